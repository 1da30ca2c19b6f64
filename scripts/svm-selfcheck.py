#!/usr/bin/env python3
"""The SVM host's self-check: a known-good VMM inside it, as a control.

Runs inside scripts/svm-host.sh (`scripts/svm-host.sh --selfcheck`). QEMU
(`-accel kvm`, this machine's own, through the shared /usr) boots Debian's
kernel with ferry-guest-checker as its init: one thread per vCPU writes and
verifies a pattern and prints a numbered line a second. The guest is then
migrated between two QEMUs over loopback, back and forth, --moves times.
After each move the new side must print further lines, with no pattern
mismatch and no kernel warning.

The default guest has 4 vCPUs: with the destination QEMU up beside the
source, the host runs them overcommitted, as ferry's demos load it (a
4-vCPU demo is 8 vCPU threads on 2 CPUs).

Writes its tally after every move to target/svm-host/selfcheck.json, so that
scripts/svm-host.sh can still report the moves made when the host itself
crashes or hangs (it adds `host_crashes` and `hangs` from outside). The last
stdout line (with --json) is the tally as JSON.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE = os.path.join(REPO, "target", "svm-host")
WARNINGS = re.compile(r"WARNING:|BUG:|Oops|soft lockup|hung task|rcu.*stall|Kernel panic|clocksource.*unstable")
# Notices that carry the word but warn of nothing that happened.
NOT_WARNINGS = re.compile(r"Speculative Return Stack Overflow: WARNING: See")
LINE = re.compile(r"checker (\d+) gen=(\d+) pages=(\d+) mismatches=(\d+) max_gap_ms=([\d.]+)")


class Qmp:
    """QEMU's monitor protocol over a unix socket: one command at a time."""

    def __init__(self, path, timeout=60):
        deadline = time.time() + timeout
        while True:
            try:
                self.sock = socket.socket(socket.AF_UNIX)
                self.sock.connect(path)
                break
            except OSError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        self.file = self.sock.makefile("rw")
        self._read()  # the greeting
        self.cmd("qmp_capabilities")

    def _read(self):
        while True:
            line = self.file.readline()
            if not line:
                raise ConnectionError("QMP closed")
            msg = json.loads(line)
            if "event" not in msg:
                return msg

    def cmd(self, name, **args):
        self.file.write(json.dumps({"execute": name, "arguments": args}) + "\n")
        self.file.flush()
        reply = self._read()
        if "error" in reply:
            raise RuntimeError(f"{name}: {reply['error']}")
        return reply["return"]


class Guest:
    """One QEMU process: its console file and monitor."""

    def __init__(self, name, args, incoming=None):
        self.incoming = incoming is not None
        self.console = os.path.join(STATE, f"selfcheck-{name}.console")
        self.sock = f"/tmp/selfcheck-{name}.qmp"
        for f in (self.console, self.sock):
            if os.path.exists(f):
                os.unlink(f)
        cmd = [
            "qemu-system-x86_64", "-accel", "kvm", "-cpu", "host", "-machine", "q35",
            "-smp", str(args.vcpus), "-m", str(args.mem),
            "-kernel", args.kernel, "-initrd", args.initrd,
            "-append", f"console=ttyS0 panic=-1 checker.mib={args.mib} {args.guest_append}".strip(),
            "-display", "none", "-monitor", "none", "-no-reboot", "-nic", "none",
            "-serial", f"file:{self.console}", "-qmp", f"unix:{self.sock},server=on,wait=off",
        ]
        if incoming:
            cmd += ["-incoming", incoming]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.qmp = Qmp(self.sock)

    def lines(self):
        try:
            with open(self.console, errors="replace") as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    def warnings(self):
        """The guest kernel's warnings on this side's console once the
        checker runs: (before the checker started, after it)."""
        # An incoming side's console starts after the move: all of it counts.
        before, after, started = [], [], self.incoming
        for l in self.lines():
            started = started or l.startswith("checker start")
            if l.startswith(("checker-warning: ", "checker-boot-warning: ")):
                continue  # the checker repeating the kernel's own line
            if WARNINGS.search(l) and not NOT_WARNINGS.search(l):
                (after if started else before).append(l.strip())
        return before, after

    def stop(self):
        try:
            self.qmp.cmd("quit")
        except Exception:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def checker_lines(lines):
    return [m for m in (LINE.search(l) for l in lines) if m]


def wait_lines(guest, after_seq, count, timeout):
    """Waits for `count` checker lines numbered past `after_seq`; returns them."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = [m for m in checker_lines(guest.lines()) if int(m.group(1)) > after_seq]
        if len(found) >= count:
            return found
        if guest.proc.poll() is not None:
            return found
        time.sleep(0.5)
    return [m for m in checker_lines(guest.lines()) if int(m.group(1)) > after_seq]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--moves", type=int, default=20)
    p.add_argument("--vcpus", type=int, default=4)
    p.add_argument("--mem", type=int, default=512, help="guest MiB")
    p.add_argument("--mib", type=int, default=64, help="MiB written per vCPU")
    p.add_argument("--boot-timeout", type=int, default=600)
    p.add_argument("--move-timeout", type=int, default=600)
    p.add_argument("--guest-append", default="")
    p.add_argument("--kernel", required=True)
    p.add_argument("--initrd", required=True)
    p.add_argument("--json", action="store_true")
    args = p.parse_args()

    tally = {"moves": args.moves, "moves_completed": 0, "guest_errors": 0, "hangs": 0,
             "host_crashes": 0, "vcpus": args.vcpus, "kernel": os.uname().release,
             "move_s": [], "downtime_ms": [], "errors": [], "boot_warnings": []}
    out = os.path.join(STATE, "selfcheck.json")

    def save():
        with open(out + ".tmp", "w") as f:
            json.dump(tally, f)
        os.replace(out + ".tmp", out)

    def fail(kind, what):
        tally[kind] += 1
        tally["errors"].append(what)
        print(f"selfcheck: {what}", file=sys.stderr, flush=True)

    def check_warnings(guest, side):
        # A warning while the guest booted comes from the CPU the host
        # gives it (the same before any move), and is noted; one after the
        # checker started is a guest error.
        before, after = guest.warnings()
        for w in before:
            if w not in tally["boot_warnings"]:
                tally["boot_warnings"].append(w)
        for w in after:
            fail("guest_errors", f"{side} guest kernel: {w}")

    save()
    t0 = time.time()
    guest = Guest("0", args)
    first = wait_lines(guest, 0, 2, args.boot_timeout)
    if len(first) < 2:
        fail("hangs", f"the guest printed no checker lines within {args.boot_timeout} s of starting")
    else:
        print(f"selfcheck: guest up in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    last_seq = int(first[-1].group(1)) if first else 0
    port = 47000
    for move in range(1, args.moves + 1 if first else 1):
        port += 1
        dest = Guest(str(move % 2), args, incoming=f"tcp:127.0.0.1:{port}")
        start = time.time()
        # QEMU's best convergence for a guest that writes without pause:
        # auto-converge throttles it until the rounds catch up. The link is
        # loopback inside the host; QEMU's own cap should not decide.
        guest.qmp.cmd("migrate-set-capabilities",
                      capabilities=[{"capability": "auto-converge", "state": True}])
        guest.qmp.cmd("migrate-set-parameters", **{"max-bandwidth": 1 << 30})
        guest.qmp.cmd("migrate", uri=f"tcp:127.0.0.1:{port}")
        status = {}
        while time.time() - start < args.move_timeout:
            status = guest.qmp.cmd("query-migrate")
            if status.get("status") in ("completed", "failed", "cancelled"):
                break
            time.sleep(0.5)
        took = time.time() - start
        if status.get("status") != "completed":
            what = status.get("error-desc", status.get("status", "no status"))
            fail("hangs" if status.get("status") not in ("failed", "cancelled") else "guest_errors",
                 f"move {move}: migration {what} after {took:.0f} s")
            dest.stop()
            break
        check_warnings(guest, f"move {move}: the source's")
        guest.stop()
        guest = dest
        tally["move_s"].append(round(took, 1))
        tally["downtime_ms"].append(status.get("downtime"))
        after = wait_lines(guest, last_seq, 3, args.move_timeout)
        if len(after) < 3:
            fail("hangs", f"move {move}: the guest printed {len(after)} lines in {args.move_timeout} s after the move")
            break
        bad = [m.group(0) for m in after if int(m.group(4)) != 0]
        if bad:
            fail("guest_errors", f"move {move}: pattern mismatches: {bad[-1]}")
        last_seq = int(after[-1].group(1))
        tally["moves_completed"] += 1
        print(f"selfcheck: move {move} completed in {took:.1f} s, downtime {status.get('downtime')} ms, "
              f"guest at line {last_seq}", file=sys.stderr, flush=True)
        save()
    check_warnings(guest, "the last side's")
    guest.stop()
    save()
    if args.json:
        print(json.dumps(tally))
    ok = tally["moves_completed"] == args.moves and tally["guest_errors"] == 0 and tally["hangs"] == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
