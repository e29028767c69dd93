#!/usr/bin/env bash
# Rebuilds the committed plugin components in plugins/dist/ from the guest
# sources in plugins/, reproducibly:
#   - the pinned toolchain (rust-toolchain.toml) and plugins/Cargo.lock;
#   - build paths remapped, so the bytes do not depend on where the checkout
#     or the cargo home lives;
#   - each core module wrapped into a component by `bmoe plugin wrap` (the
#     pinned wit-component in Cargo.lock).
#
# usage: scripts/build-plugins.sh           write plugins/dist/
#        scripts/build-plugins.sh --check   fail if plugins/dist/ is not what the sources build
#
# Needs the wasm32-unknown-unknown target (`rustup target add wasm32-unknown-unknown`);
# building bmoe itself does not.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

check=false
case "${1:-}" in
  --check) check=true ;;
  "") ;;
  *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

# (crate, directory under plugins/, where the component goes under plugins/dist/)
guests=(
  "ngram ngram ngram.wasm"
  "ngram-multi ngram-multi ngram-multi.wasm"
  "suffix suffix suffix.wasm"
  "drop-cold drop-cold drop-cold.wasm"
  "hostile-drafter tests/hostile-drafter fixtures/hostile-drafter.wasm"
  "hostile-dropper tests/hostile-dropper fixtures/hostile-dropper.wasm"
  "future-drafter tests/future-drafter fixtures/future-drafter.wasm"
)

if ! rustup target list --installed 2> /dev/null | grep -qx wasm32-unknown-unknown; then
  echo "build-plugins: the wasm32-unknown-unknown target is not installed: rustup target add wasm32-unknown-unknown" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
target="$root/target/plugins"
cargo_home=${CARGO_HOME:-$HOME/.cargo}

# The host's flags are not the guests'.
unset RUSTFLAGS CARGO_BUILD_RUSTFLAGS CARGO_BUILD_TARGET CARGO_TARGET_DIR RUSTC_WORKSPACE_WRAPPER
flags=("--remap-path-prefix=$root=/bmoe" "--remap-path-prefix=$cargo_home=/cargo")
CARGO_ENCODED_RUSTFLAGS=$(printf '%s\x1f' "${flags[@]}")
export CARGO_ENCODED_RUSTFLAGS="${CARGO_ENCODED_RUSTFLAGS%$'\x1f'}"

packages=()
for g in "${guests[@]}"; do
  read -r name _ _ <<< "$g"
  packages+=(-p "$name")
done
echo "build-plugins: building ${#guests[@]} guests for wasm32-unknown-unknown" >&2
cargo build --release --locked --quiet --target wasm32-unknown-unknown \
  --manifest-path plugins/Cargo.toml --target-dir "$target" "${packages[@]}"
unset CARGO_ENCODED_RUSTFLAGS

echo "build-plugins: wrapping the core modules into components" >&2
# The same build as `cargo test --release` makes, so CI reuses it.
cargo build --release --locked --quiet --all-targets
mkdir -p "$work/fixtures"
for g in "${guests[@]}"; do
  read -r name _ out <<< "$g"
  core="$target/wasm32-unknown-unknown/release/${name//-/_}.wasm"
  target/release/bmoe plugin wrap "$core" -o "$work/$out" > /dev/null
done

stale=()
for g in "${guests[@]}"; do
  read -r name dir out <<< "$g"
  if ! cmp -s "$work/$out" "plugins/dist/$out"; then
    stale+=("plugins/dist/$out (from plugins/$dir)")
  fi
done

if $check; then
  if [ ${#stale[@]} -gt 0 ]; then
    echo "build-plugins: committed plugins differ from what their sources build:" >&2
    printf '  %s\n' "${stale[@]}" >&2
    echo "run scripts/build-plugins.sh and commit plugins/dist/" >&2
    exit 1
  fi
  echo "build-plugins: plugins/dist/ matches the sources (${#guests[@]} components)" >&2
else
  mkdir -p plugins/dist/fixtures
  for g in "${guests[@]}"; do
    read -r _ _ out <<< "$g"
    install -m 644 "$work/$out" "plugins/dist/$out"
  done
  echo "build-plugins: wrote plugins/dist/ (${#stale[@]} changed)" >&2
fi
