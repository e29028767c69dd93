#!/usr/bin/env bash
# Speculative decoding with each bundled drafter on the bench model, with
# streaming on, side by side with plain decoding in the same run.
#
# usage: scripts/draft-bench.sh [WORKDIR] [TOKENS] [CACHE_MB]
#
# Two prompts:
#   code  source code with repeated blocks (the classic n-gram case); the
#         random-weight model does not copy from its prompt, so drafts from
#         the prompt are wrong: this measures what failed drafting costs.
#   echo  "Hello" + the model's own continuation of "Hello" + "Hello": the
#         model repeats itself, so drafts are right: this measures what
#         successful drafting gains.
# With default parameters the drafters rarely draft on `code` (the model's
# output shares no 3-token suffix with the prompt); the `eager` rows lower
# min_match to 1 so they draft, and are wrong, on most steps.
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench-work}
tokens=${2:-128}
cache=${3:-2000}
source scripts/bench-model.sh

code=$(printf 'for (int i = 0; i < n; i++) {\n    sum += a[i] * b[i];\n}\n%.0s' 1 2 3 4; printf 'int dot(const int *a, const int *b, int n) {\n    int sum = 0;\n'; printf 'for (int i = 0; i < n; i++) {\n    sum += a[i] * b[i];\n}\n%.0s' 1 2 3)
echo_text=$($bmoe generate -m "$model" -p "Hello" -n 200 2> /dev/null)
echo_prompt="Hello${echo_text}Hello"

printf "%-6s %-12s %8s %8s %11s %11s %10s %9s\n" prompt drafter tok_s accept tok/verify steps MiB/token extra/ver
for prompt_name in code echo eager; do
  if [ "$prompt_name" = echo ]; then prompt=$echo_prompt; else prompt=$code; fi
  drafters="none ngram ngram-multi suffix"
  [ "$prompt_name" = eager ] && drafters="ngram ngram-multi suffix"
  for drafter in $drafters; do
    csv=$work/draft-$prompt_name-$drafter.csv
    args=(generate -m "$model" -p "$prompt" -n "$tokens" --moe-stream --cache-mb "$cache" --force-cache --csv "$csv")
    [ "$drafter" = none ] || args+=(--draft-plugin "$drafter" --draft 4)
    if [ "$prompt_name" = eager ]; then
      case $drafter in
        ngram) args+=(--draft-param min_match=1) ;;
        ngram-multi) args+=(--draft-param n_min=1) ;;
        suffix) args+=(--draft-param min_match=1 --draft-param p_min=0) ;;
      esac
    fi
    $bmoe "${args[@]}" > "$work/draft-$prompt_name-$drafter.txt" 2> /dev/null
    s=$(grep '^# summary' "$csv" | tr ' ' '\n')
    f() { echo "$s" | grep "^$1=" | cut -d= -f2; }
    acc=$(awk -v d="$(f drafted)" -v a="$(f accepted)" 'BEGIN { if (d > 0) printf "%.1f%%", 100 * a / d; else print "-" }')
    per=$(awk -v v="$(f verify_steps)" -v a="$(f accepted)" 'BEGIN { if (v > 0) printf "%.2f", (a + v) / v; else print "-" }')
    extra=$(awk -v v="$(f verify_steps)" -v x="$(f draft_extra_mib)" 'BEGIN { if (v > 0) printf "%.1f", x / v; else print "-" }')
    printf "%-6s %-12s %8.2f %8s %11s %11s %10.1f %9s\n" "$prompt_name" "$drafter" "$(f decode_tok_s)" "$acc" "$per" "$(f decode_steps)" "$(f read_mib_per_token)" "$extra"
  done
  # Speculative decoding must not change the text.
  base=$work/draft-$prompt_name-none.txt
  [ "$prompt_name" = eager ] && base=$work/draft-code-none.txt
  for drafter in ngram ngram-multi suffix; do
    cmp -s "$base" "$work/draft-$prompt_name-$drafter.txt" || echo "MISMATCH: $drafter changed the $prompt_name output"
  done
done
