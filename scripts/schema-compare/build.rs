//! Links the llama.cpp that bmoe's own release build made (the same static
//! libraries `target/release/bmoe` carries), so the grammar sampler measured
//! here is the one bmoe runs, and this benchmark does not build llama.cpp a
//! second time. `LLAMA_SYS_OUT` names llama-cpp-sys-2's build output folder
//! (the one holding `output` and `out/bindings.rs`); without it the newest
//! one under `BMOE_TARGET_DIR` (default: bmoe's `target/`) is taken.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

fn main() {
    println!("cargo:rerun-if-env-changed=LLAMA_SYS_OUT");
    println!("cargo:rerun-if-env-changed=BMOE_TARGET_DIR");
    let dir = match std::env::var_os("LLAMA_SYS_OUT") {
        Some(d) => PathBuf::from(d),
        None => newest_build().unwrap_or_else(|| {
            panic!(
                "no llama-cpp-sys-2 build of bmoe found under {}/release/build: run `cargo build --release` \
                 in bmoe first, or set LLAMA_SYS_OUT",
                target_dir().display()
            )
        }),
    };
    let output = fs::read_to_string(dir.join("output")).expect("read the build script's output");
    for line in output.lines() {
        if line.starts_with("cargo:rustc-link-search=") || line.starts_with("cargo:rustc-link-lib=") {
            println!("{line}");
        }
    }
    println!("cargo:rustc-env=LLAMA_BINDINGS={}", dir.join("out/bindings.rs").display());
    println!("cargo:rustc-env=LLAMA_SYS_DIR={}", dir.display());
    println!("cargo:rerun-if-changed={}", dir.join("output").display());
}

fn target_dir() -> PathBuf {
    match std::env::var_os("BMOE_TARGET_DIR") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target"),
    }
}

/// The newest llama-cpp-sys-2 build under bmoe's release target that
/// finished (its `output` links libllama) and kept its bindings.
fn newest_build() -> Option<PathBuf> {
    let build = target_dir().join("release/build");
    let mut best: Option<(SystemTime, PathBuf)> = None;
    for entry in fs::read_dir(&build).ok()?.flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("llama-cpp-sys-2-") || !path.join("out/bindings.rs").exists() {
            continue;
        }
        let Ok(text) = fs::read_to_string(path.join("output")) else { continue };
        if !text.lines().any(|l| l == "cargo:rustc-link-lib=static=llama") {
            continue;
        }
        let time = fs::metadata(path.join("output")).and_then(|m| m.modified()).ok()?;
        if best.as_ref().is_none_or(|(t, _)| time > *t) {
            best = Some((time, path));
        }
    }
    best.map(|(_, p)| p)
}
