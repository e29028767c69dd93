//! The hub's HTTP interface: a repository's listing (files, sizes, LFS
//! hashes, the commit) and a file's bytes from an offset. Errors say what
//! to do: a gated repository's licence, a token, a name to check.

use std::io::Read as _;
use std::time::Duration;

use serde::Deserialize;

use super::{HubSettings, validate};

/// One file of a repository.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoFile {
    /// Its path in the repository.
    pub name: String,
    /// Its size in bytes.
    pub size: u64,
    /// Its SHA-256 (64 lower-case hex digits), for a file stored in LFS
    /// (every GGUF).
    pub sha256: Option<String>,
    /// Its blob's name in the cache: the SHA-256, else the git blob id (40
    /// lower-case hex digits, the SHA-1 of `blob SIZE\0` and the bytes).
    pub blob: String,
}

/// A repository at one commit.
#[derive(Debug, Clone)]
pub struct RepoListing {
    /// The commit the revision resolved to.
    pub commit: String,
    /// Its files.
    pub files: Vec<RepoFile>,
}

/// Why the hub did not answer as hoped.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// No connection (no network, a wrong `HF_ENDPOINT`, a timeout).
    #[error("{0}")]
    Unreachable(String),
    /// The hub answered with a refusal or something unreadable.
    #[error("{0}")]
    Refused(String),
    /// The server does not answer byte ranges.
    #[error("{0}")]
    NoRanges(String),
}

/// A connection to the hub of [`HubSettings`].
pub struct HubClient {
    agent: ureq::Agent,
    endpoint: String,
    token: Option<String>,
}

/// The listing's JSON, as far as bmoe reads it.
#[derive(Deserialize)]
struct ModelInfo {
    sha: String,
    #[serde(default)]
    siblings: Vec<Sibling>,
}

#[derive(Deserialize)]
struct Sibling {
    rfilename: String,
    size: Option<u64>,
    #[serde(rename = "blobId")]
    blob_id: Option<String>,
    lfs: Option<Lfs>,
}

#[derive(Deserialize)]
struct Lfs {
    sha256: String,
    size: u64,
}

impl Sibling {
    /// The file it lists, every string checked ([`validate`]): a file
    /// whose bytes cannot be checked (no SHA-256, no blob id) is refused.
    fn file(self) -> Result<RepoFile, String> {
        validate::file_name(&self.rfilename)?;
        let sha256 = self.lfs.as_ref().map(|l| validate::sha256(&l.sha256)).transpose()?;
        let blob_id = self.blob_id.as_deref().map(validate::blob_id).transpose()?;
        let named = validate::shown(&self.rfilename);
        let size = self.lfs.as_ref().map(|l| l.size).or(self.size).ok_or_else(|| format!("{named}: no size"))?;
        let blob = sha256
            .clone()
            .or(blob_id)
            .ok_or_else(|| format!("{named}: neither lfs.sha256 nor blobId, so its bytes could not be checked"))?;
        Ok(RepoFile { name: self.rfilename, size, sha256, blob })
    }
}

impl HubClient {
    /// A client for `settings`' endpoint and token.
    pub fn new(settings: &HubSettings) -> Result<HubClient, HubError> {
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .user_agent(format!("bmoe/{}", env!("CARGO_PKG_VERSION")))
            .timeout_connect(Some(Duration::from_secs(30)))
            .timeout_recv_response(Some(Duration::from_secs(60)))
            .timeout_per_read(Some(Duration::from_secs(60)))
            .build()
            .into();
        Ok(HubClient { agent, endpoint: settings.endpoint.clone(), token: settings.token.clone() })
    }

    /// `repo`'s files at `revision`.
    pub fn listing(&self, repo: &str, revision: &str) -> Result<RepoListing, HubError> {
        let url = format!("{}/api/models/{repo}/revision/{}?blobs=true", self.endpoint, encode(revision));
        let mut response = self.get(&url, None)?;
        check(&response, repo, None, self.token.is_some())?;
        let info: ModelInfo = response
            .body_mut()
            .read_json()
            .map_err(|e| HubError::Refused(format!("{url}: the listing is not what the hub sends: {e}")))?;
        if !validate::is_commit(&info.sha) {
            return Err(HubError::Refused(format!(
                "{url}: the listing names no commit (sha {})",
                validate::shown(&info.sha)
            )));
        }
        let files = info
            .siblings
            .into_iter()
            .map(Sibling::file)
            .collect::<Result<Vec<_>, String>>()
            .map_err(|e| HubError::Refused(format!("{url}: the listing is refused: {e}")))?;
        Ok(RepoListing { commit: info.sha.to_ascii_lowercase(), files })
    }

    /// `file`'s bytes from `offset` on, at `commit`. The flag says whether
    /// the reply starts at `offset` (a server that ignores ranges sends the
    /// whole file: `false`).
    pub fn open(&self, repo: &str, commit: &str, file: &str, offset: u64) -> Result<(ureq::Body, bool), HubError> {
        let url = format!("{}/{repo}/resolve/{commit}/{}", self.endpoint, encode(file));
        let response = self.get(&url, (offset > 0).then(|| format!("bytes={offset}-")))?;
        check(&response, repo, Some(file), self.token.is_some())?;
        let ranged = response.status().as_u16() == 206;
        if ranged {
            let range = header(&response, "content-range").unwrap_or_default();
            if !range.starts_with(&format!("bytes {offset}-")) {
                return Err(HubError::Refused(format!("{url}: asked for bytes from {offset}, got {range:?}")));
            }
        }
        Ok((response.into_body(), offset == 0 || ranged))
    }

    /// Up to `len` bytes of `file` from `start` (fewer where the file ends),
    /// by one range request: what `bmoe fit` reads of a header without
    /// downloading the file.
    pub fn read_range(&self, repo: &str, commit: &str, file: &str, start: u64, len: u64) -> Result<Vec<u8>, HubError> {
        let url = format!("{}/{repo}/resolve/{commit}/{}", self.endpoint, encode(file));
        let failed = |e: std::io::Error| HubError::Unreachable(format!("{url}: {e}"));
        let reader = self.open_range(repo, commit, file, start, start + len.max(1))?.into_reader();
        let mut bytes = Vec::new();
        reader.take(len).read_to_end(&mut bytes).map_err(failed)?;
        Ok(bytes)
    }

    /// The bytes `start..end` of `file` at `commit`, by a range request the
    /// server must answer as one (206 from `start`): a server that ignores
    /// ranges is an error here, where [`HubClient::open`] restarts instead.
    pub fn open_range(
        &self,
        repo: &str,
        commit: &str,
        file: &str,
        start: u64,
        end: u64,
    ) -> Result<ureq::Body, HubError> {
        let url = format!("{}/{repo}/resolve/{commit}/{}", self.endpoint, encode(file));
        let response = self.get(&url, Some(format!("bytes={start}-{}", end.max(start + 1) - 1)))?;
        check(&response, repo, Some(file), self.token.is_some())?;
        let range = header(&response, "content-range").unwrap_or_default();
        if response.status().as_u16() != 206 || !range.starts_with(&format!("bytes {start}-")) {
            return Err(HubError::NoRanges(format!(
                "{url}: asked for bytes {start}-{}, got HTTP {} {range:?}",
                end - 1,
                response.status().as_u16()
            )));
        }
        Ok(response.into_body())
    }

    /// A GET with the token and an optional `Range`.
    fn get(&self, url: &str, range: Option<String>) -> Result<ureq::http::Response<ureq::Body>, HubError> {
        let mut request = self.agent.get(url);
        if let Some(token) = &self.token {
            request = request.header("Authorization", &format!("Bearer {token}"));
        }
        if let Some(range) = range {
            request = request.header("Range", &range);
        }
        request.call().map_err(|e| match e {
            ureq::Error::Io(_)
            | ureq::Error::Timeout(_)
            | ureq::Error::HostNotFound
            | ureq::Error::ConnectionFailed => HubError::Unreachable(format!("{url}: {e}")),
            other => HubError::Refused(format!("{url}: {other}")),
        })
    }
}

/// A reply that is not 200/206, said as what to do.
fn check(
    response: &ureq::http::Response<ureq::Body>,
    repo: &str,
    file: Option<&str>,
    has_token: bool,
) -> Result<(), HubError> {
    let status = response.status().as_u16();
    if status == 200 || status == 206 {
        return Ok(());
    }
    let code = header(response, "x-error-code").unwrap_or_default();
    let message = header(response, "x-error-message").unwrap_or_default();
    let detail =
        if message.is_empty() { String::new() } else { format!(" (the hub says: {})", validate::shown(&message)) };
    let gated = code == "GatedRepo" || message.to_ascii_lowercase().contains("gated");
    let why = match (status, file) {
        (401 | 403, _) if gated && has_token => format!(
            "{repo} is gated and the token in HF_TOKEN has no access to it: accept its licence at \
             https://huggingface.co/{repo} with that account"
        ),
        (401 | 403, _) if gated => format!(
            "{repo} is gated: accept its licence at https://huggingface.co/{repo}, then set HF_TOKEN to a \
             read token of that account (https://huggingface.co/settings/tokens)"
        ),
        (401, _) if !has_token => {
            format!("{repo}: no such repository, or a private one (set HF_TOKEN to a token that can read it)")
        }
        (401 | 403, _) => format!("{repo}: the token in HF_TOKEN is refused (HTTP {status}); check it and its access"),
        (404, Some(file)) if code != "RepoNotFound" => format!("{repo} has no file {file}"),
        (404, _) if code == "RevisionNotFound" => format!("{repo}: no such revision"),
        (404, _) => format!("{repo}: no such repository (check the name)"),
        (416, _) => format!("{repo}: the hub refused the byte range asked for"),
        (429, _) => format!("{repo}: the hub asks to slow down (HTTP 429); try again in a minute"),
        (500.., _) => format!("{repo}: the hub failed (HTTP {status}); try again later"),
        _ => format!("{repo}: unexpected HTTP {status}"),
    };
    Err(HubError::Refused(format!("{why}{detail}")))
}

/// A header's value as text.
fn header(response: &ureq::http::Response<ureq::Body>, name: &str) -> Option<String> {
    response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string)
}

/// A path for a URL: the characters a file name may hold that a URL reads
/// otherwise, escaped (`/` kept).
fn encode(path: &str) -> String {
    let mut out = String::with_capacity(path.len());
    for b in path.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => out.push(b as char),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}
