#!/usr/bin/env bash
# Checks the README's promise that `cargo test --release` passes on a machine
# with only the listed requirements: runs the test command in a private mount
# namespace where the optional packages cannot run (an empty file mounted
# over tmux, chromium and chromedriver, an empty directory over Python's
# ensurepip and over the wasm32 target's library), then checks that it
# passed and that each test needing one of them said NOT RUN and why.
#
# usage: scripts/test-without-extras.sh [CARGO TEST ARGS...]
# Needs root or unprivileged user namespaces (`unshare`); .ci/run runs it
# after the full test run, so nothing is rebuilt.
set -euo pipefail
cd "$(dirname "$0")/.."

# The tests that need an optional package (tests/common/requires.rs).
expected=(
  chat_in_a_real_terminal
  the_terminal_is_restored_after_a_panic
  the_chat_page_streams_a_reply_and_shows_the_routing_panel
  a_page_on_another_origin_calls_the_api_with_cors
  the_openai_python_client_drives_the_server
  the_anthropic_python_client_runs_a_streamed_tool_loop
  the_openai_python_client_runs_a_streamed_tool_loop_on_responses
  the_ollama_python_client_runs_a_streamed_tool_loop
  huggingface_hub_reads_the_cache_bmoe_writes_and_bmoe_reads_its
  scaffolded_plugins_build_and_load
)

if [ "${1:-}" != --inside ]; then
  if [ "$(id -u)" -eq 0 ]; then unshare_flags=(-m); else unshare_flags=(-r -m); fi
  log=target/test-without-extras.log
  mkdir -p target
  start=$SECONDS
  set +e
  # Every BMOE_REQUIRE_* unset: here a missing package must be skipped.
  env -u BMOE_REQUIRE_TMUX -u BMOE_REQUIRE_BROWSER -u BMOE_REQUIRE_PYTHON_VENV -u BMOE_REQUIRE_WASM_TARGET \
    unshare "${unshare_flags[@]}" "$0" --inside "$@" 2>&1 | tee "$log" | grep -E '^test result|NOT RUN|FAILED|panicked|^hidden:'
  status=${PIPESTATUS[0]}
  set -e
  if [ "$status" -ne 0 ]; then
    echo "test-without-extras: the test command failed without the optional packages (exit $status; log: $log)" >&2
    exit 1
  fi
  for t in "${expected[@]}"; do
    # (not anchored: libtest's own lines may share the line)
    if ! grep -qE "$t: NOT RUN: .+ \((apt-get install|rustup target add) [^)]+\)" "$log"; then
      echo "test-without-extras: $t did not say NOT RUN with an install line (log: $log)" >&2
      exit 1
    fi
  done
  # Every test that skips names its package in the list above (which the
  # README and docs/testing.md count): a new one must be added there.
  unlisted=$(grep -oE '[A-Za-z0-9_]+: NOT RUN:' "$log" | sed 's/: NOT RUN://' | sort -u | grep -vxF -f <(printf '%s\n' "${expected[@]}") || true)
  if [ -n "$unlisted" ]; then
    echo "test-without-extras: these tests said NOT RUN but are not in this script's list: $unlisted" >&2
    exit 1
  fi
  passed=$(grep -E '^test result: ok' "$log" | awk '{ n += $4 } END { print n }')
  echo "test-without-extras: passed in $((SECONDS - start)) s: $passed tests passed, ${#expected[@]} of them said NOT RUN"
  exit 0
fi
shift

# Inside the namespace: nothing mounted here is seen outside.
mount --make-rprivate /
hide=$(mktemp -d)
trap 'rm -rf "$hide"' EXIT
touch "$hide/empty-file"
mkdir "$hide/empty-dir"
hide_file() {
  local path
  path=$(command -v "$1" || true)
  [ -z "$path" ] && [ -e "$1" ] && path=$1
  [ -n "$path" ] || return 0
  mount --bind "$hide/empty-file" "$(readlink -f "$path")"
  echo "hidden: $1"
}
hide_dir() {
  [ -d "$1" ] || return 0
  mount --bind "$hide/empty-dir" "$1"
  echo "hidden: $1"
}
hide_file tmux
hide_file /usr/bin/chromium
hide_file /usr/bin/chromedriver
if ensurepip=$(python3 -c 'import ensurepip, os; print(os.path.dirname(ensurepip.__file__))' 2> /dev/null); then
  hide_dir "$ensurepip"
fi
hide_dir "$(rustc --print sysroot)/lib/rustlib/wasm32-unknown-unknown"
cargo test --release --locked "$@"
