//! `bmoe plugin new`: the files of a new guest crate, ready to build with
//! `cargo build --release` and load with `--draft-plugin` / `--drop-plugin`.

use super::PluginKind;

/// The WIT interface this bmoe speaks, copied into every new plugin.
pub const WIT: &str = include_str!("../../plugins/wit/policy.wit");

const CARGO_TOML: &str = r#"[package]
name = "__CRATE__"
version = "0.1.0"
edition = "2024"
publish = false

[lib]
crate-type = ["cdylib"]

[dependencies]
wit-bindgen = { version = "0.61", default-features = false, features = ["macros", "realloc"] }

[profile.release]
opt-level = 3
lto = true
codegen-units = 1
panic = "abort"
strip = true
"#;

const CARGO_CONFIG: &str = r#"# Plugins are built for wasm32-unknown-unknown: no WASI, no imports.
[build]
target = "wasm32-unknown-unknown"
"#;

const DRAFTER: &str = r#"//! __NAME__: a bmoe draft policy. It proposes the tokens that followed the
//! most recent earlier occurrence of the last token (a bigram lookup).
//! Replace `draft` with your own policy; see bmoe's docs/plugins.md.

use std::cell::RefCell;

use bmoe::policy::types::{Info, Param};
use exports::bmoe::policy::drafter_policy::Guest;

wit_bindgen::generate!({ world: "drafter", path: "wit" });

struct Policy;

thread_local! {
    /// Every token of the conversation so far.
    static CONTEXT: RefCell<Vec<i32>> = const { RefCell::new(Vec::new()) };
    static MAX_RUN: RefCell<usize> = const { RefCell::new(8) };
}

impl Guest for Policy {
    fn describe() -> Info {
        Info {
            name: "__NAME__".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "drafts what followed the last earlier occurrence of the last token".into(),
            params: vec![Param {
                name: "max_run".into(),
                default: "8".into(),
                description: "most tokens copied per draft".into(),
            }],
        }
    }

    fn configure(params: Vec<(String, String)>) -> Result<(), String> {
        for (name, value) in params {
            match name.as_str() {
                "max_run" => {
                    let v: usize = value.parse().map_err(|_| format!("max_run: not a number: {value}"))?;
                    MAX_RUN.with_borrow_mut(|m| *m = v);
                }
                _ => return Err(format!("unknown parameter `{name}`")),
            }
        }
        Ok(())
    }

    fn reset(context: Vec<i32>) {
        CONTEXT.with_borrow_mut(|c| *c = context);
    }

    fn observe(accepted: Vec<i32>) {
        CONTEXT.with_borrow_mut(|c| c.extend(accepted));
    }

    fn draft(max: u32) -> Vec<i32> {
        let limit = (max as usize).min(MAX_RUN.with_borrow(|m| *m));
        CONTEXT.with_borrow(|c| {
            let Some(&last) = c.last() else { return Vec::new() };
            let Some(at) = c[..c.len() - 1].iter().rposition(|&t| t == last) else { return Vec::new() };
            c[at + 1..].iter().take(limit).copied().collect()
        })
    }
}

export!(Policy);
"#;

const DROPPER: &str = r#"//! __NAME__: a bmoe expert-drop policy. It drops routed experts whose
//! router weight is below `min_weight`, never the top-ranked one. With the
//! default 0 it drops nothing. Replace `decide` with your own policy; see
//! bmoe's docs/plugins.md.

use std::cell::Cell;

use bmoe::policy::types::{Info, Param};
use exports::bmoe::policy::dropper_policy::{Guest, Routed};

wit_bindgen::generate!({ world: "dropper", path: "wit" });

struct Policy;

thread_local! {
    static MIN_WEIGHT: Cell<f32> = const { Cell::new(0.0) };
}

impl Guest for Policy {
    fn describe() -> Info {
        Info {
            name: "__NAME__".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            description: "drops routed experts below a weight, never the top one".into(),
            params: vec![Param {
                name: "min_weight".into(),
                default: "0".into(),
                description: "router weight below which an expert is dropped".into(),
            }],
        }
    }

    fn configure(params: Vec<(String, String)>) -> Result<(), String> {
        for (name, value) in params {
            match name.as_str() {
                "min_weight" => MIN_WEIGHT.set(value.parse().map_err(|_| format!("min_weight: not a number: {value}"))?),
                _ => return Err(format!("unknown parameter `{name}`")),
            }
        }
        Ok(())
    }

    fn decide(_layer: u32, _k: u32, slots: Vec<Routed>) -> Vec<u32> {
        let min = MIN_WEIGHT.get();
        // Slot 0 holds the largest weight: always keep it.
        slots.iter().skip(1).filter(|s| s.weight < min).map(|s| s.expert).collect()
    }
}

export!(Policy);
"#;

const README: &str = r#"# __NAME__

A bmoe __KIND__ plugin (WebAssembly component, interface `bmoe:policy@__VERSION__`).

```sh
rustup target add wasm32-unknown-unknown   # once
cargo build --release
bmoe plugin check target/wasm32-unknown-unknown/release/__CRATE_FILE__.wasm
bmoe plugin bench target/wasm32-unknown-unknown/release/__CRATE_FILE__.wasm
bmoe generate --moe-stream __FLAG__ target/wasm32-unknown-unknown/release/__CRATE_FILE__.wasm
bmoe plugin wrap target/wasm32-unknown-unknown/release/__CRATE_FILE__.wasm -o __NAME__.wasm   # one file to share
```

`wit/policy.wit` is the interface, copied from the bmoe that made this crate. The plugin
may import nothing: no files, clocks or network. Each call has a CPU-time limit and the
plugin's memory is capped; a plugin that traps, runs out of time or memory, or answers
with invalid data is disabled for the rest of the run and decoding goes on without it.
"#;

/// The files of a new plugin crate named `name`, as (relative path, contents).
pub fn files(name: &str, kind: PluginKind) -> Vec<(String, String)> {
    let fill = |t: &str| {
        t.replace("__NAME__", name)
            .replace("__CRATE__", name)
            .replace("__CRATE_FILE__", &name.replace('-', "_"))
            .replace("__KIND__", kind.name())
            .replace("__VERSION__", &super::wasm::interface_version())
            .replace("__FLAG__", if kind == PluginKind::Drafter { "--draft-plugin" } else { "--drop-plugin" })
    };
    let lib = if kind == PluginKind::Drafter { DRAFTER } else { DROPPER };
    vec![
        ("Cargo.toml".into(), fill(CARGO_TOML)),
        (".cargo/config.toml".into(), CARGO_CONFIG.into()),
        ("src/lib.rs".into(), fill(lib)),
        ("wit/policy.wit".into(), WIT.into()),
        ("README.md".into(), fill(README)),
        (".gitignore".into(), "/target\n".into()),
    ]
}

/// True for a name cargo accepts as a package name and bmoe as a plugin name.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_filled() {
        for kind in [PluginKind::Drafter, PluginKind::Dropper] {
            for (path, text) in files("my-policy", kind) {
                assert!(!text.contains("__"), "{path} still has a placeholder");
            }
        }
        assert!(valid_name("my-policy") && !valid_name("My Policy") && !valid_name("") && !valid_name("9lives"));
    }
}
