#!/bin/bash
# Rebuild speed of one 2 GiB member of a full RAID-5 volume (5 file members), offline,
# against the same disk's sequential 1 MiB O_DIRECT write bandwidth on a fresh file.
set -e
S=${STRIPELOG:-./target/release/stripelog}
d=${1:-stripelog-rebuild-speed}; mkdir -p "$d"; d=$(cd "$d" && pwd)
rm -f $d/m* $d/new* $d/seq
$S create --raid 5 --chunk 1MiB --spare 27% --member-size 2GiB $d/m0 $d/m1 $d/m2 $d/m3 $d/m4 >/dev/null
$S bench mix "engine:$d/m0,$d/m1,$d/m2,$d/m3,$d/m4" --force --quiet --pattern sequential --block-size 1MiB --queue-depth 4 --duration 60s --json /dev/null --region 5GiB >/dev/null 2>&1 || true
$S info $d/m0 $d/m1 $d/m2 $d/m3 $d/m4 | grep -E "mapped|segments"
rm $d/m2
$S replace --member 2 --with $d/new2 --json $d/m0 $d/m1 $d/m2 $d/m3 $d/m4 > $d/rebuild.json 2>/dev/null
cat $d/rebuild.json
fio --name=seq --filename=$d/seq --size=2g --rw=write --bs=1m --direct=1 --ioengine=io_uring --iodepth=4 --output-format=json 2>/dev/null | python3 -c 'import json,sys; t=sys.stdin.read(); j=json.loads(t[t.index("{"):])["jobs"][0]; print("fio sequential write MB/s", round(j["write"]["bw_bytes"]/1e6))'
python3 -c 'import json; r=json.load(open("'$d'/rebuild.json")); print("rebuild MB/s", round(r["bytes_written"]/r["seconds"]/1e6))'
$S check $d/m0 $d/m1 $d/new2 $d/m3 $d/m4 | tail -1
rm -f $d/seq
