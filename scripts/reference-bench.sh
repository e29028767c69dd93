#!/usr/bin/env bash
# Resident decode speed side by side with the reference: plain llama.cpp
# (the source llama-cpp-sys-2 vendors, from cargo's registry; its tools are
# not vendored, so scripts/reference/decode.c is a minimal greedy decoder
# over its public API) built for the host CPU with llama.cpp's defaults, on
# the same model file, and the same reference with weight repacking off
# (resident bmoe repacks its expert banks as llama.cpp does when the model
# fits in memory, `--repack auto`; dense weights keep the file's layout).
# Alternates the three, REPS times each, and prints every run and the
# median ratios. Builds the reference once into target/llama-ref
# (a full llama.cpp build: several minutes on two cores).
#
# usage: scripts/reference-bench.sh [MODEL] [TOKENS] [REPS] [THREADS]
#   MODEL defaults to the bench preset (made under bench-work/ if missing).
set -euo pipefail
cd "$(dirname "$0")/.."
tokens=${2:-128}
reps=${3:-3}
threads=${4:-$(nproc)}
work=bench-work
if [ -n "${1:-}" ]; then
  cargo build --release --quiet
  bmoe=target/release/bmoe
  model=$1
else
  source scripts/bench-model.sh
fi

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

prompt="The capital of Japan is"
speed() { sed -n 's/^decode: [^(]*(\([0-9.]*\) tok\/s).*/\1/p'; }
echo "model $model, $tokens tokens, $threads threads, $reps alternations"
echo "reference $("$ref/reference-decode" "$model" "$prompt" 2 "$threads" | sed -n 's/^cpu: *//p')"
echo "bmoe      $($bmoe --version | sed -n 's/^llama.cpp CPU: *//p')"
ref_runs=()
plain_runs=()
bmoe_runs=()
for i in $(seq 1 "$reps"); do
  r=$("$ref/reference-decode" "$model" "$prompt" "$tokens" "$threads" | speed)
  p=$("$ref/reference-decode" "$model" "$prompt" "$tokens" "$threads" norepack | speed)
  b=$($bmoe generate -m "$model" -p "$prompt" -n "$tokens" -t "$threads" 2>&1 > /dev/null | speed)
  echo "run $i: reference $r tok/s, reference without repacking $p tok/s, bmoe $b tok/s"
  ref_runs+=("$r")
  plain_runs+=("$p")
  bmoe_runs+=("$b")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
r=$(median "${ref_runs[@]}")
p=$(median "${plain_runs[@]}")
b=$(median "${bmoe_runs[@]}")
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }
echo "median: reference $r tok/s, without repacking $p tok/s, bmoe $b tok/s"
echo "bmoe / reference $(ratio "$b" "$r")x; bmoe / reference without repacking $(ratio "$b" "$p")x"
