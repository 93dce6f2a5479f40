#!/usr/bin/env bash
# The benchmark tool's side-by-side runs for BENCHMARKS.md (issue 5): stripelog RAID-5 over
# 5 file members against the raw member files and `nbdkit memory`.
#   1. `stripelog bench compare`: 4 KiB random write and read at queue depth 32 on the five
#      raw members at once, stripelog on them in process and over NBD, and nbdkit memory.
#   2. `stripelog bench grid` (the seeds' table) on one raw member file, on stripelog
#      (a fresh volume, in process) and on nbdkit memory.
# Usage: scripts/bench-compare.sh [DIRECTORY] [SECONDS_PER_COMPARE_CELL] [SECONDS_PER_GRID_CELL]
# DIRECTORY (default stripelog-bench-compare) gets 5 member files of MEMBER_SIZE (2GiB).
set -euo pipefail
directory=${1:-stripelog-bench-compare}
compare_seconds=${2:-10}
grid_seconds=${3:-2}
member_size=${MEMBER_SIZE:-2GiB}
grid_threads=${GRID_THREADS:-1,10,40}
stripelog=${STRIPELOG:-./target/release/stripelog}
command -v nbdkit >/dev/null || { echo "bench-compare: nbdkit is not installed (scripts/install-deps.sh)" >&2; exit 1; }
[ -x "$stripelog" ] || { echo "bench-compare: build first: cargo build --release" >&2; exit 1; }
mkdir -p "$directory"
directory=$(cd "$directory" && pwd)
socket="$directory/nbdkit.sock"
members=()
for index in 0 1 2 3 4; do members+=("$directory/member$index"); done
rm -f "$socket" "${members[@]}"
nbdkit --foreground --unix "$socket" memory 8G 2>/dev/null &
nbdkit_pid=$!
cleanup() {
  kill "$nbdkit_pid" 2>/dev/null || true
  wait "$nbdkit_pid" 2>/dev/null || true
  rm -f "${members[@]}"
}
trap cleanup EXIT
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.1; done
peer="nbd+unix:///?socket=$socket"
list=$(IFS=,; echo "${members[*]}")

echo "## compare"
"$stripelog" bench compare --quiet --members "$list" --member-size "$member_size" --peer "$peer" \
  --duration "${compare_seconds}s" --json "$directory/compare.json" 2>/dev/null

grid() { # LABEL TARGET [FLAGS...]
  local label=$1 target=$2
  shift 2
  echo
  echo "## grid: $label"
  "$stripelog" bench grid --quiet "$target" --threads "$grid_threads" --duration "${grid_seconds}s" \
    --json "$directory/grid-$label.json" "$@" 2>/dev/null
}
grid raw-member "${members[0]}" --force --region 1GiB
"$stripelog" create --raid 5 --chunk 1MiB --spare 27% "${members[@]}" >/dev/null
grid stripelog "engine:$list" --force --region 4GiB
grid nbdkit-memory "$peer" --region 4GiB
