#!/usr/bin/env bash
# The bench model under a memory cap of a third of the file on each class of
# disk: the machine's own disk, then reads throttled to a phone's UFS (2000
# MB/s), a Pi 5's NVMe (800), eMMC (300) and a microSD card (90), by the
# harness's cgroup (bmoe bench --disk-class). Per class: mmap (with fewer
# tokens: under the cap it re-reads the file for every token), the cache off,
# the default (io_uring into registered memory) and the default with
# positioned reads (--no-io-uring); then the replay's bytes per token at the default run's
# cache budget for the live policies and Belady's offline optimum, on a route
# trace of the same prompt. Needs root (the cap and the throttle are a cgroup).
#
# usage: sudo scripts/disk-classes.sh [WORKDIR] [TOKENS] [REPS] [MMAP_TOKENS] [CLASSES]
#   CLASSES: a space-separated list from "fast ufs nvme emmc sd" (default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench-work}
tokens=${2:-32}
reps=${3:-2}
mmap_tokens=${4:-4}
classes=${5:-fast ufs nvme emmc sd}
source scripts/bench-model.sh
cap=$(( $(stat -c %s "$model") / 3 / 1048576 ))
prompt="The capital of Japan is"
for class in $classes; do
  throttle=()
  [ "$class" = fast ] || throttle=(--disk-class "$class")
  echo "== $class =="
  $bmoe bench -m "$model" --cap-mb "$cap" --reps "$reps" -n "$mmap_tokens" -p "$prompt" "${throttle[@]}" \
    --setting "mmap=" --csv "$work/disk-$class-mmap.csv" --work "$work/disk-runs"
  $bmoe bench -m "$model" --cap-mb "$cap" --reps "$reps" -n "$tokens" -p "$prompt" "${throttle[@]}" \
    --setting "cache-off=--moe-stream --cache-mb 0" --setting "default=--moe-stream" \
    --setting "positioned=--moe-stream --no-io-uring" \
    --csv "$work/disk-$class.csv" --work "$work/disk-runs"
done
# The default run's cache budget (the CSV's cache_budget_mib) and a trace of its routing.
first=$(echo "$classes" | awk '{print $1}')
budget=$(awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == "cache_budget_mib") col = i; next }
                  $2 == "default" && $4 == "true" { print $col; exit }' "$work/disk-$first.csv")
$bmoe generate -q -m "$model" -p "$prompt" -n "$tokens" --moe-stream --route-trace "$work/disk-trace.csv" > /dev/null
echo "== replay at the default's budget, $budget MiB =="
$bmoe replay "$work/disk-trace.csv" --cache-mb "$budget" --policy decay,lru,foresight,belady
