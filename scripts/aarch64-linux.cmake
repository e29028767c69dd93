# CMake toolchain for cross-building llama.cpp (through llama-cpp-sys-2) for
# aarch64 Linux with Debian's cross compilers. scripts/build-arm64.sh hands it
# to the `cmake` crate as CMAKE_TOOLCHAIN_FILE_aarch64_unknown_linux_gnu.
#
# llama-cpp-sys-2 defines GGML_CPU_ARM_ARCH=armv8-a (NEON only) for every
# aarch64 Linux build that is not `target-cpu=native`, after any value from the
# environment. A toolchain file runs at `project()`, after the command line's
# cache entries, so the baseline set here is the one ggml compiles for.
set(CMAKE_SYSTEM_NAME Linux)
set(CMAKE_SYSTEM_PROCESSOR aarch64)
set(CMAKE_C_COMPILER aarch64-linux-gnu-gcc)
set(CMAKE_CXX_COMPILER aarch64-linux-gnu-g++)
set(CMAKE_FIND_ROOT_PATH /usr/aarch64-linux-gnu)
set(CMAKE_FIND_ROOT_PATH_MODE_PROGRAM NEVER)
set(CMAKE_FIND_ROOT_PATH_MODE_LIBRARY ONLY)
set(CMAKE_FIND_ROOT_PATH_MODE_INCLUDE ONLY)

# The ARM baseline: armv8.2-a with dotprod and fp16 (Cortex-A76 in the Pi 5,
# A78AE in Jetson Orin, current phones), unless the environment's
# GGML_CPU_ARM_ARCH names another (scripts/arm64-env.sh exports it, so cargo
# rebuilds llama.cpp when it changes).
if(DEFINED ENV{GGML_CPU_ARM_ARCH})
  set(bmoe_arm_arch "$ENV{GGML_CPU_ARM_ARCH}")
else()
  set(bmoe_arm_arch "armv8.2-a+dotprod+fp16")
endif()
set(GGML_CPU_ARM_ARCH "${bmoe_arm_arch}" CACHE STRING "ggml's -march on ARM" FORCE)
