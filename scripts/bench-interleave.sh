#!/usr/bin/env bash
# Two stripelog binaries compared in turn, ROUNDS rounds each: `bench engine` (fresh 4 KiB
# random writes and reads against the members' sequential bandwidth) and `bench saturate`
# (steady state on a full volume with the cleaner running). Prints each round and the
# means, new ÷ old. Usage:
#   [FORCE=1] scripts/bench-interleave.sh OLD_BINARY NEW_BINARY DIRECTORY [ROUNDS=3]
# DIRECTORY must be empty or new (FORCE=1 allows one that holds files; the benchmarks
# write ~40 GB of member files under it, removed after each run); results stay in
# DIRECTORY/results.
set -euo pipefail
old=${1:?usage: scripts/bench-interleave.sh OLD NEW DIRECTORY [ROUNDS]}
new=${2:?usage: scripts/bench-interleave.sh OLD NEW DIRECTORY [ROUNDS]}
directory=${3:?usage: scripts/bench-interleave.sh OLD NEW DIRECTORY [ROUNDS]}
rounds=${4:-3}
for binary in "$old" "$new"; do
  [ -x "$binary" ] || { echo "bench-interleave: $binary is not an executable" >&2; exit 1; }
done
if [ "${FORCE:-0}" != 1 ] && [ -d "$directory" ] && [ -n "$(ls -A "$directory")" ]; then
  echo "bench-interleave: $directory is not empty (it holds $(ls -A "$directory" | head -3 | tr '\n' ' ')...): choose an empty directory, or pass FORCE=1" >&2
  exit 1
fi
mkdir -p "$directory/results"
results=$directory/results
cleanup() { rm -rf "$directory/engine" "$directory/saturate"; }
trap cleanup EXIT
for round in $(seq "$rounds"); do
  for which in old new; do
    binary=${!which}
    cleanup
    "$binary" bench engine --dir "$directory/engine" --members 5 --member-size 8GiB --threads 1,4 \
      --read-threads 1,8 --duration 10s --json "$results/engine-$which-$round.json" > "$results/engine-$which-$round.txt" 2>&1
    cleanup
    "$binary" bench saturate --dir "$directory/saturate" --member-size 2GiB --passes 3 --time-limit 480s --quiet \
      --json "$results/saturate-$which-$round.json" > "$results/saturate-$which-$round.txt" 2>&1
  done
done
python3 - "$results" "$rounds" <<'PYTHON'
import json, os, statistics, sys
results, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for which in ('old', 'new'):
    for round_number in range(1, rounds + 1):
        engine = json.load(open(os.path.join(results, f'engine-{which}-{round_number}.json')))
        saturate = json.load(open(os.path.join(results, f'saturate-{which}-{round_number}.json')))
        writes = {run['threads']: run for run in engine['random_write']}
        reads = {run['threads']: run for run in engine['random_read']}
        rows.setdefault(which, []).append({
            'write1': writes[1]['iops'], 'ratio1': writes[1]['ratio_to_sequential'],
            'write4': writes[4]['iops'], 'ratio4': writes[4]['ratio_to_sequential'],
            'read1': reads[1]['iops'], 'read8': reads[8]['iops'],
            'steady': saturate['writes'] / saturate['seconds'], 'steady_seq': saturate['ratio_to_sequential'],
            'steady_cleaner': saturate['ratio_to_cleaner_bound'], 'steady_span': saturate['ratio_to_span_read_bound'],
            'wa': saturate['write_amplification'], 'p99_us': saturate['latency_p99_ns'] / 1e3})
keys = list(rows['old'][0])
cell = lambda value: f'{value:>16.3f}' if value < 10 else f'{value:>16.0f}'
print('binary round ' + ''.join(f'{key:>16s}' for key in keys))
for which, runs in rows.items():
    for index, run in enumerate(runs):
        print(f'{which:6s} {index + 1:5d} ' + ''.join(cell(run[key]) for key in keys))
mean = {which: {key: statistics.mean(run[key] for run in runs) for key in keys} for which, runs in rows.items()}
for which in rows:
    print(f'{which:6s} mean  ' + ''.join(cell(mean[which][key]) for key in keys))
print('new ÷ old    ' + ''.join(f'{mean["new"][key] / mean["old"][key]:>16.3f}' for key in keys))
PYTHON
