//! Which expert banks compute with the CPU's repacked kernels (`--repack`).
//!
//! llama.cpp's CPU backend multiplies some quantized types faster when a
//! weight's rows are interleaved in groups ([`crate::llama::Repacker`]).
//! A resident run has llama.cpp repack the expert banks as it loads them
//! (into its own memory: the model must fit); a streamed run repacks each
//! expert slice as it is read into the cache. Both give the same bytes to
//! the same kernels, so streamed output stays identical to resident output
//! with the same setting. Dense weights keep the file's layout either way.
//!
//! Repacking a slice as it is read is a pass over its bytes on a read lane,
//! which costs more than the faster kernels save while every token misses
//! tens of MiB on two cores (measured in `docs/benchmarks.md`); a streamed
//! run therefore reads from a repacked copy of the banks on disk
//! ([`super::repacked`]) when it can. `auto` repacks resident runs whose
//! model fits in memory and streamed runs that read from a whole copy (or whose
//! model fits), so the defaults agree: a streamed run equals the resident
//! run of a machine the model fits on.

use crate::gguf::ModelFiles;
use crate::llama::Repacker;

/// `--repack`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Repack {
    /// Repacked when the model file fits in the memory available (a resident
    /// run's repacked banks are copies, not file maps; a streamed run's
    /// cache then keeps what it repacked).
    #[default]
    Auto,
    /// Always (a resident model then needs its experts' size in memory).
    On,
    /// Never: every weight keeps the file's layout.
    Off,
}

impl Repack {
    /// Parses `auto`, `on` or `off`.
    pub fn from_name(name: &str) -> Option<Repack> {
        match name {
            "auto" => Some(Repack::Auto),
            "on" => Some(Repack::On),
            "off" => Some(Repack::Off),
            _ => None,
        }
    }

    /// The name.
    pub fn name(self) -> &'static str {
        match self {
            Repack::Auto => "auto",
            Repack::On => "on",
            Repack::Off => "off",
        }
    }

    /// Whether a run repacks its experts: when on; with auto, when the model
    /// file fits in `memory` bytes, or when it streams from a whole repacked
    /// copy
    /// ([`super::repacked`], which costs no CPU per read).
    pub fn applies(self, file_bytes: u64, memory: Option<u64>, from_copy: bool) -> bool {
        match self {
            Repack::Off => false,
            Repack::On => true,
            Repack::Auto => from_copy || memory.is_some_and(|m| file_bytes <= m),
        }
    }
}

/// Whether the tensor named `name` with these dimensions is a merged
/// expert bank.
pub fn is_bank(name: &str, dims: &[u64]) -> bool {
    name.ends_with("_exps.weight") && dims.len() == 3
}

/// The expert banks of `files` that the CPU backend has repacked kernels
/// for, by name.
pub fn repackable_banks(files: &ModelFiles) -> Vec<String> {
    files
        .tensors()
        .filter(|t| is_bank(&t.info.name, &t.info.dims))
        .filter(|t| {
            let (Ok(ne0), Ok(ne1)) = (i64::try_from(t.info.dims[0]), i64::try_from(t.info.dims[1])) else {
                return false;
            };
            Repacker::new(t.info.ty.id(), ne0, ne1).is_some()
        })
        .map(|t| t.info.name.clone())
        .collect()
}

/// Regular expressions matching exactly `names` (`blk.<layer>.<rest>`; other
/// names are left out): one alternation over the layers per distinct rest,
/// so llama.cpp's loader tries a handful of patterns per tensor, not one
/// per bank.
pub fn name_patterns(names: &[String]) -> Vec<String> {
    let mut by_rest: std::collections::BTreeMap<&str, Vec<&str>> = Default::default();
    for name in names {
        let Some((layer, rest)) = name.strip_prefix("blk.").and_then(|n| n.split_once('.')) else { continue };
        if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) || !rest.is_ascii() {
            continue;
        }
        by_rest.entry(rest).or_default().push(layer);
    }
    by_rest.into_iter().map(|(rest, layers)| format!(r"^blk\.({})\.{}$", layers.join("|"), escape(rest))).collect()
}

/// `text` with every character other than ASCII letters, digits and `_`
/// escaped, so a regular expression matches it literally.
pub(crate) fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() * 2);
    for c in text.chars() {
        if !(c.is_ascii_alphanumeric() || c == '_') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_repacks_models_that_fit_in_memory_or_stream_from_a_copy() {
        assert!(Repack::Auto.applies(10, Some(10), false));
        assert!(!Repack::Auto.applies(10, Some(9), false));
        assert!(!Repack::Auto.applies(10, None, false));
        assert!(Repack::Auto.applies(10, Some(9), true));
        assert!(Repack::On.applies(10, Some(1), false));
        assert!(!Repack::Off.applies(10, Some(100), true));
        for r in [Repack::Auto, Repack::On, Repack::Off] {
            assert_eq!(Repack::from_name(r.name()), Some(r));
        }
        assert_eq!(Repack::from_name("yes"), None);
    }

    #[test]
    fn patterns_group_layers_per_projection_and_escape_the_rest() {
        let names: Vec<String> =
            ["blk.0.ffn_up_exps.weight", "blk.12.ffn_up_exps.weight", "blk.3.ffn_down_exps.weight", "output.weight"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        assert_eq!(
            name_patterns(&names),
            vec![r"^blk\.(3)\.ffn_down_exps\.weight$".to_string(), r"^blk\.(0|12)\.ffn_up_exps\.weight$".to_string()]
        );
        let hostile = vec!["blk.1.a(b|c)*.weight".to_string(), "blk.x.y".to_string()];
        assert_eq!(name_patterns(&hostile), vec![r"^blk\.(1)\.a\(b\|c\)\*\.weight$".to_string()]);
    }
}
