//! One way to name a model everywhere: what a command is given for a model
//! (`-m`, `fit`, `inspect`, `template`, `models rm`, `cache remove --model`,
//! the chat's `model.path`) is a file, or a hub model written as `pull`
//! takes it (`OWNER/NAME[:QUANT]`, `hf:` in front or not) or as `bmoe
//! models` lists it (`OWNER/NAME:FILE.gguf`).

use std::path::{Path, PathBuf};

use super::{HubSettings, HubSpec, RepoCache, RepoFile, select_files};

/// A model as a user named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    /// A file on disk (which may not exist: opening it says so).
    File(PathBuf),
    /// A model on the hub.
    Hub(HubSpec),
}

impl ModelRef {
    /// Reads `arg`: `hf:OWNER/NAME[:QUANT]` is a hub model; an existing
    /// file is that file; `OWNER/NAME[:QUANT]` or `OWNER/NAME:FILE.gguf`
    /// (one `/`, no leading `.` or `/`, a name that is not itself a
    /// `.gguf` file) is a hub model; anything else is a path.
    pub fn parse(arg: &str) -> Result<ModelRef, String> {
        if let Some(spec) = HubSpec::from_model_arg(arg) {
            return spec.map(ModelRef::Hub);
        }
        let path = Path::new(arg);
        if path.exists() {
            return Ok(ModelRef::File(path.to_path_buf()));
        }
        let repo = arg.split_once(':').map_or(arg, |(repo, _)| repo);
        let looks_like_repo = !repo.starts_with(['.', '/', '~'])
            && repo.matches('/').count() == 1
            && !repo.to_ascii_lowercase().ends_with(".gguf");
        match arg.parse::<HubSpec>() {
            Ok(spec) if looks_like_repo => Ok(ModelRef::Hub(spec)),
            _ => Ok(ModelRef::File(path.to_path_buf())),
        }
    }

    /// The model's first file on this machine, downloading nothing: a file
    /// as given (it must exist), a hub model from the hub cache's last pull.
    pub fn local(&self, settings: &HubSettings) -> Result<PathBuf, String> {
        match self {
            ModelRef::File(path) if path.is_file() => Ok(path.clone()),
            ModelRef::File(path) => Err(format!("{}: no such file", path.display())),
            ModelRef::Hub(spec) => cached_files(spec, &settings.cache).map(|(_, files)| files[0].clone()),
        }
    }
}

/// The commit and files of `spec` in the hub cache `cache` (its last pulled
/// snapshot), first shard first; the error says how to get them.
pub fn cached_files(spec: &HubSpec, cache: &Path) -> Result<(String, Vec<PathBuf>), String> {
    let cache = RepoCache::new(cache, &spec.repo);
    let not_here =
        || format!("{spec}: not in the hub cache ({}): `bmoe pull {spec}` fetches it", cache.root().display());
    let (commit, names) = cache.snapshot(&spec.revision).ok_or_else(not_here)?;
    let files: Vec<RepoFile> =
        names.iter().map(|n| RepoFile { name: n.clone(), size: 0, sha256: None, blob: String::new() }).collect();
    let chosen = select_files(&files, spec.selector.as_deref()).map_err(|e| format!("{spec} in the hub cache: {e}"))?;
    let paths: Vec<PathBuf> = chosen.iter().map(|f| cache.snapshot_path(&commit, &f.name)).collect();
    match paths.iter().find(|p| !p.is_file()) {
        Some(gone) => Err(format!("{spec}: the cached file {} is missing or incomplete", gone.display())),
        None if paths.is_empty() => Err(not_here()),
        None => Ok((commit, paths)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hub(repo: &str, selector: Option<&str>) -> ModelRef {
        ModelRef::Hub(HubSpec { repo: repo.into(), selector: selector.map(str::to_string), revision: "main".into() })
    }

    #[test]
    fn names_read_as_files_or_hub_models() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("m.gguf");
        std::fs::write(&file, b"x").unwrap();
        let as_given = file.to_str().unwrap();
        assert_eq!(ModelRef::parse(as_given).unwrap(), ModelRef::File(file.clone()));
        assert_eq!(ModelRef::parse("hf:acme/Chat:q8_0").unwrap(), hub("acme/Chat", Some("q8_0")));
        assert_eq!(ModelRef::parse("acme/Chat-MoE-GGUF:q8_0").unwrap(), hub("acme/Chat-MoE-GGUF", Some("q8_0")));
        assert_eq!(
            ModelRef::parse("acme/Chat-MoE-GGUF:Chat-MoE-Q8_0.gguf").unwrap(),
            hub("acme/Chat-MoE-GGUF", Some("Chat-MoE-Q8_0.gguf"))
        );
        assert_eq!(ModelRef::parse("acme/Chat").unwrap(), hub("acme/Chat", None));
        // Paths that are not there stay paths: opening them says "no such file".
        for path in ["models/q30.gguf", "./acme/Chat", "/acme/Chat", "q30.gguf", "a/b/c.gguf"] {
            assert_eq!(ModelRef::parse(path).unwrap(), ModelRef::File(path.into()), "{path}");
        }
        assert!(ModelRef::parse("hf:not a repo").is_err());
        let e = ModelRef::File("nosuch.gguf".into()).local(&HubSettings::from_vars(|_| None)).unwrap_err();
        assert!(e.contains("no such file"), "{e}");
    }

    #[test]
    fn a_hub_model_is_found_in_the_cache_or_the_error_says_pull() {
        let dir = tempfile::tempdir().unwrap();
        let settings = HubSettings { cache: dir.path().to_path_buf(), ..HubSettings::from_vars(|_| None) };
        let spec: HubSpec = "acme/Chat-MoE-GGUF:q8_0".parse().unwrap();
        let e = cached_files(&spec, &settings.cache).unwrap_err();
        assert!(e.contains("bmoe pull acme/Chat-MoE-GGUF:q8_0"), "{e}");
        let repo = dir.path().join("models--acme--Chat-MoE-GGUF");
        let commit = "abc1230000000000000000000000000000000000";
        let snapshot = repo.join("snapshots").join(commit);
        std::fs::create_dir_all(&snapshot).unwrap();
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::write(repo.join("refs/main"), commit).unwrap();
        std::fs::write(snapshot.join("Chat-MoE-Q8_0.gguf"), b"gguf").unwrap();
        std::fs::write(snapshot.join("Chat-MoE-Q4_K_M.gguf"), b"gguf").unwrap();
        let want = snapshot.join("Chat-MoE-Q8_0.gguf");
        for name in ["acme/Chat-MoE-GGUF:q8_0", "hf:acme/Chat-MoE-GGUF:Q8_0", "acme/Chat-MoE-GGUF:Chat-MoE-Q8_0.gguf"] {
            assert_eq!(ModelRef::parse(name).unwrap().local(&settings).unwrap(), want, "{name}");
        }
        let e = ModelRef::parse("acme/Chat-MoE-GGUF:q2_k").unwrap().local(&settings).unwrap_err();
        assert!(e.contains("q2_k") || e.contains("Q2_K"), "{e}");
    }
}
