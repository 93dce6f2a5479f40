#!/usr/bin/env bash
# Issue 23's measurements, in one run, with deduplication off and on (docs/deduplication.md;
# results in BENCHMARKS.md, "Deduplication through NBD"). Volumes are RAID-5 on 3 file
# members in WORK_DIRECTORY, served by `stripelog serve` on a Unix socket.
#  images: the ten ext4 images of /usr of scripts/dedup-corpora.sh (image k with 20 files
#     of its own changed) written side by side through NBD (scripts/dedup-images.py) into
#     a thin deduplicated volume of ten images' size; the first image also into a volume
#     without deduplication (one copy). Prints, after each image, the blocks the
#     deduplicated volume holds against one copy, against exact deduplication (every
#     distinct non-zero block once, counted by the writer), the share of exact
#     deduplication's duplicates found, and the index's RAM per physical block.
#  fio: fio's nbd engine, 4 KiB random writes (depth 16 × 2 jobs) with dedupe_percentage
#     0, 50 and 90, off and on taking turns to go first: IOPS, on ÷ off, and the space
#     saved (blocks saved ÷ logical blocks holding data).
#  The images parts' volume under test is deduplicated and not compressed unless
#     ON_DEDUP=off, ON_COMPRESSION=lz4 (ON_MEMBER_SIZE for room: 40GiB without dedup).
#  restarts: the ten images into a deduplicated volume with the server restarted
#     (SIGTERM, a clean close) after every two images, and killed (SIGKILL) in the middle
#     of image 5, which is then written again whole, as a client would after a crash: the
#     same table as "images" (what the name index kept across the restarts).
#  copy: ext4 on the export through nbdfuse + a loop device; `cp` of one 1 GiB file of
#     random bytes COPIES times (24), then `sync` (kvdo issue #82: 28 minutes where 5 s
#     was expected): seconds, on ÷ off.
#  mount: a deduplicated volume of 1 TiB data space (3 sparse 512 GiB members), 8 GiB of
#     unique data written through NBD (fio), closed; then three clean opens by `serve`:
#     seconds until it serves, and until the name index is loaded (`status --json`); the
#     name index's RAM and disk per physical block (`info --json`).
#  nbd-copy: the same COPIES copies through NBD directly: qemu-io writes the 1 GiB file at
#     1 GiB, 2 GiB, … of the export (`write -s`), then flushes: seconds, on ÷ off.
# Usage (as root, for losetup and mount): [PARTS="images fio copy"] [SECONDS_PER_CELL=30]
#   [REPEATS=2] [COPIES=24] [PERCENTAGES="0 50 90"] [FORCE=1] scripts/bench-dedup.sh [WORK_DIRECTORY]
# WORK_DIRECTORY (default /var/tmp/stripelog-bench-dedup) must be on the filesystem of
# /usr (the corpus hard-links it); files this run would overwrite are refused unless FORCE=1.
set -euo pipefail
work=${1:-/var/tmp/stripelog-bench-dedup}
parts=${PARTS:-images fio copy}
seconds=${SECONDS_PER_CELL:-30}
repeats=${REPEATS:-2}
copies=${COPIES:-24}
stripelog=${STRIPELOG:-./target/release/stripelog}
scripts=$(cd "$(dirname "$0")" && pwd)
for tool in fio nbdfuse losetup mkfs.ext4 mkfs.ext4 fusermount3 /usr/bin/python3 python3; do
  command -v "$tool" >/dev/null || { echo "bench-dedup: $tool is not installed (scripts/install-deps.sh)" >&2; exit 1; }
done
/usr/bin/python3 -c 'import nbd' 2>/dev/null ||
  { echo "bench-dedup: the libnbd Python binding is not installed (python3-libnbd)" >&2; exit 1; }
[ -x "$stripelog" ] || { echo "bench-dedup: build first: cargo build --release" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "bench-dedup: run as root (losetup, mount)" >&2; exit 1; }
stripelog=$(realpath "$stripelog")
mkdir -p "$work"
work=$(cd "$work" && pwd)
own_files=("$work"/{on,off,mount}-member-{0,1,2} "$work/source-1GiB.bin" "$work/corpus" "$work/exact.state" "$work/image-5")
if [ "${FORCE:-0}" != 1 ]; then
  for file in "${own_files[@]}"; do
    [ -e "$file" ] && { echo "bench-dedup: $file exists (it would be overwritten and removed): FORCE=1 to go on" >&2; exit 1; }
  done
fi

declare -A serve_pid=()
stop() { # setting
  local pid=${serve_pid[$1]:-}
  if [ -n "$pid" ]; then
    kill -TERM "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  fi
  serve_pid[$1]=
}
generator=
cleanup() {
  [ -n "$generator" ] && kill "$generator" 2>/dev/null
  mountpoint -q "$work/mnt" 2>/dev/null && umount "$work/mnt"
  for device in $(losetup -j "$work/fuse/disk" -O NAME -n 2>/dev/null); do losetup -d "$device"; done
  mountpoint -q "$work/fuse" 2>/dev/null && fusermount3 -u "$work/fuse"
  stop on; stop off
  rm -rf "${own_files[@]}" "$work"/{on,off}.sock "$work"/{on,off}.sock.control
}
trap cleanup EXIT
members() { echo "$work/$1-member-0" "$work/$1-member-1" "$work/$1-member-2"; }
create() { # setting member_size spare [logical_size]
  rm -f $(members "$1")
  local dedup=$1 compression=off member_size=$2
  if [ "$1" = on ]; then # (the images parts' volume under test: ON_DEDUP, ON_COMPRESSION, ON_MEMBER_SIZE)
    dedup=${ON_DEDUP:-on} compression=${ON_COMPRESSION:-off} member_size=${ON_MEMBER_SIZE:-$2}
  fi
  "$stripelog" create --raid 5 --chunk 1MiB --member-size "$member_size" --spare "$3" --dedup "$dedup" \
    --compression "$compression" ${4:+--logical-size "$4"} --force $(members "$1") >/dev/null
}
serve() { # setting cache
  rm -f "$work/$1.sock" "$work/$1.sock.control"
  "$stripelog" serve --cache "$2" --socket "$work/$1.sock" $(members "$1") 2>>"$work/serve-$1.log" &
  serve_pid[$1]=$!
  for _ in $(seq 600); do [ -S "$work/$1.sock" ] && break; sleep 0.1; done
  [ -S "$work/$1.sock" ] || { echo "bench-dedup: the $1 server did not start (see $work/serve-$1.log)" >&2; exit 1; }
}
uri() { echo "nbd+unix:///stripelog?socket=$work/$1.sock"; }
images_table() { # images.jsonl off.json on.json
  python3 - "$@" <<'PYTHON'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
off = json.load(open(sys.argv[2]))
on = json.load(open(sys.argv[3]))
held = lambda stats: (stats.get("stored_data_bytes") or stats["thin_provisioning"]["held_data_bytes"]) // 4096
one_copy = held(off)
n = lambda value: f"{value:,}".replace(",", " ")
print(f"One copy (image 0, dedup off): {n(one_copy)} blocks held")
print()
print("| after image | non-zero blocks written | exact: kept | dedup on: held | ÷ one copy (dedup off) | found share of exact's duplicates | index RAM B/physical block | seconds |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
for row in rows:
    dedup = row["deduplication"]
    duplicates_exact = row["non_zero_blocks"] - row["exact_kept_blocks"]
    found = row["non_zero_blocks"] - row["held_blocks"]
    share = found / duplicates_exact if duplicates_exact else 1.0
    print(f"| {row['image']} | {n(row['non_zero_blocks'])} | {n(row['exact_kept_blocks'])} | {n(row['held_blocks'])} | "
          f"{row['held_blocks'] / one_copy:.3f} | {share:.4f} | {dedup['index_memory_bytes_per_physical_block'] if dedup else 0:.2f} | {row['seconds']} |")
print()
print(f"Held by the volume under test, from `stripelog info --json`: {n(held(on))} blocks = {held(on) / one_copy:.3f} x one copy"
      + (f"; compression ratio {on['compression']['ratio']:.2f}" if on.get("compression") else ""))
dedup = on["deduplication"]
if dedup is None:
    sys.exit(0)
served = rows[-1]["deduplication"]  # the finder's counters are the serving process's
print()
print("Final, from `stripelog info --json` of the deduplicated volume: "
      f"copies {dedup['shared_copies']}, saved {dedup['blocks_saved']}, ratio {dedup['ratio']:.2f}, "
      f"index {dedup['index_memory_bytes'] / 2**20:.1f} MiB = {dedup['index_memory_bytes_per_physical_block']:.2f} B per physical block; "
      f"while served: found by run/recent/sparse {served['duplicates_by_run']}/{served['duplicates_by_recent']}/{served['duplicates_by_sparse']}, "
      f"wrong candidates (checksum/bytes) {served['candidates_rejected_by_checksum']}/{served['candidates_read_unequal']}, "
      f"lost to races {served['duplicates_lost_to_races']}, over bound {served['duplicates_over_bound']}")
PYTHON
}

info() { "$stripelog" info --json $(members "$1"); }

time_off_and_on() { # cell label: REPEATS runs of `cell off` and `cell on` (seconds), taking turns to go first
  local cell=$1 label=$2 run order setting
  declare -A took=()
  for run in $(seq "$repeats"); do
    if (( run % 2 )); then order="off on"; else order="on off"; fi
    for setting in $order; do took[$setting]+="$("$cell" "$setting") "; done
  done
  python3 - "${took[off]}" "${took[on]}" "$label" <<'PYTHON'
import statistics, sys
off = [float(v) for v in sys.argv[1].split()]
on = [float(v) for v in sys.argv[2].split()]
print(f"| {sys.argv[3]} | dedup off s (each run) | dedup on s (each run) | on ÷ off (median) |")
print("|---|---|---|---:|")
print(f"| seconds | {', '.join(map(str, off))} | {', '.join(map(str, on))} | **{statistics.median(on) / statistics.median(off):.2f}** |")
PYTHON
}

start_images() { # the corpus generator, the volume under test (ten images' size) and the one copy, served
  mkdir -p "$work/corpus"
  FORCE=1 "$scripts/dedup-corpora.sh" "$work/corpus" 2>>"$work/corpus.log" &
  generator=$!
  for _ in $(seq 600); do [ -s "$work/corpus/image-bytes" ] && break; sleep 0.1; done
  image_bytes=$(cat "$work/corpus/image-bytes")
  create on 6GiB 20% $((10 * image_bytes))
  create off 6GiB 20% "$image_bytes"
  serve on 256MiB
  serve off 256MiB
}

if [[ " $parts " == *" images "* ]]; then
  start_images
  /usr/bin/python3 "$scripts/dedup-images.py" "$image_bytes" "$work/on.sock.control" "$(uri on)" "$(uri off)" \
    "$work"/corpus/image-{0..9} >"$work/images.jsonl"
  wait "$generator"; generator=
  stop on; stop off
  info off >"$work/off.json"
  info on >"$work/on.json"
  images_table "$work/images.jsonl" "$work/off.json" "$work/on.json"
  rm -rf "$work/corpus"
  echo
fi

if [[ " $parts " == *" restarts "* ]]; then
  start_images
  rm -f "$work/exact.state"
  : >"$work/restarts.jsonl"
  images() { # first [last] [from] (written with image 0 also to the one-copy volume)
    local first_only=-
    [ "$1" = 0 ] && first_only=$(uri off)
    STATE_FILE="$work/exact.state" FIRST_INDEX=$1 /usr/bin/python3 "$scripts/dedup-images.py" "$image_bytes" \
      "$work/on.sock.control" "$(uri on)" "$first_only" $(seq -f "${3:-$work/corpus}/image-%g" "$1" "${2:-$1}") \
      >>"$work/restarts.jsonl"
  }
  images 0 1
  for pair in "2 3" "4 5" "6 7" "8 9"; do
    set -- $pair
    if [ "$1" = 4 ]; then
      images 4
      # Image 5 (kept in a file: it is read twice): half of it, then SIGKILL, a restart,
      # and the whole image again.
      mkdir -p "$work/image-5"
      cat "$work/corpus/image-5" >"$work/image-5/image-5"
      PARTIAL=0.5 FIRST_INDEX=5 /usr/bin/python3 "$scripts/dedup-images.py" "$image_bytes" \
        "$work/on.sock.control" "$(uri on)" - "$work/image-5/image-5"
      kill -KILL "${serve_pid[on]}"; wait "${serve_pid[on]}" 2>/dev/null || true; serve_pid[on]=
      echo "restarts: killed the server in the middle of image 5" >&2
      serve on 256MiB
      images 5 5 "$work/image-5"
      rm -rf "$work/image-5"
    else
      stop on
      serve on 256MiB
      images "$1" "$2"
    fi
  done
  wait "$generator"; generator=
  stop on; stop off
  info off >"$work/off.json"
  info on >"$work/on.json"
  images_table "$work/restarts.jsonl" "$work/off.json" "$work/on.json"
  rm -rf "$work/corpus"
  echo
fi

if [[ " $parts " == *" fio "* ]]; then
  cell() { # setting percentage -> "IOPS saved_fraction"
    create "$1" 2GiB 27%
    local logical; logical=$(info "$1" | python3 -c 'import json,sys; print(json.load(sys.stdin)["logical_size_bytes"])')
    serve "$1" 0
    local iops
    iops=$(fio --name=cell --ioengine=nbd --uri="$(uri "$1")" --rw=randwrite --bs=4k --iodepth=16 --numjobs=2 \
      --dedupe_percentage="$2" --refill_buffers --randrepeat=0 --norandommap --size="$logical" \
      --time_based --runtime="$seconds" --group_reporting --output-format=json 2>/dev/null |
      python3 -c 'import json,sys; t=sys.stdin.read(); print(round(json.loads(t[t.index("{"):])["jobs"][0]["write"]["iops"]))')
    stop "$1"
    info "$1" | python3 -c '
import json, sys
stats = json.load(sys.stdin)
dedup = stats.get("deduplication") or {}
logical = stats["blocks_mapped"] + dedup.get("shared_logical_blocks", 0)
print(sys.argv[1], round(dedup.get("blocks_saved", 0) / logical, 3) if logical else 0)' "$iops"
  }
  results="$work/fio.tsv"
  : >"$results"
  for percentage in ${PERCENTAGES:-0 50 90}; do
    for run in $(seq "$repeats"); do
      if (( run % 2 )); then order="off on"; else order="on off"; fi
      for setting in $order; do
        echo -e "$percentage\t$run\t$setting\t$(cell "$setting" "$percentage" | tr ' ' '\t')" >>"$results"
      done
    done
  done
  python3 - "$results" <<'PYTHON'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines()]
print("| dedupe_percentage | off IOPS (each run) | on IOPS (each run) | on ÷ off (median) | space saved, on |")
print("|---:|---|---|---:|---:|")
for percentage in dict.fromkeys(row[0] for row in rows):
    runs = {}
    for p, run, setting, iops, saved in rows:
        if p == percentage:
            runs.setdefault(run, {})[setting] = (float(iops), float(saved))
    off = [r["off"][0] for r in runs.values()]
    on = [r["on"][0] for r in runs.values()]
    ratios = [r["on"][0] / r["off"][0] for r in runs.values() if r["off"][0]]
    saved = statistics.median(r["on"][1] for r in runs.values())
    print(f"| {percentage} % | {', '.join(f'{v:.0f}' for v in off)} | {', '.join(f'{v:.0f}' for v in on)} | "
          f"**{statistics.median(ratios):.2f}** ({', '.join(f'{v:.2f}' for v in ratios)}) | {saved:.1%} |")
PYTHON
  echo
fi

if [[ " $parts " == *" copy "* ]]; then
  head -c 1G /dev/urandom >"$work/source-1GiB.bin"
  copy_cell() { # setting -> seconds
    if [ "$1" = on ]; then create on 6GiB 20% 28GiB; else create off 16GiB 20% 28GiB; fi
    serve "$1" 256MiB
    mkdir -p "$work/fuse" "$work/mnt"
    nbdfuse "$work/fuse/disk" "$(uri "$1")" >/dev/null 2>&1 &
    local fuse_pid=$!
    for _ in $(seq 100); do [ -s "$work/fuse/disk" ] && break; sleep 0.1; done
    local device; device=$(losetup -f --show "$work/fuse/disk")
    mkfs.ext4 -q -F -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$device"
    mount "$device" "$work/mnt"
    cat "$work/source-1GiB.bin" >/dev/null
    local started; started=$(date +%s.%N)
    for index in $(seq "$copies"); do cp "$work/source-1GiB.bin" "$work/mnt/$index"; done
    sync
    local took; took=$(python3 -c "import time; print(round(time.time() - $started, 1))")
    umount "$work/mnt"
    losetup -d "$device"
    fusermount3 -u "$work/fuse"
    wait "$fuse_pid" 2>/dev/null || true
    stop "$1"
    echo "$took"
  }
  time_off_and_on copy_cell "$copies × cp of a 1 GiB file + sync, ext4 on nbdfuse + loop"
  info on >"$work/copy-on.json"
  python3 - "$work/copy-on.json" <<'PYTHON'
import json, sys
dedup = json.load(open(sys.argv[1]))["deduplication"]
print(f"dedup on, last run: {dedup['shared_logical_blocks']} shared logical blocks in {dedup['shared_copies']} copies, ratio {dedup['ratio']:.2f}")
PYTHON
fi

if [[ " $parts " == *" nbd-copy "* ]]; then
  command -v qemu-io >/dev/null || { echo "bench-dedup: qemu-io is not installed (scripts/install-deps.sh)" >&2; exit 1; }
  [ -s "$work/source-1GiB.bin" ] || head -c 1G /dev/urandom >"$work/source-1GiB.bin"
  nbd_copy_cell() { # setting -> seconds
    if [ "$1" = on ]; then create on 6GiB 20% 28GiB; else create off 16GiB 20% 28GiB; fi
    serve "$1" 256MiB
    cat "$work/source-1GiB.bin" >/dev/null
    local started; started=$(date +%s.%N)
    for index in $(seq "$copies"); do
      qemu-io -f raw -c "write -q -s $work/source-1GiB.bin $((index << 30)) 1G" -c flush "$(uri "$1")" >/dev/null
    done
    local took; took=$(python3 -c "import time; print(round(time.time() - $started, 1))")
    stop "$1"
    echo "$took"
  }
  time_off_and_on nbd_copy_cell "$copies × 1 GiB written through NBD (qemu-io write -s, flush)"
fi

if [[ " $parts " == *" mount "* ]]; then
  rm -f $(members mount)
  "$stripelog" create --raid 5 --chunk 1MiB --member-size 512GiB --spare 10% --dedup on --force $(members mount) >/dev/null
  serve mount 256MiB
  fio --name=fill --ioengine=nbd --uri="$(uri mount)" --rw=write --bs=1m --iodepth=8 --size=8g --refill_buffers \
    --output-format=terse >/dev/null
  stop mount
  info mount | python3 -c '
import json, sys
stats = json.load(sys.stdin); dedup = stats["deduplication"]; data = stats["physical_data_bytes"]
ram = dedup["index_memory_bytes_per_physical_block"]; pages = dedup["name_index_pages"]
print("data space %.2f TiB; name index RAM %.3f B per physical block; on disk %d pages, %.3f B per physical block"
      % (data / 2**40, ram, pages, pages * 4096 / (data // 4096)))'
  for run in 1 2 3; do
    started=$(date +%s.%N)
    serve mount 256MiB
    serving=$(date +%s.%N)
    for _ in $(seq 6000); do
      waiting=$("$stripelog" status --control "$work/mount.sock.control" --json |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["exports"][0]["deduplication"]["name_index_pages_waiting_to_load"])')
      [ "$waiting" = 0 ] && break
      sleep 0.05
    done
    loaded=$(date +%s.%N)
    python3 -c "print(f'open {$run}: serving after {$serving - $started:.2f} s (socket polled every 0.1 s); name index loaded after {$loaded - $started:.2f} s')"
    stop mount
  done
  rm -f $(members mount)
fi
