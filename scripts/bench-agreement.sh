#!/usr/bin/env bash
# `stripelog bench mix` against fio on the same targets, in one run, so that the
# benchmark's figures can be trusted (issue 5: within 15 % of fio's):
#   - a file on the local disk (O_DIRECT, io_uring on both sides): 4 KiB random write
#     and random read at queue depth 32, 1 MiB sequential write at queue depth 4;
#   - `nbdkit memory` over a Unix socket: 4 KiB random write at queue depth 32 (fio's
#     nbd engine, libnbd, against our own NBD client);
#   - the headroom: 4 KiB random writes on a file in /dev/shm, where the storage costs
#     almost nothing, so the figure is the tool's own ceiling.
# Each pair runs ROUNDS times (default 4), the tools taking turns and alternating who goes
# first; medians are printed.
# Usage: [ROUNDS=N] scripts/bench-agreement.sh [DIRECTORY] [SECONDS_PER_RUN]
set -euo pipefail
directory=${1:-stripelog-bench-agreement}
seconds=${2:-10}
rounds=${ROUNDS:-4}
stripelog=${STRIPELOG:-./target/release/stripelog}
for tool in fio nbdkit python3; do
  command -v "$tool" >/dev/null || { echo "bench-agreement: $tool is not installed (scripts/install-deps.sh)" >&2; exit 1; }
done
[ -x "$stripelog" ] || { echo "bench-agreement: build first: cargo build --release" >&2; exit 1; }

mkdir -p "$directory"
directory=$(cd "$directory" && pwd)
file="$directory/agreement-target"
socket="$directory/nbdkit.sock"
shm_file="/dev/shm/stripelog-agreement-$$"
rm -f "$file" "$socket"
nbdkit --foreground --unix "$socket" memory 4G 2>/dev/null &
nbdkit_pid=$!
cleanup() {
  kill "$nbdkit_pid" 2>/dev/null || true
  wait "$nbdkit_pid" 2>/dev/null || true
  rm -f "$file" "$shm_file"
}
trap cleanup EXIT
for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.1; done
# Written once in full, so that reads hit data on both sides.
fio --name=fill --filename="$file" --size=4g --rw=write --bs=1m --direct=1 --ioengine=io_uring --iodepth=4 >/dev/null
truncate -s 1g "$shm_file"
nbd_uri="nbd+unix:///?socket=$socket"

fio_iops() { # extra fio arguments...
  fio --name=cell --time_based --runtime="$seconds" --output-format=json "$@" 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round(j["write"]["iops"]+j["read"]["iops"]))'
}
ours_iops() { # target, extra stripelog arguments...
  local target=$1 report="$directory/mix.json"
  shift
  "$stripelog" bench mix "$target" --quiet --force --duration "${seconds}s" --json "$report" "$@" >/dev/null
  python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(round(r["read"]["iops"]+r["write"]["iops"]))' "$report"
}

echo "| workload | target | fio IOPS | stripelog bench IOPS | bench / fio (range over $rounds rounds) |"
echo "|---|---|---:|---:|---:|"
pair() { # label, target label, fio arguments (one string), stripelog target, stripelog arguments (one string)
  local theirs=() ours=()
  for round in $(seq "$rounds"); do
    # Who goes first alternates: a disk still writing back the previous run's data
    # slows whoever comes next.
    if [ $((round % 2)) -eq 1 ]; then
      # shellcheck disable=SC2086
      theirs+=("$(fio_iops $3)")
      # shellcheck disable=SC2086
      ours+=("$(ours_iops "$4" $5)")
    else
      # shellcheck disable=SC2086
      ours+=("$(ours_iops "$4" $5)")
      # shellcheck disable=SC2086
      theirs+=("$(fio_iops $3)")
    fi
  done
  python3 - "$1" "$2" "${theirs[*]}" "${ours[*]}" <<'PYTHON'
import statistics, sys
label, target = sys.argv[1:3]
theirs = [int(value) for value in sys.argv[3].split()]
ours = [int(value) for value in sys.argv[4].split()]
ratios = [a / b for a, b in zip(ours, theirs)]
print(f"| {label} | {target} | {statistics.median(theirs):.0f} | {statistics.median(ours):.0f} "
      f"| {statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f}) |")
PYTHON
}
file_fio="--filename=$file --size=4g --direct=1 --ioengine=io_uring"
pair "4 KiB random write, depth 32" "file (disk)" "$file_fio --rw=randwrite --bs=4k --iodepth=32" \
  "$file" "--block-size 4KiB --queue-depth 32"
pair "4 KiB random read, depth 32" "file (disk)" "$file_fio --rw=randread --bs=4k --iodepth=32" \
  "$file" "--read-percent 100 --block-size 4KiB --queue-depth 32"
pair "1 MiB sequential write, depth 4" "file (disk)" "$file_fio --rw=write --bs=1m --iodepth=4" \
  "$file" "--pattern sequential --block-size 1MiB --queue-depth 4"
pair "4 KiB random write, depth 32" "nbdkit memory" "--ioengine=nbd --uri=$nbd_uri --size=1g --rw=randwrite --bs=4k --iodepth=32" \
  "$nbd_uri" "--region 1GiB --block-size 4KiB --queue-depth 32"
pair "4 KiB random write, depth 32, 2 threads" "file in /dev/shm" "--filename=$shm_file --size=1g --ioengine=io_uring --rw=randwrite --bs=4k --iodepth=32 --numjobs=2 --group_reporting" \
  "$shm_file" "--block-size 4KiB --queue-depth 32 --threads 2"
