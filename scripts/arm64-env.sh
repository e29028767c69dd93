# Sourced by scripts/build-arm64.sh and scripts/test-arm64.sh: installs what
# a cross build for aarch64 Linux needs (as root, when missing) and exports
# the environment cargo, the `cc` crate and llama.cpp's CMake build read.
#
# Baseline: armv8.2-a with dotprod and fp16 (the Pi 5's Cortex-A76, Orin's
# A78AE, current phones), for both halves:
#   Rust      RUSTFLAGS="-C target-feature=+dotprod,+fp16"
#   llama.cpp -march=armv8.2-a+dotprod+fp16, set by scripts/aarch64-linux.cmake
#             (llama-cpp-sys-2 would otherwise pin plain armv8-a, NEON only)
# GGML_CPU_ARM_ARCH=<gcc -march value> changes llama.cpp's baseline, e.g.
# armv8.6-a+dotprod+fp16+i8mm for cores with int8 matrix multiply.

arm64_packages=(gcc-aarch64-linux-gnu g++-aarch64-linux-gnu libc6-dev-arm64-cross)
# qemu-user runs the binaries and tests under emulation.
command -v qemu-aarch64 > /dev/null || arm64_packages+=(qemu-user)
if ! command -v aarch64-linux-gnu-g++ > /dev/null || ! command -v qemu-aarch64 > /dev/null; then
  if [ "$(id -u)" != 0 ]; then
    echo "arm64: needs ${arm64_packages[*]} (apt-get install them, or run this as root)" >&2
    exit 1
  fi
  echo "arm64: installing ${arm64_packages[*]}" >&2
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${arm64_packages[@]}" > /dev/null
fi

arm64_target=aarch64-unknown-linux-gnu
rustup target list --installed | grep -qx "$arm64_target" || rustup target add "$arm64_target"
export CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc
export CXX_aarch64_unknown_linux_gnu=aarch64-linux-gnu-g++
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
export CMAKE_TOOLCHAIN_FILE_aarch64_unknown_linux_gnu="$PWD/scripts/aarch64-linux.cmake"
# llama-cpp-sys-2 reruns its build when a GGML_* variable changes, and the
# toolchain file applies this one.
export GGML_CPU_ARM_ARCH="${GGML_CPU_ARM_ARCH:-armv8.2-a+dotprod+fp16}"
# Replaces the repository's `target-cpu=native`, which names this machine's CPU.
export RUSTFLAGS="-C target-feature=+dotprod,+fp16"
# `cargo test --target aarch64-...` runs the test binaries under qemu-user;
# QEMU_PAGE_SIZE (4096, 16384, 65536) is the page size they are told.
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="qemu-aarch64 -L /usr/aarch64-linux-gnu -p ${QEMU_PAGE_SIZE:-4096}"
