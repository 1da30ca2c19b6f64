#!/usr/bin/env python3
"""Where a frozen SVM host is: its CPU's registers, named.

    scripts/svm-freeze.py MONITOR_SOCKET CONSOLE KERNEL_SYMS MODULE_SYMS

scripts/svm-host.sh runs this when the host's heartbeat stops, before it
kills the outer QEMU. It asks QEMU's monitor for the registers of each
outer vCPU and the words on top of its stack, and names every kernel
address among them: the kernel's from its text symbols as an earlier boot
listed them (KERNEL_SYMS, /proc/kallsyms's format; Debian's System.map is
a stub), shifted by the KASLR offset between that boot and this one (this
boot printed `svm-host: _text at ADDR` on its console); the modules' (kvm,
kvm_amd) from this boot's own list. Prints a report: the evidence for telling
which part of the host stopped (a spinning lock, an idle CPU with its
interrupts off, a nested guest that never exits).
"""

import bisect
import re
import socket
import sys
import time


def monitor(path, commands):
    """Each command's output from QEMU's human monitor on `path`."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(path)

    def read_until_prompt():
        buf = b""
        end = time.time() + 10
        while not buf.endswith(b"(qemu) ") and time.time() < end:
            try:
                chunk = s.recv(65536)
            except socket.timeout:
                break
            if not chunk:
                break
            buf += chunk
        return buf.decode(errors="replace")

    read_until_prompt()
    out = []
    for c in commands:
        s.sendall(c.encode() + b"\n")
        text = read_until_prompt()
        # Drop the echoed command and the prompt; HMP echoes with escapes.
        text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
        # The first line is the monitor echoing the command as typed.
        body = text.replace("(qemu) ", "").strip().split("\n", 1)[1:]
        out.append((c, "".join(body).strip()))
    s.close()
    return out


def symbols(path):
    """(sorted addresses, names) of the text symbols in a kallsyms list."""
    pairs = []
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3 and parts[1] in "tTwW":
                    label = parts[2] + (f" {parts[3]}" if len(parts) > 3 else "")
                    pairs.append((int(parts[0], 16), label))
    except OSError:
        pass
    pairs.sort()
    return [a for a, _ in pairs], [n for _, n in pairs]


def kaslr_offset(console, addrs, names):
    text = open(console, errors="replace").read()
    m = re.search(r"svm-host: _text at ([0-9a-f]+)", text)
    if not m or "_text" not in names:
        return None
    return int(m.group(1), 16) - addrs[names.index("_text")]


def name(addr, addrs, names, offset):
    if offset is None:
        return None
    a = addr - offset
    i = bisect.bisect_right(addrs, a) - 1
    if i < 0 or a - addrs[i] > 0x10000:
        return None
    return f"{names[i]}+{a - addrs[i]:#x}"


def main():
    sock, console, kernel_syms, module_syms = sys.argv[1:5]
    addrs, names = symbols(kernel_syms)
    offset = kaslr_offset(console, addrs, names)
    maddrs, mnames = symbols(module_syms)

    def label(a):
        return name(a, addrs, names, offset) or name(a, maddrs, mnames, 0)

    try:
        cpus = monitor(sock, ["info cpus"])[0][1]
    except OSError as e:
        print(f"svm-freeze: no monitor ({e})")
        return 1
    print(f"svm-freeze: KASLR offset {offset:#x}" if offset is not None else
          "svm-freeze: no KASLR offset on the console: addresses unnamed")
    print(cpus)
    for idx in re.findall(r"CPU #(\d+)", cpus) or ["0"]:
        out = monitor(sock, [f"cpu {idx}", "info registers"])
        regs = out[1][1]
        rsp = re.search(r"RSP=([0-9a-f]+)", regs)
        # Two seconds on: a CPU stuck on one instruction, or still running
        # (in the nested guest, its mode says: EFER.SVME and CPL); and the
        # host's LAPIC, whose timer interrupt should end a nested guest's
        # run (an interrupt left in its IRR means the exit never came).
        time.sleep(2)
        later = monitor(sock, [f"cpu {idx}", "info registers", "info lapic",
                               f"x/48gx 0x{rsp.group(1) if rsp else '0'}"])
        regs_later, lapic, stack = later[1][1], later[2][1], later[3][1]
        rip = re.search(r"RIP=([0-9a-f]+)", regs)
        hflags = re.search(r"HLT=(\d)", regs)
        print(f"--- outer vCPU {idx}")
        print(regs)
        if rip:
            r = int(rip.group(1), 16)
            print(f"RIP {r:#x} = {label(r) or '(not kernel text)'}"
                  f"{', halted' if hflags and hflags.group(1) == '1' else ''}")
        rip_later = re.search(r"RIP=[0-9a-f]+.*", regs_later)
        print(f"2 s later: {rip_later.group(0) if rip_later else regs_later[:200]}")
        print("the host's LAPIC (info lapic):")
        print(lapic)
        print("its stack:")
        print(stack)
        print("kernel text on its stack (a rough backtrace, innermost first):")
        for word in re.findall(r"0x([0-9a-f]{16})", stack):
            n = label(int(word, 16))
            if n:
                print(f"  {n}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
