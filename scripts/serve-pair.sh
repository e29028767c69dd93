#!/usr/bin/env bash
# The batch-invariant server against the fast one, paired request by request:
# both servers stay up side by side (bench preset by default), and each
# round sends the same N streamed greedy completions to one and then the
# other, so a slow spell of the machine falls on both halves of a pair.
# Odd rounds load the invariant server first, even rounds the fast one: on
# this machine the load that went second ran a few percent faster, whichever
# server took it.
# Prints every pair's aggregate tok/s and ratio (invariant / fast), then per
# N the median ratio and its quartiles, and the median ratios of time to
# first token and inter-token latency. serve-bench.sh measures the same
# ratio with fresh servers one after the other; on a machine whose speed
# drifts, this pairing needs fewer rounds for the same precision.
#
# MODE=resident (the default) needs memory for two resident servers (about
# 2 x 6 GiB on the bench preset). MODE=capped streams the experts
# (--moe-stream) with each server in its own cgroup v1 memory limit of a
# third of the file (root), as serve-bench.sh caps it; one server reads a
# copy of the model (made once, WORKDIR/<name>.pair-copy.gguf), so
# neither server's reads are served from the other's page cache.
# After half the rounds both servers start again in the other order: two
# servers of the same build and flags, capped, ran 0.94-0.95x when started
# first and 1.00-1.04x when started second. Capped, they also exchange
# their files: on a virtual disk one copy of the same bytes can read faster
# than the other (the host caches what was read lately), which would
# otherwise fall on one server.
#
# usage: scripts/serve-pair.sh [WORKDIR] [TOKENS] [ROUNDS]
#   MODE=resident|capped; COUNTS="1 2 4 8" the request counts; THREADS=2 compute threads for both
#   (a fixed count, so the thread tuner is not part of the comparison);
#   INVARIANT_ENV / FAST_ENV extra environment for each server (e.g.
#   INVARIANT_ENV=BMOE_INVARIANT_SGEMM=off); BMOE=path another binary;
#   FAST_FLAGS the second server's flags instead of --no-batch-invariant
#   (FAST_FLAGS= runs two invariant servers: what the pairing itself leans).
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench-work}
tokens=${2:-64}
rounds=${3:-12}
source scripts/bench-model.sh
bmoe=${BMOE:-$bmoe}
threads=${THREADS:-2}
counts=${COUNTS:-1 2 4 8}
mode=${MODE:-resident}
log=$work/serve-pair
pids=()
# Capped, each server runs in its own cgroup, named after its role (a
# restart reuses it); the exit trap removes both.
cgroups=(/sys/fs/cgroup/memory/bmoe-serve-pair-invariant /sys/fs/cgroup/memory/bmoe-serve-pair-fast)
trap 'kill "${pids[@]}" 2> /dev/null || true; wait 2> /dev/null || true; rmdir "${cgroups[@]}" 2> /dev/null || true' EXIT

inv_model=$model
fast_model=$model
case $mode in
  resident) ;;
  capped)
    [ -w /sys/fs/cgroup/memory ] || { echo "MODE=capped needs root and cgroup v1 (/sys/fs/cgroup/memory)" >&2; exit 1; }
    cap=$(($(stat -c %s "$model") / 3))
    fast_model=${model%.gguf}.pair-copy.gguf
    if ! cmp -s -n 1048576 "$model" "$fast_model" || [ "$(stat -c %s "$model")" != "$(stat -c %s "$fast_model")" ]; then
      echo "copying $model to $fast_model (once), so the two servers do not share a page cache" >&2
      cp --reflink=never "$model" "$fast_model.tmp" && mv "$fast_model.tmp" "$fast_model"
    fi
    sync
    echo 3 > /proc/sys/vm/drop_caches
    ;;
  *) echo "MODE must be resident or capped, not '$mode'" >&2; exit 1 ;;
esac

# Starts a server (name, env, model, flags...) on a free port and sets $url
# to it (not in a subshell, so that the exit trap knows its pid); capped,
# inside its own memory cgroup.
start() {
  local name=$1 env=$2 file=$3
  shift 3
  local cmd=(env $env "$bmoe" serve -q -m "$file" --port 0 --parallel 8 --ctx-size 256 --batch 256 --ubatch 256 -t "$threads")
  if [ "$mode" = capped ]; then
    local cg=/sys/fs/cgroup/memory/bmoe-serve-pair-$name
    mkdir -p "$cg"
    echo "$cap" > "$cg/memory.limit_in_bytes"
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "${cmd[@]}" --moe-stream "$@" > "$log-$name.log" 2>&1 &
  else
    "${cmd[@]}" "$@" > "$log-$name.log" 2>&1 &
  fi
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

# Starts the invariant server on file $1 and sets $inv to its URL.
start_invariant() {
  start invariant "${INVARIANT_ENV:-BMOE_UNUSED=}" "$1"
  inv=$url
}

# Starts the fast server (FAST_FLAGS) on file $1 and sets $fast to its URL.
start_fast() {
  # shellcheck disable=SC2086 # FAST_FLAGS is a list of flags
  start fast "${FAST_ENV:-BMOE_UNUSED=}" "$1" ${FAST_FLAGS---no-batch-invariant}
  fast=$url
}

# Starts both servers (stopping any running), the invariant one on file $1
# and the fast one on $2, the one named $3 (invariant or fast) first, and
# warms each up.
start_both() {
  if [ ${#pids[@]} -gt 0 ]; then
    kill "${pids[@]}" 2> /dev/null || true
    wait "${pids[@]}" 2> /dev/null || true
    pids=()
    # The files' pages the old servers left in their cgroups go too.
    if [ "$mode" = capped ]; then
      sync
      echo 3 > /proc/sys/vm/drop_caches
    fi
  fi
  if [ "$3" = invariant ]; then
    start_invariant "$1"
    start_fast "$2"
  else
    start_fast "$2"
    start_invariant "$1"
  fi
  for url in "$inv" "$fast"; do
    python3 scripts/serve-load.py "$url" 1 16 > /dev/null
    python3 scripts/serve-load.py "$url" 8 32 > /dev/null
  done
  echo "invariant $inv on $1, fast $fast on $2, the $3 one started first"
}

# One load of N on a server: tok/s, time to first token and inter-token latency (p50, ms).
load() { python3 scripts/serve-load.py "$1" "$2" "$tokens" | figures; }
# tok/s, time to first token and inter-token latency (p50, ms) of one run.
figures() { python3 -c 'import json, sys; r = json.load(sys.stdin); print(r["tok_s"], r["ttft_p50_ms"], r["itl_p50_ms"])'; }
echo "$mode${cap:+ (cap $((cap >> 20)) MiB a server)}, model $model, $tokens tokens a request, $threads threads, $rounds rounds"
start_both "$inv_model" "$fast_model" invariant
: > "$log.txt"
for round in $(seq 1 "$rounds"); do
  if [ "$rounds" -gt 1 ] && [ "$round" -eq $((rounds / 2 + 1)) ]; then
    start_both "$fast_model" "$inv_model" fast
  fi
  for n in $counts; do
    if [ $((round % 2)) -eq 1 ]; then
      read -r a a_ttft a_itl < <(load "$inv" "$n") || a_itl=
      read -r b b_ttft b_itl < <(load "$fast" "$n") || b_itl=
    else
      read -r b b_ttft b_itl < <(load "$fast" "$n") || b_itl=
      read -r a a_ttft a_itl < <(load "$inv" "$n") || a_itl=
    fi
    [ -n "$a_itl" ] && [ -n "$b_itl" ] || { echo "serve-pair: a load run printed no figures" >&2; exit 1; }
    echo "$n $a $b $a_ttft $b_ttft $a_itl $b_itl" >> "$log.txt"
    echo "round $round, $n requests: invariant $a tok/s, fast $b tok/s, ratio $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%.3f", a / b }');" \
      "TTFT p50 $a_ttft / $b_ttft ms, ITL p50 $a_itl / $b_itl ms"
  done
done
# Per request count: the median aggregate ratio and its quartiles, then the
# medians of the time-to-first-token and inter-token-latency ratios
# (invariant / fast: above 1 is slower), which tell prompts from decode steps.
python3 - "$log.txt" << 'EOF2'
import statistics, sys
pairs = {}
for line in open(sys.argv[1]):
    n, a, b, at, bt, ai, bi = line.split()
    pairs.setdefault(int(n), []).append((float(a) / float(b), float(at) / float(bt), float(ai) / float(bi)))
print("requests  median invariant/fast  quartiles  pairs  TTFT p50 inv/fast  ITL p50 inv/fast")
for n, rs in sorted(pairs.items()):
    r = [x[0] for x in rs]
    q = statistics.quantiles(r, n=4) if len(r) > 1 else [r[0]] * 3
    ttft = statistics.median(x[1] for x in rs)
    itl = statistics.median(x[2] for x in rs)
    print(f"{n:>8}  {statistics.median(r):>22.3f}  {q[0]:.3f}-{q[2]:.3f}  {len(r):>5}  {ttft:>17.3f}  {itl:>16.3f}")
EOF2
