#!/usr/bin/env bash
# Decode speed of several bmoe runs paired round by round: each round runs
# every configuration once, one after the other, on the same model and
# prompt (resident, bench preset by default), so a slow spell of the machine
# falls on all of them; prints each round's decode tok/s and, per
# configuration, the median of its ratio to the first one's.
#
# usage: scripts/decode-ab.sh [WORKDIR] [TOKENS] [ROUNDS] NAME=BINARY[ FLAGS...] ...
#   e.g. scripts/decode-ab.sh bench-work 128 16 \
#          "before=/tmp/bmoe-before --batch-invariant" \
#          "after=target/release/bmoe --batch-invariant" \
#          "fast=target/release/bmoe --no-batch-invariant"
#   THREADS=2 compute threads (a fixed count, so the thread tuner is not
#   part of the comparison); PRESET=name another preset.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench-work}
tokens=${2:-128}
rounds=${3:-8}
shift $(($# < 3 ? $# : 3))
[ $# -ge 2 ] || { echo "decode-ab: give two configurations or more, NAME=BINARY [FLAGS...]" >&2; exit 2; }
source scripts/bench-model.sh
threads=${THREADS:-2}
names=()
for config in "$@"; do names+=("${config%%=*}"); done
echo "model $model, $tokens tokens, $threads threads, $rounds rounds: ${names[*]}"
for round in $(seq 1 "$rounds"); do
  line=()
  for config in "$@"; do
    read -r -a run <<< "${config#*=}"
    speed=$("${run[@]:0:1}" generate -m "$model" -p "Tell me a story about the sea" -n "$tokens" -t "$threads" \
      "${run[@]:1}" 2>&1 > /dev/null | sed -n 's/.*decoded in [0-9.]* s (\([0-9.]*\) tok\/s.*/\1/p')
    [ -n "$speed" ] || { echo "decode-ab: ${config%%=*} printed no decode speed" >&2; exit 1; }
    line+=("$speed")
  done
  echo "round $round: ${line[*]}"
done | tee /dev/stderr | python3 -c '
import statistics, sys
names = sys.argv[1:]
rows = [list(map(float, l.split(":")[1].split())) for l in sys.stdin if l.startswith("round")]
for i, name in enumerate(names[1:], 1):
    ratios = sorted(r[i] / r[0] for r in rows)
    q = statistics.quantiles(ratios, n=4, method="inclusive") if len(ratios) > 1 else ratios * 3
    print(f"{name} / {names[0]}: median {statistics.median(ratios):.3f}, quartiles {q[0]:.3f}-{q[2]:.3f}, {len(rows)} rounds")
' "${names[@]}"
