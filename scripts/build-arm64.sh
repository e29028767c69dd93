#!/usr/bin/env bash
# Cross-builds bmoe for aarch64 Linux (Raspberry Pi 5, Jetson, ARM laptops and
# servers) on an x86-64 Debian machine: Debian's cross compilers for llama.cpp,
# Rust's aarch64-unknown-linux-gnu target for the rest. The binary lands in
# target/aarch64-unknown-linux-gnu/release/bmoe; with qemu-user installed the
# script runs its `--version` under emulation as a check.
#
# Baseline: the Rust code is built for armv8.2-a with dotprod and fp16 (the Pi
# 5's Cortex-A76, Orin's A78AE, current phones). llama.cpp is built for
# armv8-a with NEON: llama-cpp-sys-2 pins GGML_CPU_ARM_ARCH=armv8-a for every
# aarch64 Linux build that is not `target-cpu=native`, and a `target-cpu` here
# would reach the C compiler as an invalid `-march`. On the device itself,
# `cargo build --release` (the repository's own `target-cpu=native`) builds
# llama.cpp for the device's CPU, dotprod and i8mm included.
#
# usage: scripts/build-arm64.sh        (root installs the cross compilers if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v aarch64-linux-gnu-gcc > /dev/null || ! command -v aarch64-linux-gnu-g++ > /dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "build-arm64: needs gcc-aarch64-linux-gnu, g++-aarch64-linux-gnu and libc6-dev-arm64-cross" \
      "(apt-get install them, or run this as root)" >&2
    exit 1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q gcc-aarch64-linux-gnu g++-aarch64-linux-gnu \
    libc6-dev-arm64-cross > /dev/null
fi
target=aarch64-unknown-linux-gnu
rustup target add "$target" > /dev/null
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
# Replaces the repository's `target-cpu=native`, which names this machine's CPU.
export RUSTFLAGS="-C target-feature=+dotprod,+fp16"
cargo build --release --target "$target" --bin bmoe
bin="${CARGO_TARGET_DIR:-target}/$target/release/bmoe"
echo "build-arm64: $bin"
if command -v qemu-aarch64 > /dev/null; then
  qemu-aarch64 -L /usr/aarch64-linux-gnu "$bin" --version
fi
