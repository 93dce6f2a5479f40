#!/usr/bin/env bash
# The cleaner's write amplification on the issue's workloads (`stripelog sim gc`), as a
# markdown table: uniform writes at five spare fractions with both policies; hot/cold and
# Zipf workloads with both policies and the one-log greedy baseline (no separation).
# Usage: [CHUNK=256KiB] scripts/sim-gc-grid.sh [OUTPUT_DIRECTORY]
# With the default 1 MiB chunk (segments of 1024 blocks, 5 GiB of RAM) the grid takes
# about an hour on 2 cores; with CHUNK=256KiB (256 blocks per segment) a few minutes.
set -euo pipefail
stripelog=${STRIPELOG:-./target/release/stripelog}
out=${1:-sim-gc-results}
chunk=${CHUNK:-1MiB}
[ -x "$stripelog" ] || { echo "sim-gc-grid: build first: cargo build --release" >&2; exit 1; }
mkdir -p "$out"
runs=()
for spare in 7 13 20 27 40; do
  for policy in greedy cost-benefit; do runs+=("uniform $spare $policy sep"); done
done
for workload in hotcold:90/10 hotcold:80/20; do
  for spare in 13 27; do
    runs+=("$workload $spare greedy one-log" "$workload $spare greedy sep" "$workload $spare cost-benefit sep")
  done
done
for exponent in 0.6 0.8 1.0; do
  runs+=("zipf:$exponent 27 greedy one-log" "zipf:$exponent 27 greedy sep" "zipf:$exponent 27 cost-benefit sep")
done
echo "| workload | spare | policy | placement | write amplification | analytic greedy (uniform) | at the spare left for data | total with RAID-5 |"
echo "|---|---:|---|---|---:|---:|---:|---:|"
for run in "${runs[@]}"; do
  set -- $run
  json="$out/$(echo "$1-$2-$3-$4" | tr ':/' '__').json"
  flags=()
  [ "$4" = one-log ] && flags+=(--no-separation)
  "$stripelog" sim gc --workload "$1" --spare "$2%" --policy "$3" --chunk "$chunk" "${flags[@]}" --json "$json" >/dev/null
  python3 - "$json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def figure(value):
    return "" if value is None else f"{value:.2f}"
placement = "streams" if r["separate_streams"] else "one log"
print(f"| {r['workload']} | {r['spare_fraction']*100:.0f} % | {r['policy']} | {placement} | {r['write_amplification']:.2f} "
      f"| {figure(r['reference_greedy_uniform'])} | {figure(r['reference_greedy_uniform_for_data'])} | {r['total_amplification']:.2f} |")
PY
done
