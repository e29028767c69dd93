#!/usr/bin/env bash
# Measures how the bench model routes, next to real models' route traces.
#
# usage: scripts/routing-realism.sh [WORKDIR] [REAL_TRACE_DIR]
#   WORKDIR          where the bench model and traces go (default: bench-work/)
#   REAL_TRACE_DIR   reference route traces (default: ../shared/data/route-traces)
#
# Prints, per trace: distinct experts per layer over the decode window,
# previous-token overlap, share of the top 10% experts, and the hit rate of a
# global LRU holding 10/25/50% of all (layer, expert) entries.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench-work}
real=${2:-../shared/data/route-traces}
source scripts/bench-model.sh
prompt="The history of the city begins in the early medieval period, when a small settlement grew around the river crossing and its market."
for k in 6 8; do
  # A cache larger than the bank: every expert is read once, the trace is pure routing.
  $bmoe generate -m "$model" -p "$prompt" -n 257 --moe-stream --cache-mb 100000 \
    --n-expert-used $k --route-trace "$work/bench-k$k.trace" > /dev/null
done
reals=()
for f in qwen gemma gptoss; do [ -f "$real/$f.route.csv" ] && reals+=("$real/$f.route.csv"); done
echo "== first 128 decode tokens (the length of the reference traces)"
$bmoe trace-stats --tokens 128 "$work/bench-k6.trace" "$work/bench-k8.trace" "${reals[@]}"
echo "== 256 decode tokens"
$bmoe trace-stats --tokens 256 "$work/bench-k6.trace" "$work/bench-k8.trace"
