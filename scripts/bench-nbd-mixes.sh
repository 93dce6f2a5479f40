#!/usr/bin/env bash
# Issue 54's NBD mixes: what one client's writes cost another client's reads, through
# `stripelog serve` with the block cache off, and the same disk work done by fio on raw
# files (the peer). As root, after `cargo build --release` and scripts/install-deps.sh.
# Usage:
#   [PHASES="reads32 reads8 writes512 mix512 mix512paced mix4k peer"] [SECONDS_PER_CELL=20] \
#     [PACED_IOPS=3200] [FORCE=1] scripts/bench-nbd-mixes.sh DIRECTORY
# DIRECTORY must be empty or new (FORCE=1 allows one that holds files: they are
# overwritten and removed). Each phase serves a fresh volume (RAID-5 on 5 × 2 GiB member
# files, 1 MiB chunks, 20 % spare) whose first 4 GiB fio writes first, then runs fio's nbd
# engine over 4 GiB (one connection per job):
#   reads32     4 KiB random reads at depth 32, alone
#   reads8      4 KiB random reads at depth 8, alone
#   writes512   512-byte random writes at depth 8, alone (bar: ≥ 0.5 × reads8)
#   mix512      512-byte writes at depth 8 beside 4 KiB reads at depth 32 (bar: the
#               reads' p99 ≤ 1.5 × reads32's)
#   mix512paced the same with the writer held to PACED_IOPS
#   mix4k       4 KiB writes at depth 8 beside 4 KiB reads at depth 32 (bar: the reads
#               keep ≥ 0.3 of reads32)
#   peer        fio on 5 raw 2 GiB files: 4 KiB random reads at depth 32 alone, then beside
#               the disk work of mix512's writer (at its measured rate: one 4 KiB read of
#               the old block per write, and the log's full-stripe writes, 5/4 × 4 KiB per
#               write, as 1 MiB sequential writes)
# Every phase also prints the write lock's hold times (status --json).
set -euo pipefail
directory=${1:?usage: scripts/bench-nbd-mixes.sh DIRECTORY}
phases=${PHASES:-reads32 reads8 writes512 mix512 mix512paced mix4k peer}
seconds=${SECONDS_PER_CELL:-20}
paced_iops=${PACED_IOPS:-3200}
stripelog=${STRIPELOG:-$PWD/target/release/stripelog}
[ -x "$stripelog" ] || { echo "bench-nbd-mixes: build first: cargo build --release" >&2; exit 1; }
for tool in fio python3; do
  command -v "$tool" >/dev/null || { echo "bench-nbd-mixes: $tool is missing (scripts/install-deps.sh)" >&2; exit 1; }
done
fio --enghelp=nbd >/dev/null 2>&1 || { echo "bench-nbd-mixes: this fio has no nbd engine (scripts/install-deps.sh)" >&2; exit 1; }
if [ "${FORCE:-0}" != 1 ] && [ -d "$directory" ] && [ -n "$(ls -A "$directory")" ]; then
  echo "bench-nbd-mixes: $directory is not empty (it holds $(ls -A "$directory" | head -3 | tr '\n' ' ')...); the phases write over and remove files there: choose an empty directory, or pass FORCE=1" >&2
  exit 1
fi
mkdir -p "$directory"
directory=$(cd "$directory" && pwd)
results=$directory/results
mkdir -p "$results"
server=
cleanup() {
  if [ -n "$server" ]; then kill -INT "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
  rm -f "$directory"/m? "$directory"/peer?
}
trap cleanup EXIT

socket=$directory/s.sock
uri="nbd+unix:///stripelog?socket=$socket"
common=(--ioengine=nbd "--uri=$uri" --size=4g --group_reporting=0 --output-format=json --randrepeat=0)
members=("$directory/m0" "$directory/m1" "$directory/m2" "$directory/m3" "$directory/m4")

phase() {
  local name=$1; shift
  rm -f "${members[@]}" "$socket" "$socket.control"
  "$stripelog" create --raid 5 --chunk 1MiB --spare 20% --member-size 2GiB "${members[@]}" >/dev/null
  "$stripelog" serve --socket "$socket" --cache 0 "${members[@]}" 2> "$results/serve-$name.log" &
  server=$!
  for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.1; done
  if ! [ -S "$socket" ] || ! kill -0 "$server" 2>/dev/null; then
    echo "bench-nbd-mixes: the server did not start (see $results/serve-$name.log)" >&2
    exit 1
  fi
  fio --name=fill "${common[@]}" --rw=write --bs=1m --iodepth=8 > "$results/fill-$name.json"
  fio "${common[@]}" --time_based "--runtime=$seconds" "$@" > "$results/$name.json"
  "$stripelog" status --control "$socket.control" --json > "$results/status-$name.json"
  kill -INT "$server"; wait "$server" || true
  server=
}

# The writer's measured rate in mix512 (0 when it did not run).
writer_iops() {
  python3 - "$results/mix512.json" <<'EOF'
import json, sys, os
path = sys.argv[1]
if not os.path.exists(path):
    print(0); sys.exit()
text = open(path).read(); data = json.loads(text[text.index('{'):])
print(int(sum(job['write']['iops'] for job in data['jobs'])))
EOF
}

peer() {
  local files=("$directory/peer0" "$directory/peer1" "$directory/peer2" "$directory/peer3" "$directory/peer4")
  local names; names=$(IFS=:; echo "${files[*]}")
  local rate; rate=$(writer_iops)
  [ "$rate" -gt 0 ] || { echo "bench-nbd-mixes: the peer phase needs mix512's writer rate: run mix512 first" >&2; exit 1; }
  fio --name=fill --filename="$names" --size=10g --rw=write --bs=1m --iodepth=8 --ioengine=io_uring --direct=1 \
    --output-format=json > "$results/fill-peer.json"
  local reads=(--name=reads "--filename=$names" --size=10g --rw=randread --bs=4k --iodepth=32 --ioengine=io_uring --direct=1)
  fio --output-format=json --time_based "--runtime=$seconds" "${reads[@]}" > "$results/peer-alone.json"
  # The writer's disk work: its old-block reads and its share of full-stripe writes.
  fio --output-format=json --time_based "--runtime=$seconds" "${reads[@]}" \
    --name=old-blocks "--filename=$names" --size=10g --rw=randread --bs=4k --iodepth=8 --ioengine=io_uring --direct=1 \
      "--rate_iops=$rate" \
    --name=stripes "--filename=$names" --size=10g --rw=write --bs=1m --iodepth=4 --ioengine=io_uring --direct=1 \
      "--rate=,$((rate * 4096 * 5 / 4))" \
    > "$results/peer-mix.json"
  rm -f "${files[@]}"
}

for name in $phases; do
  case $name in
    reads32) phase reads32 --name=reads --rw=randread --bs=4k --iodepth=32 ;;
    reads8) phase reads8 --name=reads --rw=randread --bs=4k --iodepth=8 ;;
    writes512) phase writes512 --name=writes --rw=randwrite --bs=512 --iodepth=8 ;;
    mix512) phase mix512 --name=writes --rw=randwrite --bs=512 --iodepth=8 \
      --name=reads --rw=randread --bs=4k --iodepth=32 ;;
    mix512paced) phase mix512paced --name=writes --rw=randwrite --bs=512 --iodepth=8 "--rate_iops=$paced_iops" \
      --name=reads --rw=randread --bs=4k --iodepth=32 ;;
    mix4k) phase mix4k --name=writes --rw=randwrite --bs=4k --iodepth=8 \
      --name=reads --rw=randread --bs=4k --iodepth=32 ;;
    peer) peer ;;
    *) echo "bench-nbd-mixes: no phase $name" >&2; exit 1 ;;
  esac
done

python3 - "$results" "$paced_iops" <<'EOF'
import json, os, sys
results, paced = sys.argv[1], sys.argv[2]
def load(name):
    path = os.path.join(results, name + '.json')
    if not os.path.exists(path):
        return None
    text = open(path).read(); data = json.loads(text[text.index('{'):]); jobs = {}
    for job in data['jobs']:
        for kind in ('read', 'write'):
            side = job[kind]
            if side['total_ios'] > 0:
                percentiles = side['clat_ns']['percentile']
                jobs[job['jobname']] = (side['iops'], percentiles['99.000000'] / 1e3, percentiles['99.900000'] / 1e3)
    return jobs
names = ['reads32', 'reads8', 'writes512', 'mix512', 'mix512paced', 'mix4k', 'peer-alone', 'peer-mix']
found = {name: load(name) for name in names}
for name, jobs in found.items():
    if jobs is None:
        continue
    for job, (iops, p99, p999) in jobs.items():
        print(f"{name:12s} {job:10s} {iops:9.0f} IOPS  p99 {p99:7.0f} µs  p99.9 {p999:7.0f} µs")
    status = os.path.join(results, 'status-' + name + '.json')
    if os.path.exists(status):
        lock = json.load(open(status))['exports'][0].get('write_lock')
        if lock is None:
            print(f"{'':12s} write lock: not reported by this binary")
            continue
        print(f"{'':12s} write lock: {lock['holds']} holds, p99 {lock['hold_p99_seconds'] * 1e6:.1f} µs, "
              f"p99.9 {lock['hold_p999_seconds'] * 1e6:.1f} µs, longest {lock['hold_maximum_seconds'] * 1e6:.0f} µs")
def figure(name, job, index):
    jobs = found.get(name)
    return jobs[job][index] if jobs and job in jobs else float('nan')
print(f"512-byte writes ÷ 4 KiB reads, both at depth 8: {figure('writes512', 'writes', 0) / figure('reads8', 'reads', 0):.3f} (bar ≥ 0.5)")
print(f"mix512: the reads' p99 ÷ alone: {figure('mix512', 'reads', 1) / figure('reads32', 'reads', 1):.2f} (bar ≤ 1.5); "
      f"the peer (raw files, the same disk work): {figure('peer-mix', 'reads', 1) / figure('peer-alone', 'reads', 1):.2f}")
print(f"mix512, the writer held to {paced} IOPS: the reads' p99 ÷ alone: {figure('mix512paced', 'reads', 1) / figure('reads32', 'reads', 1):.2f}")
print(f"mix4k: the reads ÷ alone: {figure('mix4k', 'reads', 0) / figure('reads32', 'reads', 0):.3f} (bar ≥ 0.3)")
EOF
