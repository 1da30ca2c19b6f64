#!/usr/bin/env bash
# Builds the fuzz targets and runs each for SECONDS (default 60), starting
# from the seeds (fuzz/seeds/TARGET, taken from real migrations). A crash,
# a panic, a leak or an out-of-memory fails the run, with the input kept in
# fuzz/artifacts/TARGET. Needs nightly Rust and cargo-fuzz; scripts/setup.sh
# installs cargo-fuzz where it is missing.
#
#   bash fuzz/run.sh            60 s per target (the test command's run)
#   bash fuzz/run.sh 3600       an hour per target
set -uo pipefail
cd "$(dirname "$0")"
secs="${1:-60}"
targets=(frame header page_batch control sections)

export PATH="$HOME/.cargo/bin:$PATH"
if ! cargo +nightly --version >/dev/null 2>&1 || ! cargo +nightly fuzz --version >/dev/null 2>&1; then
    # A SKIP only where the set-up recorded that this machine cannot have
    # them; anywhere else it installs them, so their absence is a failure.
    why=$(grep -E '^(nightly|cargo-fuzz): ' ../target/setup/missing 2>/dev/null | head -1)
    if [ -n "$why" ]; then
        echo "fuzz: SKIP: $why"
        exit 0
    fi
    echo "fuzz: nightly Rust or cargo-fuzz is missing: run bash scripts/setup.sh (the README's test command does)" >&2
    exit 1
fi
cargo +nightly fuzz build -O || { echo "fuzz: 0 passed, ${#targets[@]} failed (build)"; exit 1; }

passed=0
failed=0
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
for t in "${targets[@]}"; do
    mkdir -p "$work/$t"
    log="$work/$t.log"
    # The first corpus directory takes what the run finds; the seeds stay
    # as committed. -rss_limit_mb: a decoder must not allocate what a
    # frame's size limit does not allow.
    if cargo +nightly fuzz run -O "$t" "$work/$t" "seeds/$t" -- \
        -max_total_time="$secs" -rss_limit_mb=2048 -print_final_stats=1 >"$log" 2>&1; then
        runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$')
        cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
        echo "fuzz: $t: ${runs:-?} executions in ${secs} s, ${cov:-cov: ?}, no crash"
        passed=$((passed + 1))
    else
        echo "fuzz: $t: FAILED; the input is under fuzz/artifacts/$t:"
        grep -E 'ERROR|panicked|SUMMARY|Test unit written' "$log" | head -20
        failed=$((failed + 1))
    fi
done
echo "fuzz: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
