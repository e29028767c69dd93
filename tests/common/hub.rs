//! A stand-in for the Hugging Face Hub over real HTTP on 127.0.0.1: the
//! listing API, `resolve` answering with a redirect to a second port (the
//! "CDN", another origin as on the real hub) that serves byte ranges, the
//! hub's refusals (401 gated or unknown, 404), faults on demand (a
//! connection cut mid-file, a corrupted byte, a body that stalls or
//! trickles), and a hostile hub's listings served as given.

// Each test binary that includes the stand-in uses a part of it.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::sync::{Arc, Mutex};

use sha2::{Digest, Sha256};

/// A file the stand-in serves.
pub struct HubFile {
    pub name: String,
    pub bytes: Vec<u8>,
    pub sha256: String,
}

/// A repository the stand-in serves.
pub struct HubRepo {
    pub commit: String,
    pub files: Vec<HubFile>,
    /// Needs `Authorization: Bearer` with this token.
    pub gated_token: Option<String>,
}

/// Faults the CDN injects, each once.
#[derive(Default)]
pub struct Faults {
    /// Close the connection after this many body bytes of the next download.
    pub cut_after: Option<u64>,
    /// Flip a byte of the next download at this offset.
    pub corrupt_at: Option<u64>,
    /// Send this many body bytes of the next download, then nothing more
    /// (the connection stays open) for ten minutes.
    pub stall_after: Option<u64>,
    /// Send the next download in 64 KiB pieces this many milliseconds
    /// apart.
    pub slow_ms: Option<u64>,
}

#[derive(Default)]
struct State {
    repos: HashMap<String, HubRepo>,
    /// Listings served as they are instead of the repository's own.
    listings: HashMap<String, serde_json::Value>,
    faults: Faults,
    /// Each request: method, path, Range header.
    log: Vec<(String, String, Option<String>)>,
}

/// The running stand-in.
pub struct FakeHub {
    pub endpoint: String,
    state: Arc<Mutex<State>>,
}

impl HubFile {
    /// A file from disk, named `name` in the repository.
    pub fn from_path(name: &str, path: &Path) -> HubFile {
        let bytes = std::fs::read(path).unwrap();
        let sha256 = Sha256::digest(&bytes).iter().map(|b| format!("{b:02x}")).collect();
        HubFile { name: name.into(), bytes, sha256 }
    }
}

impl FakeHub {
    /// Starts the hub and its CDN on two free ports.
    pub fn start() -> FakeHub {
        let state = Arc::new(Mutex::new(State::default()));
        let cdn = TcpListener::bind("127.0.0.1:0").unwrap();
        let cdn_url = format!("http://127.0.0.1:{}", cdn.local_addr().unwrap().port());
        let hub = TcpListener::bind("127.0.0.1:0").unwrap();
        let endpoint = format!("http://127.0.0.1:{}", hub.local_addr().unwrap().port());
        for (listener, is_cdn) in [(cdn, true), (hub, false)] {
            let state = state.clone();
            let cdn_url = cdn_url.clone();
            std::thread::spawn(move || {
                for stream in listener.incoming().flatten() {
                    let state = state.clone();
                    let cdn_url = cdn_url.clone();
                    std::thread::spawn(move || serve(stream, &state, is_cdn, &cdn_url));
                }
            });
        }
        FakeHub { endpoint, state }
    }

    /// Adds (or replaces) a repository.
    pub fn add(&self, repo: &str, r: HubRepo) {
        self.state.lock().unwrap().repos.insert(repo.into(), r);
    }

    /// Serves `listing` as `repo`'s listing JSON, whatever its files are
    /// (a hostile hub's): downloads still find files by name and hash.
    pub fn set_listing(&self, repo: &str, listing: serde_json::Value) {
        self.state.lock().unwrap().listings.insert(repo.into(), listing);
    }

    /// Sets the faults of the next download.
    pub fn inject(&self, faults: Faults) {
        self.state.lock().unwrap().faults = faults;
    }

    /// The requests so far (method, path, Range).
    pub fn log(&self) -> Vec<(String, String, Option<String>)> {
        self.state.lock().unwrap().log.clone()
    }
}

/// One connection: requests until the client closes it.
fn serve(stream: TcpStream, state: &Mutex<State>, is_cdn: bool, cdn_url: &str) {
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    let mut out = stream;
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line).unwrap_or(0) == 0 {
            return;
        }
        let mut parts = line.split_whitespace();
        let (method, target) = (parts.next().unwrap_or("").to_string(), parts.next().unwrap_or("").to_string());
        let mut headers = HashMap::new();
        loop {
            let mut h = String::new();
            if reader.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
            }
        }
        state.lock().unwrap().log.push((method.clone(), target.clone(), headers.get("range").cloned()));
        let keep = if is_cdn {
            cdn(&mut out, state, &method, &target, &headers)
        } else {
            hub(&mut out, state, &method, &target, &headers, cdn_url)
        };
        if !keep {
            return;
        }
    }
}

/// Writes a reply with `headers` and `body` (HEAD: no body).
fn reply(out: &mut TcpStream, status: &str, headers: &[(&str, String)], body: &[u8], head: bool) -> bool {
    let mut text = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
    for (k, v) in headers {
        text.push_str(&format!("{k}: {v}\r\n"));
    }
    text.push_str("\r\n");
    out.write_all(text.as_bytes()).is_ok() && (head || out.write_all(body).is_ok())
}

/// The hub's API and `resolve`.
fn hub(
    out: &mut TcpStream,
    state: &Mutex<State>,
    method: &str,
    target: &str,
    headers: &HashMap<String, String>,
    cdn_url: &str,
) -> bool {
    let head = method == "HEAD";
    let path = target.split('?').next().unwrap_or("");
    let state = state.lock().unwrap();
    let (repo_name, rest) = match path.strip_prefix("/api/models/") {
        Some(p) => split_repo(p),
        None => split_repo(path.trim_start_matches('/')),
    };
    let token = headers.get("authorization").and_then(|a| a.strip_prefix("Bearer ")).map(str::to_string);
    let Some(repo) = state.repos.get(&repo_name) else {
        let h = [("X-Error-Code", "RepoNotFound".to_string()), ("X-Error-Message", "Repository not found".into())];
        let status = if token.is_some() { "404 Not Found" } else { "401 Unauthorized" };
        return reply(out, status, &h, b"{\"error\":\"Repository not found\"}", head);
    };
    if let Some(needed) = &repo.gated_token
        && token.as_ref() != Some(needed)
    {
        let status = if token.is_some() { "403 Forbidden" } else { "401 Unauthorized" };
        let h = [
            ("X-Error-Code", "GatedRepo".to_string()),
            ("X-Error-Message", format!("Access to model {repo_name} is restricted.")),
        ];
        return reply(out, status, &h, b"{\"error\":\"gated\"}", head);
    }
    if path.starts_with("/api/models/")
        && let Some(listing) = state.listings.get(&repo_name)
    {
        let body = listing.to_string();
        return reply(out, "200 OK", &[("Content-Type", "application/json".into())], body.as_bytes(), head);
    }
    if path.starts_with("/api/models/") {
        let siblings: Vec<serde_json::Value> = repo
            .files
            .iter()
            .map(|f| {
                serde_json::json!({"rfilename": f.name, "size": f.bytes.len(), "blobId": "0".repeat(40),
                    "lfs": {"sha256": f.sha256, "size": f.bytes.len(), "pointerSize": 134}})
            })
            .collect();
        let body = serde_json::json!({"id": repo_name, "sha": repo.commit, "siblings": siblings}).to_string();
        return reply(out, "200 OK", &[("Content-Type", "application/json".into())], body.as_bytes(), head);
    }
    // resolve/REVISION/FILE
    let file = rest.strip_prefix("resolve/").and_then(|r| r.split_once('/')).map(|(_, f)| f.to_string());
    let Some(file) = file.and_then(|f| repo.files.iter().find(|x| x.name == f)) else {
        let h = [("X-Error-Code", "EntryNotFound".to_string()), ("X-Repo-Commit", repo.commit.clone())];
        return reply(out, "404 Not Found", &h, b"{\"error\":\"Entry not found\"}", head);
    };
    let h = [
        ("Location", format!("{cdn_url}/blob/{}", file.sha256)),
        ("X-Repo-Commit", repo.commit.clone()),
        ("X-Linked-Etag", format!("\"{}\"", file.sha256)),
        ("X-Linked-Size", file.bytes.len().to_string()),
        ("ETag", "\"0000\"".into()),
    ];
    reply(out, "302 Found", &h, b"", head)
}

/// `owner/name` and what follows it.
fn split_repo(path: &str) -> (String, String) {
    let mut parts = path.splitn(3, '/');
    let (owner, name, rest) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    (format!("{owner}/{name}"), rest.to_string())
}

/// The CDN: blobs by hash, with ranges and the injected faults.
fn cdn(
    out: &mut TcpStream,
    state: &Mutex<State>,
    method: &str,
    target: &str,
    headers: &HashMap<String, String>,
) -> bool {
    let head = method == "HEAD";
    let sha = target.trim_start_matches("/blob/");
    let (mut bytes, faults) = {
        let mut state = state.lock().unwrap();
        let found = state.repos.values().flat_map(|r| &r.files).find(|f| f.sha256 == sha).map(|f| f.bytes.clone());
        let Some(bytes) = found else {
            drop(state);
            return reply(out, "404 Not Found", &[], b"no such blob", head);
        };
        let faults = if head { Faults::default() } else { std::mem::take(&mut state.faults) };
        (bytes, faults)
    };
    if let Some(at) = faults.corrupt_at {
        bytes[at as usize] ^= 0x5a;
    }
    let total = bytes.len() as u64;
    let range = headers.get("range").and_then(|r| r.strip_prefix("bytes=")).and_then(|r| r.split_once('-'));
    let start = range.and_then(|(s, _)| s.parse::<u64>().ok());
    // `bytes=A-B` ends at B (inclusive), `bytes=A-` at the file's end.
    let end = range.and_then(|(_, e)| e.parse::<u64>().ok()).map_or(total, |e| (e + 1).min(total));
    let (status, from, extra) = match start {
        Some(s) if s >= total => {
            return reply(
                out,
                "416 Range Not Satisfiable",
                &[("Content-Range", format!("bytes */{total}"))],
                b"",
                head,
            );
        }
        Some(s) => ("206 Partial Content", s, vec![("Content-Range", format!("bytes {s}-{}/{total}", end - 1))]),
        None => ("200 OK", 0, vec![]),
    };
    let body = &bytes[from as usize..if start.is_some() { end as usize } else { total as usize }];
    let head_of = |status: &str, extra: &[(&str, String)], len: usize| {
        let mut text = format!("HTTP/1.1 {status}\r\nContent-Length: {len}\r\n");
        for (k, v) in extra {
            text.push_str(&format!("{k}: {v}\r\n"));
        }
        text.push_str("\r\n");
        text
    };
    if let Some(stall) = faults.stall_after.filter(|_| !head) {
        let _ = out.write_all(head_of(status, &extra, body.len()).as_bytes());
        let _ = out.write_all(&body[..(stall as usize).min(body.len())]);
        let _ = out.flush();
        std::thread::sleep(std::time::Duration::from_secs(600));
        return false;
    }
    if let Some(ms) = faults.slow_ms.filter(|_| !head) {
        let _ = out.write_all(head_of(status, &extra, body.len()).as_bytes());
        for piece in body.chunks(64 << 10) {
            if out.write_all(piece).is_err() {
                return false;
            }
            let _ = out.flush();
            std::thread::sleep(std::time::Duration::from_millis(ms));
        }
        return true;
    }
    match faults.cut_after {
        Some(cut) if !head => {
            // The headers promise the whole rest; the connection ends early.
            let mut text = format!("HTTP/1.1 {status}\r\nContent-Length: {}\r\n", body.len());
            for (k, v) in &extra {
                text.push_str(&format!("{k}: {v}\r\n"));
            }
            text.push_str("\r\n");
            let _ = out.write_all(text.as_bytes());
            let _ = out.write_all(&body[..(cut as usize).min(body.len())]);
            let _ = out.flush();
            let _ = out.shutdown(std::net::Shutdown::Both);
            false
        }
        _ => reply(out, status, &extra, body, head),
    }
}

/// `bmoe ARGS` with the hub at `hub` and its cache (and bmoe's) under
/// `home`, none of the user's hub settings inherited.
pub fn bmoe_command(hub: &str, home: &Path, args: &[&str]) -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_bmoe"));
    cmd.args(args)
        .env("HF_ENDPOINT", hub)
        .env("HF_HOME", home)
        .env("XDG_CACHE_HOME", home.join("xdg"))
        .env_remove("HF_TOKEN")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("HF_HUB_CACHE");
    cmd
}

/// Reads a file whole (for comparisons).
pub fn read(path: &Path) -> Vec<u8> {
    let mut v = Vec::new();
    std::fs::File::open(path).unwrap().read_to_end(&mut v).unwrap();
    v
}
