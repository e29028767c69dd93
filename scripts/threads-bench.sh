#!/usr/bin/env bash
# Decode speed of the default thread count (-t 0: tuned while decoding)
# against every fixed count, on a quiet machine and beside one and two
# busy cores (shell loops this script starts and stops), on the tiny, demo
# and bench presets, streamed (--moe-stream, the default cache). Runs are
# interleaved (default, -t 1, -t 2, ..., then again) so a slow spell of the
# machine falls on every setting alike. Prints one row per preset and load:
# the median tok/s of each setting, and the default's as a share of the
# best fixed setting's.
#
# usage: scripts/threads-bench.sh [WORKDIR] [TOKENS] [REPS] [PRESETS]
#   PRESETS: space-separated, default "tiny demo bench" (bench is a 6 GB file)
#   BMOE=path/to/bmoe measures that binary instead of building this tree's.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench-work}
tokens=${2:-48}
reps=${3:-3}
presets=${4:-tiny demo bench}
cores=$(nproc)
mkdir -p "$work"
bmoe=${BMOE:-}
if [ -z "$bmoe" ]; then
  cargo build --release --quiet
  bmoe=target/release/bmoe
fi

hogs=()
stop_hogs() {
  for pid in "${hogs[@]}"; do kill "$pid" 2> /dev/null || true; done
  for pid in "${hogs[@]}"; do wait "$pid" 2> /dev/null || true; done
  hogs=()
}
trap stop_hogs EXIT
start_hogs() {
  for _ in $(seq 1 "$1"); do
    (while :; do :; done) &
    hogs+=($!)
  done
}

# tok/s of one run: the `decode:` line of the summary.
run() {
  local model=$1 threads=$2
  "$bmoe" generate -q -m "$model" -p "The history of the river" -n "$tokens" --moe-stream -t "$threads" 2>&1 > /dev/null \
    | sed -n 's/^decode: [^(]*(\([0-9.]*\) tok\/s).*/\1/p'
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : "nan") }'; }

settings=(0 $(seq 1 "$cores"))
printf '%-6s %-6s' preset busy
for t in "${settings[@]}"; do printf ' %10s' "$([ "$t" = 0 ] && echo default || echo "-t $t")"; done
printf ' %14s\n' "default/best"
for preset in $presets; do
  model=$work/threads-$preset.gguf
  [ -f "$model" ] || "$bmoe" make-model -q --preset "$preset" -o "$model"
  "$bmoe" generate -q -m "$model" -p "warm" -n 4 --moe-stream > /dev/null 2>&1 # page cache, repacked copy
  for busy in $(seq 0 "$cores"); do
    start_hogs "$busy"
    declare -A speeds=()
    for _ in $(seq 1 "$reps"); do
      for t in "${settings[@]}"; do
        speeds[$t]+="$(run "$model" "$t") "
      done
    done
    stop_hogs
    printf '%-6s %-6s' "$preset" "$busy"
    best=0
    declare -A med=()
    for t in "${settings[@]}"; do
      med[$t]=$(tr ' ' '\n' <<< "${speeds[$t]}" | grep . | median)
      printf ' %10s' "${med[$t]}"
      if [ "$t" != 0 ]; then best=$(awk -v a="$best" -v b="${med[$t]}" 'BEGIN { print (b > a ? b : a) }'); fi
    done
    awk -v d="${med[0]}" -v b="$best" 'BEGIN { printf " %13.2fx\n", (b > 0 ? d / b : 0) }'
    unset speeds med
  done
done
