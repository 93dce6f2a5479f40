#!/bin/bash
# Foreground I/O during an online rebuild. A RAID-5 volume of 5 × 2 GiB file members,
# 4 GiB of it written, is served over NBD; 4 KiB random I/O (70 % reads, depth 16, 10 s,
# `stripelog bench mix` over NBD) runs healthy, degraded (one member file deleted), during
# the online rebuild of that member at full speed, and during a second rebuild at
# --rate 50MiB. Prints IOPS, the ratios to healthy and each rebuild's speed.
set -e
S=${STRIPELOG:-./target/release/stripelog}
d=${1:-stripelog-rebuild-foreground}; mkdir -p "$d"; d=$(cd "$d" && pwd)
rm -f $d/m? $d/new* $d/*.json $d/s.sock $d/s.sock.control
members="$d/m0 $d/m1 $d/m2 $d/m3 $d/m4"
$S create --raid 5 --chunk 1MiB --spare 27% --member-size 2GiB $members >/dev/null
$S bench mix "engine:$d/m0,$d/m1,$d/m2,$d/m3,$d/m4" --force --quiet --pattern sequential --block-size 1MiB \
    --queue-depth 4 --region 4GiB --write-limit 4GiB --duration 120s --json /dev/null >/dev/null
$S serve --socket $d/s.sock $members 2>$d/serve.log &
server=$!
trap 'kill -TERM $server 2>/dev/null || true; wait $server 2>/dev/null || true' EXIT
for _ in $(seq 600); do [ -S $d/s.sock ] && [ -S $d/s.sock.control ] && break; sleep 0.1; done
uri="nbd+unix:///stripelog?socket=$d/s.sock"
iops() { python3 -c 'import json,sys; j=json.load(open(sys.argv[1])); print(round(j["read"]["iops"]+j["write"]["iops"]))' "$1"; }
measure() {
    $S bench mix "$uri" --read-percent 70 --queue-depth 16 --region 4GiB --duration 10s --seed 7 --quiet --json $d/$1.json >/dev/null
    echo "$1: $(iops $d/$1.json) IOPS"
}
rebuild() { # NAME REPLACED NEW [RATE]
    $S replace --control $d/s.sock.control --member $2 --with $3 ${4:+--rate $4} --json > $d/$1-report.json &
    local replacing=$!
    sleep 1
    measure "$1"
    wait $replacing
    python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print("  rebuild: %.1f s, %.0f MB/s" % (r["seconds"], r["bytes_written"]/r["seconds"]/1e6))' $d/$1-report.json
}
measure healthy
rm $d/m2; sleep 3
measure degraded
rebuild rebuilding $d/m2 $d/new2
rm $d/new2; sleep 3
rebuild rebuilding-50MiB $d/new2 $d/new2b 50MiB
python3 - "$d" <<'PY'
import json, sys
d = sys.argv[1]
def iops(name):
    j = json.load(open(f"{d}/{name}.json"))
    return j["read"]["iops"] + j["write"]["iops"]
healthy = iops("healthy")
for name in ["degraded", "rebuilding", "rebuilding-50MiB"]:
    print(f"{name} ÷ healthy: {iops(name) / healthy:.2f}")
PY
kill -TERM $server; wait $server || true; trap - EXIT
$S check $d/m0 $d/m1 $d/new2b $d/m3 $d/m4 | tail -1
