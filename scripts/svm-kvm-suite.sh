#!/usr/bin/env bash
# Every test binary that runs guests on /dev/kvm, inside one boot of the SVM
# host (scripts/svm-host.sh), one after another: ferry-kvm's,
# ferry-kvm-memstress's, minivmm's (with and without vhost), and the CLI's
# kvm tests. By hand, not in CI: at TCG speed it takes far longer than
# scripts/svm-ci.sh, the subset the test command runs.
#
#   bash scripts/svm-kvm-suite.sh            build (debug), then run inside
#   bash scripts/svm-kvm-suite.sh local vhost    only the binaries so named
#
# Prints one line per binary (passed, failed, or timed out, with its time)
# and a JSON tally last; target/svm-host/kvm-suite.log keeps each binary's
# output. Exits non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
list=target/svm-host/kvm-suite.list
log=target/svm-host/kvm-suite.log

if [ "${SVM_HOST:-}" != 1 ]; then
    mkdir -p target/svm-host
    # The test binaries cargo builds for these targets, by name (two
    # calls: a --test filter would apply to every package named).
    {
        cargo test --no-run --message-format=json -p ferry-kvm -p ferry-kvm-memstress -p minivmm
        cargo test --no-run --message-format=json -p ferry \
            --test migration --test postcopy --test local --test converge --test cpu_check
    } 2>/dev/null | python3 -c '
import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["profile"]["test"]:
        print(m["target"]["name"], m["executable"])
' | sort -u >"$list"
    [ -s "$list" ] || { echo "svm-kvm-suite: no test binaries built" >&2; exit 2; }
    exec bash scripts/svm-host.sh --timeout 14400 bash "$0" "$@"
fi

# Binaries named on the command line, or all of them.
selected() {
    [ $# -eq 1 ] && return 0
    local want
    for want in "${@:2}"; do [ "$want" = "$1" ] && return 0; done
    return 1
}

: >"$log"
passed=0 failed=0
started=$(date +%s)
while read -r name exe; do
    selected "$name" "$@" || continue
    t0=$(date +%s)
    echo "=== $name ($exe)" >>"$log"
    timeout 1800 "$exe" >>"$log" 2>&1
    status=$?
    took=$(($(date +%s) - t0))
    summary=$(grep -E '^test result:' "$log" | tail -1)
    case $status in
        0) passed=$((passed + 1)); echo "svm-kvm-suite: $name: passed in $took s ($summary)" ;;
        124) failed=$((failed + 1)); echo "svm-kvm-suite: $name: TIMED OUT after $took s" ;;
        *) failed=$((failed + 1)); echo "svm-kvm-suite: $name: FAILED (exit $status) in $took s ($summary)" ;;
    esac
done <"$list"
echo "{\"binaries_passed\": $passed, \"binaries_failed\": $failed, \"seconds\": $(($(date +%s) - started))}"
[ "$failed" -eq 0 ]
