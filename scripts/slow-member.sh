#!/bin/bash
# One slow member of five (20 ms latency spikes on 10 % of its reads and writes): random
# read latency, random and sequential write throughput, with and without hedged reads and
# per-member write queues, against the same volume with no slow member. ROUNDS rounds
# (default 3), each printing its table; BENCHMARKS.md records them.
set -e
S=${STRIPELOG:-./target/release/stripelog}
d=${1:-stripelog-slow-member}; mkdir -p "$d"; d=$(cd "$d" && pwd)
ROUNDS=${ROUNDS:-3}
for round in $(seq 1 "$ROUNDS"); do
    echo "== round $round"
    $S bench slow-member --members $d/m0,$d/m1,$d/m2,$d/m3,$d/m4 --member-size 2GiB --force --quiet \
        --spike-latency 20ms --spike-fraction 10% --queue-depth 16 --duration 10s --region 2GiB \
        --seed "$round" --json $d/slow-member-$round.json
done
rm -f $d/m0 $d/m1 $d/m2 $d/m3 $d/m4
