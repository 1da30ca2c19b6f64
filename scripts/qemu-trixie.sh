#!/usr/bin/env bash
# Debian trixie's QEMU 10 beside this machine's bookworm QEMU 7.2, without
# installing it: benchmarks compare against QEMU 10's `mapped-ram`
# snapshot-to-file migration, which 7.2 lacks.
#
#   scripts/qemu-trixie.sh      then: target/qemu-trixie/qemu-system-x86_64 ...
#
# It downloads trixie's qemu-system-x86, the firmware a q35 machine boots
# with (qemu-system-data, seabios, ipxe-qemu), trixie's libc6 and the whole
# closure of their dependencies, and unpacks them (dpkg-deb -x) under
# target/qemu-trixie/root/. apt runs on a private configuration
# (APT_CONFIG: the system's /etc/apt, its apt.conf.d hooks and its state
# are neither read nor touched). The Release file is verified against
# /usr/share/keyrings/debian-archive-keyring.gpg, which on bookworm already
# holds trixie's keys: no trusted=yes.
#
# The wrapper target/qemu-trixie/qemu-system-x86_64 runs the binary through
# trixie's own loader with --library-path (so QEMU's children, e.g. an
# exec: migration's shell, keep this machine's libraries), and finds root/
# from its own path, so it also works in a VM that shares the repository at
# the same path over a different /usr. A second run only says where it is.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
dir="$repo/target/qemu-trixie"
root="$dir/root"
wrapper="$dir/qemu-system-x86_64"
say() { echo "qemu-trixie: $*" >&2; }

if [ -x "$wrapper" ] && [ -x "$root/usr/bin/qemu-system-x86_64" ]; then
    say "ready: $wrapper"
    exit 0
fi

# A private apt: its own sources, lists, cache and an empty dpkg status.
apt="$dir/apt"
mkdir -p "$apt/etc/apt.conf.d" "$apt/etc/preferences.d" "$apt/etc/sources.list.d" \
         "$apt/state/lists/partial" "$apt/cache/archives/partial"
touch "$apt/state/status"
echo 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main' \
    >"$apt/etc/sources.list"
cat >"$apt/apt.conf" <<EOF
Dir::Etc "$apt/etc";
Dir::State "$apt/state";
Dir::State::status "$apt/state/status";
Dir::Cache "$apt/cache";
APT::Architecture "amd64";
APT::Architectures { "amd64"; };
APT::Sandbox::User "root";
Acquire::Languages "none";
EOF
export APT_CONFIG="$apt/apt.conf"

say "apt-get update (trixie, private lists under $apt)"
apt-get update -qq >/dev/null
# Real packages only: apt-cache prints virtual ones as <name>.
apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
    --no-breaks --no-replaces --no-enhances \
    qemu-system-x86 qemu-system-data seabios ipxe-qemu libc6 \
    | grep -v '^[ <]' | sort -u >"$dir/packages.txt"
say "downloading $(wc -l <"$dir/packages.txt") packages"
rm -rf "$dir/debs" "$root"
mkdir -p "$dir/debs" "$root"
(cd "$dir/debs" && xargs apt-get download -qq <"$dir/packages.txt" >/dev/null)
for deb in "$dir"/debs/*.deb; do dpkg-deb -x "$deb" "$root"; done

# QEMU takes its directory from /proc/self/exe, here the loader's
# (usr/lib/x86_64-linux-gnu), and prefers <that>/qemu-bundle/<built-in path>
# for its module and firmware dirs: this link keeps it off this machine's
# /usr/lib/x86_64-linux-gnu/qemu (7.2's modules, which it would try and
# refuse with "Only modules from the same build can be loaded").
lib="$root/usr/lib/x86_64-linux-gnu"
ln -sfn ../../.. "$lib/qemu-bundle"

# Every library the binary needs must come from root/.
libs=$("$root/usr/lib64/ld-linux-x86-64.so.2" --library-path "$lib" --list "$root/usr/bin/qemu-system-x86_64")
if grep -v -e "$root/" -e linux-vdso <<<"$libs"; then
    say "the libraries above resolve outside $root"; exit 1
fi

cat >"$wrapper.tmp" <<'EOF'
#!/bin/sh
# Debian trixie's QEMU 10 through trixie's own loader (scripts/qemu-trixie.sh).
root=$(dirname "$(readlink -f "$0")")/root
lib=$root/usr/lib/x86_64-linux-gnu
export QEMU_MODULE_DIR="$lib/qemu"
exec "$root/usr/lib64/ld-linux-x86-64.so.2" --library-path "$lib" \
    "$root/usr/bin/qemu-system-x86_64" \
    -L "$root/usr/share/qemu" -L "$root/usr/share/seabios" "$@"
EOF
chmod +x "$wrapper.tmp"
mv "$wrapper.tmp" "$wrapper"
say "$("$wrapper" --version | head -1)"
say "ready: $wrapper ($(du -sh "$dir/debs" | cut -f1) downloaded)"
