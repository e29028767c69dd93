#!/usr/bin/env bash
# Shows that resident memory follows the expert cache budget: runs the bench
# model with several budgets and prints, side by side, the budget, the bytes
# the cache holds, anonymous and file-backed RSS, hit rate and decode speed.
#
# usage: scripts/rss-vs-budget.sh [WORKDIR] [TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
work=${1:-bench-work}
tokens=${2:-64}
source scripts/bench-model.sh
printf "%10s %12s %10s %10s %10s %8s %8s\n" budget_mib cache_mib rss_mib anon_mib file_mib hit_pct tok_s
for mb in 0 250 500 1000 2000 4000; do
  csv=$work/rss-$mb.csv
  $bmoe generate -m "$model" -p "hello there" -n "$tokens" --moe-stream --cache-mb "$mb" --force-cache --csv "$csv" > /dev/null 2>&1
  # Last data row: memory after the final decode; summary line: speed and hit rate.
  row=$(grep -v '^#' "$csv" | tail -1)
  summary=$(grep '^# summary' "$csv")
  field() { echo "$summary" | tr ' ' '\n' | grep "^$1=" | cut -d= -f2; }
  echo "$row" | awk -F, -v mb="$mb" -v hit="$(field hit_pct)" -v tps="$(field decode_tok_s)" \
    '{ printf "%10s %12s %10s %10s %10s %8.1f %8.2f\n", mb, $16, $17, $18, $19, hit, tps }'
done
