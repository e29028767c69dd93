//! Build script: records which ggml the pinned llama-cpp-sys-2 vendors, so
//! telemetry files name the exact engine, and whether it was built for the
//! host CPU (`GGML_NATIVE`) or, on ARM, for which baseline, which `bmoe --version` reports.
//!
//! It also compiles `src/llama/invariant_sgemm.cpp`, a CPU extra buffer type for
//! batch-invariant contexts, against the vendored llama.cpp's internal
//! headers (ggml's CPU backend has no public API for it).
//!
//! The bundled plugins are not built here: they are committed, already built,
//! in `plugins/dist/` (see `scripts/build-plugins.sh`), so building bmoe needs
//! no wasm toolchain.

use std::path::PathBuf;

fn ggml_version() -> Option<String> {
    // llama-cpp-sys-2 declares `links = "llama"` and exports its OUT_DIR as `root`.
    let root = PathBuf::from(std::env::var_os("DEP_LLAMA_ROOT")?);
    let cache = std::fs::read_to_string(root.join("build/CMakeCache.txt")).ok()?;
    let src = cache.lines().find_map(|l| l.strip_prefix("ggml_SOURCE_DIR:STATIC="))?;
    let cmake = std::fs::read_to_string(PathBuf::from(src).join("CMakeLists.txt")).ok()?;
    let part = |name: &str| {
        cmake
            .lines()
            .find_map(|l| l.trim().strip_prefix(&format!("set({name} "))?.strip_suffix(')').map(str::to_string))
    };
    Some(format!("{}.{}.{}", part("GGML_VERSION_MAJOR")?, part("GGML_VERSION_MINOR")?, part("GGML_VERSION_PATCH")?))
}

/// A llama.cpp build setting (`GGML_NATIVE:BOOL`, ...) as CMake cached it.
fn ggml_setting(key_and_type: &str) -> Option<String> {
    let root = PathBuf::from(std::env::var_os("DEP_LLAMA_ROOT")?);
    let cache = std::fs::read_to_string(root.join("build/CMakeCache.txt")).ok()?;
    let prefix = format!("{key_and_type}=");
    cache.lines().find_map(|l| l.strip_prefix(&prefix)).map(str::to_string)
}

/// The vendored ggml source directory, as llama.cpp's CMake cache names it.
fn ggml_source_dir() -> Option<PathBuf> {
    let root = PathBuf::from(std::env::var_os("DEP_LLAMA_ROOT")?);
    let cache = std::fs::read_to_string(root.join("build/CMakeCache.txt")).ok()?;
    cache.lines().find_map(|l| l.strip_prefix("ggml_SOURCE_DIR:STATIC=")).map(PathBuf::from)
}

/// Compiles the invariant-sgemm buffer type against the vendored ggml headers.
fn compile_padded_sgemm() {
    println!("cargo:rerun-if-changed=src/llama/invariant_sgemm.cpp");
    let ggml = ggml_source_dir().expect("llama-cpp-sys-2's CMake cache names no ggml_SOURCE_DIR");
    cc::Build::new()
        .cpp(true)
        .std("c++17")
        .file("src/llama/invariant_sgemm.cpp")
        .include(ggml.join("include"))
        .include(ggml.join("src"))
        .warnings(true)
        // The vendored ggml-impl.h defines static helpers this file does not
        // use, and GCC's own AVX-512 headers trip its uninitialized check.
        .flag_if_supported("-Wno-unused-function")
        .flag_if_supported("-Wno-maybe-uninitialized")
        .compile("bmoe_invariant_sgemm");
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    compile_padded_sgemm();
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_ROOT");
    // llama.cpp reconfigured (another ARM baseline) rewrites its CMake cache.
    if let Some(root) = std::env::var_os("DEP_LLAMA_ROOT") {
        println!("cargo:rerun-if-changed={}", PathBuf::from(root).join("build/CMakeCache.txt").display());
    }
    let version = ggml_version().unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BMOE_GGML_VERSION={version}");
    let native = ggml_setting("GGML_NATIVE:BOOL").unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BMOE_GGML_NATIVE={native}");
    // The ARM baseline of a portable aarch64 build (empty elsewhere).
    let arm_arch = ggml_setting("GGML_CPU_ARM_ARCH:STRING").unwrap_or_default();
    println!("cargo:rustc-env=BMOE_GGML_ARM_ARCH={arm_arch}");
}
