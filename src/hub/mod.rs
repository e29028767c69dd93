//! Models from the Hugging Face Hub: `bmoe pull REPO[:QUANT]` and `-m
//! hf:REPO[:QUANT]` pick a repository's GGUF file (every shard of a split
//! set), download it resumably with its SHA-256 checked, and keep it in the
//! Hugging Face cache layout, where `huggingface-cli`, transformers and
//! llama.cpp find it too (docs/models.md).

mod api;
mod cache;
mod download;
mod model_ref;
mod parallel;
mod remote;
mod select;
mod settings;
mod spec;
pub mod validate;

pub use api::{HubClient, HubError, RepoFile, RepoListing};
pub use cache::{CachedModel, RepoCache, cached_models, names_by_file, repo_of};
pub use download::free_bytes;
pub use model_ref::{ModelRef, cached_files};
pub use remote::{RemoteModel, quantization_sizes, read_headers};
pub use select::{quantizations, select_files, set_of};
pub use settings::{DEFAULT_CONNECTIONS, HubSettings};
pub use spec::HubSpec;

use std::path::PathBuf;

use anyhow::Result;

/// What [`pull`] made available.
#[derive(Debug, Clone)]
pub struct Pulled {
    /// The file to open: the only file, or a split set's first shard.
    pub model: PathBuf,
    /// Every file of the model, in the snapshot folder.
    pub files: Vec<PathBuf>,
    /// Bytes downloaded by this call (0: all were cached).
    pub downloaded: u64,
    /// The repository's commit the files are from.
    pub commit: String,
}

/// The model `spec` names, downloaded unless the cache has it: with a
/// network, the repository's listing decides (a newer commit is fetched);
/// offline (`HF_HUB_OFFLINE=1`, or the hub unreachable) the cache's last
/// pull answers.
pub fn pull(spec: &HubSpec, settings: &HubSettings) -> Result<Pulled> {
    let cache = RepoCache::new(&settings.cache, &spec.repo);
    if settings.offline {
        return from_cache(spec, settings, "HF_HUB_OFFLINE is set");
    }
    let client = HubClient::new(settings)?;
    let listing = match client.listing(&spec.repo, &spec.revision) {
        Ok(listing) => listing,
        Err(HubError::Unreachable(why)) => {
            return from_cache(spec, settings, &format!("the hub cannot be reached ({why})"));
        }
        Err(e) => return Err(e.into()),
    };
    let files =
        select_files(&listing.files, spec.selector.as_deref()).map_err(|e| anyhow::anyhow!("{}: {e}", spec.repo))?;
    let missing: Vec<&RepoFile> = files.iter().filter(|f| cache.blob_if_complete(f).is_none()).copied().collect();
    let needed: u64 = missing.iter().map(|f| f.size.saturating_sub(cache.partial_len(f))).sum();
    download::check_space(&settings.cache, needed, files.iter().map(|f| f.size).sum())?;
    let mut downloaded = 0;
    for (i, file) in missing.iter().enumerate() {
        let label =
            if missing.len() > 1 { format!("{} ({}/{})", file.name, i + 1, missing.len()) } else { file.name.clone() };
        downloaded +=
            download::fetch(&client, &cache, &spec.repo, &listing.commit, file, &label, settings.connections)?;
    }
    let mut paths = Vec::new();
    for file in &files {
        paths.push(cache.link(&listing.commit, file)?);
    }
    cache.write_ref(&spec.revision, &listing.commit)?;
    Ok(Pulled { model: paths[0].clone(), files: paths, downloaded, commit: listing.commit })
}

/// The model from the cache alone, saying why the hub was not asked.
fn from_cache(spec: &HubSpec, settings: &HubSettings, why: &str) -> Result<Pulled> {
    let (commit, paths) = cached_files(spec, &settings.cache).map_err(|e| anyhow::anyhow!("{e}; {why}"))?;
    eprintln!("bmoe: {why}: using the cached {} (commit {commit})", spec.repo);
    Ok(Pulled { model: paths[0].clone(), files: paths, downloaded: 0, commit })
}
