#!/usr/bin/env bash
# The cleaner's write amplification on the issue's workloads (`stripelog sim gc`), as a
# markdown table: uniform writes at five spare fractions with both policies; hot/cold and
# Zipf workloads with both policies and the one-log greedy baseline (no separation).
# Usage: [JOBS=2] [SEGMENTS=2048] [CHUNK=256KiB] scripts/sim-gc-grid.sh [OUTPUT_DIRECTORY]
# Runs JOBS cells at a time (each is single-threaded and deterministic; 2048 segments of
# 256 KiB chunks take 2.5 GiB of RAM); about 20 minutes on 2 cores.
set -euo pipefail
stripelog=${STRIPELOG:-./target/release/stripelog}
out=${1:-sim-gc-results}
chunk=${CHUNK:-256KiB}
segments=${SEGMENTS:-2048}
jobs=${JOBS:-2}
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
json_of() { echo "$out/$(echo "$1-$2-$3-$4" | tr ':/' '__').json"; }
for run in "${runs[@]}"; do
  set -- $run
  flags=()
  [ "$4" = one-log ] && flags+=(--no-separation)
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n; done
  "$stripelog" sim gc --workload "$1" --spare "$2%" --policy "$3" --chunk "$chunk" --segments "$segments" \
    "${flags[@]}" --json "$(json_of "$@")" >/dev/null &
done
wait
echo "| workload | spare | policy | placement | write amplification | analytic greedy (uniform) | after the cleaner's reserve | summaries | total with RAID-5 |"
echo "|---|---:|---|---|---:|---:|---:|---:|---:|"
for run in "${runs[@]}"; do
  set -- $run
  python3 - "$(json_of "$@")" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
def figure(value):
    return "" if value is None else f"{value:.2f}"
placement = "streams" if r["separate_streams"] else "one log"
print(f"| {r['workload']} | {r['spare_fraction']*100:.0f} % | {r['policy']} | {placement} | {r['write_amplification']:.2f} "
      f"| {figure(r['reference_greedy_uniform'])} | {figure(r['reference_greedy_uniform_for_data'])} "
      f"| {r['summary_share']*100:.2f} % | {r['total_amplification']:.2f} |")
PY
done
