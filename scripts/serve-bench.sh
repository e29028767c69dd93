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
# first token. Each round starts each server afresh (the invariant kernels,
# then the fast ones, for each mode) and sends 1, 2, 4 and 8 requests, so a
# slow spell of the machine falls on both kernel sets alike; the last table
# gives the invariant / fast ratio round by round, its median and range.
# Every run is kept in WORKDIR/serve-bench-rounds.jsonl.
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
  # Warm: the page cache, the expert cache, the thread count; eight
  # requests at once reach most experts, so the first measured run of a
  # fresh server is not the one that reads them.
  python3 scripts/serve-load.py "$url" 1 16 > /dev/null
  python3 scripts/serve-load.py "$url" 8 32 > /dev/null
}

summary=$work/serve-bench.jsonl
rounds_file=$work/serve-bench-rounds.jsonl
: > "$summary"
: > "$rounds_file"
# Each round starts every server afresh, one after the other (invariant,
# then fast, for each mode and target), so a slow spell of the machine
# falls on both kernel sets of the same round: the ratios below pair the
# two sets round by round.
for round in $(seq 1 "$rounds"); do
for mode in ${MODES:-resident capped}; do
for kernels in ${KERNELS:-invariant fast}; do
for target in ${TARGETS:-3 0}; do
  capped=0
  flags=(--step-target "$target")
  if [ "$mode" = capped ]; then capped=1; flags+=(--moe-stream); fi
  if [ "$kernels" = fast ]; then flags+=(--no-batch-invariant); fi
  start_server "${flags[@]}"
  for n in 1 2 4 8; do
    python3 scripts/serve-load.py "$url" "$n" "$tokens" |
      python3 -c 'import json, sys; r = json.loads(sys.stdin.read()); r.update(round=int(sys.argv[1]), kernels=sys.argv[2], mode=sys.argv[3], target=sys.argv[4]); print(json.dumps(r))' \
        "$round" "$kernels" "$mode" "$target" >> "$rounds_file"
  done
  stop_server
  echo "round $round/$rounds: $kernels $mode target $target done" >&2
done
done
done
done
# Medians over rounds of each figure.
printf '%-9s %-9s %6s %3s %8s %7s %9s %9s %9s %8s %8s\n' kernels mode target n tok/s xone MiB/tok ttft_p50 ttft_p99 itl_p50 itl_p99
python3 - "$rounds_file" "$summary" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
groups = {}
for r in runs:
    groups.setdefault((r["kernels"], r["mode"], r["target"]), {}).setdefault(r["n"], []).append(r)
skip = {"n", "round", "kernels", "mode", "target"}
for (kernels, mode, target), by_n in groups.items():
    med = {n: {k: statistics.median(r[k] for r in rs) for k in rs[0] if k not in skip} for n, rs in by_n.items()}
    for n in sorted(med):
        m = med[n]
        print(f"{kernels:<9} {mode:<9} {target:>6} {n:>3} {m['tok_s']:>8.2f} {m['tok_s'] / med[min(med)]['tok_s']:>6.2f}x "
              f"{m['mib_per_token']:>9.3f} {m['ttft_p50_ms']:>9.1f} {m['ttft_p99_ms']:>9.1f} {m['itl_p50_ms']:>8.1f} "
              f"{m['itl_p99_ms']:>8.1f}")
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps({"kernels": kernels, "mode": mode, "target": target, "n": n, **m}) + "\n")
PY
# Round by round: the invariant kernels' aggregate over the fast kernels'
# in the same round, then the median and range of those ratios.
python3 - "$rounds_file" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
by = {(r["round"], r["kernels"], r["mode"], r["target"], r["n"]): r for r in runs}
keys = sorted({(m, t, n) for (_, k, m, t, n) in by if k == "invariant"}, key=lambda p: (p[0] != "resident", p[1], p[2]))
lines = []
for m, t, n in keys:
    ratios = [by[(rd, "invariant", m, t, n)]["tok_s"] / by[(rd, "fast", m, t, n)]["tok_s"]
              for (rd, k, mm, tt, nn) in by if k == "invariant" and (mm, tt, nn) == (m, t, n) and (rd, "fast", m, t, n) in by]
    if ratios:
        lines.append(f"{m:<9} {t:>6} {n:>3} {statistics.median(ratios):>10.3f} {min(ratios):>7.3f} {max(ratios):>7.3f}   "
                     + " ".join(f"{x:.2f}" for x in ratios))
if lines:
    print()
    print(f"{'mode':<9} {'target':>6} {'n':>3} {'inv/fast':>10} {'min':>7} {'max':>7}   each round")
    print("\n".join(lines))
PY
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
