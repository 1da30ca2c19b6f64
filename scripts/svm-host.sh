#!/usr/bin/env bash
# A real hardware-virtualized KVM host on this machine: Debian's own kernel
# and kvm-amd, booted under QEMU's TCG, which emulates an AMD CPU with SVM
# and nested paging (docs/svm-host.md says why, and which configuration).
#
#   scripts/svm-host.sh CMD [ARG...]      run CMD inside the host
#   scripts/svm-host.sh --selfcheck [--moves N] [--json]
#                                         a known-good VMM (QEMU -accel kvm)
#                                         in the host, migrated N times
#
# CMD runs from the repository's root, which the host shares at the same
# path (read-write, 9p), with this machine's /usr, /etc and $HOME. CMD's
# stdout, stderr and exit status pass through. The host's serial console
# goes in full to target/svm-host/console.log (console.PID.log while it
# runs). If the host itself fails, this exits non-zero naming the cause:
#   125  the host crashed (a kernel panic, BUG or Oops on its console)
#   126  the host froze: its heartbeat (a console line every 10 s from its
#        init) stopped for 60 s, so its userspace no longer ran
#   124  CMD hung: no exit within --timeout, the host still beating
# (An RCU stall report on the host's console, a CPU of its stuck for over
# 21 s, is named on stderr and leaves the status alone.)
#
# Options (before CMD): --timeout S (default 3600), --smp N, --mem MiB.
# The configuration's other knobs, for trying others (docs/svm-host.md):
# SVM_HOST_QEMU, SVM_HOST_ACCEL, SVM_HOST_CPU, SVM_HOST_APPEND,
# SVM_HOST_KVM_PARAMS, SVM_HOST_KVM_AMD_PARAMS.
#
# It installs what it lacks (scripts/setup.sh --svm: QEMU, busybox-static)
# and downloads Debian's kernel package once, unpacked under
# target/svm-host/, where it also caches the initramfs.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
state="$repo/target/svm-host"
mkdir -p "$state"

# The chosen configuration (docs/svm-host.md has the matrix).
timeout_s=3600
smp=${SVM_HOST_SMP:-1}
mem=${SVM_HOST_MEM:-8192}
qemu=${SVM_HOST_QEMU:-qemu-system-x86_64}
accel=${SVM_HOST_ACCEL:-tcg}
cpu=${SVM_HOST_CPU:-EPYC,+svm,+npt}
append_extra=${SVM_HOST_APPEND:-}
kvm_params=${SVM_HOST_KVM_PARAMS:-}
kvm_amd_params=${SVM_HOST_KVM_AMD_PARAMS:-}

selfcheck=0
while [ $# -gt 0 ]; do
    case "$1" in
        --timeout) timeout_s=$2; shift 2 ;;
        --smp) smp=$2; shift 2 ;;
        --mem) mem=$2; shift 2 ;;
        --selfcheck) selfcheck=1; shift; break ;;
        --help | -h) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        --) shift; break ;;
        *) break ;;
    esac
done
if [ "$selfcheck" -eq 1 ]; then
    selfcheck_args=("$@")
    set -- selfcheck
fi
[ $# -gt 0 ] || { echo "svm-host: no command (see --help)" >&2; exit 2; }

say() { echo "svm-host: $*" >&2; }

# What the host is made of: QEMU and busybox from Debian, the kernel package
# unpacked here.
if ! command -v "$qemu" >/dev/null || ! [ -x /bin/busybox ] || ! command -v cpio >/dev/null; then
    bash "$repo/scripts/setup.sh" --svm >&2
    command -v "$qemu" >/dev/null || { say "no $qemu, and Debian's qemu-system-x86 could not be installed"; exit 2; }
fi
kdir="$state/kernel"
if [ ! -f "$state/kernel.ready" ]; then
    say "downloading Debian's kernel package (once)"
    pkg=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
    [ -n "$pkg" ] || { apt-get update -qq >&2 || true; pkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'); }
    [ -n "$pkg" ] || { say "cannot find Debian's linux-image-amd64 package"; exit 2; }
    rm -rf "$state/pkg" "$kdir"
    mkdir -p "$state/pkg"
    (cd "$state/pkg" && apt-get download "$pkg" >/dev/null 2>&1) || { say "apt-get download $pkg failed"; exit 2; }
    dpkg-deb -x "$state"/pkg/*.deb "$kdir"
    rm -rf "$state/pkg"
    touch "$state/kernel.ready"
fi
vmlinuz=$(ls "$kdir"/boot/vmlinuz-*)
kver=${vmlinuz##*/vmlinuz-}
mods="$kdir/lib/modules/$kver/kernel"

# The Linux guests' initramfs: ferry-guest-checker, static, as init (built
# apart from the workspace's target dir, where its flags would rebuild it
# back and forth). The self-check's QEMU boots it; commands inside find it
# and the kernel as $SVM_HOST_CHECKER_INITRD and $SVM_HOST_KERNEL.
cargo rustc -q -p ferry-guest-checker --bin ferry-guest-checker --release --target-dir "$repo/target/guest" \
    -- -C target-feature=+crt-static >&2 || { say "cannot build ferry-guest-checker"; exit 2; }
checker="$repo/target/guest/release/ferry-guest-checker"
checker_initrd="$state/checker-initrd.cpio.gz"
if [ ! -f "$checker_initrd" ] || [ "$checker" -nt "$checker_initrd" ]; then
    gtmp=$(mktemp -d)
    cp "$checker" "$gtmp/init"
    (cd "$gtmp" && echo init | cpio -o -H newc --quiet | gzip -1) >"$checker_initrd.tmp"
    mv "$checker_initrd.tmp" "$checker_initrd"
    rm -rf "$gtmp"
fi
# A Linux guest's initramfs for minivmm (crates/minivmm/src/linux): busybox,
# the kernel package's virtio-mmio and virtio-blk modules, and the checker;
# $SVM_HOST_GUEST_INITRD inside.
guest_initrd="$state/guest-initrd.cpio.gz"
if [ ! -f "$guest_initrd" ] || [ "$checker" -nt "$guest_initrd" ] || [ "$0" -nt "$guest_initrd" ]; then
    gtmp=$(mktemp -d)
    mkdir -p "$gtmp"/{bin,dev,proc,sys,tmp,lib/modules}
    cp /bin/busybox "$gtmp/bin/busybox"
    cp "$checker" "$gtmp/bin/checker"
    kmods=$(ls -d "$state"/kernel/lib/modules/*/kernel)
    for m in drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_mmio \
        drivers/block/virtio_blk; do
        cp "$kmods/$m.ko" "$gtmp/lib/modules/"
    done
    cat >"$gtmp/init" <<'GINIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for m in virtio_ring virtio virtio_mmio virtio_blk; do
    insmod /lib/modules/$m.ko || echo "init: insmod $m failed"
done
echo "init: $(ls /sys/bus/virtio/devices 2>/dev/null | wc -l) virtio devices, starting the checker"
exec /bin/checker
GINIT
    chmod +x "$gtmp/init"
    (cd "$gtmp" && find . | cpio -o -H newc --quiet | gzip -1) >"$guest_initrd.tmp"
    mv "$guest_initrd.tmp" "$guest_initrd"
    rm -rf "$gtmp"
fi
if [ "$selfcheck" -eq 1 ]; then
    set -- python3 "$repo/scripts/svm-selfcheck.py" --kernel "$vmlinuz" \
        --initrd "$checker_initrd" ${selfcheck_args[@]+"${selfcheck_args[@]}"}
    rm -f "$state/selfcheck.json"
fi

# The initramfs: busybox, the modules, and /init below. Rebuilt when this
# script changes.
initrd="$state/initrd-$kver.cpio.gz"
if [ ! -f "$initrd" ] || [ "$0" -nt "$initrd" ]; then
    tmp=$(mktemp -d)
    mkdir -p "$tmp"/{bin,sbin,proc,sys,dev,tmp,run,kmod,mnt,root}
    cp /bin/busybox "$tmp/bin/busybox"
    for m in drivers/virtio/virtio_ring drivers/virtio/virtio drivers/virtio/virtio_pci_modern_dev \
        drivers/virtio/virtio_pci_legacy_dev drivers/virtio/virtio_pci fs/netfs/netfs fs/fscache/fscache \
        net/9p/9pnet net/9p/9pnet_virtio fs/9p/9p virt/lib/irqbypass arch/x86/kvm/kvm \
        drivers/crypto/ccp/ccp arch/x86/kvm/kvm-amd; do
        cp "$mods/$m.ko" "$tmp/kmod/"
        echo "${m##*/}" >>"$tmp/kmod/order"
    done
    cat >"$tmp/init" <<'INIT'
#!/bin/busybox sh
/bin/busybox --install -s /bin
export PATH=/bin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /dev/hugepages
mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t hugetlbfs hugetlbfs /dev/hugepages
arg() { tr ' ' '\n' </proc/cmdline | sed -n "s/^svmhost\.$1=//p"; }
for m in $(cat /kmod/order); do
    p=""
    [ "$m" = kvm ] && p=$(arg kvm | tr ',' ' ')
    [ "$m" = kvm-amd ] && p=$(arg kvm_amd | tr ',' ' ')
    insmod /kmod/$m.ko $p || echo "svm-host: insmod $m failed"
done
opts=trans=virtio,version=9p2000.L,msize=524288,cache=none
repo=$(arg repo); home=$(arg home); run=$(arg run)
mkdir -p /usr /etc.host "$repo" "$home"
mount -t 9p -o $opts,ro usr /usr
mount -t 9p -o $opts,ro etc /etc.host
mount -t 9p -o $opts repo "$repo"
mount -t 9p -o $opts home "$home"
# Merged /usr, as the machine has it; the host's /etc beside busybox's.
for d in lib lib64; do ln -s usr/$d /$d; done
for f in passwd group hosts nsswitch.conf ld.so.cache ssl ca-certificates alternatives; do
    [ -e /etc.host/$f ] && ln -sf /etc.host/$f /etc/$f
done
ip link set lo up
echo 64 >/proc/sys/vm/nr_hugepages
# What scripts/svm-freeze.py names a frozen CPU's addresses with: the
# kernel's text symbols once per kernel (Debian's System.map is a stub),
# shifted by this boot's _text; the modules' (kvm, kvm_amd) every boot.
echo "svm-host: _text at $(sed -n 's/^\([0-9a-f]*\) T _text$/\1/p' /proc/kallsyms)"
ksyms="$repo/target/svm-host/kallsyms-$(uname -r)"
[ -s "$ksyms" ] || { grep -v '\[' /proc/kallsyms | grep ' [tTwW] ' >"$ksyms.tmp" && mv "$ksyms.tmp" "$ksyms"; }
grep '\[' /proc/kallsyms | grep ' [tTwW] ' >"$run/modsyms"
echo "svm-host: ready: $(uname -r), /dev/kvm $( [ -c /dev/kvm ] && echo present || echo ABSENT )"
# The heartbeat: while this host's userspace runs, its console grows.
( while sleep 10; do echo "svm-host: heartbeat $(cut -d' ' -f1 /proc/uptime)" >/dev/console; done ) &
cd "$repo"
env -i HOME="$home" PATH="$home/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" \
    TERM=dumb LANG=C.UTF-8 SVM_HOST=1 \
    /bin/sh "$run/cmd.sh" >"$run/stdout" 2>"$run/stderr" </dev/null
echo $? >"$run/status.tmp" && mv "$run/status.tmp" "$run/status"
sync
echo "svm-host: command exited $(cat $run/status)"
poweroff -f
INIT
    chmod +x "$tmp/init"
    (cd "$tmp" && find . | cpio -o -H newc --quiet | gzip -1) >"$initrd.tmp"
    mv "$initrd.tmp" "$initrd"
    rm -rf "$tmp"
fi

# One run directory per call, under the shared repository.
run="$state/runs/$$"
rm -rf "$run"
mkdir -p "$run"
: >"$run/stdout"
: >"$run/stderr"
{
    printf 'export SVM_HOST_KERNEL=%q SVM_HOST_CHECKER_INITRD=%q SVM_HOST_GUEST_INITRD=%q\n' \
        "$vmlinuz" "$checker_initrd" "$guest_initrd"
    printf 'cd %q\n' "$PWD"
    printf 'exec'
    printf ' %q' "$@"
    printf '\n'
} >"$run/cmd.sh"
# Each host's console is its own while it runs (hosts may run side by side),
# and becomes target/svm-host/console.log when it ends.
console="$state/console.$$.log"
: >"$console"

append="console=ttyS0 panic=-1 oops=panic svmhost.repo=$repo svmhost.home=$HOME svmhost.run=$run"
[ -n "$kvm_params" ] && append="$append svmhost.kvm=$kvm_params"
[ -n "$kvm_amd_params" ] && append="$append svmhost.kvm_amd=$kvm_amd_params"
append="$append $append_extra"
share() { echo "-virtfs local,path=$1,mount_tag=$2,security_model=none,multidevs=remap"; }

# The outer QEMU's monitor: where a frozen host's registers are read
# (scripts/svm-freeze.py). Not under the repository: its path may be too
# long for a UNIX socket.
monitor="/tmp/svm-host.$$.monitor"
rm -f "$monitor"
# shellcheck disable=SC2046
"$qemu" -accel "$accel" -machine q35 -cpu "$cpu" -smp "$smp" -m "$mem" \
    -kernel "$vmlinuz" -initrd "$initrd" -append "$append" \
    -nographic -no-reboot -serial "file:$console" -monitor "unix:$monitor,server,nowait" \
    -nic none $(share /usr usr) $(share /etc etc) $(share "$repo" repo) $(share "$HOME" home) \
    >"$run/qemu.log" 2>&1 &
qpid=$!
tail -n +1 -F --pid=$qpid -s 0.2 "$run/stdout" 2>/dev/null &
t1=$!
tail -n +1 -F --pid=$qpid -s 0.2 "$run/stderr" >&2 2>/dev/null &
t2=$!
trap 'kill $qpid $t1 $t2 2>/dev/null || true; rm -f "$monitor"' EXIT
trap 'exit 130' INT TERM

hung=0
froze=0
start=$(date +%s)
# Once the host is up, its init adds a heartbeat line every 10 s; 60 s
# without a new one means it froze. Heartbeats are counted, not the
# console's size: with two outer vCPUs one can freeze while the other
# fills the console with the stalls it sees (2026-12-07, h1).
beats=0
beat_at=$start
while kill -0 $qpid 2>/dev/null; do
    now=$(date +%s)
    if [ $((now - start)) -ge "$timeout_s" ]; then
        hung=1
        kill $qpid 2>/dev/null
        break
    fi
    n=$(grep -c '^svm-host: heartbeat' "$console" 2>/dev/null || true)
    if [ "${n:-0}" != "$beats" ]; then
        beats=${n:-0}
        beat_at=$now
    elif [ $((now - beat_at)) -ge 60 ] && [ "$beats" -gt 0 ]; then
        froze=1
        python3 "$repo/scripts/svm-freeze.py" "$monitor" "$console" "$state/kallsyms-$kver" "$run/modsyms" \
            >"$state/freeze.log" 2>&1 || true
        kill $qpid 2>/dev/null
        break
    fi
    sleep 1
done
wait $qpid 2>/dev/null || true
sleep 0.5
kill $t1 $t2 2>/dev/null || true
wait $t1 $t2 2>/dev/null || true

fault=$(grep -m1 -E 'Kernel panic|BUG:|Oops:|general protection fault|stack guard page|corrupted stack end' "$console" || true)
mv -f "$console" "$state/console.log"
console="$state/console.log"
# With two outer vCPUs one can stop while the other runs on, reporting it:
# the command may finish, but what it measured ran on a limping host.
stalls=$(grep -cE 'rcu: INFO: .*(detected stalls|self-detected stall|detected expedited stalls)' "$console" || true)
if [ "${stalls:-0}" -gt 0 ]; then
    say "the SVM host logged $stalls RCU stall report(s), a CPU of its stuck for over 21 s: distrust what this boot measured (console: $console)"
fi
status=
if [ -n "$fault" ]; then
    say "the SVM host crashed: $fault (console: $console)"
    status=125
elif [ "$froze" -eq 1 ]; then
    say "the SVM host froze: no heartbeat on its console for 60 s, so its userspace stopped running (console: $console; its CPU: $state/freeze.log, $(grep -m1 '^RIP' "$state/freeze.log" 2>/dev/null || echo 'no registers'))"
    status=126
elif [ "$hung" -eq 1 ]; then
    if [ "$beats" -gt 0 ]; then
        say "the command hung: no exit within ${timeout_s} s, the host still beating (console: $console)"
    else
        say "no exit within ${timeout_s} s, and the host never beat: it did not come up (console: $console)"
    fi
    status=124
elif [ ! -f "$run/status" ]; then
    say "the SVM host stopped without the command's status (console: $console; QEMU: $(tail -1 "$run/qemu.log"))"
    status=125
fi
if [ -n "$status" ]; then
    # The self-check's tally so far, with the host's own failure added:
    # its JSON line still comes out.
    if [ "$selfcheck" -eq 1 ] && [ -f "$state/selfcheck.json" ]; then
        python3 - "$state/selfcheck.json" "$status" "$fault" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
t["host_crashes" if sys.argv[2] in ("125", "126") else "hangs"] += 1
why = {"124": "hung", "126": "froze"}.get(sys.argv[2], "stopped")
t["errors"].append("the SVM host: " + (sys.argv[3] or why))
print(json.dumps(t))
PY
    fi
    exit "$status"
fi
status=$(cat "$run/status")
rm -rf "$run"
exit "$status"
