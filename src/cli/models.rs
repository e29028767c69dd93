//! `bmoe models`: the GGUF models on this machine (the Hugging Face cache,
//! bmoe's demo models, the files runs have opened) with their size, shape,
//! whether they stream, their copies and last use; `bmoe models rm` removes
//! one with its copies.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use anyhow::{Result, anyhow, bail};
use clap::{Args, Subcommand};

use crate::gguf::ModelFiles;
use crate::hub::{self, HubSettings};
use crate::moe::copies::{self, CachedCopy, CopyKind};
use crate::units::{size, sizes};

/// What `bmoe models` does (listing when none is given).
#[derive(Subcommand, Debug)]
pub enum ModelsCommand {
    /// List the models: size, architecture, main tensor type, whether bmoe streams it, its copies
    /// in bmoe's cache, last use, and its name (OWNER/NAME:FILE for the hub cache) or path.
    List,
    /// Remove a model (a name or path `bmoe models` lists) with its lean and repacked copies,
    /// after saying what that frees.
    #[command(visible_alias = "remove")]
    Rm(RmArgs),
}

/// `bmoe models rm`'s arguments.
#[derive(Args, Debug)]
pub struct RmArgs {
    /// The model: its name as listed (OWNER/NAME:FILE for the hub cache), the spec `pull` took
    /// (OWNER/NAME[:QUANT], hf: in front or not), or its path.
    pub model: String,
    /// Delete a model file outside the hub and bmoe caches too (one you put there yourself).
    #[arg(long)]
    pub yes: bool,
    /// Say what would be removed and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Where a listed model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    /// The hub cache: its repository folder.
    Hub(PathBuf),
    /// bmoe's demo model.
    Demo,
    /// A file a run opened.
    Used,
}

/// One listed model.
#[derive(Debug, Clone)]
struct Listed {
    name: String,
    files: Vec<PathBuf>,
    origin: Origin,
    /// The first file's real path (what copies record).
    canonical: PathBuf,
    last_used: Option<SystemTime>,
}

/// Runs `bmoe models`.
pub fn models(command: Option<ModelsCommand>) -> Result<()> {
    let copies = copies::list(&copies::cache_root()).unwrap_or_default();
    let listed = gather(&copies);
    match command.unwrap_or(ModelsCommand::List) {
        ModelsCommand::List => super::print_stdout(&table(&listed, &copies, SystemTime::now())),
        ModelsCommand::Rm(args) => remove(&args, &listed, &copies),
    }
}

/// Every model: the hub cache's, the demo models, then those runs opened.
fn gather(copies: &[CachedCopy]) -> Vec<Listed> {
    let used = crate::host::models_used();
    let last = |canonical: &Path| {
        let run = used.iter().find(|(p, _)| p == canonical).map(|(_, at)| *at);
        let copy = copies.iter().filter(|c| c.model.as_deref() == Some(canonical)).map(|c| c.last_used).max();
        run.max(copy)
    };
    let mut listed: Vec<Listed> = Vec::new();
    let mut add = |name: String, files: Vec<PathBuf>, origin: Origin| {
        let canonical = std::fs::canonicalize(&files[0]).unwrap_or_else(|_| files[0].clone());
        if listed.iter().any(|l| l.canonical == canonical) {
            return;
        }
        let last_used = last(&canonical);
        listed.push(Listed { name, files, origin, canonical, last_used });
    };
    for m in hub::cached_models(&HubSettings::from_env().cache) {
        add(m.name, m.files, Origin::Hub(m.repo_folder));
    }
    for c in copies.iter().filter(|c| c.kind == CopyKind::Demo) {
        add(c.path.display().to_string(), vec![c.path.clone()], Origin::Demo);
    }
    for (path, _) in &used {
        if path.is_file() {
            add(path.display().to_string(), shard_files(path), Origin::Used);
        }
    }
    listed
}

/// A model's files: every shard of a split set, else the file.
fn shard_files(path: &Path) -> Vec<PathBuf> {
    ModelFiles::open(path).map(|f| f.paths().to_vec()).unwrap_or_else(|_| vec![path.to_path_buf()])
}

/// The listing.
fn table(listed: &[Listed], copies: &[CachedCopy], now: SystemTime) -> String {
    if listed.is_empty() {
        return "no models yet: `bmoe pull OWNER/NAME[:QUANT]` fetches one, `bmoe chat` makes the demo\n".into();
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:>10} {:<14} {:<8} {:<7} {:>10} {:>9}  model",
        "size", "architecture", "type", "streams", "copies", "last use"
    );
    for l in listed {
        let bytes: u64 = l.files.iter().filter_map(|f| std::fs::metadata(f).ok()).map(|m| m.len()).sum();
        let (arch, ty, streams) = match ModelFiles::open(&l.files[0]) {
            Ok(files) => (
                files.meta().architecture().unwrap_or("?").to_string(),
                crate::moe::inspect::main_type(&files),
                if crate::moe::inspect::stream_verdict(&files).is_ok() { "yes" } else { "no" },
            ),
            Err(_) => ("unreadable".into(), "-".into(), "no"),
        };
        let copy_bytes: u64 = copies_of(l, copies).map(|c| c.disk_bytes).sum();
        let copies_text = if copy_bytes == 0 { "-".to_string() } else { size(copy_bytes) };
        let ago = l
            .last_used
            .map(|t| super::cache::ago(now.duration_since(t).unwrap_or_default()))
            .unwrap_or_else(|| "-".into());
        let shards = if l.files.len() > 1 { format!(" ({} shards)", l.files.len()) } else { String::new() };
        let origin = match l.origin {
            Origin::Hub(_) => " [hub]",
            Origin::Demo => " [demo]",
            Origin::Used => "",
        };
        let _ = writeln!(
            out,
            "{:>10} {arch:<14} {ty:<8} {streams:<7} {copies_text:>10} {ago:>9}  {}{shards}{origin}",
            size(bytes),
            l.name
        );
    }
    out
}

/// The cached copies made of `model`.
fn copies_of<'c>(model: &Listed, copies: &'c [CachedCopy]) -> impl Iterator<Item = &'c CachedCopy> {
    let canonical = model.canonical.clone();
    copies.iter().filter(move |c| c.kind != CopyKind::Demo && c.model.as_deref() == Some(canonical.as_path()))
}

/// `bmoe models rm`.
fn remove(args: &RmArgs, listed: &[Listed], copies: &[CachedCopy]) -> Result<()> {
    let given = std::fs::canonicalize(&args.model)
        .ok()
        .or_else(|| std::fs::canonicalize(super::local_model(&args.model).ok()?).ok());
    let Some(model) = listed
        .iter()
        .find(|l| l.name == args.model || Some(&l.canonical) == given.as_ref() || l.files[0] == Path::new(&args.model))
    else {
        bail!("{}: not a model `bmoe models` lists (write a name or path as listed)", args.model);
    };
    if model.origin == Origin::Used && !args.yes {
        bail!(
            "{} is a file of yours, outside the hub and bmoe caches: pass --yes to delete it with its copies \
             (`bmoe cache remove --model {}` removes the copies alone)",
            model.name,
            model.name
        );
    }
    // The files to delete: a hub model's blobs no other snapshot links to,
    // with the links; any other model's files.
    let mut doomed: Vec<PathBuf> = Vec::new();
    let mut file_bytes = 0;
    for f in &model.files {
        let real = std::fs::canonicalize(f).unwrap_or_else(|_| f.clone());
        file_bytes += std::fs::metadata(&real).map(|m| m.len()).unwrap_or(0);
        if let Origin::Hub(_) = model.origin {
            doomed.push(f.clone());
            let shared = listed
                .iter()
                .filter(|o| o.name != model.name)
                .flat_map(|o| &o.files)
                .any(|o| std::fs::canonicalize(o).ok().as_ref() == Some(&real));
            if !shared {
                doomed.push(real);
            }
        } else {
            doomed.push(real);
        }
    }
    let own: Vec<&CachedCopy> = copies_of(model, copies).collect();
    let copy_bytes: u64 = own.iter().map(|c| c.disk_bytes).sum();
    let [files_text, copies_text, total] = sizes([file_bytes, copy_bytes, file_bytes + copy_bytes]);
    println!(
        "{}: {} file{} ({files_text}), {} cop{} ({copies_text})",
        model.name,
        model.files.len(),
        if model.files.len() == 1 { "" } else { "s" },
        own.len(),
        if own.len() == 1 { "y" } else { "ies" }
    );
    if args.dry_run {
        println!("would free {total} (--dry-run: nothing removed)");
        return Ok(());
    }
    for c in &own {
        copies::remove(c).map_err(|e| anyhow!("removing {}: {e}", c.path.display()))?;
    }
    for path in &doomed {
        match std::fs::remove_file(path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => bail!("removing {}: {e}", path.display()),
            _ => {}
        }
    }
    if let Origin::Hub(folder) = &model.origin {
        prune_empty(&folder.join("snapshots"));
        forget_empty_repo(folder);
    }
    println!("removed; freed {total}");
    Ok(())
}

/// Removes a hub repository's folder once no snapshot and no blob is left
/// in it: its `refs/` would otherwise point at a snapshot that is gone.
fn forget_empty_repo(folder: &Path) {
    let empty = |dir: &Path| std::fs::read_dir(dir).map_or(true, |mut d| d.next().is_none());
    if empty(&folder.join("snapshots")) && empty(&folder.join("blobs")) {
        let _ = std::fs::remove_dir_all(folder);
    }
}

/// Removes the empty folders under `dir` (a snapshot whose links are gone).
fn prune_empty(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    let mut seen = BTreeSet::new();
    for e in entries.flatten() {
        if e.path().is_dir() {
            prune_empty(&e.path());
            seen.insert(e.path());
        }
    }
    for d in seen {
        let _ = std::fs::remove_dir(d);
    }
}
