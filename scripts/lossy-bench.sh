#!/usr/bin/env bash
# What the lossy settings cost on the bench model under a memory cap of a
# third of the file: decode speed and MiB read per token (bmoe bench) beside
# the KL divergence from the exact run and top-1 agreement (bmoe bench --kl),
# the exact streamed run as the zero point. Two matrices: --n-expert-used 8..2
# and the drop-cold plugin's thresholds with the automatic cache, then
# drop-cold again with a cache of a quarter of the cap (drop-cold drops only
# cache misses, which the automatic cache leaves few of). Needs root (the cap
# is a cgroup).
#
# usage: sudo scripts/lossy-bench.sh [WORKDIR] [TOKENS] [REPS] [KL_POSITIONS]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench-work}
tokens=${2:-32}
reps=${3:-2}
positions=${4:-128}
source scripts/bench-model.sh
cap=$(( $(stat -c %s "$model") / 3 / 1048576 ))
configs=(--setting "exact=--moe-stream")
for k in 6 4 3 2; do configs+=(--setting "top$k=--moe-stream --n-expert-used $k"); done
for f in 0.25 0.5 0.75 1; do configs+=(--setting "cold-F$f=--moe-stream --drop-plugin drop-cold --drop-param F=$f"); done
$bmoe bench -m "$model" --cap-mb "$cap" --reps "$reps" -n "$tokens" --kl "$positions" \
  --csv "$work/lossy-bench.csv" --work "$work/lossy-runs" "${configs[@]}"
small=$(( cap / 4 ))
configs=(--setting "c$small=--moe-stream --cache-mb $small")
for f in 0.25 0.5 0.75 1; do
  configs+=(--setting "c$small-F$f=--moe-stream --cache-mb $small --drop-plugin drop-cold --drop-param F=$f")
done
$bmoe bench -m "$model" --cap-mb "$cap" --reps "$reps" -n "$tokens" --kl "$positions" \
  --csv "$work/lossy-bench-small-cache.csv" --work "$work/lossy-runs" "${configs[@]}"
