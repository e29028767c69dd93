#!/usr/bin/env bash
# Records route traces of one model over several prompts, one trace a
# prompt, for `bmoe replay --learn-from-others` (each prompt scored with a
# route profile learned from the others).
#
# usage: scripts/profile-traces.sh MODEL OUTDIR [TOKENS]
set -euo pipefail
cd "$(dirname "$0")/.."
model=$1
out=$2
tokens=${3:-48}
bmoe=${BMOE:-target/release/bmoe}
mkdir -p "$out"
prompts=(
  "Explain how a river delta forms over thousands of years."
  "Write a short Python function that checks whether a string is a palindrome."
  "What were the main causes of the French Revolution?"
  "Give me three ideas for a vegetarian dinner with lentils."
  "Describe the rules of chess for someone who has never played."
  "Translate into French: the train leaves at seven and arrives at noon."
)
for i in "${!prompts[@]}"; do
  # Routing does not depend on the cache: keep it whole so the run is quick.
  $bmoe -q generate -m "$model" -p "${prompts[$i]}" -n "$tokens" --moe-stream --route-profile off \
    --route-trace "$out/prompt$i.trace" > /dev/null
  echo "$out/prompt$i.trace"
done
