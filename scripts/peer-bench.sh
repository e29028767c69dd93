#!/usr/bin/env bash
# bmoe's streaming side by side with llama.cpp's own (upstream PR #25294,
# `--moe-stream`), on one model file under one memory cap (a cgroup v1
# memory limit around each run; root). The peer is an outside program: build
# a llama.cpp tree that has `--moe-stream` outside this repository and pass
# its `llama-completion` (see docs/benchmarks.md, "Against llama.cpp's own
# streaming", for the build).
#
# One uncounted bmoe run comes first (it writes bmoe's repacked copy of the
# experts on a file's first open). Each round runs both programs twice, the
# page cache dropped before every run: a decode run (a short prompt, then TOKENS tokens one at a time) and a
# prefill run (a prompt of about PROMPT_TOKENS tokens in one batch, then one
# token). From the decode run: decode tok/s, MiB read from disk per
# generated token (the whole run's block reads, GNU time's file-system
# inputs, over the tokens generated: the dense weights' one read and the
# short prompt's are in it for both alike) and the expert cache's hit rate
# (each program's own count). From the prefill run: prefill tok/s. Rounds
# alternate the two programs; the medians and bmoe / peer are printed last.
#
# usage: sudo scripts/peer-bench.sh PEER_BIN [MODEL] [CAP_MB] [TOKENS] [ROUNDS] [THREADS]
#   MODEL defaults to the bench preset (made under bench-work/ if missing;
#   PRESET=qwen3-30b-a3b picks another preset); CAP_MB to 2048; TOKENS to 64;
#   ROUNDS to 3; THREADS to the core count. PROMPT_TOKENS (default 450) sizes
#   the prefill prompt; CTX (default 1024) is both programs' context length; PEER_FLAGS replaces the peer's streaming flags
#   (default: "--moe-stream-cache 32s --moe-stream-io-threads 4
#   --moe-stream-direct"); BMOE_FLAGS adds flags to bmoe's runs.
set -euo pipefail
cd "$(dirname "$0")/.."
peer=${1:?usage: scripts/peer-bench.sh PEER_BIN [MODEL] [CAP_MB] [TOKENS] [ROUNDS] [THREADS]}
[ -x "$peer" ] || { echo "peer-bench: $peer is not an executable" >&2; exit 1; }
peer_help=$("$peer" --help 2>&1 || true)
grep -q -- '--moe-stream-cache' <<< "$peer_help" \
  || { echo "peer-bench: $peer has no --moe-stream-cache (a llama.cpp with PR #25294's streaming is needed)" >&2; exit 1; }
cap_mb=${3:-2048}
tokens=${4:-64}
rounds=${5:-3}
threads=${6:-$(nproc)}
prompt_tokens=${PROMPT_TOKENS:-450}
ctx=${CTX:-1024}
peer_flags=${PEER_FLAGS:---moe-stream-cache 32s --moe-stream-io-threads 4 --moe-stream-direct}
work=bench-work
model_file=${2:-}
source scripts/bench-model.sh
[ "$(id -u)" = 0 ] || { echo "peer-bench: needs root (a cgroup memory limit and dropping the page cache)" >&2; exit 1; }
cg=/sys/fs/cgroup/memory/bmoe-peer-bench
mkdir -p "$cg" "$work/peer-bench"
trap 'rmdir "$cg" 2> /dev/null || true' EXIT
echo $((cap_mb * 1024 * 1024)) > "$cg/memory.limit_in_bytes"
logs=$work/peer-bench

# About PROMPT_TOKENS tokens (long-prompt.py's sentences are about 2.65 tokens a word).
long_prompt=$(python3 scripts/long-prompt.py $((prompt_tokens * 100 / 265)))
short_prompt="The history of the printing press begins with"
read -r -a peer_args <<< "$peer_flags"
read -r -a bmoe_args <<< "${BMOE_FLAGS:-}"

# Runs a command in the capped cgroup after dropping the page cache; its
# output (stdout and stderr) goes to $1, GNU time's block reads to $1.io.
# A run that fails (the cap's out-of-memory kill included) leaves a note in
# its log and counts as no result; the round goes on.
capped() {
  local log=$1 oom
  shift
  sync
  echo 3 > /proc/sys/vm/drop_caches
  oom=$(sed -n 's/^oom_kill //p' "$cg/memory.oom_control")
  if ! /usr/bin/time -f '%I' -o "$log.io" sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@" > "$log" 2>&1; then
    if [ "$(sed -n 's/^oom_kill //p' "$cg/memory.oom_control")" != "$oom" ]; then
      echo "peer-bench: out of memory under the cap of $cap_mb MiB: $1" | tee -a "$log" >&2
    else
      echo "peer-bench: failed: $1 (its log: $log)" >&2
    fi
    echo "0" > "$log.io"
  fi
}
run_bmoe() { # log prompt tokens
  capped "$1" "$bmoe" generate -m "$model" -p "$2" -n "$3" -t "$threads" -c "$ctx" --moe-stream "${bmoe_args[@]}"
}
run_peer() { # log prompt tokens
  capped "$1" "$peer" -m "$model" -p "$2" -n "$3" -t "$threads" -c "$ctx" --temp 0 --ignore-eos -no-cnv \
    --no-warmup -lv 4 "${peer_args[@]}"
}
# Parsers: bmoe's summary lines, the peer's llama_perf lines and stream stats.
bmoe_decode() { sed -n 's/^decode: [^(]*(\([0-9.]*\) tok\/s).*/\1/p' "$1"; }
bmoe_prefill() { sed -n 's/^decode: .*| prefill: [0-9]* tokens (\([0-9.]*\) tok\/s).*/\1/p' "$1"; }
bmoe_generated() { sed -n 's/^decode: *\([0-9]*\) tokens.*/\1/p' "$1"; }
bmoe_hits() { sed -n 's/^cache: *\([0-9.]*\)% hit rate.*/\1/p' "$1"; }
peer_decode() { sed -n 's/.*[^t] eval time = .*, *\([0-9.]*\) tokens per second.*/\1/p' "$1" | tail -1; }
peer_prefill() { sed -n 's/.*prompt eval time = .*, *\([0-9.]*\) tokens per second.*/\1/p' "$1" | tail -1; }
peer_generated() { sed -n 's/.*[^t] eval time = *[0-9.]* ms \/ *\([0-9]*\) runs.*/\1/p' "$1" | tail -1; }
peer_hits() { sed -n 's/.*hit rate = \([0-9.]*\)%.*/\1/p' "$1" | tail -1; }
# MiB read per generated token: $1.io holds 512-byte blocks; $2 the tokens.
mib_per_token() { awk -v b="$(cat "$1.io")" -v n="$2" 'BEGIN { printf "%.1f", b * 512 / 1048576 / (n > 0 ? n : 1) }'; }

echo "model $model, cap $cap_mb MiB, decode $tokens tokens, prefill about $prompt_tokens tokens, context $ctx, $threads threads, $rounds rounds"
echo "peer  $peer $peer_flags"
echo "bmoe  $bmoe --moe-stream ${BMOE_FLAGS:-}"
# bmoe's first open of a file writes its repacked copy of the experts
# (docs/architecture.md, "Repacked expert banks"): one uncounted run first.
run_bmoe "$logs/bmoe-warm.log" "$short_prompt" 1
printf '%-5s %-5s %8s %8s %9s %6s\n' round prog decode prefill MiB/tok hit%
declare -a bd bp bm bh pd pp pm ph
for i in $(seq 1 "$rounds"); do
  run_bmoe "$logs/bmoe-decode.log" "$short_prompt" "$tokens"
  run_bmoe "$logs/bmoe-prefill.log" "$long_prompt" 1
  run_peer "$logs/peer-decode.log" "$short_prompt" "$tokens"
  run_peer "$logs/peer-prefill.log" "$long_prompt" 1
  # A failed run's fields stay empty: "-" in its row, left out of the medians.
  bd+=("$(bmoe_decode "$logs/bmoe-decode.log")"); bp+=("$(bmoe_prefill "$logs/bmoe-prefill.log")")
  n=$(bmoe_generated "$logs/bmoe-decode.log")
  bm+=("$([ -n "$n" ] && mib_per_token "$logs/bmoe-decode.log" "$n")"); bh+=("$(bmoe_hits "$logs/bmoe-decode.log")")
  pd+=("$(peer_decode "$logs/peer-decode.log")"); pp+=("$(peer_prefill "$logs/peer-prefill.log")")
  n=$(peer_generated "$logs/peer-decode.log")
  pm+=("$([ -n "$n" ] && mib_per_token "$logs/peer-decode.log" "$n")"); ph+=("$(peer_hits "$logs/peer-decode.log")")
  printf '%-5s %-5s %8s %8s %9s %6s\n' "$i" bmoe "${bd[-1]:--}" "${bp[-1]:--}" "${bm[-1]:--}" "${bh[-1]:--}"
  printf '%-5s %-5s %8s %8s %9s %6s\n' "$i" peer "${pd[-1]:--}" "${pp[-1]:--}" "${pm[-1]:--}" "${ph[-1]:--}"
done
median() { printf '%s\n' "$@" | grep . | sort -g | awk '{ a[NR] = $1 } END { print (NR == 0) ? "-" : (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b == 0) printf "-"; else printf "%.2f", a / b }'; }
printf '%-5s %-5s %8s %8s %9s %6s\n' median bmoe "$(median "${bd[@]}")" "$(median "${bp[@]}")" "$(median "${bm[@]}")" "$(median "${bh[@]}")"
printf '%-5s %-5s %8s %8s %9s %6s\n' median peer "$(median "${pd[@]}")" "$(median "${pp[@]}")" "$(median "${pm[@]}")" "$(median "${ph[@]}")"
echo "bmoe / peer: decode $(ratio "$(median "${bd[@]}")" "$(median "${pd[@]}")")x," \
  "prefill $(ratio "$(median "${bp[@]}")" "$(median "${pp[@]}")")x," \
  "MiB read per token $(ratio "$(median "${bm[@]}")" "$(median "${pm[@]}")")x"
