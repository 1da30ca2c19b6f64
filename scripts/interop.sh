#!/usr/bin/env bash
# Old and new ferry releases migrating to each other, both ways, on both
# backends: the proof behind docs/compatibility.md.
#
#   scripts/interop.sh [OLD_COMMIT]      (default 76c7980, wire 5)
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
# The first run builds both binaries: about 15 minutes on a 2-core host.
# Exits non-zero if any move fails.
set -euo pipefail

old=${1:-76c7980}
root=$(git -C "$(dirname "$0")" rev-parse --show-toplevel)
cd "$root"
old_tree=target/interop/$old
old_target=target/interop/target-$old

if [ ! -d "$old_tree" ]; then
    git worktree add --detach "$old_tree" "$old" >/dev/null
fi
echo "interop: building ferry at $old (release) ..." >&2
CARGO_TARGET_DIR=$old_target cargo build --quiet --release \
    --manifest-path "$old_tree/Cargo.toml" -p ferry
echo "interop: building this tree's ferry (release) ..." >&2
cargo build --quiet --release -p ferry
old_bin=$old_target/release/ferry
new_bin=target/release/ferry
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
exit $failed
