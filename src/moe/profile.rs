//! A model's route profile: how often each expert of each layer is routed,
//! learned across runs and kept in bmoe's cache directory beside the
//! model's other derived files. Which experts a model favours is mostly a
//! property of the model, not of one prompt, so the expert cache uses the
//! profile as a prior when it evicts ([`super::evict`]) and reads the most
//! popular experts ahead at open (a warm start).
//!
//! Counts only: a profile holds per-(layer, expert) routed rows and per-layer
//! tokens, both halving every [`PROFILE_HALF_LIFE_TOKENS`] tokens a layer
//! routes, so it follows how the model is used; nothing of the text. It is
//! keyed by the model's identity ([`model_identity`]: the file's path, its
//! tensor layout and the first bytes of its routers), so a model changed in
//! place, or another one (another seed of a synthetic one included), never
//! reads it; a moved model learns afresh. Saving a profile removes those of
//! models that are gone.

use std::fs;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::gguf::ModelFiles;

/// Tokens (per layer) after which a profile's counts weigh half.
pub const PROFILE_HALF_LIFE_TOKENS: f64 = 16384.0;

/// Version of the profile file format.
const VERSION: u32 = 1;

/// What a session does with the model's route profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProfileMode {
    /// Neither read nor write it.
    Off,
    /// Use it (eviction prior, warm start) and leave it as it is.
    Read,
    /// Use it, and add this run's routing to it (the default).
    #[default]
    Update,
}

impl ProfileMode {
    /// Every mode.
    pub const ALL: [ProfileMode; 3] = [ProfileMode::Off, ProfileMode::Read, ProfileMode::Update];

    /// Its name in flags and `bmoe.toml`.
    pub fn name(self) -> &'static str {
        match self {
            ProfileMode::Off => "off",
            ProfileMode::Read => "read",
            ProfileMode::Update => "update",
        }
    }

    /// True when the session reads the profile.
    pub fn reads(self) -> bool {
        self != ProfileMode::Off
    }

    /// True when the session writes its routing back.
    pub fn writes(self) -> bool {
        self == ProfileMode::Update
    }
}

impl std::str::FromStr for ProfileMode {
    type Err = String;

    fn from_str(s: &str) -> Result<ProfileMode, String> {
        ProfileMode::ALL
            .into_iter()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown route profile mode `{s}`: off, read or update"))
    }
}

/// Per-(layer, expert) routing counts of one model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteProfile {
    /// Format version.
    version: u32,
    /// The model's identity ([`model_identity`]).
    pub model: String,
    /// The model file it was last learned from (informational).
    pub model_path: String,
    /// Layers (those without experts keep zero counts).
    pub n_layer: usize,
    /// Experts per layer.
    pub n_expert: usize,
    /// Experts routed per token.
    pub k: usize,
    /// Decayed tokens routed, per layer.
    tokens: Vec<f64>,
    /// Decayed routed rows, `layer * n_expert + expert`.
    counts: Vec<f64>,
}

impl RouteProfile {
    /// An empty profile of a model with this shape.
    pub fn new(model: &str, n_layer: usize, n_expert: usize, k: usize) -> RouteProfile {
        RouteProfile {
            version: VERSION,
            model: model.to_string(),
            model_path: String::new(),
            n_layer,
            n_expert,
            k: k.max(1),
            tokens: vec![0.0; n_layer],
            counts: vec![0.0; n_layer * n_expert],
        }
    }

    /// Adds the routed rows of one layer (`experts`, one per routed row,
    /// `k` rows a token). Experts or layers out of range are skipped.
    pub fn observe(&mut self, layer: usize, experts: impl IntoIterator<Item = u32>) {
        if layer >= self.n_layer {
            return;
        }
        let row = &mut self.counts[layer * self.n_expert..(layer + 1) * self.n_expert];
        let mut rows = 0usize;
        for e in experts {
            if let Some(c) = row.get_mut(e as usize) {
                *c += 1.0;
                rows += 1;
            }
        }
        if rows == 0 {
            return;
        }
        let tokens = rows as f64 / self.k as f64;
        let keep = (-tokens / PROFILE_HALF_LIFE_TOKENS).exp2();
        row.iter_mut().for_each(|c| *c *= keep);
        self.tokens[layer] = self.tokens[layer] * keep + tokens;
    }

    /// Tokens learned from at the busiest layer (decayed).
    pub fn tokens(&self) -> f64 {
        self.tokens.iter().copied().fold(0.0, f64::max)
    }

    /// True when it has learned nothing.
    pub fn is_empty(&self) -> bool {
        self.tokens() <= 0.0
    }

    /// The share of tokens that route `expert` at `layer` (0..=1; 0 when
    /// the layer learned nothing).
    pub fn share(&self, layer: usize, expert: usize) -> f64 {
        let tokens = self.tokens.get(layer).copied().unwrap_or(0.0);
        if tokens <= 0.0 || expert >= self.n_expert {
            return 0.0;
        }
        (self.counts[layer * self.n_expert + expert] / tokens).min(1.0)
    }

    /// The shares of every entry, `layer * n_expert + expert`.
    pub fn shares(&self) -> Vec<f64> {
        (0..self.n_layer * self.n_expert).map(|id| self.share(id / self.n_expert, id % self.n_expert)).collect()
    }

    /// Entries `(layer, expert)` by share, most routed first (entries never
    /// routed left out).
    pub fn most_routed(&self) -> Vec<(usize, usize)> {
        let shares = self.shares();
        let mut ids: Vec<usize> = (0..shares.len()).filter(|&i| shares[i] > 0.0).collect();
        ids.sort_by(|&a, &b| shares[b].total_cmp(&shares[a]).then(a.cmp(&b)));
        ids.into_iter().map(|id| (id / self.n_expert, id % self.n_expert)).collect()
    }

    /// True when it describes a model of this identity and shape.
    pub fn fits(&self, model: &str, n_layer: usize, n_expert: usize) -> bool {
        self.model == model && self.n_layer == n_layer && self.n_expert == n_expert
    }

    /// Reads a profile file; an error names what is wrong with it.
    pub fn load(path: &Path) -> io::Result<RouteProfile> {
        let bytes = fs::read(path)?;
        let profile: RouteProfile = serde_json::from_slice(&bytes)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("not a route profile: {e}")))?;
        profile.check().map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        Ok(profile)
    }

    /// Checks the shape and values a file gave.
    fn check(&self) -> Result<(), String> {
        if self.version != VERSION {
            return Err(format!("route profile version {} (this bmoe reads {VERSION})", self.version));
        }
        if self.tokens.len() != self.n_layer || self.counts.len() != self.n_layer * self.n_expert || self.k == 0 {
            return Err("route profile sizes disagree with its shape".into());
        }
        if self.tokens.iter().chain(&self.counts).any(|v| !v.is_finite() || *v < 0.0) {
            return Err("route profile holds a negative or non-finite count".into());
        }
        Ok(())
    }

    /// Writes it to `path` through a temporary file, so a reader never sees
    /// half of it, and removes the profiles beside it of models that are
    /// gone or were replaced (another model written over this one's file:
    /// its identity cannot come back).
    pub fn save(&self, path: &Path) -> io::Result<()> {
        if let Some(dir) = path.parent() {
            fs::create_dir_all(dir)?;
            remove_stale(dir, path, &self.model_path);
        }
        let tmp = path.with_extension("json.tmp");
        fs::write(&tmp, serde_json::to_vec(self).map_err(io::Error::other)?)?;
        fs::rename(&tmp, path)
    }
}

/// Removes the profiles in `dir` (but `keep`) whose model file is gone or
/// is `model` (now another model's). Best effort: a file it cannot read is
/// left alone.
fn remove_stale(dir: &Path, keep: &Path, model: &str) {
    let Ok(entries) = fs::read_dir(dir) else { return };
    for path in entries.flatten().map(|e| e.path()) {
        if path == keep || path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        if let Ok(p) = RouteProfile::load(&path)
            && !p.model_path.is_empty()
            && (p.model_path == model || !Path::new(&p.model_path).exists())
        {
            let _ = fs::remove_file(&path);
        }
    }
}

/// Where route profiles live: `profiles/` in bmoe's cache directory.
pub fn profiles_dir() -> PathBuf {
    super::copies::cache_root().join("profiles")
}

/// The profile file of the model of identity `identity` in `dir`.
pub fn profile_path(dir: &Path, identity: &str) -> PathBuf {
    dir.join(format!("{identity}.json"))
}

/// Bytes of each router tensor that go into a model's identity.
const ROUTER_BYTES: u64 = 4096;

/// A model's identity: its architecture, then a hash of its file's path,
/// its tensor layout (names, types, shapes, offsets, file sizes) and the
/// first bytes of every router (`ffn_gate_inp`) tensor. Another file,
/// another model or another seed: another identity.
pub fn model_identity(files: &ModelFiles) -> io::Result<String> {
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let first = &files.paths()[0];
    h.update(fs::canonicalize(first).unwrap_or_else(|_| first.clone()).as_os_str().as_encoded_bytes());
    for (path, shard) in files.paths().iter().zip(files.shards()) {
        h.update(&shard.file_size.to_le_bytes());
        let mut file = fs::File::open(path)?;
        for t in shard.tensors() {
            h.update(t.name.as_bytes());
            h.update(format!("{:?}", t.ty).as_bytes());
            t.dims.iter().for_each(|d| h.update(&d.to_le_bytes()));
            h.update(&t.offset.to_le_bytes());
            if t.name.contains("ffn_gate_inp") {
                let mut buf = vec![0u8; ROUTER_BYTES.min(t.size) as usize];
                file.seek(SeekFrom::Start(shard.data_offset + t.offset))?;
                file.read_exact(&mut buf)?;
                h.update(&buf);
            }
        }
    }
    let arch = files.meta().architecture().unwrap_or("model");
    let arch: String = arch.chars().filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c)).take(32).collect();
    Ok(format!("{arch}-{:016x}", h.digest()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_become_shares_and_halve_with_use() {
        let mut p = RouteProfile::new("m", 2, 4, 2);
        assert!(p.is_empty());
        p.observe(0, [1, 2, 1, 3]);
        assert!((p.share(0, 1) - 1.0).abs() < 1e-3 && (p.share(0, 2) - 0.5).abs() < 1e-3, "{p:?}");
        assert_eq!((p.share(1, 1), p.share(0, 9), p.share(7, 0)), (0.0, 0.0, 0.0));
        assert_eq!(p.most_routed(), [(0, 1), (0, 2), (0, 3)]);
        // Out-of-range experts and layers are skipped, not counted.
        p.observe(0, [99]);
        p.observe(5, [1]);
        assert!((p.tokens() - 2.0).abs() < 1e-3);
        // A half-life of tokens routing expert 0 only: expert 1's count halves.
        let before = p.counts[1];
        let rows = vec![0u32; (2.0 * PROFILE_HALF_LIFE_TOKENS) as usize];
        p.observe(0, rows);
        assert!((p.counts[1] / before - 0.5).abs() < 1e-6);
        assert!(p.share(0, 0) > 0.99);
    }

    #[test]
    fn a_saved_profile_loads_back_and_a_bad_file_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let path = profile_path(dir.path(), "qwen3moe-0123");
        let mut p = RouteProfile::new("qwen3moe-0123", 3, 8, 2);
        p.observe(1, [4, 5, 4, 7]);
        p.save(&path).unwrap();
        assert_eq!(RouteProfile::load(&path).unwrap(), p);
        // Saving removes the profiles of models that are gone, and only those.
        let mut gone = RouteProfile::new("gone", 1, 2, 1);
        gone.model_path = dir.path().join("gone.gguf").display().to_string();
        gone.save(&profile_path(dir.path(), "gone")).unwrap();
        let mut here = RouteProfile::new("here", 1, 2, 1);
        here.model_path = path.display().to_string();
        here.save(&profile_path(dir.path(), "here")).unwrap();
        p.save(&path).unwrap();
        assert!(!profile_path(dir.path(), "gone").exists() && profile_path(dir.path(), "here").exists());
        // Another model written over `here`'s file: its profile replaces the old one.
        let mut replacing = RouteProfile::new("replacing", 1, 2, 1);
        replacing.model_path = here.model_path.clone();
        replacing.save(&profile_path(dir.path(), "replacing")).unwrap();
        assert!(!profile_path(dir.path(), "here").exists() && path.exists());
        assert!(p.fits("qwen3moe-0123", 3, 8) && !p.fits("other", 3, 8) && !p.fits("qwen3moe-0123", 3, 9));
        fs::write(&path, b"{\"version\": 1, \"model\": ").unwrap();
        assert!(RouteProfile::load(&path).unwrap_err().to_string().contains("not a route profile"));
        let mut bad = serde_json::to_value(&p).unwrap();
        bad["counts"][3] = serde_json::json!(-1.0);
        fs::write(&path, serde_json::to_vec(&bad).unwrap()).unwrap();
        assert!(RouteProfile::load(&path).unwrap_err().to_string().contains("negative"));
        bad["counts"] = serde_json::json!([1.0]);
        fs::write(&path, serde_json::to_vec(&bad).unwrap()).unwrap();
        assert!(RouteProfile::load(&path).unwrap_err().to_string().contains("sizes"));
    }
}
