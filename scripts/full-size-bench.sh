#!/usr/bin/env bash
# The headline numbers: full-size presets (random weights in a real model's
# shape, vocabulary and release quantization) under memory caps, in the
# memory-capped harness: mmap, streaming with no cache, and bmoe's default
# (streaming with the auto cache). qwen3-30b-a3b (Q4_K_M, 17.3 GiB) under
# 4 GiB and 8 GiB, gpt-oss-20b (MXFP4, 11.3 GiB) under 4 GiB. Needs root
# (the harness makes a cgroup) and about 30 GB of disk for the two models.
#
# usage: sudo scripts/full-size-bench.sh [WORKDIR] [TOKENS] [REPS]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench-work}
tokens=${2:-16}
reps=${3:-2}
mkdir -p "$work"
cargo build --release --quiet
bmoe=target/release/bmoe
for preset in qwen3-30b-a3b gpt-oss-20b; do
  [ -f "$work/$preset.gguf" ] || $bmoe make-model --preset "$preset" -o "$work/$preset.gguf"
done
run() {
  local preset=$1 cap=$2
  echo "== $preset under $cap MiB"
  $bmoe bench -m "$work/$preset.gguf" --cap-mb "$cap" --reps "$reps" -n "$tokens" \
    --setting "mmap=" --setting "stream-cache0=--moe-stream --cache-mb 0" --setting "default=--moe-stream" \
    --csv "$work/full-$preset-$cap.csv" --work "$work/full-runs"
}
run qwen3-30b-a3b 4096
run qwen3-30b-a3b 8192
run gpt-oss-20b 4096
