#!/usr/bin/env bash
# Resident decode and prefill speed side by side with the reference: plain
# llama.cpp (the source llama-cpp-sys-2 vendors, from cargo's registry; its
# tools are not vendored, so scripts/reference/decode.c is a minimal greedy
# decoder over its public API) built for the host CPU with llama.cpp's
# defaults, on the same model file, and the same reference with weight
# repacking off. Each run reads a prompt of about 450 tokens in one batch
# (prefill), then decodes TOKENS tokens one at a time (decode). Alternates
# the three, REPS times each, and prints every run and the median ratios.
# Builds the reference once into target/llama-ref (a full llama.cpp build:
# several minutes on two cores).
#
# usage: scripts/reference-bench.sh [MODEL] [TOKENS] [REPS] [THREADS]
#   MODEL defaults to the bench preset (made under bench-work/ if missing;
#   PRESET=qwen3-30b-a3b picks another preset). BMOE_FLAGS adds flags to
#   bmoe's runs (e.g. "--no-batch-invariant").
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${2:-128}
reps=${3:-3}
threads=${4:-$(nproc)}
work=bench-work
model_file=${1:-}
source scripts/bench-model.sh

# The vendored llama.cpp of the pinned llama-cpp-sys-2.
version=$(grep -A1 '^name = "llama-cpp-sys-2"' Cargo.lock | sed -n 's/^version = "\(.*\)"/\1/p')
src=$(find "${CARGO_HOME:-$HOME/.cargo}/registry/src" -maxdepth 2 -type d -name "llama-cpp-sys-2-$version" | head -1)/llama.cpp
[ -d "$src" ] || { echo "reference-bench: no vendored llama.cpp for llama-cpp-sys-2 $version (run cargo build first)" >&2; exit 1; }
ref=target/llama-ref
if [ ! -x "$ref/reference-decode" ]; then
  echo "reference-bench: building the reference decoder against $src for the host CPU (GGML_NATIVE=ON)..." >&2
  cmake -S scripts/reference -B "$ref" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_SRC="$src" > "$ref.log" 2>&1
  cmake --build "$ref" --target reference-decode -j "$(nproc)" >> "$ref.log" 2>&1
fi

# About 450 tokens on the bench preset; the reference reads at most 512.
prompt=$(python3 scripts/long-prompt.py 170)
decode_speed() { sed -n 's/^decode: [^(]*(\([0-9.]*\) tok\/s).*/\1/p'; }
prefill_speed() { sed -n 's/^decode: .*| prefill: \([0-9]*\) tokens (\([0-9.]*\) tok\/s).*/\2/p'; }
prompt_tokens() { sed -n 's/^decode: .*| prefill: \([0-9]*\) tokens.*/\1/p'; }
read -r -a bmoe_flags <<< "${BMOE_FLAGS:-}"
echo "model $model, $tokens tokens, $threads threads, $reps alternations, bmoe flags: ${BMOE_FLAGS:-(defaults)}"
echo "reference $("$ref/reference-decode" "$model" "x" 2 "$threads" | sed -n 's/^cpu: *//p')"
echo "bmoe      $($bmoe --version | sed -n 's/^llama.cpp CPU: *//p')"
declare -a ref_d ref_p plain_d plain_p bmoe_d bmoe_p
for i in $(seq 1 "$reps"); do
  r=$("$ref/reference-decode" "$model" "$prompt" "$tokens" "$threads")
  p=$("$ref/reference-decode" "$model" "$prompt" "$tokens" "$threads" norepack)
  b=$($bmoe generate -m "$model" -p "$prompt" -n "$tokens" -t "$threads" "${bmoe_flags[@]}" 2>&1 > /dev/null | grep '^decode:')
  ref_d+=("$(decode_speed <<< "$r")"); ref_p+=("$(prefill_speed <<< "$r")")
  plain_d+=("$(decode_speed <<< "$p")"); plain_p+=("$(prefill_speed <<< "$p")")
  bmoe_d+=("$(decode_speed <<< "$b")"); bmoe_p+=("$(prefill_speed <<< "$b")")
  echo "run $i (prompt: reference $(prompt_tokens <<< "$r") tokens, bmoe $(prompt_tokens <<< "$b")), tok/s decode / prefill:" \
    "reference ${ref_d[-1]} / ${ref_p[-1]}, reference without repacking ${plain_d[-1]} / ${plain_p[-1]}," \
    "bmoe ${bmoe_d[-1]} / ${bmoe_p[-1]}"
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
rd=$(median "${ref_d[@]}"); rp=$(median "${ref_p[@]}")
pd=$(median "${plain_d[@]}"); pp=$(median "${plain_p[@]}")
bd=$(median "${bmoe_d[@]}"); bp=$(median "${bmoe_p[@]}")
echo "median tok/s, decode / prefill: reference $rd / $rp, without repacking $pd / $pp, bmoe $bd / $bp"
echo "bmoe / reference: decode $(ratio "$bd" "$rd")x, prefill $(ratio "$bp" "$rp")x"
echo "bmoe / reference without repacking: decode $(ratio "$bd" "$pd")x, prefill $(ratio "$bp" "$pp")x"
