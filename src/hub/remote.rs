//! A hub model's GGUF headers read by range requests, without downloading
//! the files: what `bmoe fit` knows of a model before it is pulled.

use std::cell::Cell;
use std::path::Path;

use anyhow::{Result, anyhow};

use super::{HubClient, HubSettings, HubSpec, RepoFile, RepoListing, select_files};
use crate::gguf::{GgufFile, ModelFiles};

/// The first bytes asked for; a header that needs more is read on in
/// pieces four times as large (a 150,000-token vocabulary's header is
/// 6-10 MiB).
const FIRST_READ: u64 = 1 << 20;

/// The most of a file's header read from the hub: twice the largest real
/// header (a 262,144-token vocabulary's, ~16 MiB). A header that claims
/// more (a string or an array past it) is refused with the bytes read so
/// far, so a lying file cannot make `fit` fetch or hold gigabytes.
pub const MAX_HEADER: u64 = 32 << 20;

/// A model on the hub as its headers describe it.
pub struct RemoteModel {
    /// The headers of the chosen file (every shard of a split set), the
    /// paths being the repository's names.
    pub files: ModelFiles,
    /// The repository at the commit read.
    pub listing: RepoListing,
    /// The chosen files' names.
    pub chosen: Vec<String>,
    /// Bytes fetched to read the headers.
    pub bytes_read: u64,
}

/// Reads the headers of the model `spec` names from the hub.
pub fn read_headers(spec: &HubSpec, settings: &HubSettings) -> Result<RemoteModel> {
    if settings.offline {
        return Err(anyhow!(
            "{}: HF_HUB_OFFLINE is set: reading a model on the hub needs the network (or pull it first and pass -m)",
            spec.repo
        ));
    }
    let client = HubClient::new(settings)?;
    let listing = client.listing(&spec.repo, &spec.revision)?;
    let chosen: Vec<RepoFile> = select_files(&listing.files, spec.selector.as_deref())
        .map_err(|e| anyhow!("{}: {e}", spec.repo))?
        .into_iter()
        .cloned()
        .collect();
    let fetched = Cell::new(0u64);
    let load = |path: &Path| -> Result<Option<GgufFile>, crate::gguf::GgufError> {
        let name = path.to_string_lossy();
        let Some(file) = listing.files.iter().find(|f| f.name == name) else { return Ok(None) };
        GgufFile::read_header(path, file.size, FIRST_READ, MAX_HEADER, |buf, want| {
            let start = buf.len() as u64;
            let bytes = client
                .read_range(&spec.repo, &listing.commit, &file.name, start, want.saturating_sub(start))
                .map_err(std::io::Error::other)?;
            fetched.set(fetched.get() + bytes.len() as u64);
            buf.extend_from_slice(&bytes);
            Ok(())
        })
        .map(Some)
    };
    let files = ModelFiles::open_with(Path::new(&chosen[0].name), load)?;
    let bytes_read = fetched.get();
    Ok(RemoteModel { files, chosen: chosen.iter().map(|f| f.name.clone()).collect(), listing, bytes_read })
}

/// The repository's other models: each quantization tag that picks one
/// model, with its total size, in the order of size.
pub fn quantization_sizes(files: &[RepoFile]) -> Vec<(String, u64)> {
    let mut out: Vec<(String, u64)> = super::quantizations(files)
        .into_iter()
        .filter_map(|tag| {
            let set = select_files(files, Some(&tag)).ok()?;
            Some((tag, set.iter().map(|f| f.size).sum()))
        })
        .collect();
    out.sort_by_key(|(_, size)| *size);
    out
}
