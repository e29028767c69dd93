#!/usr/bin/env bash
# Cross-builds bmoe for aarch64 Linux (Raspberry Pi 5, Jetson, ARM laptops and
# servers) on an x86-64 Debian machine: Debian's cross compilers for llama.cpp,
# Rust's aarch64-unknown-linux-gnu target for the rest, for the baseline named
# in scripts/arm64-env.sh (armv8.2-a+dotprod+fp16). The binary lands in
# target/aarch64-unknown-linux-gnu/release/bmoe and its `--version` runs under
# qemu-user as a check. docs/edge.md builds on the device for its own CPU.
#
# usage: scripts/build-arm64.sh        (as root it installs the cross compilers)
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/arm64-env.sh
cargo build --release --locked --target "$arm64_target" --bin bmoe
bin="${CARGO_TARGET_DIR:-target}/$arm64_target/release/bmoe"
echo "build-arm64: $bin"
qemu-aarch64 -L /usr/aarch64-linux-gnu "$bin" --version
