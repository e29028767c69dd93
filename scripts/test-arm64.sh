#!/usr/bin/env bash
# Runs bmoe's byte-identity gates and plugin tests for aarch64 Linux under
# emulation: cross-built as scripts/build-arm64.sh builds (same baseline),
# each test binary run by qemu-user as cargo's target runner.
#
# usage: scripts/test-arm64.sh [--subset] [PAGE_SIZE...]
#        scripts/test-arm64.sh --ci
#        scripts/test-arm64.sh --build
#   PAGE_SIZE   page sizes the tests are told (qemu-aarch64 -p): 4096 (the
#               default), 16384 (Raspberry Pi OS on a Pi 5, Asahi), 65536
#               (many ARM server kernels); the tests run once per size
#   --subset    only the SUBSET below (about a quarter of the run time)
#   --ci        what .ci/run runs: the subset and every generated
#               architecture's gate at 4096, and at 16384 and 65536 the
#               subset's tests whose work depends on the page size (PAGES);
#               ARM64_JOBS runs at a time (default 2)
#   --build     only cross-build the test binaries
#
# The whole set: the library's unit tests, tests/gates.rs (cache off and
# evicting, read-ahead, lanes, O_DIRECT and buffered, repacked copies, split
# files, ...), tests/arch_gates.rs (every generated architecture),
# tests/quant_gates.rs (every expert quant type and release mix),
# tests/plugins.rs (the Wasm plugins under wasmtime), tests/scripts.rs (Rhai)
# and tests/chat_tui.rs (the chat screens from real engine events). Tests
# that start the bmoe binary themselves are left out: under emulation the
# kernel cannot run an aarch64 program without binfmt_misc.
set -euo pipefail
cd "$(dirname "$0")/.."
subset=0
ci=0
build_only=0
sizes=()
for a in "$@"; do
  case "$a" in
    --subset) subset=1 ;;
    --ci) ci=1 ;;
    --build) build_only=1 ;;
    4096 | 16384 | 65536) sizes+=("$a") ;;
    *) echo "usage: scripts/test-arm64.sh [--subset] [4096|16384|65536...] | --ci | --build" >&2; exit 2 ;;
  esac
done
[ ${#sizes[@]} -gt 0 ] || sizes=(4096)
source scripts/arm64-env.sh
tests=(--lib --test gates --test arch_gates --test quant_gates --test plugins --test scripts --test chat_tui)
# chat_tui's one test that starts `bmoe rpc-server`.
skips=(--skip layers_on_an_rpc_server_show_in_the_header)
# SUBSET: the memory, lane, io_uring and layout unit tests; the gates of
# cache off with four lanes, an evicting cache, buffered and O_DIRECT reads,
# page recycling, read-ahead, a repacked copy and split files; four
# architectures (plain, shared experts, expert biases, hybrid); a K-quant,
# an IQ type, mxfp4 and the release mixes; every plugin test; Rhai's
# sandbox and error tests; the chat screens.
# The subset's streamed gates, which PAGES below runs at every page size.
stream_filters=(cache_off_four_lanes cache_evicting_every_token buffered_reads o_direct_is_really_used
  recycled_pages_are_lossless read_ahead_is_lossless repacked_experts_stream_like_resident_ones
  three_shard_split_model
  gate_qwen3moe gate_deepseek2 gate_gpt_oss gate_qwen3next
  gate_q4_k gate_iq4_xs gate_mxfp4)
subset_filters=(memory:: cpu_layouts:: lanes:: uring:: "${stream_filters[@]}" gate_quant_mixes
  _plugin_ bundled hostile bad_files
  a_runaway_loop writes_outside errors_point_at
  screens_at_two_sizes routing_panel_cells a_setting_changed a_tool_call mtp_acceptance)
# PAGES: the subset less what does not depend on the page size (the layout
# tests, the plugins, Rhai, the chat screens, the release mixes): the page
# windows, releases and moves, the lanes, and the streamed gates.
page_tests=(--lib --test gates --test arch_gates --test quant_gates)
page_filters=(memory:: lanes:: uring:: "${stream_filters[@]}")

# Runs tests at page size $1: the whole set, the subset, its page-size part
# or every architecture's gate ($2: whole, subset, pages or arches).
run_at() {
  local size=$1 selected=("${tests[@]}") filters=()
  case "$2" in
    subset) filters=("${subset_filters[@]}") ;;
    pages) selected=("${page_tests[@]}") filters=("${page_filters[@]}") ;;
    arches) selected=(--test arch_gates) ;;
  esac
  echo "test-arm64: page size $size ($2)"
  local start=$SECONDS
  CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -p $size" \
    cargo test --release --locked --target "$arm64_target" "${selected[@]}" -- "${skips[@]}" "${filters[@]}"
  echo "test-arm64: page size $size passed in $((SECONDS - start)) s"
}

# Runs each "SIZE KIND" given with run_at, ARM64_JOBS at a time (qemu runs
# a test binary on about one core, so two runs keep two cores busy). A run's
# output is held in a file and printed whole when it ends; every run goes
# to its end, and a failed one fails the whole.
run_parallel() {
  local max=${ARM64_JOBS:-2} logs pending=0 failed=0 run pid status
  local -A name_of=()
  logs=$(mktemp -d)
  finish_one() {
    status=0
    wait -n -p pid || status=$?
    pending=$((pending - 1))
    cat "$logs/${name_of[$pid]}.log"
    if [ "$status" -ne 0 ]; then
      echo "test-arm64: ${name_of[$pid]} failed (exit $status)"
      failed=1
    fi
  }
  for run in "$@"; do
    [ "$pending" -lt "$max" ] || finish_one
    # shellcheck disable=SC2086 # "SIZE KIND" splits into run_at's two arguments
    run_at $run > "$logs/${run// /-}.log" 2>&1 &
    name_of[$!]=${run// /-}
    pending=$((pending + 1))
  done
  while [ "$pending" -gt 0 ]; do finish_one; done
  cat "$logs"/*.log | grep -E '^test result: ok' | awk '{ n += $4 } END { print "test-arm64: " n " tests passed in all" }'
  rm -rf "$logs"
  return "$failed"
}

cargo test --release --locked --target "$arm64_target" --no-run "${tests[@]}"
[ "$build_only" = 1 ] && exit 0
if [ "$ci" = 1 ]; then
  # The longest run first, so the other three share the second slot.
  run_parallel "4096 subset" "4096 arches" "16384 pages" "65536 pages"
else
  for size in "${sizes[@]}"; do run_at "$size" "$([ "$subset" = 1 ] && echo subset || echo whole)"; done
fi
