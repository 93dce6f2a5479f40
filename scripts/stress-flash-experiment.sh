#!/usr/bin/env bash
# The flash experiment's parity test (tests/flash_experiments.rs) run in pairs beside a
# busy-looping shell, RUNS pairs (default 30): the load that showed a writer getting a
# spurious ENOSPC, with segments the cleaner thread's rounds had emptied since the
# writer's own flush and checkpoint (about one run in thirty before the fix; none in 80
# runs after it). Prints the failures.
#   RUNS=30 scripts/stress-flash-experiment.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test -p stripelog-bench --test flash_experiments --no-run 2>/dev/null
binary=$(ls -t target/debug/deps/flash_experiments-* | grep -v '\.d$' | head -1)
cd crates/bench
timeout 1800 sh -c 'while :; do :; done' &
hog=$!
trap 'kill $hog 2>/dev/null || true' EXIT
failures=0
output=$(mktemp -d)
for run in $(seq 1 "${RUNS:-30}"); do
  "../../$binary" parity_raid >"$output/a" 2>&1 & first=$!
  second=0; "../../$binary" parity_raid >"$output/b" 2>&1 || second=$?
  first_status=0; wait "$first" || first_status=$?
  for status in $first_status $second; do
    if [ "$status" != 0 ]; then
      failures=$((failures + 1))
      grep -h -m1 -A1 panicked "$output/a" "$output/b" || true
    fi
  done
done
rm -rf "$output"
echo "failures: $failures of $(( ${RUNS:-30} * 2 )) runs"
