#!/usr/bin/env bash
# Issue 24's figures, each printed next to its bound measured in the same run on this
# machine (BENCHMARKS.md, "Performance where users live"). As root, after
# `cargo build --release` and scripts/install-deps.sh. Usage:
#   [PARTS="tool steady reads nbd rebuild cores hotcold"] [SECONDS_PER_CELL=10] [FORCE=1] \
#     scripts/bench-performance.sh DIRECTORY
# DIRECTORY must be empty or new (FORCE=1 allows one that holds files: they may be
# overwritten and removed).
# Parts:
#   tool     `stripelog bench mix`, one thread, depth 32, on a file in /dev/shm ÷ fio, one job
#   steady   `bench engine` (fresh volume: IOPS × 4 KiB ÷ the members' sequential writes)
#            and `bench saturate` (27 % spare, full: steady IOPS ÷ the cleaner's traffic
#            bound, maximum latency per 10 s interval), and ÷ what fio gets from the disk
#            doing the cleaner's own mix of reads and writes at once
#   reads    4 KiB random reads with the block cache off, depth 32, in process and over
#            NBD ÷ fio's random reads over the raw member files at depth 32; over NBD again
#            with a map cache of a twentieth of the index; and the NBD peer: nbdkit's
#            file plugin (O_DIRECT) serving a raw member to the same client
#   nbd      one NBD connection at depth 32, 4 KiB random writes ÷ `nbdkit memory`; and
#            `nbdkit null` (a server that stores nothing) with the same client, to show
#            how much of the rate is the client and the socket rather than the server
#   rebuild  rebuild of one member and `check` ÷ the disk's sequential write and read
#            bandwidth (fio), and rebuild ÷ fio doing the same reads and writes at once
#            and ÷ the most one disk gives a rebuild (four bytes read per byte written)
#   cores    NBD 4 KiB random writes, 2 connections, members in /dev/shm: the server on 2
#            cores ÷ on 1 core (taskset)
#   hotcold  `sim gc` write amplification ÷ the two-pool bound, 90/10 and 80/20 at 13 and
#            27 % spare, client writes in one stream (`create --one-client-stream`)
#            and with the cold stream (the default)
set -euo pipefail
directory=${1:?usage: scripts/bench-performance.sh DIRECTORY}
parts=${PARTS:-tool steady reads nbd rebuild cores hotcold}
seconds=${SECONDS_PER_CELL:-10}
stripelog=${STRIPELOG:-$PWD/target/release/stripelog}
[ -x "$stripelog" ] || { echo "bench-performance: build first: cargo build --release" >&2; exit 1; }
for tool in fio nbdkit python3 taskset; do
  command -v "$tool" >/dev/null || { echo "bench-performance: $tool is missing (scripts/install-deps.sh)" >&2; exit 1; }
done
# The parts write over and remove member and scratch files in DIRECTORY: one that already
# holds files is refused unless FORCE=1.
if [ "${FORCE:-0}" != 1 ] && [ -d "$directory" ] && [ -n "$(ls -A "$directory")" ]; then
  echo "bench-performance: $directory is not empty (it holds $(ls -A "$directory" | head -3 | tr '\n' ' ')...); the parts write over and remove files there: choose an empty directory, or pass FORCE=1" >&2
  exit 1
fi
mkdir -p "$directory"
directory=$(cd "$directory" && pwd)
shm=/dev/shm/stripelog-bench-performance
children=()
cleanup() {
  for pid in "${children[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$shm"
}
trap cleanup EXIT

# `ratio NAME FIGURE BOUND [BAR]`: one line per figure.
ratio() {
  python3 - "$@" <<'EOF'
import sys
name, figure, bound = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
bar = f"   (bar {sys.argv[4]})" if len(sys.argv) > 4 else ""
print(f"{name:<66} {figure:>10.6g} / {bound:>10.6g} = {figure / bound if bound else 0:.3f}{bar}")
EOF
}
# The IOPS or bandwidth of a JSON report: `json FILE EXPRESSION` (j is the document).
json() { python3 -c "import json,sys; t=open(sys.argv[1]).read(); j=json.loads(t[t.index('{'):]); print($2)" "$1"; }
fio_iops() { json "$1" 'j["jobs"][0]["write"]["iops"] + j["jobs"][0]["read"]["iops"]'; }
wait_for_socket() { for _ in $(seq 200); do [ -S "$1" ] && return 0; sleep 0.1; done; echo "no socket $1" >&2; exit 1; }
serve() { # SOCKET LOG ARGUMENTS...: start a server in the background
  local socket=$1 log=$2; shift 2
  rm -f "$socket"
  "$@" --socket "$socket" 2>"$log" &
  children+=($!)
  wait_for_socket "$socket"
}
stop_servers() {
  for pid in "${children[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${children[@]}"; do wait "$pid" 2>/dev/null || true; done
  children=()
}
five_members() { echo "$1"/m0 "$1"/m1 "$1"/m2 "$1"/m3 "$1"/m4; }
echo "stripelog bench-performance, $(date -u +%FT%TZ), $(nproc) cores, ${seconds} s per cell, parts: $parts"

for part in $parts; do
case $part in
tool)
  mkdir -p "$shm"; rm -f "$shm/tool"
  # Written whole first: tmpfs allocates a page on the first write to a hole.
  dd if=/dev/zero of="$shm/tool" bs=1M count=1024 status=none
  for round in 1 2 3; do
    "$stripelog" bench mix "$shm/tool" --force -q --queue-depth 32 --duration "${seconds}s" \
      --json "$directory/tool-stripelog.json" >/dev/null
    fio --name=tool --filename="$shm/tool" --size=1g --rw=randwrite --bs=4k --ioengine=io_uring --direct=1 \
      --iodepth=32 --time_based --runtime="$seconds" --output-format=json >"$directory/tool-fio.json" 2>/dev/null
    ratio "bench mix, 1 thread, depth 32, 4 KiB random write, /dev/shm ÷ fio (round $round)" \
      "$(json "$directory/tool-stripelog.json" 'j["write"]["iops"]')" "$(fio_iops "$directory/tool-fio.json")" "≥ 0.8"
  done
  rm -f "$shm/tool"
  ;;
steady)
  "$stripelog" bench engine --dir "$directory/engine" --member-size 4GiB --region 8GiB --threads 4 \
    --read-threads 8 --duration "${seconds}s" --force --json "$directory/engine.json" >"$directory/engine.txt" 2>&1
  # What the disk gives the cleaner's own traffic, measured by fio: 1 MiB reads and writes
  # at scattered chunk offsets of five written 2 GiB files, at once, in the share of bytes
  # the steady state moves per host block (WA ÷ data share written, (WA − 1) × the span
  # bytes read per live byte relocated), at depth 4 per file as the sequential bounds. The
  # host blocks per second that traffic carries is the most a cleaner that reads what ours
  # reads can reach on this disk. The disk drifts over minutes, so fio runs before and
  # after `bench saturate` and the bound is the mean: before, at 45 % reads (the share of
  # every earlier run at 27 % spare: WA 2.13, 1.89 bytes read per live byte); after, at
  # the run's own share.
  m=$directory/mix; mkdir -p "$m"; rm -f "$m"/f*
  mix_files=$(echo "$m"/f0 "$m"/f1 "$m"/f2 "$m"/f3 "$m"/f4 | tr ' ' :)
  fio --name=fill --filename="$mix_files" --size=10g --rw=write --bs=1m --direct=1 --ioengine=io_uring \
    --iodepth=20 --output-format=json >"$m/fill.json" 2>/dev/null
  mix_run() { # NAME READ_PERCENT
    fio --name=mix --filename="$mix_files" --rw=randrw --rwmixread="$2" --bs=1m --direct=1 \
      --ioengine=io_uring --iodepth=20 --time_based --runtime="$seconds" --output-format=json \
      >"$m/$1.json" 2>/dev/null
  }
  mix_run before 45
  # Six passes: enough 10 s intervals after the fill for the SNIA steady-state window (5
  # intervals within 20 % of their mean) to exclude the first, where the cleaner starts.
  "$stripelog" bench saturate --dir "$directory/saturate" --member-size 2GiB --passes 6 --force \
    --json "$directory/saturate.json" --chart "$directory/saturate.svg" >"$directory/saturate.txt" 2>&1
  fresh=$(json "$directory/engine.json" '"%.3f" % j["random_write"][-1]["ratio_to_sequential"]')
  echo "fresh volume, 4 KiB random writes (4 threads) × 4 KiB ÷ (members' sequential writes × data share): $fresh"
  steady_iops=$(json "$directory/saturate.json" 'j["cleaner_bound_iops"] * j["ratio_to_cleaner_bound"]')
  ratio "steady state at 27 % spare: IOPS ÷ the cleaner's traffic bound" "$steady_iops" \
    "$(json "$directory/saturate.json" 'j["cleaner_bound_iops"]')" "≥ 0.85, goal 0.95"
  json "$directory/saturate.json" '"  the cleaner read %.2f bytes per live byte relocated (whole spans of rows); with those reads the bound is %.0f IOPS: ratio %.3f" % (j["cleaner_read_per_relocated_byte"], j["span_read_bound_iops"], j["ratio_to_span_read_bound"])'
  # Bytes the members moved per host block in the run, written and read, and the share of
  # reads among them.
  read -r write_per_block read_per_block read_percent < <(json "$directory/saturate.json" \
    '"%f %f %d" % ((w := j["write_amplification"] * 4096 / j["data_fraction"]), (r := (j["write_amplification"] - 1) * max(1.0, j["cleaner_read_per_relocated_byte"]) * 4096), round(100 * r / (r + w)))')
  mix_run after "$read_percent"
  # Host blocks per second a fio run of the mix carries: its slower side sets it.
  mix_blocks() { json "$m/$1.json" "min(j['jobs'][0]['read']['bw_bytes'] / $read_per_block, j['jobs'][0]['write']['bw_bytes'] / $write_per_block)"; }
  for run in "before 45" "after $read_percent"; do
    set -- $run
    json "$m/$1.json" "'  fio, the cleaner\\'s mix $1 the run, $2 %% of its 1 MiB I/Os reads: read %.0f MB/s, write %.0f MB/s, carrying %.0f host blocks/s; the disk\\'s slowest 1 MiB read %.0f ms, write %.0f ms' % (j['jobs'][0]['read']['bw_bytes'] / 1e6, j['jobs'][0]['write']['bw_bytes'] / 1e6, $(mix_blocks "$1"), j['jobs'][0]['read']['clat_ns']['max'] / 1e6, j['jobs'][0]['write']['clat_ns']['max'] / 1e6)"
  done
  ratio "steady state IOPS ÷ host blocks/s of fio's cleaner's mix (mean)" "$steady_iops" \
    "$(python3 -c "print(($(mix_blocks before) + $(mix_blocks after)) / 2)")"
  rm -f "$m"/f*
  json "$directory/saturate.json" '"steady state: WA %.2f, maximum write latency per 10 s interval from the steady state on: %s ms (bar ≤ 20 ms)" % (j["write_amplification"], ", ".join("%.0f" % (i["latency_max_ns"] / 1e6) for i in j["intervals"][(j["steady_state"] or {"first_interval": 0})["first_interval"]:])) if j["steady_state"] else "NO STEADY STATE DETECTED (the IOPS above is the mean of the last intervals, perhaps with the fill): maximum write latency per 10 s interval: %s ms" % ", ".join("%.0f" % (i["latency_max_ns"] / 1e6) for i in j["intervals"])'
  ;;
reads)
  d=$directory/reads; mkdir -p "$d"; rm -f "$d"/m*
  # shellcheck disable=SC2046
  "$stripelog" create --force --raid 5 --chunk 1MiB --spare 27% --member-size 2GiB $(five_members "$d") >/dev/null
  members=$(five_members "$d" | tr ' ' ,)
  "$stripelog" bench mix "engine:$members" --force -q --pattern sequential --block-size 1MiB --queue-depth 4 \
    --write-limit 5GiB --region 5GiB --duration 120s >/dev/null
  # The raw bound reads the bytes of the member files that hold the volume's data and
  # parity: 5 GiB × 5/4 = 1 280 MiB at the start of each member, every byte allocated
  # (beyond it the files are holes, which read as zeros without touching the disk). The
  # virtual disk serves a smaller footprint faster, so the bound is read over the same
  # one, before and after the volume's runs (the disk drifts), and averaged.
  raw_read() {
    fio --name=raw --filename="$(five_members "$d" | tr ' ' :)" --rw=randread --bs=4k --direct=1 \
      --ioengine=io_uring --iodepth=32 --time_based --runtime="$seconds" --size="$2" --output-format=json \
      >"$d/$1.json" 2>/dev/null
  }
  raw_read raw-read-before 6400m
  "$stripelog" bench mix "engine:$members" --engine-cache 0 -q --read-percent 100 --queue-depth 32 \
    --duration "${seconds}s" --region 5GiB --json "$d/engine-read.json" >/dev/null
  # shellcheck disable=SC2046
  serve "$d/s.sock" "$d/serve.log" "$stripelog" serve --cache 0 $(five_members "$d")
  "$stripelog" bench mix "nbd+unix:///stripelog?socket=$d/s.sock" -q --read-percent 100 --queue-depth 32 \
    --duration "${seconds}s" --region 5GiB --json "$d/nbd-read.json" >/dev/null
  stop_servers
  # The same with a map cache of 200 KiB, about a twentieth of this volume's index (3.6 MB
  # at 2.8 bytes per block), as a multi-terabyte array has in little RAM: most lookups
  # find their index page only in the log, and the server reads it through its ring.
  # shellcheck disable=SC2046
  serve "$d/s.sock" "$d/serve-small-map.log" "$stripelog" serve --cache 0 --map-cache 200KiB $(five_members "$d")
  "$stripelog" bench mix "nbd+unix:///stripelog?socket=$d/s.sock" -q --read-percent 100 --queue-depth 32 \
    --duration "${seconds}s" --region 5GiB --json "$d/nbd-read-small-map.json" >/dev/null
  stop_servers
  # The NBD peer: nbdkit's file plugin serving one raw member file with O_DIRECT, the
  # same client at the same depth, over the part of m0 that holds data (1 280 MiB).
  rm -f "$d/k.sock"; nbdkit --foreground --unix "$d/k.sock" file file="$d/m0" cache=none 2>"$d/nbdkit.log" &
  children+=($!)
  wait_for_socket "$d/k.sock"
  "$stripelog" bench mix "nbd+unix:///?socket=$d/k.sock" -q --read-percent 100 --queue-depth 32 \
    --duration "${seconds}s" --region 1280MiB --json "$d/nbdkit-read.json" >/dev/null
  stop_servers
  raw_read raw-read-after 6400m
  # The footprint this script used before: 400 MiB of each member.
  raw_read raw-read-small 2g
  raw=$(python3 -c "print(($(fio_iops "$d/raw-read-before.json") + $(fio_iops "$d/raw-read-after.json")) / 2)")
  echo "raw member files, 4 KiB random reads at depth 32 over the volume's 1 280 MiB of each member: $(fio_iops "$d/raw-read-before.json") before, $(fio_iops "$d/raw-read-after.json") after (bound: the mean); over 400 MiB of each: $(fio_iops "$d/raw-read-small.json")"
  nbd_read=$(json "$d/nbd-read.json" 'j["read"]["iops"]')
  nbdkit_read=$(json "$d/nbdkit-read.json" 'j["read"]["iops"]')
  ratio "random read, cache off, depth 32, in process ÷ raw members" "$(json "$d/engine-read.json" 'j["read"]["iops"]')" "$raw" "≥ 0.9"
  ratio "random read, cache off, depth 32, over NBD ÷ raw members" "$nbd_read" "$raw" "≥ 0.9"
  ratio "  nbdkit file (O_DIRECT) over NBD, same client and depth ÷ raw members" "$nbdkit_read" "$raw"
  ratio "  over NBD with a 200 KiB map cache (index pages read back as needed) ÷ raw members" \
    "$(json "$d/nbd-read-small-map.json" 'j["read"]["iops"]')" "$raw"
  ratio "  stripelog over NBD ÷ nbdkit file over NBD" "$nbd_read" "$nbdkit_read"
  ratio "  in process ÷ raw members over 400 MiB of each (this script's footprint before)" \
    "$(json "$d/engine-read.json" 'j["read"]["iops"]')" "$(fio_iops "$d/raw-read-small.json")"
  ;;
nbd)
  d=$directory/nbd; mkdir -p "$d"; rm -f "$d"/m*
  # shellcheck disable=SC2046
  "$stripelog" create --force --raid 5 --chunk 1MiB --spare 20% --member-size 4GiB $(five_members "$d") >/dev/null
  # The block cache holds the 1 GiB region, as nbdkit memory holds everything.
  # shellcheck disable=SC2046
  serve "$d/s.sock" "$d/serve.log" "$stripelog" serve --cache 2GiB $(five_members "$d")
  rm -f "$d/k.sock" "$d/n.sock"; nbdkit --foreground --unix "$d/k.sock" memory 4G 2>"$d/nbdkit.log" & children+=($!)
  nbdkit --foreground --unix "$d/n.sock" null 4G 2>"$d/nbdkit-null.log" & children+=($!)
  wait_for_socket "$d/k.sock"; wait_for_socket "$d/n.sock"
  # A first pass on each, not counted: nbdkit allocates its pages on first write.
  for server in s k; do
    export_name=$([ $server = s ] && echo stripelog || echo "")
    fio --name=warm --ioengine=nbd --uri="nbd+unix:///$export_name?socket=$d/$server.sock" --rw=write --bs=1m \
      --iodepth=8 --size=1g >/dev/null 2>&1
  done
  for round in 1 2 3; do
    for server in s k n; do
      export_name=$([ $server = s ] && echo stripelog || echo "")
      fio --name=one --ioengine=nbd --uri="nbd+unix:///$export_name?socket=$d/$server.sock" --rw=randwrite --bs=4k \
        --iodepth=32 --numjobs=1 --size=1g --time_based --runtime="$seconds" --output-format=json \
        >"$d/$server-$round.json" 2>/dev/null
    done
    ratio "one NBD connection, depth 32, 4 KiB random write ÷ nbdkit memory (round $round)" \
      "$(fio_iops "$d/s-$round.json")" "$(fio_iops "$d/k-$round.json")" "≥ 1.0, goal 1.2"
    ratio "  nbdkit null (stores nothing) ÷ nbdkit memory (round $round)" \
      "$(fio_iops "$d/n-$round.json")" "$(fio_iops "$d/k-$round.json")"
    ratio "  stripelog ÷ nbdkit null (round $round)" "$(fio_iops "$d/s-$round.json")" "$(fio_iops "$d/n-$round.json")"
  done
  stop_servers
  rm -f "$d"/m*
  ;;
rebuild)
  d=$directory/rebuild; mkdir -p "$d"; rm -f "$d"/m* "$d"/new2 "$d"/fio*
  # shellcheck disable=SC2046
  "$stripelog" create --force --raid 5 --chunk 1MiB --spare 27% --member-size 2GiB $(five_members "$d") >/dev/null
  "$stripelog" bench mix "engine:$(five_members "$d" | tr ' ' ,)" --force -q --pattern sequential \
    --block-size 1MiB --queue-depth 4 --write-limit 5GiB --region 5GiB --duration 120s >/dev/null
  rm "$d/m2"
  "$stripelog" replace --member 2 --with "$d/new2" --json "$d/m0" "$d/m1" missing "$d/m3" "$d/m4" \
    >"$d/rebuild.json" 2>/dev/null
  "$stripelog" check --json "$d/m0" "$d/m1" "$d/new2" "$d/m3" "$d/m4" >"$d/check.json"
  fio --name=seq --filename="$d/fio-seq" --size=2g --rw=write --bs=1m --direct=1 --ioengine=io_uring \
    --iodepth=4 --output-format=json >"$d/seq-write.json" 2>/dev/null
  fio --name=seq --filename="$d/fio-seq" --size=2g --rw=read --bs=1m --direct=1 --ioengine=io_uring \
    --iodepth=4 --output-format=json >"$d/seq-read.json" 2>/dev/null
  # What the disk gives the rebuild's own traffic: four survivors read and one member
  # written, all at once, on this one disk.
  fio --output-format=json --bs=1m --direct=1 --ioengine=io_uring --iodepth=4 --size=2g \
    --name=r0 --rw=read --filename="$d/m0" --name=r1 --rw=read --filename="$d/m1" \
    --name=r3 --rw=read --filename="$d/m3" --name=r4 --rw=read --filename="$d/m4" \
    --name=w --rw=write --filename="$d/fio-new" >"$d/same-traffic.json" 2>/dev/null
  rebuild=$(json "$d/rebuild.json" 'j["bytes_written"] / j["seconds"] / 1e6')
  ratio "rebuild MB/s written to the new member ÷ the disk's sequential write" "$rebuild" \
    "$(json "$d/seq-write.json" 'j["jobs"][0]["write"]["bw_bytes"] / 1e6')" "≥ 0.5, goal 0.8"
  ratio "rebuild MB/s ÷ fio writing while reading 4 members (same disk)" "$rebuild" \
    "$(json "$d/same-traffic.json" '[x for x in j["jobs"] if x["jobname"] == "w"][0]["write"]["bw_bytes"] / 1e6')"
  # On one disk each byte written to the new member is four bytes read from the survivors,
  # and reads and writes share the disk's time: at most 1 / (1/W + 4/R) MB/s, W and R its
  # sequential write and read. Members on separate drives do not share it.
  write_bandwidth=$(json "$d/seq-write.json" 'j["jobs"][0]["write"]["bw_bytes"] / 1e6')
  read_bandwidth=$(json "$d/seq-read.json" 'j["jobs"][0]["read"]["bw_bytes"] / 1e6')
  one_disk_bound=$(python3 -c "print(1 / (1 / $write_bandwidth + 4 / $read_bandwidth))")
  ratio "rebuild MB/s ÷ the one-disk bound, 1 / (1/W + 4/R)" "$rebuild" "$one_disk_bound"
  ratio "  the one-disk bound ÷ the disk's sequential write (the most the bar can read here)" \
    "$one_disk_bound" "$write_bandwidth"
  ratio "check MB/s of member rows read ÷ the disk's sequential read" \
    "$(json "$d/check.json" 'j["bytes_read"] / j["seconds"] / 1e6')" \
    "$(json "$d/seq-read.json" 'j["jobs"][0]["read"]["bw_bytes"] / 1e6')" "≥ 0.4"
  rm -f "$d"/m* "$d"/new2 "$d"/fio*
  ;;
cores)
  mkdir -p "$shm"; rm -f "$shm"/m*
  # shellcheck disable=SC2046
  "$stripelog" create --force --raid 5 --chunk 1MiB --spare 20% --member-size 1GiB $(five_members "$shm") >/dev/null
  for cpus in 0 0,1; do
    # shellcheck disable=SC2046
    serve "$directory/cores.sock" "$directory/cores-serve.log" taskset -c "$cpus" "$stripelog" serve --cache 1GiB \
      $(five_members "$shm")
    "$stripelog" bench mix "nbd+unix:///stripelog?socket=$directory/cores.sock" --force -q --threads 2 \
      --queue-depth 32 --region 1GiB --duration "${seconds}s" --json "$directory/cores-$cpus.json" >/dev/null
    stop_servers
  done
  ratio "NBD 4 KiB random write, 2 connections, /dev/shm: 2 cores ÷ 1 core" \
    "$(json "$directory/cores-0,1.json" 'j["write"]["iops"]')" "$(json "$directory/cores-0.json" 'j["write"]["iops"]')" "≥ 1.7"
  rm -f "$shm"/m*
  ;;
hotcold)
  for spare in 13 27; do
    for workload in 90/10 80/20; do
      for streams in --one-client-stream ""; do
        "$stripelog" sim gc --workload "hotcold:$workload" --spare "$spare%" $streams --json "$directory/gc.json" >/dev/null
        ratio "write amplification, hot/cold $workload at $spare % spare${streams:+, one client stream} ÷ two-pool bound" \
          "$(json "$directory/gc.json" 'j["write_amplification"]')" \
          "$(json "$directory/gc.json" 'j["reference_two_pool"]')" "within 10 % at 27 %"
      done
    done
  done
  ;;
*) echo "bench-performance: unknown part $part" >&2; exit 2 ;;
esac
done
