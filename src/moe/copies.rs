//! What bmoe keeps in its cache directory: the lean and repacked copies of
//! the models it streamed ([`super::lean`], [`super::repacked`]), the demo
//! models it generated and the route profiles it learned
//! ([`super::profile`]), with the model each belongs to, its room on disk
//! and when it was last used, so `bmoe cache` can list and remove them.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use super::lean::SOURCE_FILE;

/// bmoe's cache directory: the user's cache directory's `bmoe` (the
/// system's temporary directory where there is none).
pub fn cache_root() -> PathBuf {
    dirs::cache_dir().unwrap_or_else(std::env::temp_dir).join("bmoe")
}

/// What a cached entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// A model with its expert bytes left out, for a lean open.
    Lean,
    /// A model's expert banks repacked for the CPU's kernels.
    Repacked,
    /// A generated demo model.
    Demo,
    /// A model's route profile ([`super::profile`]).
    Profile,
}

impl CopyKind {
    /// The kind's name in listings.
    pub fn name(self) -> &'static str {
        match self {
            CopyKind::Lean => "lean",
            CopyKind::Repacked => "repacked",
            CopyKind::Demo => "demo",
            CopyKind::Profile => "profile",
        }
    }
}

/// One entry of the cache directory.
#[derive(Debug, Clone)]
pub struct CachedCopy {
    /// What it is.
    pub kind: CopyKind,
    /// Its directory (copies) or file (demo models).
    pub path: PathBuf,
    /// The model it copies (`None` for demo models, or a copy whose record
    /// is missing).
    pub model: Option<PathBuf>,
    /// Whether that model is still there.
    pub model_exists: bool,
    /// Bytes it takes on disk (allocated blocks: copies are sparse).
    pub disk_bytes: u64,
    /// When a session last opened it (demo models: last written).
    pub last_used: SystemTime,
    /// A repacked copy holding only the experts read so far (its budget
    /// did not allow the whole copy).
    pub partial: bool,
}

/// The entries of the cache directory `root` (`~/.cache/bmoe`), newest use
/// first; a missing directory holds none.
pub fn list(root: &Path) -> io::Result<Vec<CachedCopy>> {
    let mut found = Vec::new();
    for (kind, dir) in [(CopyKind::Lean, root.join("lean")), (CopyKind::Repacked, root.join("repacked"))] {
        for entry in entries(&dir)? {
            let path = entry.path();
            if !path.is_dir() {
                continue;
            }
            // Each session that opens a copy writes its record again.
            let record = path.join(SOURCE_FILE);
            let model = fs::read(&record).ok().map(|b| PathBuf::from(String::from_utf8_lossy(&b).into_owned()));
            let last_used = fs::metadata(&record).or_else(|_| fs::metadata(&path)).and_then(|m| m.modified())?;
            found.push(CachedCopy {
                kind,
                model_exists: model.as_deref().is_some_and(Path::exists),
                model,
                disk_bytes: disk_bytes(&path)?,
                last_used,
                partial: kind == CopyKind::Repacked && path.join(super::partial::PRESENT_FILE).exists(),
                path,
            });
        }
    }
    for entry in entries(root)? {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_file() && name.starts_with("demo-") && name.ends_with(".gguf") {
            let meta = entry.metadata()?;
            found.push(CachedCopy {
                kind: CopyKind::Demo,
                model: None,
                model_exists: false,
                disk_bytes: meta.blocks() * 512,
                last_used: meta.modified()?,
                partial: false,
                path,
            });
        }
    }
    for entry in entries(&root.join("profiles"))? {
        let path = entry.path();
        if !path.is_file() || path.extension().is_none_or(|e| e != "json") {
            continue;
        }
        let meta = entry.metadata()?;
        // The model it was last learned from; a corrupt file names none.
        let model = super::profile::RouteProfile::load(&path)
            .ok()
            .map(|p| PathBuf::from(p.model_path))
            .filter(|p| !p.as_os_str().is_empty());
        found.push(CachedCopy {
            kind: CopyKind::Profile,
            model_exists: model.as_deref().is_some_and(Path::exists),
            model,
            disk_bytes: meta.blocks() * 512,
            last_used: meta.modified()?,
            partial: false,
            path,
        });
    }
    found.sort_by_key(|c| std::cmp::Reverse(c.last_used));
    Ok(found)
}

/// Removes `copy` from disk; returns the bytes it took. A copy a running
/// session has open stays readable to it until it closes it.
pub fn remove(copy: &CachedCopy) -> io::Result<u64> {
    match copy.kind {
        CopyKind::Demo | CopyKind::Profile => fs::remove_file(&copy.path)?,
        CopyKind::Lean | CopyKind::Repacked => fs::remove_dir_all(&copy.path)?,
    }
    Ok(copy.disk_bytes)
}

/// The entries of `dir`, none if it does not exist.
fn entries(dir: &Path) -> io::Result<Vec<fs::DirEntry>> {
    match fs::read_dir(dir) {
        Ok(read) => read.collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(io::Error::new(e.kind(), format!("{}: {e}", dir.display()))),
    }
}

/// Allocated bytes of every file under `dir`.
fn disk_bytes(dir: &Path) -> io::Result<u64> {
    let mut total = 0;
    for entry in entries(dir)? {
        let meta = entry.metadata()?;
        total += if meta.is_dir() { disk_bytes(&entry.path())? } else { meta.blocks() * 512 };
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::unix::fs::FileExt;

    /// Lists real directories laid out as the sessions write them: a sparse
    /// copy counts its written blocks only, a copy of a deleted model says
    /// so, and removing one frees it and leaves the rest.
    #[test]
    fn lists_and_removes_the_copies_on_disk() {
        let root = tempfile::tempdir().unwrap();
        let model = root.path().join("m.gguf");
        fs::write(&model, b"GGUF").unwrap();
        let copy = |kind: &str, name: &str, source: &Path| {
            let dir = root.path().join(kind).join(name);
            fs::create_dir_all(&dir).unwrap();
            fs::write(dir.join(SOURCE_FILE), source.as_os_str().as_encoded_bytes()).unwrap();
            // A sparse file: 64 MiB long, one 1 MiB run written.
            let f = fs::File::create(dir.join("m.gguf")).unwrap();
            f.set_len(64 << 20).unwrap();
            f.write_all_at(&vec![7u8; 1 << 20], 8 << 20).unwrap();
        };
        copy("repacked", "a", &model);
        copy("repacked", "p", &model);
        // A partial copy: its bitmap of the experts it holds.
        fs::write(root.path().join("repacked/p").join(crate::moe::partial::PRESENT_FILE), [1u8; 8]).unwrap();
        copy("lean", "b", &root.path().join("gone.gguf"));
        fs::File::create(root.path().join("demo-qwen3moe-v5.gguf")).unwrap().write_all(&[1u8; 8192]).unwrap();
        fs::write(root.path().join("unrelated.txt"), b"x").unwrap();
        let mut profile = crate::moe::profile::RouteProfile::new("id", 1, 4, 1);
        profile.model_path = model.display().to_string();
        profile.save(&root.path().join("profiles/qwen3moe-0123.json")).unwrap();
        fs::write(root.path().join("profiles/notes.txt"), b"x").unwrap();

        let copies = list(root.path()).unwrap();
        let profile = copies.iter().find(|c| c.kind == CopyKind::Profile).unwrap();
        assert_eq!((profile.model.as_deref(), profile.model_exists), (Some(model.as_path()), true));
        assert_eq!(remove(profile).unwrap(), profile.disk_bytes);
        let copies = list(root.path()).unwrap();
        assert_eq!(copies.len(), 4, "{copies:?}");
        let repacked = copies.iter().find(|c| c.kind == CopyKind::Repacked && !c.partial).unwrap();
        assert!(copies.iter().any(|c| c.kind == CopyKind::Repacked && c.partial && c.path.ends_with("p")));
        assert!(copies.iter().filter(|c| c.kind != CopyKind::Repacked).all(|c| !c.partial));
        assert_eq!(repacked.model.as_deref(), Some(model.as_path()));
        assert!(repacked.model_exists);
        assert!((1 << 20..4 << 20).contains(&repacked.disk_bytes), "{} bytes: holes counted", repacked.disk_bytes);
        let lean = copies.iter().find(|c| c.kind == CopyKind::Lean).unwrap();
        assert!(!lean.model_exists);
        assert!(copies.iter().any(|c| c.kind == CopyKind::Demo && c.disk_bytes >= 8192));

        assert_eq!(remove(lean).unwrap(), lean.disk_bytes);
        assert!(!lean.path.exists());
        assert_eq!(list(root.path()).unwrap().len(), 3);
        assert!(list(&root.path().join("nowhere")).unwrap().is_empty());
    }
}
