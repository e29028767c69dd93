//! Build script:
//! - records which ggml the pinned llama-cpp-sys-2 vendors, so telemetry
//!   files name the exact engine;
//! - compiles the guest plugins in `plugins/` for `wasm32-unknown-unknown`
//!   (their own cargo workspace, their own target directory) and wraps each
//!   core module into a component with `wit-component`. The bundled ones are
//!   embedded in the binary; the test fixtures are left in OUT_DIR for tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Guest crates, by package name; `true` for those embedded in bmoe.
/// Guest crates: (package name, directory under plugins/, embedded in bmoe).
const GUESTS: &[(&str, &str, bool)] = &[
    ("ngram", "ngram", true),
    ("ngram-multi", "ngram-multi", true),
    ("suffix", "suffix", true),
    ("drop-cold", "drop-cold", true),
    ("hostile-drafter", "tests/hostile-drafter", false),
    ("hostile-dropper", "tests/hostile-dropper", false),
    ("future-drafter", "tests/future-drafter", false),
];

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

fn build_guests(out: &Path) -> Result<(), String> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap()).join("plugins/Cargo.toml");
    let target_dir = out.join("plugins-target");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--release", "--locked", "--target", "wasm32-unknown-unknown", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir);
    // The outer build's flags and target settings are for the host, not the guests.
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "CARGO_BUILD_TARGET",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_RUSTFLAGS",
        "CARGO_MAKEFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
    ] {
        cmd.env_remove(var);
    }
    let status = cmd.status().map_err(|e| format!("cannot run cargo for the plugins: {e}"))?;
    if !status.success() {
        return Err("building the guest plugins failed (is the wasm32-unknown-unknown target installed? \
                    `rustup target add wasm32-unknown-unknown`)"
            .into());
    }
    let mut embedded =
        String::from("/// Bundled plugins: (name, component bytes).\npub const BUNDLED: &[(&str, &[u8])] = &[\n");
    for (name, _, bundled) in GUESTS {
        let core_path =
            target_dir.join("wasm32-unknown-unknown/release").join(format!("{}.wasm", name.replace('-', "_")));
        let core = std::fs::read(&core_path).map_err(|e| format!("{}: {e}", core_path.display()))?;
        let component = wit_component::ComponentEncoder::default()
            .module(&core)
            .and_then(|e| e.validate(true).encode())
            .map_err(|e| format!("wrapping {name} into a component: {e:#}"))?;
        let path = out.join(format!("{name}.wasm"));
        std::fs::write(&path, component).map_err(|e| format!("{}: {e}", path.display()))?;
        if *bundled {
            embedded.push_str(&format!("    ({name:?}, include_bytes!({:?})),\n", path.display().to_string()));
        }
    }
    embedded.push_str("];\n");
    std::fs::write(out.join("bundled_plugins.rs"), embedded).map_err(|e| e.to_string())
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    // Watch the sources only: a plugins/target left by a manual build must not
    // trigger rebuilds.
    for path in ["plugins/Cargo.toml", "plugins/Cargo.lock", "plugins/wit", "plugins/support"] {
        println!("cargo:rerun-if-changed={path}");
    }
    for (_, dir, _) in GUESTS {
        println!("cargo:rerun-if-changed=plugins/{dir}");
    }
    println!("cargo:rerun-if-env-changed=DEP_LLAMA_ROOT");
    let version = ggml_version().unwrap_or_else(|| "unknown".into());
    println!("cargo:rustc-env=BMOE_GGML_VERSION={version}");
    let out = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    if let Err(e) = build_guests(&out) {
        println!("cargo:warning={e}");
        panic!("{e}");
    }
}
