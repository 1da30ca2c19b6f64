#!/usr/bin/env python3
"""ferry's demos again and again inside one boot of the SVM host.

    scripts/svm-loop.py [--runs N] [--kinds 2vcpu,4vcpu,postcopy] [--json]
    scripts/svm-loop.py --kinds linux2,linux4,linux-postcopy,linux-local

Run by hand, not in CI (each demo takes 10-40 s at TCG speed). Outside the
host it boots one through scripts/svm-host.sh and runs itself there, so
every run below shares one boot:

  1. the host's control (scripts/svm-selfcheck.py: QEMU, a known-good VMM,
     migrating a Linux guest), before;
  2. --runs of each kind of `ferry demo --backend kvm --mem-per-vcpu 128M
     --json` (or, for the linux kinds, `minivmm demo --guest linux --json`:
     Debian's kernel with its checker), interleaved, each under --limit
     seconds: a run passes when it exits 0 and its last line says
     digest_match true and error null (a Linux guest's demo exits non-zero
     on any failed check of the guest's own);
  3. the control again, after.

So a failure of ferry's is told from the host's: the control shows the
host's own rate in the same boot. Each run's record goes to
target/svm-host/loop.jsonl as it ends (a host that crashes midway keeps
what was done); the last stdout line (--json) is the tally. The host's
configuration comes from scripts/svm-host.sh's knobs (SVM_HOST_SMP,
SVM_HOST_KVM_AMD_PARAMS, ...); the tally names its CPUs and paging.
"""

import argparse
import json
import os
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE = os.path.join(REPO, "target", "svm-host")
KINDS = {
    "2vcpu": ["--vcpus", "2"],
    "4vcpu": ["--vcpus", "4"],
    "postcopy": ["--vcpus", "2", "--mode", "postcopy"],
    "linux2": ["--vcpus", "2"],
    "linux4": ["--vcpus", "4"],
    "linux-postcopy": ["--vcpus", "2", "--mode", "postcopy"],
    "linux-local": ["--vcpus", "2", "--local"],
}


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=20, help="runs of each kind (default 20)")
    p.add_argument("--kinds", default="2vcpu,4vcpu,postcopy",
                   help="which demos, comma-separated: " + ", ".join(KINDS))
    p.add_argument("--limit", type=int, default=400, help="seconds a run may take (default 400)")
    p.add_argument("--selfcheck-moves", type=int, default=2,
                   help="the control's moves, before and after (default 2; 0: none)")
    p.add_argument("--selfcheck-vcpus", type=int, default=2)
    p.add_argument("--ferry", default="target/release/ferry")
    p.add_argument("--minivmm", default="target/release/minivmm")
    p.add_argument("--json", action="store_true")
    p.add_argument("--host-retries", type=int, default=3,
                   help="new boots after the host's own failures (default 3)")
    p.add_argument("--resume", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--host-failures", default="none", help=argparse.SUPPRESS)
    args = p.parse_args()
    for k in args.kinds.split(","):
        if k not in KINDS:
            p.error(f"unknown kind {k!r}: one of {', '.join(KINDS)}")
    return args


def selfcheck(args, when):
    if args.selfcheck_moves == 0:
        return None
    cmd = ["python3", os.path.join(REPO, "scripts", "svm-selfcheck.py"),
           "--kernel", os.environ["SVM_HOST_KERNEL"], "--initrd", os.environ["SVM_HOST_CHECKER_INITRD"],
           "--moves", str(args.selfcheck_moves), "--vcpus", str(args.selfcheck_vcpus), "--json"]
    say(f"the control ({when}): QEMU, {args.selfcheck_moves} moves")
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=1800).stdout
        tally = json.loads(out.strip().splitlines()[-1])
    except (subprocess.TimeoutExpired, IndexError, json.JSONDecodeError) as e:
        tally = {"moves": args.selfcheck_moves, "moves_completed": 0, "hangs": 1,
                 "errors": [f"the control gave no tally: {e}"]}
    say(f"the control ({when}): {tally.get('moves_completed')} of {tally.get('moves')} moves, "
        f"errors {tally.get('errors')}")
    return tally


def say(what):
    print(f"svm-loop: {what}", file=sys.stderr, flush=True)


def one_run(args, kind, index):
    linux = kind.startswith("linux")
    if linux:
        cmd = [args.minivmm, "demo", "--guest", "linux", "--json"] + KINDS[kind]
    else:
        cmd = [args.ferry, "demo", "--backend", "kvm", "--mem-per-vcpu", "128M", "--json"] + KINDS[kind]
    start = time.time()
    rec = {"kind": kind, "run": index}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.limit)
        rec["exit"] = p.returncode
        stdout, stderr = p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rec["exit"] = None
        rec["hang"] = True
        stdout = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        stderr = (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    rec["wall_s"] = round(time.time() - start, 1)
    last = {}
    for line in reversed(stdout.splitlines()):
        if line.startswith("{"):
            try:
                last = json.loads(line)
                break
            except json.JSONDecodeError:
                pass
    for key in ("backend", "guest", "digest_match", "error", "downtime_ms", "total_ms", "guest_pause_ms"):
        rec[key] = last.get(key)
    made_by = rec["guest"] == "linux" if linux else rec["backend"] == "ferry-kvm"
    rec["ok"] = (rec["exit"] == 0 and made_by and rec["digest_match"] is True
                 and rec["error"] is None)
    if not rec["ok"]:
        rec["stderr_tail"] = stderr.splitlines()[-12:]
    return rec


def inside(args):
    journal = os.path.join(STATE, "loop.jsonl")
    with open("/sys/module/kvm_amd/parameters/npt") as f:
        npt = f.read().strip()
    tally = {"config": {"outer_vcpus": os.cpu_count(), "kvm_amd_npt": npt}, "runs": {}, "failures": [],
             "host_failures": [] if args.host_failures == "none" else args.host_failures.split(",")}
    tally["control_before"] = selfcheck(args, "before")
    kinds = args.kinds.split(",")
    plan = [(i, kind) for i in range(1, args.runs + 1) for kind in kinds]
    # After a host failure the outer loop boots a new host and resumes here:
    # the journal holds the runs done in earlier boots.
    with open(journal, "a" if args.resume else "w") as j:
        for i, kind in plan[args.resume:]:
            rec = one_run(args, kind, i)
            j.write(json.dumps(rec) + "\n")
            j.flush()
            say(f"{kind} run {i}: {'ok' if rec['ok'] else 'FAILED'} (exit {rec['exit']}, "
                f"{rec['wall_s']} s, digest_match {rec['digest_match']}, error {rec['error']})")
    tally["control_after"] = selfcheck(args, "after")
    with open(journal) as j:
        records = [json.loads(line) for line in j if line.strip()]
    for rec in records:
        t = tally["runs"].setdefault(rec["kind"], {"runs": 0, "ok": 0, "hangs": 0, "total_ms": [],
                                                    "downtime_ms": [], "guest_pause_ms": []})
        t["runs"] += 1
        t["ok"] += rec["ok"]
        t["hangs"] += bool(rec.get("hang"))
        if rec["ok"]:
            t["total_ms"].append(round(rec["total_ms"]))
            t["downtime_ms"].append(round(rec["downtime_ms"], 1))
            if rec.get("guest_pause_ms") is not None:
                t["guest_pause_ms"].append(round(rec["guest_pause_ms"], 1))
        else:
            tally["failures"].append(rec)
    for kind, t in tally["runs"].items():
        ms = sorted(t["total_ms"]) or [0]
        dt = sorted(t["downtime_ms"]) or [0]
        say(f"{kind}: {t['ok']} of {t['runs']} ok, {t['hangs']} hangs; total {ms[0]}-{ms[-1]} ms, "
            f"downtime {dt[0]}-{dt[-1]} ms")
    say(f"the host's own failures (each then a new boot): {tally['host_failures'] or 'none'}")
    if args.json:
        print(json.dumps(tally))
    ok = all(t["ok"] == t["runs"] for t in tally["runs"].values())
    return 0 if ok else 1


def outside(args):
    """Boots the host and runs again inside it. After the host's own
    failure (125: it crashed, 126: it froze) it boots a new one and resumes
    after the runs the journal holds, at most --host-retries times; the
    run that was going is run again, counted as the host's failure, not
    ferry's. Any other status (124 for a hang) comes back."""
    journal = os.path.join(STATE, "loop.jsonl")
    os.makedirs(STATE, exist_ok=True)
    open(journal, "w").close()
    limit = (args.runs * len(args.kinds.split(",")) * args.limit) + 2 * 1800 + 600
    failures = []
    while True:
        with open(journal) as j:
            done = sum(1 for line in j if line.strip())
        cmd = ["bash", os.path.join(REPO, "scripts", "svm-host.sh"), "--timeout", str(limit),
               "python3", os.path.abspath(__file__)] + sys.argv[1:] + [
               "--resume", str(done), "--host-failures", ",".join(failures) or "none"]
        status = subprocess.call(cmd)
        if status in (125, 126) and len(failures) < args.host_retries:
            with open(journal) as j:
                done = sum(1 for line in j if line.strip())
            how = {125: "crashed", 126: "froze"}[status]
            failures.append(f"{how} after {done} runs")
            say(f"the SVM host {how}: a new boot resumes at run {done + 1}")
            continue
        return status


def main():
    args = parse()
    if os.environ.get("SVM_HOST") != "1":
        return outside(args)
    for kind in args.kinds.split(","):
        need = args.minivmm if kind.startswith("linux") else args.ferry
        if not os.path.exists(need):
            say(f"no {need}: build it first (cargo build --release)")
            return 2
    return inside(args)


if __name__ == "__main__":
    sys.exit(main())
