#!/usr/bin/env python3
"""What this host's KVM says it offers, for docs/svm-host.md: the
capabilities ferry decides by, asked of /dev/kvm and of a fresh VM
(KVM_CHECK_EXTENSION), and the kernel and modules behind them. One JSON
object on stdout. Run it on each host to compare them
(scripts/svm-host.sh python3 scripts/kvm-caps.py)."""

import fcntl
import json
import os

KVM_CHECK_EXTENSION = 0xAE03
KVM_CREATE_VM = 0xAE01
CAPS = {
    "NR_VCPUS": 9, "MAX_VCPUS": 66, "ADJUST_CLOCK": 39, "XSAVE": 55, "XCRS": 56,
    "ASYNC_PF": 59, "TSC_CONTROL": 60, "SPLIT_IRQCHIP": 121, "X86_DISABLE_EXITS": 143,
    "NESTED_STATE": 157, "EXCEPTION_PAYLOAD": 164, "MANUAL_DIRTY_LOG_PROTECT2": 168,
    "HALT_POLL": 182, "DIRTY_LOG_RING": 192, "XSAVE2": 208, "PMU_CAPABILITY": 212,
    "DIRTY_LOG_RING_ACQ_REL": 223, "DIRTY_LOG_RING_WITH_BITMAP": 225,
    "USER_MEMORY2": 231, "MEMORY_FAULT_INFO": 232, "GUEST_MEMFD": 234,
    "PRE_FAULT_MEMORY": 236,
}


def params(module):
    d = f"/sys/module/{module}/parameters"
    if not os.path.isdir(d):
        return None
    out = {}
    for p in sorted(os.listdir(d)):
        try:
            out[p] = open(os.path.join(d, p)).read().strip()
        except OSError:
            pass
    return out


def main():
    kvm = os.open("/dev/kvm", os.O_RDWR)
    vm = fcntl.ioctl(kvm, KVM_CREATE_VM, 0)
    caps = {}
    for name, num in CAPS.items():
        caps[name] = fcntl.ioctl(vm, KVM_CHECK_EXTENSION, num)
    print(json.dumps({
        "kernel": os.uname().release,
        "modules": [m for m in ("kvm_amd", "kvm_intel", "kvm_pvm") if os.path.isdir(f"/sys/module/{m}")],
        "caps": caps,
        "kvm": params("kvm"),
        "kvm_amd": params("kvm_amd"),
    }))


if __name__ == "__main__":
    main()
