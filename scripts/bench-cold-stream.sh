#!/usr/bin/env bash
# Client writes in one stream (`create --one-client-stream`) against the cold stream (the
# default), through
# a real NBD client in steady state: a 2.9 GiB RAID-5 volume at 27 % spare is filled,
# written for 30 s with fio's zoned 80/20 random 4 KiB writes (80 % of the writes to the
# first 20 % of the blocks), then measured for 60 s more: IOPS, the cleaning write
# amplification of that minute (from the control socket's counters) and the blocks that
# went to the cold stream. Usage, after `cargo build --release` and scripts/install-deps.sh:
#   scripts/bench-cold-stream.sh DIRECTORY [ROUNDS]
set -euo pipefail
directory=${1:?usage: scripts/bench-cold-stream.sh DIRECTORY [ROUNDS]}
rounds=${2:-2}
stripelog=${STRIPELOG:-$PWD/target/release/stripelog}
[ -x "$stripelog" ] || { echo "bench-cold-stream: build first: cargo build --release" >&2; exit 1; }
for tool in fio python3; do
  command -v "$tool" >/dev/null || { echo "bench-cold-stream: $tool is missing (scripts/install-deps.sh)" >&2; exit 1; }
done
mkdir -p "$directory"
directory=$(cd "$directory" && pwd)
# The runs create (--force) and remove m0 … m4 there: never over files that exist.
for name in m0 m1 m2 m3 m4 s.sock; do
  if [ -e "$directory/$name" ]; then
    echo "bench-cold-stream: $directory/$name exists; give an empty directory (nothing there is overwritten)" >&2
    exit 1
  fi
done
server=
created=false
cleanup() {
  [ -n "$server" ] && kill -TERM "$server" 2>/dev/null && wait "$server" 2>/dev/null
  if $created; then rm -f "$directory"/m[0-4] "$directory"/s.sock "$directory"/s.sock.control "$directory"/serve.log; fi
}
trap cleanup EXIT
one_run() { # CREATE-FLAG (empty: the default, with the cold stream) LABEL
  cleanup; server=; created=true
  (cd "$directory" && "$stripelog" create --force $1 --raid 5 --chunk 256KiB --spare 27% --member-size 1GiB m0 m1 m2 m3 m4 >/dev/null)
  (cd "$directory" && exec "$stripelog" serve m0 m1 m2 m3 m4 --socket s.sock 2>serve.log) &
  server=$!
  for _ in $(seq 100); do [ -S "$directory/s.sock" ] && break; sleep 0.1; done
  local uri="nbd+unix:///stripelog?socket=$directory/s.sock"
  local zoned=(--ioengine=nbd --uri="$uri" --rw=randwrite --bs=4k --iodepth=32 --size=2900m
    --random_distribution=zoned:80/20:20/80 --time_based)
  fio --name=fill --ioengine=nbd --uri="$uri" --rw=write --bs=1m --iodepth=8 --size=2900m >/dev/null
  fio --name=warm "${zoned[@]}" --runtime=30 >/dev/null
  local before after result
  before=$("$stripelog" status --json --control "$directory/s.sock.control")
  result=$(fio --name=zoned "${zoned[@]}" --runtime=60 --output-format=json)
  after=$("$stripelog" status --json --control "$directory/s.sock.control")
  python3 - "$before" "$after" "$result" "$2" <<'PY'
import json, sys
before = json.loads(sys.argv[1])["exports"][0]["counters"]
after = json.loads(sys.argv[2])["exports"][0]["counters"]
text = sys.argv[3]
fio = json.loads(text[text.index("{"):])
written = after["host_bytes_written"] - before["host_bytes_written"]
cleaned = (after["write_amplification_since_open"]["cleaning_write_cost"] * after["host_bytes_written"]
           - before["write_amplification_since_open"]["cleaning_write_cost"] * before["host_bytes_written"])
cold = after.get("blocks_written_cold", 0) - before.get("blocks_written_cold", 0)
print(f"{sys.argv[4]:<14} zoned 80/20, 60 s: {fio['jobs'][0]['write']['iops']:>8.0f} IOPS, "
      f"cleaning WA {cleaned / written:.3f}, cold stream {cold * 4096 / written * 100:.1f} % of the writes")
PY
  kill -TERM "$server"; wait "$server" 2>/dev/null || true; server=
}
for _ in $(seq "$rounds"); do
  one_run --one-client-stream "one stream"
  one_run "" "cold stream"
done
