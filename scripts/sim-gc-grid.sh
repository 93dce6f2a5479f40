#!/usr/bin/env bash
# The cleaner's write amplification on the issue's workloads (`stripelog sim gc`), each
# policy, as a markdown table. Usage: scripts/sim-gc-grid.sh [OUTPUT_DIRECTORY]
set -euo pipefail
stripelog=${STRIPELOG:-./target/release/stripelog}
out=${1:-sim-gc-results}
[ -x "$stripelog" ] || { echo "sim-gc-grid: build first: cargo build --release" >&2; exit 1; }
mkdir -p "$out"
cells=()
for spare in 7 13 20 27 40; do cells+=("uniform $spare"); done
for workload in hotcold:90/10 hotcold:80/20; do for spare in 13 27; do cells+=("$workload $spare"); done; done
for exponent in 0.6 0.8 1.0; do cells+=("zipf:$exponent 27"); done
echo "| workload | spare | policy | write amplification | reference (greedy, analytic) | total with RAID-5 |"
echo "|---|---:|---|---:|---:|---:|"
for cell in "${cells[@]}"; do
  set -- $cell
  for policy in greedy cost-benefit; do
    json="$out/$(echo "$1-$2-$policy" | tr ':/' '__').json"
    "$stripelog" sim gc --workload "$1" --spare "$2%" --policy "$policy" --json "$json" >/dev/null
    python3 - "$json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
ref = r["reference_greedy_uniform"]
print(f"| {r['workload']} | {r['spare_fraction']*100:.0f} % | {r['policy']} | {r['write_amplification']:.2f} | {'' if ref is None else f'{ref:.2f}'} | {r['total_amplification']:.2f} |")
PY
  done
done
