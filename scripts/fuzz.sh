#!/usr/bin/env bash
# Fuzzes the parsers that read untrusted input: the GGUF reader (one file and
# split sets), the route-trace parser and bmoe.toml. Uses cargo fuzz
# (libFuzzer), which needs a nightly toolchain: `rustup toolchain install
# nightly` and `cargo install cargo-fuzz`. The normal test suite replays the
# saved corpora without nightly (tests/fuzz_corpora.rs).
#
# usage: scripts/fuzz.sh seed                  write the seed corpora (needs target/release/bmoe)
#        scripts/fuzz.sh run TARGET [RUNS] [S]  fuzz until RUNS executions (default 10,000,000)
#                                               or S seconds (default 1200), whichever comes first
#        scripts/fuzz.sh min TARGET            shrink TARGET's corpus to the inputs that add coverage
#                                               (found inputs over 32 KiB are dropped)
#
# Targets: gguf_file gguf_split route_trace config. A crash, hang (10 s) or
# allocation over 1 GiB stops the run and leaves the input in
# fuzz/artifacts/TARGET/; fix it and copy the input to fuzz/regressions/TARGET/.
set -euo pipefail
cd "$(dirname "$0")/.."
corpus=fuzz/corpus

seed() {
  local bmoe=target/release/bmoe work
  [ -x "$bmoe" ] || { echo "fuzz: build bmoe first: cargo build --release" >&2; exit 1; }
  work=$(mktemp -d)
  trap 'rm -rf "$work"' RETURN
  mkdir -p "$corpus"/{gguf_file,gguf_split,route_trace,config}
  # Micro models of each architecture: every metadata key and tensor kind, few bytes.
  local micro=(--layers 2 --embd 8 --experts 4 --experts-used 2 --expert-ff 8)
  for arch in qwen3moe gemma4 gpt-oss; do
    "$bmoe" make-model "${micro[@]}" --arch "$arch" -o "$work/one-$arch.gguf" 2> /dev/null
    cp "$work/one-$arch.gguf" "$corpus/gguf_file/$arch"
    "$bmoe" make-model "${micro[@]}" --arch "$arch" --split 3 -o "$work/$arch.gguf" 2> /dev/null
    local sep
    sep=$(printf '\n--bmoe-fuzz-next-shard--\n')
    {
      cat "$work/$arch-00001-of-00003.gguf"
      printf '%s' "$sep"
      cat "$work/$arch-00002-of-00003.gguf"
      printf '%s' "$sep"
      cat "$work/$arch-00003-of-00003.gguf"
    } > "$corpus/gguf_split/$arch-3-shards"
  done
  # The header fields bmoe's load check guards: a hybrid's interval and SSM heads, MTP layers, gating.
  "$bmoe" make-model --layers 4 "${micro[@]:2}" --arch qwen3next -o "$corpus/gguf_file/qwen3next" 2> /dev/null
  "$bmoe" make-model "${micro[@]}" --arch glm4moe -o "$corpus/gguf_file/glm4moe" 2> /dev/null
  # Route traces: the head of each real trace and one of bmoe's own.
  for t in ../shared/data/route-traces/*.route.csv; do
    [ -f "$t" ] && head -c 16384 "$t" | sed '$d' > "$corpus/route_trace/$(basename "$t" .route.csv)"
  done
  "$bmoe" make-model --preset tiny -o "$work/tiny.gguf" 2> /dev/null
  "$bmoe" generate -m "$work/tiny.gguf" -p hello -n 8 -t 1 --moe-stream --route-trace "$corpus/route_trace/bmoe" > /dev/null 2>&1
  # Configs: the documented file and a few hand-written ones.
  cp bmoe.toml "$corpus/config/bmoe.toml"
  printf '[moe]\nstream = true\ncache_mb = 512.5\nio_threads = 8\n' > "$corpus/config/moe"
  printf '[plugins]\ndraft_plugin = "ngram"\ndraft = 4\ndraft_params = ["min_match=2", "max_match=8"]\n' > "$corpus/config/plugins"
  printf '[generate]\ntemp = 0.8\ntop_k = 40\ntop_p = 0.95\nseed = 7\nctx_size = 4096\n' > "$corpus/config/sampling"
  du -sh "$corpus"/*
}

run() {
  local target=$1 runs=${2:-10000000} seconds=${3:-1200}
  mkdir -p "$corpus/$target" "fuzz/artifacts/$target" "fuzz/logs"
  local log="fuzz/logs/$target.log"
  echo "fuzz: $target for $runs runs or $seconds s (log: $log)" >&2
  local dict=()
  [[ $target == gguf_* ]] && dict=(-dict=gguf.dict) # the header fields (fuzz/gguf.dict)
  (cd fuzz && cargo +nightly fuzz run "$target" "corpus/$target" -- "${dict[@]}" \
    -runs="$runs" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -malloc_limit_mb=1024 \
    -max_len=262144 -print_final_stats=1) > "$log" 2>&1 || {
    echo "fuzz: $target stopped on a finding; see $log and fuzz/artifacts/$target/" >&2
    tail -40 "$log" >&2
    exit 1
  }
  grep -E '^Done [0-9]+ runs|stat::number_of_executed_units' "$log" >&2
}

minimize() {
  local target=$1
  (cd fuzz && cargo +nightly fuzz cmin "$target" "corpus/$target")
  # Keep the repository small: drop found inputs over 32 KiB (mostly copies
  # of the seeds with changed tensor bytes); cmin renames every input to its
  # hash, so the committed seeds are checked out again under their names.
  find "$corpus/$target" -type f -size +32k -regextype posix-extended -regex '.*/[0-9a-f]{40}' -delete
  git checkout -- "$corpus/$target" 2> /dev/null || true
  echo "fuzz: $target corpus: $(ls "$corpus/$target" | wc -l) files, $(du -sh "$corpus/$target" | cut -f1)" >&2
}

case "${1:-}" in
  seed) seed ;;
  run) run "${2:?target}" "${3:-}" "${4:-}" ;;
  min) minimize "${2:?target}" ;;
  *) sed -n '2,17p' "$0" >&2; exit 2 ;;
esac
