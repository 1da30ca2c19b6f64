#!/usr/bin/env bash
# Old and new ferry releases migrating to each other, both ways, on both
# backends: the proof behind docs/compatibility.md.
#
#   scripts/interop.sh [OLD_COMMIT] [MINIVMM_OLD_COMMIT]
#                      (defaults 76c7980: wire 5, local 1; and 02c9eb2)
#
# Builds ferry at OLD_COMMIT (a git worktree under target/interop/, with
# its own target directory, kept between runs) and this tree, in release.
# Then, for kvm and soft, and for two kinds of migration (plain precopy;
# postcopy over 2 connections with lz4), it migrates old -> new,
# new -> old and new -> new over loopback (`ferry receive` in one process, `ferry migrate` in
# another), and checks each move: the source and the destination both say
# completed with the digest matched, the destination ran the guest on
# without a mismatch, and each side's summary names the wire version
# actually spoken (an old binary's receive summary has no such field).
# Then, on kvm, a same-host upgrade (`--local`, memory handed over) old ->
# new, new -> old and new -> new, checked the same way against the
# same-host protocol's version (an old binary's summary names none).
#
# Last, on kvm, the same-host upgrade of a VMM that hands its own fds over:
# minivmm with its disks (`minivmm receive --local` in one process,
# `minivmm migrate --local` in another), old -> new, new -> old and
# new -> new. Each must complete with the digest matched on both ends, the
# block checks clean (no disk write lost or doubled, no bad read: minivmm's
# blk_requests_lost, blk_requests_doubled, blk_bad_reads), the consoles
# whole, the same-host version as expected (2 with the old side, 3 new with
# new), and the disks where the protocol puts them: a new destination
# adopts the handed fds (from the Offer of an old, version-2 source; from
# the Handover of a new one); an old destination is handed none by a new
# source and opens the disks by their paths.
#
# The old side of the minivmm case is MINIVMM_OLD_COMMIT, not OLD_COMMIT.
# 76c7980's minivmm has `--local` and moves with its disk, but only to and
# from itself. This tree's minivmm always gives its VM an in-kernel
# irqchip (02c9eb2), which 76c7980's cannot load: new -> old fails with
# "the source VM had an in-kernel irqchip, this VM has none". And old ->
# new completes, but this tree's VMM then reads the guest's counters where
# 52b5512's per-vCPU lanes put them, not where 76c7980's guest keeps them
# (it reports 0 console lines and 0 verified reads), and the old summary's
# disk journal is not per vCPU: the block checks cannot be made. 02c9eb2,
# the irqchip's own commit, is the oldest minivmm that moves with its disks
# both ways (checked; 746a3e2, the last commit before same-host version 3,
# passes too). Every minivmm since 62dd1af and faad305 speaks same-host
# version 2 with the handed fds in the Offer, so the protocol pair here is
# version 2 against 3. What 76c7980 exposed, a version-1 destination that
# refuses a source's extra fds, is proven in process by
# crates/ferry-engine/tests/local.rs.
#
# The first run builds the binaries: about 15 minutes each on a 2-core
# host. Exits non-zero if any move fails.
set -euo pipefail

old=${1:-76c7980}
mini_old=${2:-02c9eb2}
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$root"
target=${CARGO_TARGET_DIR:-target}
old_tree=target/interop/$old
old_target=target/interop/target-$old
mini_tree=target/interop/$mini_old
old_mini=target/interop/bin-$mini_old/minivmm

for at in "$old:$old_tree" "$mini_old:$mini_tree"; do
    if [ ! -d "${at#*:}" ]; then
        git worktree add --detach "${at#*:}" "${at%%:*}" >/dev/null
    fi
done
echo "interop: building ferry at $old (release) ..." >&2
CARGO_TARGET_DIR=$old_target cargo build --quiet --release \
    --manifest-path "$old_tree/Cargo.toml" -p ferry
if [ ! -x "$old_mini" ]; then
    # In this tree's target directory, whose dependencies it shares; its
    # binary is moved out before this tree's is built in its place.
    echo "interop: building minivmm at $mini_old (release) ..." >&2
    CARGO_TARGET_DIR=$target cargo build --quiet --release \
        --manifest-path "$mini_tree/Cargo.toml" -p minivmm
    mkdir -p "$(dirname "$old_mini")"
    mv "$target/release/minivmm" "$old_mini"
fi
echo "interop: building this tree's ferry and minivmm (release) ..." >&2
cargo build --quiet --release -p ferry -p minivmm
old_bin=$old_target/release/ferry
new_bin=$target/release/ferry
new_mini=$target/release/minivmm
[ -x "$new_mini" ] || { echo "interop: no $new_mini after the build" >&2; exit 1; }
new_max=$("$new_bin" --version | sed -n 's/.*wire \([0-9]*\)-\([0-9]*\).*/\2/p')

kvm_ok=yes
[ -r /dev/kvm ] && [ -w /dev/kvm ] || kvm_ok=no

failed=0
# Waits (10 s at most) until a `ferry receive` says where it listens.
wait_listening() {
    for _ in $(seq 100); do
        grep -q '^listening on ' "$1" && return
        sleep 0.1
    done
}
printf '| backend | migration | source | destination | status (src/dst) | digest | guest after | wire (src/dst) |\n'
printf '|---|---|---|---|---|---|---|---|\n'
for backend in kvm soft; do
  for kind in precopy postcopy; do
    extra=()
    [ "$kind" = postcopy ] && extra=(--mode postcopy --connections 2 --compress lz4)
    if [ "$backend" = kvm ] && [ "$kvm_ok" = no ]; then
        echo "SKIP interop on kvm: /dev/kvm is not available on this machine" >&2
        continue
    fi
    for pair in "old new" "new old" "new new"; do
        set -- $pair
        src_bin=$([ "$1" = old ] && echo "$old_bin" || echo "$new_bin")
        dst_bin=$([ "$2" = old ] && echo "$old_bin" || echo "$new_bin")
        want=$([ "$pair" = "new new" ] && echo "$new_max" || echo 5)
        out=$(mktemp -d)
        "$dst_bin" receive --listen 127.0.0.1:0 --backend "$backend" --json \
            --exit-after-report --run-after 0.5 >"$out/dst.json" 2>"$out/dst.err" &
        dst_pid=$!
        wait_listening "$out/dst.json"
        addr=$(sed -n 's/^listening on //p' "$out/dst.json")
        "$src_bin" migrate --to "$addr" --backend "$backend" --json \
            --mem-per-vcpu 64M --rate-limit 32 --warmup 0.5 "${extra[@]}" \
            >"$out/src.json" 2>"$out/src.err" || true
        wait "$dst_pid" || true
        src=$(tail -n 1 "$out/src.json")
        dst=$(tail -n 1 "$out/dst.json")
        row=$(python3 - "$src" "$dst" "$want" "$kind" <<'EOF'
import json, sys
try:
    s, d = json.loads(sys.argv[1]), json.loads(sys.argv[2])
except ValueError as e:
    print(f"| no summary ({e}) | | | |"); sys.exit(1)
want, kind = int(sys.argv[3]), sys.argv[4]
ok = s.get("status") == d.get("status") == "completed"
ok &= s.get("digest_match") is True and d.get("digest_match") is True
after = d.get("mismatches_after")
ok &= after in (0, None) and (d.get("passes_after") or 0) >= 1
sw, dw = s.get("wire_version"), d.get("wire_version", "-")
ok &= sw == want and dw in (want, "-")
mode = s.get("mode")
ok &= (mode == "postcopy") == (kind == "postcopy") and (d.get("postcopy") is not None) == (kind == "postcopy")
print(f"| {s.get('status')}/{d.get('status')}, {mode} | {s.get('digest_match')}/{d.get('digest_match')} "
      f"| {d.get('passes_after')} passes, {after} mismatches | {sw}/{dw} |")
sys.exit(0 if ok else 1)
EOF
        ) && verdict=ok || { verdict=FAILED; failed=1; }
        printf '| %s | %s | %s | %s %s %s\n' "$backend" "$kind" "$1" "$2" "$row" "$verdict"
        if [ "$verdict" = FAILED ]; then
            echo "--- source stderr" >&2; tail -n 5 "$out/src.err" >&2
            echo "--- destination stderr" >&2; tail -n 5 "$out/dst.err" >&2
        fi
        rm -rf "$out"
    done
  done
done
# Same-host upgrade: the case it exists for is exactly two releases.
local_max=$("$new_bin" --version | sed -n 's/.*local \([0-9]*\)-\([0-9]*\).*/\2/p')
if [ "$kvm_ok" = yes ]; then
    for pair in "old new" "new old" "new new"; do
        set -- $pair
        src_bin=$([ "$1" = old ] && echo "$old_bin" || echo "$new_bin")
        dst_bin=$([ "$2" = old ] && echo "$old_bin" || echo "$new_bin")
        want=$([ "$pair" = "new new" ] && echo "$local_max" || echo 1)
        out=$(mktemp -d)
        sock="$out/local.sock"
        "$dst_bin" receive --local "$sock" --backend kvm --json --run-after 0.3 --exit-after-report \
            >"$out/dst.json" 2>"$out/dst.err" &
        dst_pid=$!
        wait_listening "$out/dst.json"
        "$src_bin" migrate --local "$sock" --backend kvm --backing memfd --vcpus 1 \
            --mem-per-vcpu 256M --rate-limit 32 --warmup 0.5 --json \
            >"$out/src.json" 2>"$out/src.err" || true
        wait "$dst_pid" || true
        src=$(tail -n 1 "$out/src.json")
        dst=$(tail -n 1 "$out/dst.json")
        row=$(python3 - "$src" "$dst" "$want" <<'EOF'
import json, sys
try:
    s, d = json.loads(sys.argv[1]), json.loads(sys.argv[2])
except ValueError as e:
    print(f"| no summary ({e}) | | | |"); sys.exit(1)
want = int(sys.argv[3])
ok = s.get("status") == d.get("status") == "completed"
ok &= s.get("digest_match") is True and d.get("digest_match") is True
ok &= all((x.get("guest") or {}).get("errors", 0) == 0 for x in (s, d))
# An old binary's summary names no version: it speaks 1 only.
sv, dv = s.get("version", "-"), d.get("version", "-")
ok &= all(v == want or (v == "-" and want == 1) for v in (sv, dv))
print(f"| {s.get('status')}/{d.get('status')}, local | {s.get('digest_match')}/{d.get('digest_match')} "
      f"| downtime {s.get('downtime_ms', 0):.2f} ms | local {sv}/{dv} |")
sys.exit(0 if ok else 1)
EOF
        ) && verdict=ok || { verdict=FAILED; failed=1; }
        printf '| %s | %s | %s | %s %s %s\n' kvm local "$1" "$2" "$row" "$verdict"
        if [ "$verdict" = FAILED ]; then
            echo "--- source stderr" >&2; tail -n 5 "$out/src.err" >&2
            echo "--- destination stderr" >&2; tail -n 5 "$out/dst.err" >&2
        fi
        rm -rf "$out"
    done
fi
# minivmm, a VMM that hands its disks over: the rollback that same-host
# version 3 exists for.
if [ "$kvm_ok" = yes ]; then
    for pair in "old new" "new old" "new new"; do
        set -- $pair
        src_bin=$([ "$1" = old ] && echo "$old_mini" || echo "$new_mini")
        dst_bin=$([ "$2" = old ] && echo "$old_mini" || echo "$new_mini")
        want=$([ "$pair" = "new new" ] && echo "$local_max" || echo 2)
        # A new destination adopts the handed fds; an old one is handed
        # none by a new source, and opens the disks by their paths.
        disks=$([ "$2" = new ] && echo adopted || echo "by path")
        out=$(mktemp -d)
        "$dst_bin" receive --local "$out/local.sock" --json --console "$out/dst.console" \
            --run-after-ms 500 >"$out/dst.json" 2>"$out/dst.err" &
        dst_pid=$!
        for _ in $(seq 100); do
            grep -q '"listening"' "$out/dst.json" && break
            sleep 0.1
        done
        "$src_bin" migrate --local "$out/local.sock" --backing memfd --vcpus 2 \
            --data-mib 16 --run-before-ms 500 --disk "$out/disk.img" \
            --console "$out/src.console" --json >"$out/src.json" 2>"$out/src.err" || true
        wait "$dst_pid" || true
        row=$(python3 - "$out" "$want" "$disks" <<'EOF'
import json, sys
out, want, disks_want = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def last_json(path):
    for line in reversed(open(path).read().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            pass
    return None

s, d = last_json(f"{out}/src.json"), last_json(f"{out}/dst.json")
if not s or not d or d.get("role") != "destination":
    print("| no summary | | | | |"); sys.exit(1)
ok = s.get("status") == d.get("status") == "completed"
ok &= s.get("digest_match") is True and d.get("digest_match") is True
sv = (s.get("summary") or {}).get("version", "-")
dv = (d.get("summary") or {}).get("version", "-")
ok &= sv == dv == want
vcpus = s.get("vcpus") or 1
# The disk journals, vCPU by vCPU, as minivmm's checks::disk reads them:
# every write served once, none missing between the first and the last.
writes = lost = doubled = 0
for i in range(vcpus):
    runs = [r for j in (s, d) for r in ((j.get("disk_runs") or [])[i:i + 1] or [[]])[0]]
    journal = sorted(n for a, b in runs for n in range(a, b + 1))
    writes += len(journal)
    for x, y in zip(journal, journal[1:]):
        doubled += y == x
        lost += max(y - x - 1, 0)
bad_reads = sum((j.get("guest") or {}).get("bad_reads", 0) for j in (s, d))
ok &= writes > 0 and lost == doubled == bad_reads == 0
# The consoles, vCPU by vCPU, as checks::console reads them: numbered,
# checksummed lines, each once and in order across both ends.
lines = lines_lost = lines_doubled = lines_bad = 0
for i in range(vcpus):
    text = ""
    for side in ("src", "dst"):
        try:
            text += open(f"{out}/{side}.console" + (f".{i}" if i else "")).read()
        except OSError:
            pass
    last = None
    for line in text[: text.rfind("\n") + 1].splitlines():
        parts = line[1:].split(" ")
        try:
            seq, check = (int(p, 16) for p in parts)
            good = line[0] == "L" and all(len(p) == 16 for p in parts)
            good &= check == (seq * 0x9E37_79B9_7F4A_7C15) % 2**64
        except ValueError:
            good = False
        if not good:
            lines_bad += 1
            continue
        lines += 1
        if last is not None and seq == last:
            lines_doubled += 1
        elif last is not None and seq < last:
            lines_bad += 1
        elif last is not None:
            lines_lost += seq - last - 1
        last = seq if last is None else max(last, seq)
ok &= lines > 0 and lines_lost == lines_doubled == lines_bad == 0
by_path = "opening the disks by their paths" in open(f"{out}/dst.err").read()
disks = "by path" if by_path else "adopted"
ok &= disks == disks_want
print(f"| {s.get('status')}/{d.get('status')}, local | {s.get('digest_match')}/{d.get('digest_match')} "
      f"| blk {writes} writes, {lost} lost, {doubled} doubled, {bad_reads} bad reads; "
      f"console {lines} lines, {lines_lost} lost, {lines_doubled} doubled, {lines_bad} bad; disks {disks} | local {sv}/{dv} |")
sys.exit(0 if ok else 1)
EOF
        ) && verdict=ok || { verdict=FAILED; failed=1; }
        printf '| %s | %s | %s | %s %s %s\n' minivmm "local, disks" "$1" "$2" "$row" "$verdict"
        if [ "$verdict" = FAILED ]; then
            echo "--- source stderr" >&2; tail -n 5 "$out/src.err" >&2
            echo "--- destination stderr" >&2; tail -n 5 "$out/dst.err" >&2
        fi
        rm -rf "$out"
    done
fi
exit $failed
