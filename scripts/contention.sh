#!/usr/bin/env bash
# Decode speed with another process busy on one core, against a quiet
# machine: `bmoe bench` runs the matrix quiet, then again with a busy loop
# pinned to the last core. Two workloads on the bench model, no memory cap:
#   cache0: every routed expert re-read every token (read-bound);
#   full:   a cache holding the whole bank, after an unmeasured warm-up run
#           of the same length (compute-bound);
# each with the default (tuned) compute threads and with two fixed threads,
# experts in the file's layout (`--repack off`, as a capped run keeps them).
# Page cache dropping and the cgroup need root; without it runs start warm.
#
# usage: scripts/contention.sh [WORKDIR] [TOKENS] [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench-work}
tokens=${2:-128}
reps=${3:-3}
source scripts/bench-model.sh
$bmoe bench -m "$model" --reps "$reps" -n "$tokens" --hog --common "--repack off" \
  --csv "$work/contention.csv" --work "$work/contention-runs" \
  --setting "cache0=--moe-stream --cache-mb 0" \
  --setting "cache0-t2=--moe-stream --cache-mb 0 -t 2" \
  --setting "full=--moe-stream --cache-mb 6000 --warmup $tokens" \
  --setting "full-t2=--moe-stream --cache-mb 6000 --warmup $tokens -t 2"
