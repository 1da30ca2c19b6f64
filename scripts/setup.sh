#!/usr/bin/env bash
# The set-up the README's test command runs first: it installs what the tests
# need on a fresh machine of this project's kind (Debian 12 with a Rust
# toolchain) and is quick when everything is there. It is the one place the
# project installs anything; .ci/run installs nothing itself.
#
#   bash scripts/setup.sh          everything the test command needs
#   bash scripts/setup.sh --svm    only what scripts/svm-host.sh needs
#
# What it cannot get, because the machine cannot provide it (no route to
# Debian's packages or to crates.io, not root), it records in
# target/setup/missing, one line `NAME: reason`, and goes on: tests that need
# NAME print a SKIP line with that reason. A test whose need is not recorded
# there fails rather than skips: the set-up said it was installed.
# Anything that could be installed but failed to stops the set-up.
set -uo pipefail
cd "$(dirname "$0")/.."

only_svm=0
[ "${1:-}" = "--svm" ] && only_svm=1

export PATH="$HOME/.cargo/bin:$PATH"
mkdir -p target/setup
missing=target/setup/missing
: >"$missing"
# Each test that skips appends its SKIP line here (.cargo/config.toml).
: >target/setup/skipped

say() { echo "setup: $*"; }
die() { echo "setup: error: $*" >&2; exit 1; }
record() { echo "$1: $2" >>"$missing"; say "cannot have $1 here: $2"; }

# Root runs apt-get itself; anyone else through sudo, where sudo works
# without a password. Otherwise nothing from Debian can be installed.
if [ "$(id -u)" -eq 0 ]; then
    as_root=()
elif sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
else
    as_root=(none)
fi

apt_updated=0
apt_reachable=1
# Installs the Debian packages named, once each, after one `apt-get update`.
# Returns 2 where the packages cannot be reached at all (no root, no
# network), 1 where apt-get failed with them reachable.
apt_install() {
    local need=()
    for p in "$@"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || need+=("$p")
    done
    [ ${#need[@]} -eq 0 ] && return 0
    [ "${as_root[0]:-}" = none ] && return 2
    [ "$apt_reachable" -eq 1 ] || return 2
    if [ "$apt_updated" -eq 0 ]; then
        say "apt-get update"
        if ! "${as_root[@]}" apt-get update -qq >/dev/null 2>target/setup/apt-update.log; then
            apt_reachable=0
            return 2
        fi
        apt_updated=1
    fi
    say "installing ${need[*]}"
    DEBIAN_FRONTEND=noninteractive "${as_root[@]}" apt-get install -y -qq --no-install-recommends "${need[@]}" \
        >target/setup/apt-install.log 2>&1 || { tail -20 target/setup/apt-install.log >&2; return 1; }
}

# `want NAME PACKAGE...`: installs the packages or records NAME as missing
# where the machine cannot reach them; a failed install with them reachable
# ends the set-up.
want() {
    local name="$1"
    shift
    apt_install "$@"
    case $? in
        0) ;;
        2) if [ "${as_root[0]:-}" = none ]; then
               record "$name" "not root, and no password-less sudo, so Debian's $* cannot be installed"
           else
               record "$name" "Debian's packages cannot be reached (apt-get update failed: $(tail -1 target/setup/apt-update.log))"
           fi ;;
        *) die "apt-get install $* failed (target/setup/apt-install.log)" ;;
    esac
}

svm_packages() {
    # scripts/svm-host.sh: QEMU emulates the SVM host, busybox is its
    # initramfs's shell, Debian's kernel package its kernel and kvm-amd.
    want svm-host qemu-system-x86 busybox-static cpio
}

if [ "$only_svm" -eq 1 ]; then
    svm_packages
    exit 0
fi

# The toolchain: a machine without cargo gets Debian's.
if ! command -v cargo >/dev/null 2>&1; then
    want cargo cargo rustc
    command -v cargo >/dev/null 2>&1 || die "no cargo, and it could not be installed"
fi
say "$(cargo --version)"

# A C toolchain: the linker rustc calls, and the cc crate's builds (zstd,
# ring). A Rust toolchain alone does not bring one.
command -v cc >/dev/null 2>&1 || want cc gcc libc6-dev

# fmt and clippy: the lint step of the test command.
if ! cargo fmt --version >/dev/null 2>&1 || ! cargo clippy --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
        rustup component add rustfmt clippy || die "rustup could not add rustfmt and clippy"
    else
        want lint rustfmt rust-clippy
    fi
fi

# bindgen, under userfaultfd-sys (vhost-user-backend's `postcopy` feature in
# minivmm), runs in its build script whatever features are set: it needs
# libclang to build at all.
want libclang libclang-dev

# Network namespaces and tc for `--netns` tests; headless Chromium and its
# WebDriver for the browser test of the HTML reports; a venv for QEMU's QMP
# client library; debootstrap for scripts/fresh-machine.sh.
want iproute2 iproute2
want chromium chromium chromium-driver
want python3-venv python3-venv
want debootstrap debootstrap

# qemu.qmp (QEMU's own QMP client, from PyPI) in a virtual environment under
# target/, for the tests that drive ferry's QMP socket with it.
if ! target/qmp-venv/bin/python -c "import qemu.qmp" >/dev/null 2>&1; then
    if python3 -m venv target/qmp-venv >/dev/null 2>&1 &&
        target/qmp-venv/bin/pip install -q qemu.qmp >target/setup/pip.log 2>&1; then
        say "installed qemu.qmp in target/qmp-venv"
    else
        record qemu.qmp "pip could not install it from PyPI ($(tail -1 target/setup/pip.log 2>/dev/null))"
    fi
fi

svm_packages

# 2 MiB huge pages reserved so the hugetlb backing is tested too (root only).
if [ -w /proc/sys/vm/nr_hugepages ]; then
    [ "$(cat /proc/sys/vm/nr_hugepages)" -lt 64 ] && echo 64 >/proc/sys/vm/nr_hugepages
fi
grep -q '^HugePages_Free: *[1-9]' /proc/meminfo ||
    record hugepages "no 2 MiB huge pages could be reserved (needs root)"

# The fuzzers need nightly Rust, cargo-fuzz, and a C++ compiler (libfuzzer-sys
# builds libFuzzer with it).
command -v c++ >/dev/null 2>&1 || want c++ g++
if cargo +nightly --version >/dev/null 2>&1; then
    if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
        say "installing cargo-fuzz"
        cargo install cargo-fuzz --locked >target/setup/cargo-fuzz.log 2>&1 ||
            record cargo-fuzz "cargo install cargo-fuzz failed ($(tail -1 target/setup/cargo-fuzz.log))"
    fi
else
    record nightly "no nightly Rust toolchain (rustup toolchain install nightly)"
fi

if [ -e /dev/kvm ]; then
    say "/dev/kvm present: the kvm-backend tests will run"
else
    record kvm "/dev/kvm is absent: the kvm backend's tests print SKIP, the demo runs on the soft backend"
fi
if [ -s "$missing" ]; then
    say "done; missing (tests print SKIP for these):"
    sed 's/^/setup:   /' "$missing"
else
    say "done; nothing missing"
fi
