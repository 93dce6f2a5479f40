#!/usr/bin/env bash
# Durable writes (issue 21), in one run against four servers:
#   stripelog        `stripelog serve`, RAID-5 on 5 file members, no write log
#   stripelog+log    the same with its write log on a file in /dev/shm (standing in for
#                    NVDIMM or a drive with power-loss protection)
#   stripelog+disklog   the same with its write log on one file beside the members (their
#                    disk: no faster device; not redundant)
#   stripelog+disklog2  ... a mirror of two such files (what docs/write-log.md Part 3's
#                    in-member log costs, short of building it)
#   nbdkit-file      `nbdkit file` on one plain file beside the members
#   nbdkit-memory    `nbdkit memory` (stores nothing durably: the ceiling)
# Member files and nbdkit's file are written full of zeros first, as a drive has no
# holes (a sparse file makes every first write allocate, and every fdatasync commit the
# filesystem's journal).
# Measures, per server:
#   - fio --ioengine=nbd 4 KiB random writes with --fsync=1 at depth 1 and 8: IOPS and
#     mean/p99 sync (flush) latency;
#   - 4 KiB random writes with FUA at depth 1 and 8 (`stripelog bench latency --durability
#     fua`: fio's nbd engine sends no FUA): IOPS and mean/p99 write latency;
#   - pgbench TPS on ext4 over nbdfuse + a loop device (scale 10, 8 clients, 30 s).
# Every cell runs ROUNDS times (default 3), the servers taking turns; tables give medians.
# Usage (as root, for losetup and mount):
#   [ROUNDS=N] [SECONDS_PER_CELL=S] [PGBENCH_SECONDS=S] [MEMBER_MIB=M] [CELLS="fio fua pgbench"]
#     [SERVERS="..."] [PRECONDITION=1 [PRECONDITION_SECONDS=S]] [FORCE=1] scripts/bench-sync.sh [DIRECTORY]
# Files of these names already in DIRECTORY (or /dev/shm/stripelog-bench-sync.log) are
# refused unless FORCE=1.
set -euo pipefail
directory=${1:-/var/tmp/stripelog-bench-sync}
seconds=${SECONDS_PER_CELL:-15}
pgbench_seconds=${PGBENCH_SECONDS:-30}
rounds=${ROUNDS:-3}
member_mib=${MEMBER_MIB:-2048}
stripelog=${STRIPELOG:-./target/release/stripelog}
servers=${SERVERS:-"stripelog stripelog+log nbdkit-file nbdkit-memory"}
# Which measurements: fio (--fsync=1), fua (bench latency), pgbench.
cells=${CELLS:-"fio fua pgbench"}
# PRECONDITION=1: measure the stripelog volumes in steady state (filled, then overwritten
# at random for PRECONDITION_SECONDS), the cleaner running under every cell.
precondition=${PRECONDITION:-0}
precondition_seconds=${PRECONDITION_SECONDS:-60}
postgres_bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)
for tool in fio nbdkit nbdfuse losetup mkfs.ext4 pgbench python3 runuser; do
  command -v "$tool" >/dev/null || { echo "bench-sync: $tool is not installed (scripts/install-deps.sh)" >&2; exit 1; }
done
[ -n "$postgres_bin" ] || { echo "bench-sync: PostgreSQL server is not installed (scripts/install-deps.sh)" >&2; exit 1; }
[ -x "$stripelog" ] || { echo "bench-sync: build first: cargo build --release" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "bench-sync: run as root (losetup, mount)" >&2; exit 1; }
stripelog=$(realpath "$stripelog")

mkdir -p "$directory"
directory=$(cd "$directory" && pwd)
log_file=/dev/shm/stripelog-bench-sync.log
# The files this run writes and removes: any already there may be somebody's data, so
# they are refused (named) unless FORCE=1.
own_files=("$log_file" "$directory/nbdkit-file.img" "$directory"/disklog-a "$directory"/disklog2-{a,b})
for name in plain logged disklog disklog2; do own_files+=("$directory/member-$name-"{0,1,2,3,4}); done
if [ "${FORCE:-0}" != 1 ]; then
  for file in "${own_files[@]}"; do
    [ -e "$file" ] && { echo "bench-sync: $file exists (it would be overwritten and removed): FORCE=1 to go on" >&2; exit 1; }
  done
fi
pids=()
cleanup() {
  set +e
  mountpoint -q "$directory/mnt" && umount "$directory/mnt"
  for device in $(losetup -j "$directory/fuse/disk" -O NAME -n 2>/dev/null); do losetup -d "$device"; done
  mountpoint -q "$directory/fuse" && fusermount3 -u "$directory/fuse"
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null; done
  rm -f "${own_files[@]}" "$directory"/{stripelog,stripelog-log,stripelog-disklog,stripelog-disklog2,nbdkit-file,nbdkit-memory}.sock
}
trap cleanup EXIT

zero_file() { dd if=/dev/zero of="$1" bs=1M count="$2" oflag=direct status=none; }

# Servers. Each member and nbdkit's file are written with zeros first.
declare -A uri
volume_mib=$((member_mib * 4 * 8 / 10))
start_stripelog() { # name socket log-arguments...
  local name=$1 socket=$2; shift 2
  local members=("$directory/member-$name-"{0,1,2,3,4})
  for member in "${members[@]}"; do zero_file "$member" "$member_mib"; done
  "$stripelog" create --raid 5 --chunk 1MiB --spare 20% "$@" "${members[@]}" >/dev/null
  "$stripelog" serve --socket "$directory/$socket" "${members[@]}" 2>"$directory/$socket.log" &
  pids+=($!)
  uri[$name]="nbd+unix:///stripelog?socket=$directory/$socket"
}
for server in $servers; do
  case $server in
    stripelog) start_stripelog plain stripelog.sock; uri[stripelog]=${uri[plain]} ;;
    stripelog+log) rm -f "$log_file"; start_stripelog logged stripelog-log.sock --log "$log_file"
                   uri[stripelog+log]=${uri[logged]} ;;
    stripelog+disklog) zero_file "$directory/disklog-a" 256
                       start_stripelog disklog stripelog-disklog.sock --log "$directory/disklog-a"
                       uri[stripelog+disklog]=${uri[disklog]} ;;
    stripelog+disklog2) zero_file "$directory/disklog2-a" 256; zero_file "$directory/disklog2-b" 256
                        start_stripelog disklog2 stripelog-disklog2.sock \
                          --log "$directory/disklog2-a" --log "$directory/disklog2-b"
                        uri[stripelog+disklog2]=${uri[disklog2]} ;;
    nbdkit-file) zero_file "$directory/nbdkit-file.img" "$volume_mib"
                 nbdkit --foreground --unix "$directory/nbdkit-file.sock" file "$directory/nbdkit-file.img" \
                   2>"$directory/nbdkit-file.log" &
                 pids+=($!); uri[nbdkit-file]="nbd+unix:///?socket=$directory/nbdkit-file.sock" ;;
    nbdkit-memory) nbdkit --foreground --unix "$directory/nbdkit-memory.sock" memory "${volume_mib}M" \
                     2>"$directory/nbdkit-memory.log" &
                   pids+=($!); uri[nbdkit-memory]="nbd+unix:///?socket=$directory/nbdkit-memory.sock" ;;
    *) echo "bench-sync: unknown server $server" >&2; exit 1 ;;
  esac
done
for server in $servers; do
  socket=${uri[$server]#*socket=}
  for _ in $(seq 100); do [ -S "$socket" ] && break; sleep 0.1; done
  [ -S "$socket" ] || { echo "bench-sync: $server did not start" >&2; exit 1; }
done

# Steady state: every stripelog volume is filled and then overwritten at random, so that
# its spare is all the free space there is and the cleaner runs under every cell after.
if [ "$precondition" = 1 ]; then
  for server in $servers; do
    [[ $server == stripelog* ]] || continue
    fio --name=fill --ioengine=nbd --uri="${uri[$server]}" --rw=write --bs=1m --iodepth=8 \
        --output-format=terse >/dev/null
    fio --name=overwrite --ioengine=nbd --uri="${uri[$server]}" --rw=randwrite --bs=4k --iodepth=32 \
        --time_based --runtime="$precondition_seconds" --output-format=terse >/dev/null
  done
fi

median() { python3 -c 'import statistics,sys; print(statistics.median(float(x) for x in sys.argv[1:]))' "$@"; }

# fio with --fsync=1: "IOPS mean_us p99_us" of the syncs.
fio_cell() { # uri iodepth
  fio --name=cell --ioengine=nbd --uri="$1" --rw=randwrite --bs=4k --iodepth="$2" --fsync=1 \
      --size=1g --time_based --runtime="$seconds" --output-format=json 2>/dev/null |
    python3 -c '
import json, sys
text = sys.stdin.read(); job = json.loads(text[text.index("{"):])["jobs"][0]
sync = job["sync"]["lat_ns"]
print(round(job["write"]["iops"]), round(sync["mean"] / 1000, 1), round(sync["percentile"]["99.000000"] / 1000, 1))'
}
# FUA writes: "IOPS mean_us p99_us" of the writes.
fua_cell() { # uri iodepth
  "$stripelog" bench latency "$1" --force --quiet --read-percent 0 --block-size 4KiB --durability fua \
      --queue-depths "$2" --duration "${seconds}s" --json "$directory/fua.json" >/dev/null
  python3 -c '
import json, sys
point = json.load(open(sys.argv[1]))["points"][0]
print(round(point["iops"]), round(point["mean_ns"] / 1000, 1), round(point["p99_ns"] / 1000, 1))' "$directory/fua.json"
}
declare -A results
for round in $(seq "$rounds"); do
  for depth in 1 8; do
    for server in $servers; do
      [[ " $cells " == *" fio "* ]] && results[fsync,$depth,$server]+="$(fio_cell "${uri[$server]}" "$depth");"
      [[ " $cells " == *" fua "* ]] && results[fua,$depth,$server]+="$(fua_cell "${uri[$server]}" "$depth");"
    done
  done
done

# pgbench: a fresh ext4 and cluster per server and round.
pgbench_cell() { # uri -> TPS
  mkdir -p "$directory/fuse" "$directory/mnt"
  nbdfuse "$directory/fuse/disk" "$1" >/dev/null 2>&1 &
  local fuse_pid=$!
  for _ in $(seq 100); do [ -s "$directory/fuse/disk" ] && break; sleep 0.1; done
  local device; device=$(losetup -f --show "$directory/fuse/disk")
  mkfs.ext4 -q -F -E nodiscard "$device"
  mount "$device" "$directory/mnt"
  mkdir "$directory/mnt/pg" && chown postgres "$directory/mnt/pg"
  runuser -u postgres -- "$postgres_bin/initdb" -D "$directory/mnt/pg" >/dev/null
  runuser -u postgres -- "$postgres_bin/pg_ctl" -D "$directory/mnt/pg" -o "-p 5499 -k /tmp -c listen_addresses=''" \
    -l "$directory/mnt/pg/postgres.log" -w start >/dev/null
  runuser -u postgres -- pgbench -h /tmp -p 5499 -i -s 10 -q postgres >/dev/null 2>&1
  local tps
  tps=$(runuser -u postgres -- pgbench -h /tmp -p 5499 -c 8 -j 2 -T "$pgbench_seconds" postgres 2>/dev/null |
        sed -n 's/^tps = \([0-9.]*\).*/\1/p')
  runuser -u postgres -- "$postgres_bin/pg_ctl" -D "$directory/mnt/pg" -m fast -w stop >/dev/null
  umount "$directory/mnt"
  losetup -d "$device"
  fusermount3 -u "$directory/fuse"
  wait "$fuse_pid" 2>/dev/null || true
  echo "${tps:-0}"
}
for round in $(seq "$rounds"); do
  [[ " $cells " == *" pgbench "* ]] || break
  for server in $servers; do
    results[pgbench,$server]+="$(pgbench_cell "${uri[$server]}") "
  done
done

field() { # "a b c;a b c;" index -> values
  tr ';' '\n' <<<"$1" | awk -v i="$2" 'NF { print $i }'
}
echo "| server | test | depth | IOPS | mean latency µs | p99 latency µs |"
echo "|---|---|---:|---:|---:|---:|"
for kind in fsync fua; do
  for depth in 1 8; do
    for server in $servers; do
      cells=${results[$kind,$depth,$server]:-}
      [ -n "$cells" ] || continue
      printf '| %s | %s | %s | %.0f | %.1f | %.1f |\n' "$server" \
        "$([ "$kind" = fsync ] && echo "write + fsync (fio; sync latency)" || echo "FUA write (bench latency)")" "$depth" \
        "$(median $(field "$cells" 1))" "$(median $(field "$cells" 2))" "$(median $(field "$cells" 3))"
    done
  done
done
echo
echo "| server | pgbench TPS (median of $rounds) | rounds |"
echo "|---|---:|---|"
for server in $servers; do
  [ -n "${results[pgbench,$server]:-}" ] || continue
  printf '| %s | %.0f | %s |\n' "$server" "$(median ${results[pgbench,$server]})" "${results[pgbench,$server]}"
done
