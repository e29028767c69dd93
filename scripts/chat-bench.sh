#!/usr/bin/env bash
# Decode speed inside `bmoe chat` against `bmoe generate --chat` with the same
# settings, and the chat UI thread's CPU use with a 48-layer x 128-expert
# routing panel. Each repetition runs both, one after the other, on the same
# model and message; the decode tok/s of each run comes from its --csv summary
# line, and the UI share from the line `bmoe chat` prints when it exits.
#
# usage: scripts/chat-bench.sh [WORKDIR] [TOKENS] [REPS]
#   (defaults: bench-work 256 3; needs tmux; extra bmoe flags in BMOE_FLAGS)
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench-work}
tokens=${2:-256}
reps=${3:-3}
flags=(--moe-stream --cache-mb 256 -n "$tokens" ${BMOE_FLAGS:-})
message="Tell me how a mixture of experts routes each token."

cargo build --release --locked
bmoe=$PWD/target/release/bmoe
mkdir -p "$work"
model=$work/chat-48x128.gguf
if [ ! -f "$model" ]; then
  "$bmoe" make-model --layers 48 --experts 128 --experts-used 8 --embd 256 --expert-ff 128 \
    --quant q8_0 --chat-template qwen3 -o "$model"
fi

# The decode tok/s on a CSV's summary line.
decode_tps() { sed -n 's/^# summary .*decode_tok_s=\([0-9.]*\).*/\1/p' "$1"; }
# The median wall time of a decode step, ms (robust to a stalled token).
median_ms() { awk -F, '!/^#/ && $2 == 1 { print $6 }' "$1" | sort -n | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }

socket=bmoe-chat-bench-$$
trap 'tmux -L "$socket" kill-server 2> /dev/null || true' EXIT
tmux -L "$socket" new-session -d -x 160 -y 48 "bash --norc --noprofile"
screen() { tmux -L "$socket" capture-pane -p -t 0; }
wait_for() { # wait_for REGEX: polls the screen
  for _ in $(seq 1 6000); do
    screen | grep -Eq "$1" && return 0
    sleep 0.1
  done
  echo "chat-bench: timed out waiting for /$1/" >&2
  screen >&2
  exit 1
}

: > "$work/chat-bench.txt"
printf '%-4s %12s %12s %8s %10s %10s %10s\n' rep generate chat ratio "UI CPU" "gen ms" "chat ms"
# Both run in the same tmux shell, so they see the same terminal and environment.
run_generate() {
  tmux -L "$socket" send-keys -t 0 "clear; $bmoe generate --chat -m $model ${flags[*]} --csv $work/gen-$rep.csv -p '$message' > /dev/null 2>&1; echo GEN-EXIT=\$?" Enter
  wait_for "GEN-EXIT=0"
}
run_chat() {
  tmux -L "$socket" send-keys -t 0 "clear; $bmoe chat -m $model ${flags[*]} --csv $work/chat-$rep.csv 2> $work/chat-$rep.err; echo CHAT-EXIT=\$?" Enter
  wait_for "Type a message"
  tmux -L "$socket" send-keys -t 0 -l "$message"
  tmux -L "$socket" send-keys -t 0 Enter
  wait_for "[0-9]+ tokens ·"
  tmux -L "$socket" send-keys -t 0 C-c
  tmux -L "$socket" send-keys -t 0 C-c
  wait_for "CHAT-EXIT=0"
}

for rep in $(seq 1 "$reps"); do
  # Alternate which runs first, so a machine that drifts favours neither.
  if [ $((rep % 2)) -eq 1 ]; then run_generate; run_chat; else run_chat; run_generate; fi
  gen=$(decode_tps "$work/gen-$rep.csv")
  chat=$(decode_tps "$work/chat-$rep.csv")
  ui=$(sed -n 's/.*UI thread used \([0-9.]*%\).*/\1/p' "$work/chat-$rep.err")
  ratio=$(awk -v c="$chat" -v g="$gen" 'BEGIN { printf "%.3f", c / g }')
  printf '%-4s %12s %12s %8s %10s %10s %10s\n' "$rep" "$gen" "$chat" "$ratio" "$ui" \
    "$(median_ms "$work/gen-$rep.csv")" "$(median_ms "$work/chat-$rep.csv")" | tee -a "$work/chat-bench.txt"
done
awk '/^[0-9]/ { g += $2; c += $3; u += $5; gm += $6; cm += $7; n++ }
  END { if (n) printf "mean %12.3f %12.3f %8.3f %9.1f%% %10.3f %10.3f\n", g / n, c / n, c / g, u / n, gm / n, cm / n }' "$work/chat-bench.txt"
echo "(decode tok/s from each run's CSV summary; ratio = chat / generate; UI CPU = the UI thread's CPU time"
echo " over the turn's wall time; gen/chat ms = median decode step; the mean line's ratio is of the mean tok/s)"
