#!/usr/bin/env bash
# Issue 22's measurements, in one run, with compression off and lz4
# (docs/compression.md; results in BENCHMARKS.md, "Compression through NBD"):
#  1. each corpus of scripts/compression-corpora.sh written through NBD with nbdcopy
#     into a fresh volume (RAID-5, 3 file members): the ratio logical ÷ physical data
#     (logical blocks holding data ÷ data blocks, whole and packed, written to the
#     members, from `stripelog info`), and the server's CPU seconds per GiB written;
#  2. fio's nbd engine, 4 KiB random writes at 0 % and 75 % compressible
#     (buffer_compress_percentage, refill_buffers), on a fresh volume and in steady
#     state at 27 % spare (filled sequentially, overwritten at random for WARM seconds,
#     then measured), and 4 KiB random reads of what was written (block cache off).
# Usage: scripts/bench-compression.sh CORPORA_DIRECTORY [WORK_DIRECTORY]
#   environment: SECONDS_PER_CELL (30), WARM (60), MEMBER_SIZE (2GiB, part 2),
#                PARTS ("ratio iops"), PERCENTAGES ("0 75"), REPEATS (3, part 2: each
#                cell measured this many times, off and lz4 taking turns to go first;
#                the summary gives medians), FORCE=1 to replace the work
#                directory's members
set -euo pipefail
corpora=${1:?usage: scripts/bench-compression.sh CORPORA_DIRECTORY [WORK_DIRECTORY]}
work=${2:-stripelog-bench-compression}
seconds=${SECONDS_PER_CELL:-30}
warm=${WARM:-60}
member_size=${MEMBER_SIZE:-2GiB}
parts=${PARTS:-ratio iops}
stripelog=${STRIPELOG:-./target/release/stripelog}
for tool in fio nbdcopy python3; do
  command -v "$tool" >/dev/null || { echo "bench-compression: $tool is not installed (scripts/install-deps.sh)" >&2; exit 1; }
done
[ -x "$stripelog" ] || { echo "bench-compression: build first: cargo build --release" >&2; exit 1; }
mkdir -p "$work"
work=$(cd "$work" && pwd)
members=("$work"/member-{0,1,2})
for member in "${members[@]}"; do
  if [ -e "$member" ] && [ "${FORCE:-0}" != 1 ]; then
    echo "bench-compression: $member exists; it would be overwritten (FORCE=1 to go on)" >&2
    exit 1
  fi
done
serve_pid=
stop_server() {
  if [ -n "$serve_pid" ]; then
    kill -TERM "$serve_pid" 2>/dev/null || true
    wait "$serve_pid" 2>/dev/null || true
    serve_pid=
  fi
}
cleanup() { stop_server; rm -f "${members[@]}" "$work/s.sock" "$work/s.sock.control"; }
trap cleanup EXIT

# create SETTING SPARE MEMBER_SIZE; serve CACHE
create() {
  rm -f "${members[@]}"
  "$stripelog" create --raid 5 --chunk 1MiB --spare "$2" --member-size "$3" --compression "$1" "${members[@]}" >/dev/null
}
serve() {
  rm -f "$work/s.sock" "$work/s.sock.control"
  "$stripelog" serve --cache "$1" --socket "$work/s.sock" "${members[@]}" 2>>"$work/serve.log" &
  serve_pid=$!
  for _ in $(seq 100); do [ -S "$work/s.sock" ] && break; sleep 0.1; done
}
uri="nbd+unix:///stripelog?socket=$work/s.sock"
cpu_seconds() { python3 -c "import os,sys; f=open('/proc/$serve_pid/stat').read().rsplit(')',1)[1].split(); print((int(f[11])+int(f[12]))/os.sysconf('SC_CLK_TCK'))"; }
status() { "$stripelog" info --json "${members[@]}"; }

if [[ " $parts " == *" ratio "* ]]; then
  echo "| corpus | size | compression | logical data | physical data | ratio | server CPU s/GiB | copy s |"
  echo "|---|---:|---|---:|---:|---:|---:|---:|"
  for corpus in usr.ext4 pgbench.ext4 fio-0.dat fio-75.dat; do
    path="$corpora/$corpus"
    [ -f "$path" ] || { echo "bench-compression: $path missing (scripts/compression-corpora.sh $corpora)" >&2; exit 1; }
    for setting in off lz4; do
      create "$setting" 20% 5GiB
      serve 256MiB
      before=$(cpu_seconds)
      started=$(date +%s.%N)
      nbdcopy --flush "$path" "$uri"
      copied=$(python3 -c "import time; print(round(time.time()-$started,1))")
      after=$(cpu_seconds)
      stop_server
      status >"$work/info.json"
      python3 - "$corpus" "$path" "$setting" "$before" "$after" "$copied" "$work/info.json" <<'PYTHON'
import json, os, sys
corpus, path, setting, before, after, copied, info = sys.argv[1:8]
stats = json.load(open(info))
block = stats["block_size_bytes"]
size = os.path.getsize(path)
# Physical: the data blocks the copy put on the members, whole and packed (a fresh
# volume written once: nothing relocated), which packing waste included.
logical = stats["blocks_mapped"] * block
physical = stats["lifetime"]["member_bytes_data"]
ratio = logical / physical if physical else 1.0
cpu = (float(after) - float(before)) / (size / 2**30)
gib = lambda value: f"{value / 2**30:.2f} GiB"
print(f"| {corpus} | {gib(size)} | {setting} | {gib(logical)} | {gib(physical)} | {ratio:.2f} | {cpu:.2f} | {copied} |")
PYTHON
    done
  done
  echo
fi

# One fio cell: prints IOPS.
cell() { # rw compress_percentage runtime [ramp]
  fio --name=cell --ioengine=nbd --uri="$uri" --rw="$1" --bs=4k --iodepth=16 --numjobs=2 \
      --buffer_compress_percentage="$2" --refill_buffers --randrepeat=0 --norandommap \
      --size="$logical_bytes" --time_based --runtime="$3" --ramp_time="${4:-0}" \
      --group_reporting --output-format=json 2>/dev/null |
    python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print(round(j["write"]["iops"]+j["read"]["iops"]))'
}

if [[ " $parts " == *" iops "* ]]; then
  # One machine's figures move by 10-20 % from run to run (2 cores shared with fio), more
  # than the 5 % the bar allows: each cell is measured REPEATS times, off and lz4 taking
  # turns to go first, and the summary gives the median of each and of the ratios.
  results="$work/iops.tsv"
  : >"$results"
  echo "| data | run | compression | fresh write IOPS | steady write IOPS (27 % spare) | random read IOPS | info ratio (estimate) | server CPU s/GiB (steady) |"
  echo "|---|---:|---|---:|---:|---:|---:|---:|"
  for percentage in ${PERCENTAGES:-0 75}; do
    for run in $(seq "${REPEATS:-3}"); do
      if (( run % 2 )); then order="off lz4"; else order="lz4 off"; fi
      for setting in $order; do
        create "$setting" 27% "$member_size"
        logical_bytes=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["logical_size_bytes"])')
        serve 0
        fresh=$(cell randwrite "$percentage" "$seconds")
        fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1m --iodepth=8 --numjobs=1 \
            --buffer_compress_percentage="$percentage" --refill_buffers --size="$logical_bytes" >/dev/null 2>&1
        cell randwrite "$percentage" "$warm" >/dev/null
        before=$(cpu_seconds)
        steady=$(cell randwrite "$percentage" "$seconds")
        after=$(cpu_seconds)
        read=$(cell randread "$percentage" "$seconds")
        stop_server
        status >"$work/info.json"
        python3 - "$percentage" "$run" "$setting" "$fresh" "$steady" "$read" "$before" "$after" "$seconds" "$work/info.json" "$results" <<'PYTHON'
import json, sys
percentage, run, setting, fresh, steady, read, before, after, seconds, info, results = sys.argv[1:12]
stats = json.load(open(info))
compression = stats.get("compression")
ratio = f"{compression['ratio']:.2f}" if compression else "1.00"
written_gib = int(steady) * int(seconds) * 4096 / 2**30
cpu = (float(after) - float(before)) / written_gib if written_gib else 0
print(f"| {percentage} % compressible | {run} | {setting} | {fresh} | {steady} | {read} | {ratio} | {cpu:.2f} |", flush=True)
with open(results, "a") as out:
    out.write(f"{percentage}\t{run}\t{setting}\t{fresh}\t{steady}\t{read}\t{cpu:.3f}\n")
PYTHON
      done
    done
  done
  echo
  python3 - "$results" <<'PYTHON'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines()]
cells = {}
for percentage, run, setting, fresh, steady, read, cpu in rows:
    cells.setdefault((percentage, run), {})[setting] = (float(fresh), float(steady), float(read), float(cpu))
print("| data | measure | off (median) | lz4 (median) | lz4 ÷ off, median of runs | each run |")
print("|---|---|---:|---:|---:|---|")
for percentage in dict.fromkeys(p for p, _ in cells):
    runs = [value for (p, _), value in cells.items() if p == percentage and len(value) == 2]
    for column, name in enumerate(["fresh write IOPS", "steady write IOPS", "random read IOPS", "steady CPU s/GiB"]):
        off = [run["off"][column] for run in runs]
        lz4 = [run["lz4"][column] for run in runs]
        ratios = [b / a for a, b in zip(off, lz4) if a]
        print(f"| {percentage} % | {name} | {statistics.median(off):.0f} | {statistics.median(lz4):.0f} | "
              f"**{statistics.median(ratios):.2f}** | {', '.join(f'{r:.2f}' for r in ratios)} |"
              if column < 3 else
              f"| {percentage} % | {name} | {statistics.median(off):.2f} | {statistics.median(lz4):.2f} | "
              f"{statistics.median(ratios):.2f} | {', '.join(f'{r:.2f}' for r in ratios)} |")
PYTHON
fi
