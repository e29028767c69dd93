//! Build script: records which ggml the pinned llama-cpp-sys-2 vendors, so
//! telemetry files name the exact engine, and whether it was built for the
//! host CPU (`GGML_NATIVE`), which `bmoe --version` reports.
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

/// llama.cpp's `GGML_NATIVE` setting as CMake cached it.
fn ggml_native() -> Option<String> {
    let root = PathBuf::from(std::env::var_os("DEP_LLAMA_ROOT")?);
    let cache = std::fs::read_to_string(root.join("build/CMakeCache.txt")).ok()?;
    cache.lines().find_map(|l| l.strip_prefix("GGML_NATIVE:BOOL=")).map(str::to_string)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_ROOT");
    let version = ggml_version().unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BMOE_GGML_VERSION={version}");
    let native = ggml_native().unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BMOE_GGML_NATIVE={native}");
}
