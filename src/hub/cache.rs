//! One repository's folder in the Hugging Face cache: `blobs/` holds each
//! file once under its hash (the LFS SHA-256, or the git blob id),
//! `snapshots/COMMIT/NAME` links to it relatively, and `refs/REVISION`
//! holds the commit a revision last resolved to (no newline, as
//! `huggingface_hub` reads it).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result};

use super::select::{is_model, set_of};
use super::{RepoFile, validate};

/// A model in the hub cache: one GGUF, or a split set, of one snapshot.
#[derive(Debug, Clone)]
pub struct CachedModel {
    /// `OWNER/NAME:FILE` (the first shard's name for a split set).
    pub name: String,
    /// The snapshot's links to its files, first shard first.
    pub files: Vec<PathBuf>,
    /// The repository's folder.
    pub repo_folder: PathBuf,
}

/// Every model in the hub cache `cache`.
pub fn cached_models(cache: &Path) -> Vec<CachedModel> {
    let mut found = Vec::new();
    let Ok(repos) = fs::read_dir(cache) else { return found };
    for repo in repos.flatten() {
        let folder_name = repo.file_name().to_string_lossy().into_owned();
        let Some(repo_name) = folder_name.strip_prefix("models--").map(|n| n.replacen("--", "/", 1)) else { continue };
        let Ok(snapshots) = fs::read_dir(repo.path().join("snapshots")) else { continue };
        for snapshot in snapshots.flatten() {
            let mut names = Vec::new();
            if list_files(&snapshot.path(), "", &mut names).is_err() {
                continue;
            }
            names.sort();
            let mut sets: Vec<(String, Vec<String>)> = Vec::new();
            for name in names.into_iter().filter(|n| is_model(n)) {
                let set = set_of(&name);
                match sets.iter_mut().find(|(s, _)| *s == set) {
                    Some((_, members)) => members.push(name),
                    None => sets.push((set, vec![name])),
                }
            }
            for (_, members) in sets {
                found.push(CachedModel {
                    name: format!("{repo_name}:{}", members[0]),
                    files: members.iter().map(|m| snapshot.path().join(m)).collect(),
                    repo_folder: repo.path(),
                });
            }
        }
    }
    found.sort_by(|a, b| a.name.cmp(&b.name));
    found
}

/// Each hub-cache model's first file, resolved to its blob (the path copies
/// and route profiles record), with its name as [`cached_models`] gives it.
pub fn names_by_file(cache: &Path) -> Vec<(PathBuf, String)> {
    cached_models(cache).into_iter().filter_map(|m| Some((fs::canonicalize(&m.files[0]).ok()?, m.name))).collect()
}

/// `models--OWNER--NAME` under the hub cache.
#[derive(Debug, Clone)]
pub struct RepoCache {
    root: PathBuf,
}

impl RepoCache {
    /// The folder of `repo` (`owner/name`) under `cache`.
    pub fn new(cache: &Path, repo: &str) -> RepoCache {
        RepoCache { root: cache.join(format!("models--{}", repo.replace('/', "--"))) }
    }

    /// The repository's folder.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Where `file`'s bytes live once complete.
    pub fn blob(&self, file: &RepoFile) -> PathBuf {
        self.root.join("blobs").join(&file.blob)
    }

    /// Where `file`'s bytes are written while they download (kept across
    /// runs, so a pull continues where it stopped).
    pub fn partial(&self, file: &RepoFile) -> PathBuf {
        self.root.join("blobs").join(format!("{}.incomplete", file.blob))
    }

    /// The complete blob of `file`, when it is there with the listed size.
    pub fn blob_if_complete(&self, file: &RepoFile) -> Option<PathBuf> {
        let path = self.blob(file);
        // A file, not a link: a link planted there is no download.
        fs::symlink_metadata(&path).ok().filter(|m| m.is_file() && m.len() == file.size).map(|_| path)
    }

    /// Bytes of `file` already downloaded by an earlier, cut pull.
    pub fn partial_len(&self, file: &RepoFile) -> u64 {
        let partial = self.partial(file);
        // A download over ranges writes each in its place: the record says
        // how much of the (sparse) file is there.
        if let Some(ranges) = super::parallel::read_ranges(&super::parallel::ranges_path(&partial), file.size) {
            return ranges.iter().map(|r| r.done - r.start).sum();
        }
        fs::metadata(partial).map(|m| m.len()).unwrap_or(0).min(file.size)
    }

    /// `snapshots/COMMIT/NAME`.
    pub fn snapshot_path(&self, commit: &str, name: &str) -> PathBuf {
        self.root.join("snapshots").join(commit).join(name)
    }

    /// Makes the folder `folder` (under the repository's folder) and checks
    /// that it is there once links are followed: a folder planted as a
    /// link to elsewhere is refused, so nothing is written outside.
    pub fn make_folder(&self, folder: &Path) -> Result<()> {
        fs::create_dir_all(folder).with_context(|| format!("creating {}", folder.display()))?;
        let root = fs::canonicalize(&self.root).with_context(|| format!("reading {}", self.root.display()))?;
        let real = fs::canonicalize(folder).with_context(|| format!("reading {}", folder.display()))?;
        if !real.starts_with(&root) || !folder.starts_with(&self.root) {
            anyhow::bail!(
                "{} leads to {}, outside the repository's cache folder {}: refused (remove the link)",
                folder.display(),
                real.display(),
                self.root.display()
            );
        }
        Ok(())
    }

    /// Links `snapshots/COMMIT/NAME` to `file`'s blob (relative, as
    /// `huggingface_hub` makes it) and returns the link.
    pub fn link(&self, commit: &str, file: &RepoFile) -> Result<PathBuf> {
        validate::file_name(&file.name).map_err(anyhow::Error::msg)?;
        anyhow::ensure!(validate::is_commit(commit), "commit {}: not 40 hex digits", validate::shown(commit));
        let link = self.snapshot_path(commit, &file.name);
        let folder = link.parent().expect("a snapshot path has a folder");
        self.make_folder(folder)?;
        let depth = file.name.matches('/').count() + 2;
        let target = Path::new(&"../".repeat(depth)).join("blobs").join(&file.blob);
        match fs::symlink_metadata(&link) {
            Ok(_) if fs::read_link(&link).is_ok_and(|t| t == target) => return Ok(link),
            Ok(_) => fs::remove_file(&link).with_context(|| format!("replacing {}", link.display()))?,
            Err(_) => {}
        }
        symlink(&target, &link).with_context(|| format!("linking {} to its blob", link.display()))?;
        Ok(link)
    }

    /// Records that `revision` is at `commit`.
    pub fn write_ref(&self, revision: &str, commit: &str) -> Result<()> {
        validate::revision(revision).map_err(anyhow::Error::msg)?;
        anyhow::ensure!(validate::is_commit(commit), "commit {}: not 40 hex digits", validate::shown(commit));
        let path = self.root.join("refs").join(revision);
        let folder = path.parent().expect("a ref path has a folder");
        self.make_folder(folder)?;
        if fs::read_to_string(&path).is_ok_and(|c| c == commit) {
            return Ok(());
        }
        let temp = path.with_extension("bmoe-tmp");
        fs::write(&temp, commit)
            .and_then(|()| fs::rename(&temp, &path))
            .with_context(|| format!("writing {}", path.display()))
    }

    /// The commit `revision` resolved to at the last pull (a commit hash
    /// names itself), with the files of its snapshot (relative names).
    pub fn snapshot(&self, revision: &str) -> Option<(String, Vec<String>)> {
        validate::revision(revision).ok()?;
        // A ref holding anything but a commit is not followed.
        let commit = match fs::read_to_string(self.root.join("refs").join(revision)) {
            Ok(held) => held.trim().to_string(),
            Err(_) => revision.to_string(),
        };
        if !validate::is_commit(&commit) {
            return None;
        }
        let folder = self.root.join("snapshots").join(&commit);
        let mut names = Vec::new();
        list_files(&folder, "", &mut names).ok()?;
        names.sort();
        Some((commit, names))
    }
}

/// The files under `folder` (links included), as `prefix/name`.
fn list_files(folder: &Path, prefix: &str, out: &mut Vec<String>) -> io::Result<()> {
    for entry in fs::read_dir(folder)? {
        let entry = entry?;
        let name = format!("{prefix}{}", entry.file_name().to_string_lossy());
        if entry.path().is_dir() {
            list_files(&entry.path(), &format!("{name}/"), out)?;
        } else {
            out.push(name);
        }
    }
    Ok(())
}

#[cfg(unix)]
fn symlink(target: &Path, link: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(target, link)
}

#[cfg(not(unix))]
fn symlink(target: &Path, link: &Path) -> io::Result<()> {
    // Without symbolic links the snapshot holds a copy, as huggingface_hub
    // does on such systems.
    let blob = link.parent().map(|p| p.join(target)).unwrap_or_else(|| target.to_path_buf());
    fs::copy(blob, link).map(|_| ())
}

/// The repository (`owner/name`) a file in the hub cache belongs to, read
/// from its `models--OWNER--NAME` folder; `None` outside the hub cache.
pub fn repo_of(path: &Path) -> Option<String> {
    path.ancestors().find_map(|a| a.file_name()?.to_str()?.strip_prefix("models--").map(|n| n.replacen("--", "/", 1)))
}
