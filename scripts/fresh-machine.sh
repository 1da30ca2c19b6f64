#!/usr/bin/env bash
# Runs the README's two commands exactly as written on a fresh machine of
# this project's kind: a clean Debian root made with debootstrap, lent the
# host's Rust toolchain read-only (stable and the nightly the fuzzers use)
# with what any Rust toolchain needs (a C linker, CA certificates) and a
# writable CARGO_HOME of its own, /dev/kvm bound in where the host
# has one, and the repository cloned into it at HEAD. Nothing else is
# installed first: the README's test command must do its own set-up.
#
#   bash scripts/fresh-machine.sh [DIR]    (DIR: default /var/tmp/ferry-fresh)
#   FRESH_KEEP_BUILD=1 bash scripts/fresh-machine.sh
#                                          a rerun that keeps the last run's
#                                          build and downloaded crates
#
# Needs root, debootstrap (scripts/setup.sh installs it) and Debian's
# packages. Takes about an hour on 2 cores: run it by hand before a change
# to the set-up lands, not in CI. It prints each command's tail and exit
# status, and exits non-zero if either command failed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
root=${1:-/var/tmp/ferry-fresh}
rustup_home=${RUSTUP_HOME:-$HOME/.rustup}
cargo_bin=${CARGO_HOME:-$HOME/.cargo}/bin

[ "$(id -u)" -eq 0 ] || { echo "fresh-machine: needs root (debootstrap, chroot, mounts)" >&2; exit 1; }
command -v debootstrap >/dev/null || { echo "fresh-machine: needs debootstrap (bash scripts/setup.sh)" >&2; exit 1; }
[ -x "$cargo_bin/cargo" ] || { echo "fresh-machine: no Rust toolchain under $cargo_bin to lend" >&2; exit 1; }

mounts=()
cleanup() {
    # Whatever still runs in the root dies with this script.
    for p in /proc/[0-9]*; do
        [ "$(readlink "$p/root" 2>/dev/null)" = "$root" ] && kill -9 "${p#/proc/}" 2>/dev/null
    done
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
bind() { # bind SRC DST [ro]
    if [ -d "$1" ]; then mkdir -p "$2"; else mkdir -p "$(dirname "$2")" && touch "$2"; fi
    mount --bind "$1" "$2"
    mounts+=("$2")
    [ "${3:-}" = ro ] && mount -o remount,bind,ro "$2"
    return 0
}

# The clean root is made once ($root.base) and copied afresh for every
# run, so nothing a run installed is there for the next.
base="$root.base"
if [ ! -f "$base/.ready" ]; then
    rm -rf "$base"
    echo "fresh-machine: debootstrap bookworm into $base"
    debootstrap --variant=minbase bookworm "$base" http://deb.debian.org/debian >"$root.debootstrap.log" 2>&1 ||
        { tail -20 "$root.debootstrap.log"; exit 1; }
    # Debian's security updates as a machine of this kind has them.
    echo "deb http://deb.debian.org/debian-security bookworm-security main" >>"$base/etc/apt/sources.list"
    # The machine's own network settings, as every machine of its kind has
    # them: its resolver, the CA certificates its egress is signed with,
    # and pip's and apt's configuration.
    cp /etc/resolv.conf "$base/etc/resolv.conf"
    mkdir -p "$base/usr/local/share/ca-certificates" "$base/etc/apt/apt.conf.d"
    cp /usr/local/share/ca-certificates/* "$base/usr/local/share/ca-certificates/" 2>/dev/null || true
    cp /etc/pip.conf "$base/etc/pip.conf" 2>/dev/null || true
    cp /etc/apt/apt.conf.d/99artifact-registry "$base/etc/apt/apt.conf.d/" 2>/dev/null || true
    # What a Rust toolchain itself needs on any machine that has one: a C
    # linker (rustc links through cc) and the CA certificates cargo checks
    # crates.io against. Nothing the project needs is installed here.
    chroot "$base" sh -c 'apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev ca-certificates && update-ca-certificates' \
        >"$root.toolchain.log" 2>&1 || { tail -20 "$root.toolchain.log"; exit 1; }
    touch "$base/.ready"
fi
# --keep-build: a rerun keeps the last run's target/ and downloaded
# crates, so it does not build everything again (say so when you quote it).
keep=
if [ "${FRESH_KEEP_BUILD:-0}" = 1 ] && [ -d "$root/work/ferry/target" ]; then
    keep=$(mktemp -d /var/tmp/ferry-fresh-keep.XXXX)
    mv "$root/work/ferry/target" "$keep/target"
    mv "$root/root/.cargo" "$keep/cargo"
fi
# Mounts a killed run left inside the old root (network namespaces), deepest
# first, or rm cannot remove it.
awk -v r="$root/" 'index($2, r) == 1 {print $2}' /proc/mounts | sort -r | xargs -r -n1 umount -l
rm -rf "$root"
cp -a "$base" "$root"
rm -f "$root/.ready"
# The hosts file a Debian machine gets from its installer (debootstrap
# writes none): chromedriver reaches its browser at "localhost".
[ -f "$root/etc/hosts" ] || printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$root/etc/hosts"
# Its own / must be a mount point, as a machine's is: `ip netns` remounts
# it (mount --make-rslave /).
mount --bind "$root" "$root" && mounts+=("$root")

# A fresh clone of HEAD, as a user makes one.
rm -rf "$root/work/ferry"
mkdir -p "$root/work"
git clone -q "$repo" "$root/work/ferry"
git -C "$root/work/ferry" checkout -q "$(git -C "$repo" rev-parse HEAD)"
echo "fresh-machine: cloned $(git -C "$root/work/ferry" log --oneline -1)"
if [ -n "$keep" ]; then
    mv "$keep/target" "$root/work/ferry/target"
    mkdir -p "$root/root"
    mv "$keep/cargo" "$root/root/.cargo"
    rmdir "$keep"
    echo "fresh-machine: FRESH_KEEP_BUILD=1: kept the last run's target/ and downloaded crates"
fi

mount -t proc proc "$root/proc" && mounts+=("$root/proc")
mount -t sysfs sys "$root/sys" && mounts+=("$root/sys")
mount -t tmpfs tmpfs "$root/dev" && mounts+=("$root/dev")
for d in null zero full random urandom tty ptmx userfaultfd net/tun kvm; do
    [ -e "/dev/$d" ] && bind "/dev/$d" "$root/dev/$d"
done
mkdir -p "$root/dev/pts" "$root/dev/shm" "$root/dev/hugepages"
mount -t devpts devpts "$root/dev/pts" && mounts+=("$root/dev/pts")
mount -t tmpfs tmpfs "$root/dev/shm" && mounts+=("$root/dev/shm")
mount -t hugetlbfs hugetlbfs "$root/dev/hugepages" && mounts+=("$root/dev/hugepages")
mkdir -p "$root/run/netns" "$root/tmp" && chmod 1777 "$root/tmp"

# The host's toolchain, read-only; the root's own CARGO_HOME for downloads
# and `cargo install`.
bind "$rustup_home" "$root/opt/rustup" ro
bind "$cargo_bin" "$root/opt/cargo-bin" ro
mkdir -p "$root/root/.cargo/bin"

run() { # run LABEL COMMAND: the command as written, in the clean root
    local log="$root.$1.log" status=0
    echo "fresh-machine: $1: $2"
    # The machine's environment as CI has it: its certificate and proxy
    # settings pass; nothing else of this shell's does.
    local -a pass=()
    while IFS= read -r v; do pass+=("$v"); done < <(env | grep -E '^[A-Z_]*(SSL|CERT|CA_BUNDLE|CA_CERTS|PROXY|proxy)[A-Z_]*=' || true)
    chroot "$root" /usr/bin/env -i "${pass[@]}" HOME=/root TERM=dumb LANG=C.UTF-8 \
        RUSTUP_HOME=/opt/rustup CARGO_HOME=/root/.cargo \
        PATH=/root/.cargo/bin:/opt/cargo-bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        /bin/bash -c "cd /work/ferry && $2" >"$log" 2>&1 || status=$?
    tail -40 "$log"
    echo "fresh-machine: $1 exited $status (log: $log)"
    return "$status"
}

readme="$root/work/ferry/README.md"
main_job=$(awk '/Run the main job/ {f=1} f && /^cargo run/ {print; exit}' "$readme")
tests=$(awk '/Run every test/ {f=1} f && /^```/ {n++; next} f && n==1 {print; exit}' "$readme")
status=0
run main-job "$main_job" || status=1
run tests "$tests" || status=1
echo "fresh-machine: what the set-up could not have (target/setup/missing):"
cat "$root/work/ferry/target/setup/missing" 2>/dev/null
echo "fresh-machine: tests that skipped, and why (target/setup/skipped):"
sort "$root/work/ferry/target/setup/skipped" 2>/dev/null | uniq -c
echo "fresh-machine: $(grep -E '^test result' "$root.tests.log" | awk '{p+=$4; f+=$6; i+=$8} END {print p" passed, "f" failed, "i" ignored"}') in the test command's cargo test"
exit "$status"
