//! Build script: records which ggml the pinned llama-cpp-sys-2 vendors, so
//! telemetry files name the exact engine, and whether it was built for the
//! host CPU (`GGML_NATIVE`) or, on ARM, for which baseline, which `bmoe --version` reports.
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

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
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
