#!/usr/bin/env bash
# Runs the whole test suite three times while a CPU hog keeps one core busy:
# no test may depend on how fast the machine is. Exits non-zero on the first
# failing run.
#
# usage: scripts/stress-tests.sh [RUNS]   (default 3)
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-3}

# Build first, without the hog: the point is the tests, not the compiler.
cargo test --release --locked --no-run

# The hog: one busy process pinned to the last core.
core=$(($(nproc) - 1))
taskset -c "$core" sh -c 'while :; do :; done' &
hog=$!
trap 'kill "$hog" 2> /dev/null || true' EXIT
echo "stress-tests: CPU hog (pid $hog) busy on core $core"

for i in $(seq 1 "$runs"); do
  start=$(date +%s)
  status=0
  cargo test --release --locked > "target/stress-run-$i.log" 2>&1 || status=$?
  grep -E '^test result|FAILED|panicked|NOT RUN' "target/stress-run-$i.log" || true
  echo "stress-tests: run $i of $runs: exit $status in $(($(date +%s) - start)) s (log: target/stress-run-$i.log)"
  if [ "$status" -ne 0 ]; then
    exit "$status"
  fi
done
echo "stress-tests: $runs runs passed with one core busy"
