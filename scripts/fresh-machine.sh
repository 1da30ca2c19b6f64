#!/usr/bin/env bash
# Runs the README's two commands exactly as written on a fresh machine of
# this project's kind: a clean Debian root made with debootstrap, lent the
# host's Rust toolchain read-only (stable and the nightly the fuzzers use)
# with a writable CARGO_HOME of its own, /dev/kvm bound in where the host
# has one, and the repository cloned into it at HEAD. Nothing else is
# installed first: the README's test command must do its own set-up.
#
#   bash scripts/fresh-machine.sh [DIR]    (DIR: default /var/tmp/ferry-fresh)
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
    for ((i = ${#mounts[@]} - 1; i >= 0; i--)); do umount -l "${mounts[i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
bind() { # bind SRC DST [ro]
    mkdir -p "$2"
    mount --bind "$1" "$2"
    mounts+=("$2")
    [ "${3:-}" = ro ] && mount -o remount,bind,ro "$2"
    return 0
}

if [ ! -x "$root/bin/bash" ]; then
    rm -rf "$root"
    echo "fresh-machine: debootstrap bookworm into $root"
    debootstrap --variant=minbase bookworm "$root" http://deb.debian.org/debian >"$root.debootstrap.log" 2>&1 ||
        { tail -20 "$root.debootstrap.log"; exit 1; }
    # Debian's security updates as a machine of this kind has them.
    echo "deb http://deb.debian.org/debian-security bookworm-security main" >>"$root/etc/apt/sources.list"
fi
cp /etc/resolv.conf "$root/etc/resolv.conf"

# A fresh clone of HEAD, as a user makes one.
rm -rf "$root/work/ferry"
mkdir -p "$root/work"
git clone -q "$repo" "$root/work/ferry"
git -C "$root/work/ferry" checkout -q "$(git -C "$repo" rev-parse HEAD)"
echo "fresh-machine: cloned $(git -C "$root/work/ferry" log --oneline -1)"

mount -t proc proc "$root/proc" && mounts+=("$root/proc")
mount -t sysfs sys "$root/sys" && mounts+=("$root/sys")
mount -t tmpfs tmpfs "$root/dev" && mounts+=("$root/dev")
for d in null zero full random urandom tty ptmx userfaultfd net/tun; do
    [ -e "/dev/$d" ] || continue
    mkdir -p "$(dirname "$root/dev/$d")"
    touch "$root/dev/$d"
    bind "/dev/$d" "$root/dev/$d"
done
[ -e /dev/kvm ] && touch "$root/dev/kvm" && bind /dev/kvm "$root/dev/kvm"
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
    chroot "$root" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
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
echo "fresh-machine: SKIP lines of the test command:"
grep -h 'SKIP' "$root.tests.log" | sort | uniq -c || true
exit "$status"
