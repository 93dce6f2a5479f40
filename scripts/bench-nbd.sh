#!/usr/bin/env bash
# fio's nbd engine against `stripelog serve` (RAID-5 on 5 file members on the local
# disk) and against `nbdkit memory` (a server that stores nothing), in one run:
# 4 KiB random write and random read at iodepth 1 and 32, 1 and 2 jobs. Prints a
# markdown table with the ratio stripelog / nbdkit. The machine is noisy, so each cell
# runs ROUNDS times (default 3), the two servers taking turns; the table gives the
# median IOPS of each and the median of the per-round ratios, with their range. Usage:
#   [ROUNDS=N] scripts/bench-nbd.sh [DIRECTORY] [SECONDS_PER_CELL]
set -euo pipefail
directory=${1:-stripelog-bench-nbd}
seconds=${2:-10}
rounds=${ROUNDS:-3}
region=1g            # per job; jobs use separate regions (offset_increment)
stripelog=${STRIPELOG:-./target/release/stripelog}
for tool in fio nbdkit python3; do
  command -v "$tool" >/dev/null || { echo "bench-nbd: $tool is not installed (scripts/install-deps.sh)" >&2; exit 1; }
done
[ -x "$stripelog" ] || { echo "bench-nbd: build first: cargo build --release" >&2; exit 1; }

mkdir -p "$directory"
directory=$(cd "$directory" && pwd)
members=("$directory"/member-{0,1,2,3,4})
rm -f "${members[@]}" "$directory/stripelog.sock" "$directory/nbdkit.sock"
"$stripelog" create --raid 5 --chunk 1MiB --spare 20% --member-size 4GiB "${members[@]}" >/dev/null
# The block cache holds the working set (2 jobs x 1 GiB), as nbdkit memory holds all.
cache=${CACHE:-3GiB}
"$stripelog" serve --cache "$cache" --socket "$directory/stripelog.sock" "${members[@]}" 2>"$directory/serve.log" &
serve_pid=$!
nbdkit --foreground --unix "$directory/nbdkit.sock" memory 4G 2>"$directory/nbdkit.log" &
nbdkit_pid=$!
cleanup() {
  kill -TERM "$serve_pid" "$nbdkit_pid" 2>/dev/null || true
  wait "$serve_pid" "$nbdkit_pid" 2>/dev/null || true
  rm -f "${members[@]}"
}
trap cleanup EXIT
for socket in stripelog.sock nbdkit.sock; do
  for _ in $(seq 100); do [ -S "$directory/$socket" ] && break; sleep 0.1; done
done

uri() { echo "nbd+unix:///$1?socket=$directory/$2"; }
stripelog_uri=$(uri stripelog stripelog.sock)
nbdkit_uri=$(uri "" nbdkit.sock)

# One fio cell; prints its IOPS.
cell() { # uri rw iodepth jobs
  fio --name=cell --ioengine=nbd --uri="$1" --rw="$2" --bs=4k --iodepth="$3" --numjobs="$4" \
      --size="$region" --offset_increment="$region" --time_based --runtime="$seconds" \
      --group_reporting --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round(j["write"]["iops"]+j["read"]["iops"]))'
}

# Reads must hit written data on both servers: fill each job's region first.
for target in "$stripelog_uri" "$nbdkit_uri"; do
  fio --name=fill --ioengine=nbd --uri="$target" --rw=write --bs=1m --iodepth=8 --numjobs=2 \
      --size="$region" --offset_increment="$region" >/dev/null 2>&1
done

echo "| workload | iodepth | jobs | stripelog IOPS | nbdkit memory IOPS | stripelog / nbdkit (range over $rounds rounds) |"
echo "|---|---:|---:|---:|---:|---:|"
for rw in randwrite randread; do
  for depth in 1 32; do
    for jobs in 1 2; do
      ours=() theirs=()
      for _ in $(seq "$rounds"); do
        ours+=("$(cell "$stripelog_uri" "$rw" "$depth" "$jobs")")
        theirs+=("$(cell "$nbdkit_uri" "$rw" "$depth" "$jobs")")
      done
      python3 - "$rw" "$depth" "$jobs" "${ours[*]}" "${theirs[*]}" <<'PYTHON'
import statistics, sys
rw, depth, jobs = sys.argv[1:4]
ours = [int(value) for value in sys.argv[4].split()]
theirs = [int(value) for value in sys.argv[5].split()]
ratios = [a / b for a, b in zip(ours, theirs)]
print(f"| 4 KiB {rw} | {depth} | {jobs} | {statistics.median(ours):.0f} | {statistics.median(theirs):.0f} "
      f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
PYTHON
    done
  done
done
