//! What a script may do: the engine's limits (operations, call depth,
//! expression depth, string, array and map sizes), no modules and no
//! `eval`, Ctrl-C checked between operations, and files written only under
//! one output directory.

use std::path::{Component, Path, PathBuf};

use rhai::{Dynamic, Engine};

use crate::interrupt;

/// Limits of one script run.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// Operations before the script is stopped (0 = no limit).
    pub max_operations: u64,
    /// Nested function calls.
    pub max_call_levels: usize,
    /// Bytes in one string.
    pub max_string_size: usize,
    /// Elements in one array.
    pub max_array_size: usize,
    /// Entries in one map.
    pub max_map_size: usize,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            // About a second or two of pure script work; model runs count as one operation.
            max_operations: 50_000_000,
            max_call_levels: 64,
            max_string_size: 16 << 20,
            max_array_size: 1 << 20,
            max_map_size: 1 << 16,
        }
    }
}

/// Applies every limit of the sandbox to `engine`: the one place they are set.
pub fn harden(engine: &mut Engine, limits: &Limits) {
    engine.set_max_operations(limits.max_operations);
    engine.set_max_call_levels(limits.max_call_levels);
    engine.set_max_expr_depths(64, 64);
    engine.set_max_string_size(limits.max_string_size);
    engine.set_max_array_size(limits.max_array_size);
    engine.set_max_map_size(limits.max_map_size);
    // No `import` of script files, no `eval` of strings built at run time.
    engine.set_module_resolver(rhai::module_resolvers::DummyModuleResolver::new());
    engine.disable_symbol("eval");
    // Ctrl-C stops the script at its next operation.
    engine.on_progress(|_| interrupt::requested().then(|| Dynamic::from("interrupted by Ctrl-C")));
}

/// The directory a script may write under.
#[derive(Debug, Clone)]
pub struct OutDir {
    root: PathBuf,
}

impl OutDir {
    /// The output directory `root` (created on first write).
    pub fn new(root: PathBuf) -> OutDir {
        OutDir { root }
    }

    /// Its path.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where a script's `path` goes: relative, inside the output directory
    /// (no `..`, no absolute path), parent directories created.
    pub fn resolve(&self, path: &str) -> Result<PathBuf, String> {
        let p = Path::new(path);
        let inside = !path.is_empty() && p.components().all(|c| matches!(c, Component::Normal(_) | Component::CurDir));
        if !inside {
            return Err(format!(
                "`{path}` is outside the output directory: scripts write only under {} (give a relative path without `..`)",
                self.root.display()
            ));
        }
        let full = self.root.join(p);
        if let Some(dir) = full.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        }
        Ok(full)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_stay_inside_the_output_directory() {
        let dir = tempfile::tempdir().unwrap();
        let out = OutDir::new(dir.path().join("out"));
        assert_eq!(out.resolve("a/b.csv").unwrap(), dir.path().join("out/a/b.csv"));
        assert!(dir.path().join("out/a").is_dir());
        for bad in ["../x.csv", "/etc/passwd", "a/../../x", ""] {
            let e = out.resolve(bad).unwrap_err();
            assert!(e.contains("outside the output directory"), "{bad}: {e}");
        }
    }
}
