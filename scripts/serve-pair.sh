#!/usr/bin/env bash
# The batch-invariant server against the fast one, paired request by request:
# both servers stay up side by side (resident, bench preset by default), and
# each round sends the same N streamed greedy completions to one and then
# the other, so a slow spell of the machine falls on both halves of a pair.
# Prints every pair's aggregate tok/s and ratio (invariant / fast), then per
# N the median ratio and its quartiles. Needs memory for two resident
# servers (about 2 x 6 GiB on the bench preset). serve-bench.sh measures the
# same ratio with fresh servers one after the other; on a machine whose
# speed drifts, this pairing needs fewer rounds for the same precision.
#
# usage: scripts/serve-pair.sh [WORKDIR] [TOKENS] [ROUNDS]
#   COUNTS="1 2 4 8" the request counts; THREADS=2 compute threads for both
#   (a fixed count, so the thread tuner is not part of the comparison);
#   INVARIANT_ENV / FAST_ENV extra environment for each server (e.g.
#   INVARIANT_ENV=BMOE_INVARIANT_SGEMM=off); BMOE=path another binary.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench-work}
tokens=${2:-64}
rounds=${3:-12}
source scripts/bench-model.sh
bmoe=${BMOE:-$bmoe}
threads=${THREADS:-2}
counts=${COUNTS:-1 2 4 8}
log=$work/serve-pair
pids=()
trap 'kill "${pids[@]}" 2> /dev/null || true; wait 2> /dev/null || true' EXIT

# Starts a server (name, env, flags...) on a free port and sets $url to it
# (not in a subshell, so that the exit trap knows its pid).
start() {
  local name=$1 env=$2
  shift 2
  env $env "$bmoe" serve -q -m "$model" --port 0 --parallel 8 --ctx-size 256 --batch 256 --ubatch 256 -t "$threads" "$@" \
    > "$log-$name.log" 2>&1 &
  pids+=($!)
  url=
  for _ in $(seq 1 6000); do
    kill -0 "${pids[-1]}" 2> /dev/null || { cat "$log-$name.log" >&2; exit 1; }
    url=$(grep -o 'http://[0-9.:]*' "$log-$name.log" | head -1 || true)
    [ -n "$url" ] && curl -sf "$url/health" > /dev/null && break
    sleep 0.1
  done
  [ -n "$url" ] || { cat "$log-$name.log" >&2; exit 1; }
}

start invariant "${INVARIANT_ENV:-BMOE_UNUSED=}"
inv=$url
start fast "${FAST_ENV:-BMOE_UNUSED=}" --no-batch-invariant
fast=$url
for url in "$inv" "$fast"; do
  python3 scripts/serve-load.py "$url" 1 16 > /dev/null
  python3 scripts/serve-load.py "$url" 8 32 > /dev/null
done
echo "model $model, $tokens tokens a request, $threads threads, $rounds rounds; invariant $inv, fast $fast"
tok_s() { python3 -c 'import json, sys; print(json.load(sys.stdin)["tok_s"])'; }
: > "$log.txt"
for round in $(seq 1 "$rounds"); do
  for n in $counts; do
    a=$(python3 scripts/serve-load.py "$inv" "$n" "$tokens" | tok_s)
    b=$(python3 scripts/serve-load.py "$fast" "$n" "$tokens" | tok_s)
    echo "$n $a $b" >> "$log.txt"
    echo "round $round, $n requests: invariant $a tok/s, fast $b tok/s, ratio $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }')"
  done
done
python3 - "$log.txt" << 'EOF'
import statistics, sys
pairs = {}
for line in open(sys.argv[1]):
    n, a, b = line.split()
    pairs.setdefault(int(n), []).append(float(a) / float(b))
print("requests  median invariant/fast  quartiles  pairs")
for n, r in sorted(pairs.items()):
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0]] * 3
    print(f"{n:>8}  {statistics.median(r):>22.3f}  {q[0]:.3f}-{q[2]:.3f}  {len(r):>5}")
EOF
