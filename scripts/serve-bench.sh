#!/usr/bin/env bash
# Concurrent requests against `bmoe serve` on the bench preset: 1, 2, 4 and
# 8 streamed greedy completions of TOKENS tokens at once, resident and
# streamed under a memory cap of a third of the file (a cgroup v1 memory
# limit around the server; root), with the batch-invariant kernels (the
# default) and with --no-batch-invariant, with the prompt budget
# (--step-target 3, the default) and without it (--step-target 0). Prints
# one row per run: aggregate tok/s, MiB of experts read per generated token,
# time to first token and inter-token latency (p50, p99), and each
# aggregate as a multiple of one request's; then the invariant kernels'
# aggregate tok/s and time to first token as multiples of the others', and
# with the budget against without: the p99/p50 gap, tok/s and time to
# first token. Rounds are interleaved (1, 2, 4, 8, then again) so a slow
# spell of the machine falls on every width alike.
#
# usage: scripts/serve-bench.sh [WORKDIR] [TOKENS] [ROUNDS]
#   PRESET=name picks another preset (default bench); BMOE=path another binary;
#   KERNELS="invariant fast" which kernels to run (default both); MODES="resident capped" likewise;
#   TARGETS="3 0" the --step-target values (default both; the first is the budget compared with 0).
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench-work}
tokens=${2:-64}
rounds=${3:-2}
source scripts/bench-model.sh
bmoe=${BMOE:-$bmoe}
size=$(stat -c %s "$model")
cap=$((size / 3))
cg=/sys/fs/cgroup/memory/bmoe-serve-bench
server=

stop_server() {
  if [ -n "$server" ]; then
    kill "$server" 2> /dev/null || true
    wait "$server" 2> /dev/null || true
    server=
  fi
}
trap 'stop_server; rmdir "$cg" 2> /dev/null || true' EXIT

# Starts the server with extra flags ($@), in the capped cgroup when
# $capped, and waits for /health.
start_server() {
  local log=$work/serve-bench.log
  sync
  echo 3 > /proc/sys/vm/drop_caches
  if [ "$capped" = 1 ]; then
    mkdir -p "$cg"
    echo "$cap" > "$cg/memory.limit_in_bytes"
    sh -c "echo \$\$ > $cg/cgroup.procs && exec $bmoe serve -q -m $model --port 0 --parallel 8 --ctx-size 256 --batch 256 --ubatch 256 $*" > "$log" 2>&1 &
  else
    $bmoe serve -q -m "$model" --port 0 --parallel 8 --ctx-size 256 --batch 256 --ubatch 256 "$@" > "$log" 2>&1 &
  fi
  server=$!
  url=
  for _ in $(seq 1 6000); do
    kill -0 "$server" 2> /dev/null || { cat "$log"; exit 1; }
    url=$(grep -o 'http://[0-9.:]*' "$log" | head -1 || true)
    [ -n "$url" ] && curl -sf "$url/health" > /dev/null && break
    sleep 0.1
  done
  [ -n "$url" ] || { cat "$log"; exit 1; }
  # Warm: the page cache, the expert cache, the thread count.
  python3 scripts/serve-load.py "$url" 1 16 > /dev/null
}

summary=$work/serve-bench.jsonl
: > "$summary"
printf '%-9s %-9s %6s %3s %8s %7s %9s %9s %9s %8s %8s\n' kernels mode target n tok/s xone MiB/tok ttft_p50 ttft_p99 itl_p50 itl_p99
for kernels in ${KERNELS:-invariant fast}; do
for mode in ${MODES:-resident capped}; do
for target in ${TARGETS:-3 0}; do
  capped=0
  flags=(--step-target "$target")
  if [ "$mode" = capped ]; then capped=1; flags+=(--moe-stream); fi
  if [ "$kernels" = fast ]; then flags+=(--no-batch-invariant); fi
  start_server "${flags[@]}"
  declare -A rows=()
  for _ in $(seq 1 "$rounds"); do
    for n in 1 2 4 8; do
      rows[$n]+="$(python3 scripts/serve-load.py "$url" "$n" "$tokens")"$'\n'
    done
  done
  stop_server
  # Medians over rounds of each figure.
  python3 - "$kernels" "$mode" "$target" "$summary" <<PY
import json, statistics, sys
kernels, mode, target, summary = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
rows = {$(for n in 1 2 4 8; do printf '%s: """%s""",' "$n" "${rows[$n]}"; done)}
med = {}
for n, text in rows.items():
    runs = [json.loads(l) for l in text.splitlines() if l.strip()]
    med[n] = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k != "n"}
for n in sorted(med):
    m = med[n]
    print(f"{kernels:<9} {mode:<9} {target:>6} {n:>3} {m['tok_s']:>8.2f} {m['tok_s'] / med[1]['tok_s']:>6.2f}x "
          f"{m['mib_per_token']:>9.3f} {m['ttft_p50_ms']:>9.1f} {m['ttft_p99_ms']:>9.1f} {m['itl_p50_ms']:>8.1f} "
          f"{m['itl_p99_ms']:>8.1f}")
    with open(summary, "a") as f:
        f.write(json.dumps({"kernels": kernels, "mode": mode, "target": target, "n": n, **m}) + "\n")
PY
  unset rows
done
done
done
# Side by side: the invariant kernels against the others, and the prompt
# budget (the first target) against none (target 0).
python3 - "$summary" "${TARGETS:-3 0}" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
budget = sys.argv[2].split()[0]
by = {(r["kernels"], r["mode"], r["target"], r["n"]): r for r in rows}
pairs = [(m, t, n) for (k, m, t, n) in by if k == "invariant" and ("fast", m, t, n) in by]
if pairs:
    print()
    print(f"{'mode':<9} {'target':>6} {'n':>3} {'tok/s inv/fast':>15} {'ttft_p50 inv/fast':>18}")
    for m, t, n in sorted(pairs, key=lambda p: (p[0] != "resident", p[1], p[2])):
        a, b = by[("invariant", m, t, n)], by[("fast", m, t, n)]
        print(f"{m:<9} {t:>6} {n:>3} {a['tok_s'] / b['tok_s']:>15.3f} {a['ttft_p50_ms'] / b['ttft_p50_ms']:>18.3f}")
pairs = [(k, m, n) for (k, m, t, n) in by if t == budget and budget != "0" and (k, m, "0", n) in by]
if pairs:
    print()
    print(f"{'kernels':<9} {'mode':<9} {'n':>3} {'p99/p50 budget':>15} {'p99/p50 none':>13} {'tok/s b/none':>13} "
          f"{'ttft_p50 b/none':>16} {'ttft_p99 b/none':>16}")
    for k, m, n in sorted(pairs, key=lambda p: (p[0], p[1] != "resident", p[2])):
        a, b = by[(k, m, budget, n)], by[(k, m, "0", n)]
        ratio = lambda r: r["itl_p99_ms"] / r["itl_p50_ms"] if r["itl_p50_ms"] else float("nan")
        print(f"{k:<9} {m:<9} {n:>3} {ratio(a):>15.2f} {ratio(b):>13.2f} {a['tok_s'] / b['tok_s']:>13.3f} "
              f"{a['ttft_p50_ms'] / b['ttft_p50_ms']:>16.3f} {a['ttft_p99_ms'] / b['ttft_p99_ms']:>16.3f}")
PY
