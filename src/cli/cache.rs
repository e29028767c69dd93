//! `bmoe cache`: list and remove what bmoe keeps in its cache directory
//! (lean and repacked copies of models, demo models, route profiles).

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{Context, Result, anyhow, bail};
use clap::{Args, Subcommand};

use crate::moe::copies::{self, CachedCopy, CopyKind};

/// What `bmoe cache` does (listing when none is given).
#[derive(Subcommand, Debug)]
pub enum CacheCommand {
    /// List the lean and repacked copies, the demo models and the route profiles: kind, room on
    /// disk, last use, model.
    List,
    /// Remove entries: those of models that are gone, those unused for a while, one model's, one
    /// kind, or all (a session that has a copy open keeps reading it until it closes).
    #[command(visible_alias = "rm")]
    Remove(RemoveArgs),
}

/// Which entries `bmoe cache remove` removes: those every given filter accepts.
#[derive(Args, Debug)]
pub struct RemoveArgs {
    /// Entries unused for longer than AGE: days, or a number with a unit (30m, 12h, 7d, 2w).
    #[arg(long, value_name = "AGE")]
    pub older_than: Option<String>,
    /// Copies of models that no longer exist.
    #[arg(long)]
    pub gone: bool,
    /// Copies of this model: its file, or a hub model as `pull` takes it or `bmoe models` and
    /// `bmoe cache list` name it.
    #[arg(long, value_name = "MODEL")]
    pub model: Option<String>,
    /// Entries of this kind: lean, repacked, demo or profile.
    #[arg(long)]
    pub kind: Option<String>,
    /// Every entry.
    #[arg(long)]
    pub all: bool,
    /// Say what would be removed and remove nothing.
    #[arg(long)]
    pub dry_run: bool,
}

/// Runs `bmoe cache`.
pub fn cache(command: Option<CacheCommand>) -> Result<()> {
    let root = copies::cache_root();
    let entries = copies::list(&root).with_context(|| format!("reading {}", root.display()))?;
    match command.unwrap_or(CacheCommand::List) {
        CacheCommand::List => {
            print!("{}", listing(&entries, SystemTime::now()));
            println!("{} in {}", total(&entries), root.display());
        }
        CacheCommand::Remove(args) => remove(&args, &entries)?,
    }
    Ok(())
}

fn remove(args: &RemoveArgs, entries: &[CachedCopy]) -> Result<()> {
    if args.older_than.is_none() && !args.gone && args.model.is_none() && args.kind.is_none() && !args.all {
        bail!("say which entries to remove: --older-than AGE, --gone, --model MODEL, --kind KIND or --all");
    }
    let age = args.older_than.as_deref().map(parse_age).transpose()?;
    let kind = args.kind.as_deref().map(parse_kind).transpose()?;
    let model = match &args.model {
        Some(m) => Some(model_path(m).with_context(|| format!("--model {m}"))?),
        None => None,
    };
    let now = SystemTime::now();
    let chosen: Vec<CachedCopy> = entries
        .iter()
        .filter(|c| age.is_none_or(|a| now.duration_since(c.last_used).unwrap_or_default() > a))
        .filter(|c| !args.gone || (c.model.is_some() && !c.model_exists))
        .filter(|c| model.as_ref().is_none_or(|m| c.model.as_ref() == Some(m)))
        .filter(|c| kind.is_none_or(|k| c.kind == k))
        .cloned()
        .collect();
    if chosen.is_empty() {
        println!("nothing to remove ({} entries, none matches)", entries.len());
        return Ok(());
    }
    print!("{}", listing(&chosen, now));
    if args.dry_run {
        println!(
            "would free {} (--dry-run: nothing removed)",
            crate::units::size(chosen.iter().map(|c| c.disk_bytes).sum())
        );
        return Ok(());
    }
    let mut freed = 0;
    for c in &chosen {
        freed += copies::remove(c).map_err(|e| anyhow!("removing {}: {e}", c.path.display()))?;
    }
    println!("removed {}, freed {}", entries_count(chosen.len()), crate::units::size(freed));
    Ok(())
}

/// The file a `--model` name means, as copies record it: a hub model's
/// blob in the hub cache, else the file's real path (a deleted model's
/// copies still name it: its absolute path then).
fn model_path(name: &str) -> Result<PathBuf> {
    let named = crate::hub::ModelRef::parse(name).map_err(anyhow::Error::msg)?;
    let path = match named {
        crate::hub::ModelRef::Hub(_) => super::local_model(name)?,
        crate::hub::ModelRef::File(path) => path,
    };
    Ok(std::fs::canonicalize(&path).or_else(|_| std::path::absolute(&path))?)
}

/// The entries as a table, each model named as `bmoe models` names it.
fn listing(entries: &[CachedCopy], now: SystemTime) -> String {
    let mut out = String::new();
    if entries.is_empty() {
        return "no copies, demo models or route profiles\n".into();
    }
    let hub_names = crate::hub::names_by_file(&crate::hub::HubSettings::from_env().cache);
    let name = |m: &std::path::Path| {
        hub_names.iter().find(|(file, _)| file == m).map_or_else(|| m.display().to_string(), |(_, n)| n.clone())
    };
    let _ = writeln!(out, "{:<9} {:>10} {:>9}  model", "kind", "on disk", "last use");
    for c in entries {
        let model = match (&c.model, c.kind) {
            (_, CopyKind::Demo) => c.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
            (Some(m), _) if c.model_exists => name(m),
            (Some(m), _) => format!("{} (gone)", m.display()),
            (None, _) => format!("? ({})", c.path.display()),
        };
        let model = if c.partial { format!("{model} (partial: the experts read so far)") } else { model };
        let ago = ago(now.duration_since(c.last_used).unwrap_or_default());
        let _ = writeln!(out, "{:<9} {:>10} {:>9}  {model}", c.kind.name(), crate::units::size(c.disk_bytes), ago);
    }
    out
}

fn total(entries: &[CachedCopy]) -> String {
    format!("{}, {}", entries_count(entries.len()), crate::units::size(entries.iter().map(|c| c.disk_bytes).sum()))
}

/// `1 entry`, `3 entries`.
fn entries_count(n: usize) -> String {
    if n == 1 { "1 entry".into() } else { format!("{n} entries") }
}

/// A duration as the listing shows it: `now`, `5 min`, `3 h`, `12 d`.
pub(super) fn ago(d: Duration) -> String {
    let s = d.as_secs();
    match s {
        0..60 => "now".into(),
        60..3600 => format!("{} min", s / 60),
        3600..86_400 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// `7`, `7d`, `12h`, `30m`, `2w`.
fn parse_age(text: &str) -> Result<Duration> {
    let t = text.trim();
    let (number, unit) = t.split_at(t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len()));
    let secs = match unit.trim() {
        "" | "d" => 86_400.0,
        "h" => 3600.0,
        "m" => 60.0,
        "w" => 7.0 * 86_400.0,
        _ => bail!("--older-than {text}: a number of days, or with a unit m, h, d or w (e.g. 12h, 30d)"),
    };
    let n: f64 =
        number.parse().ok().filter(|n: &f64| n.is_finite() && *n >= 0.0).ok_or_else(|| {
            anyhow!("--older-than {text}: a number of days, or with a unit m, h, d or w (e.g. 12h, 30d)")
        })?;
    Ok(Duration::from_secs_f64(n * secs))
}

fn parse_kind(text: &str) -> Result<CopyKind> {
    [CopyKind::Lean, CopyKind::Repacked, CopyKind::Demo, CopyKind::Profile]
        .into_iter()
        .find(|k| k.name() == text)
        .ok_or_else(|| anyhow!("--kind {text}: lean, repacked, demo or profile"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_parse_with_and_without_units() {
        assert_eq!(parse_age("7").unwrap(), Duration::from_secs(7 * 86_400));
        assert_eq!(parse_age("12h").unwrap(), Duration::from_secs(12 * 3600));
        assert_eq!(parse_age("30m").unwrap(), Duration::from_secs(1800));
        assert_eq!(parse_age("2w").unwrap(), Duration::from_secs(14 * 86_400));
        assert_eq!(parse_age("1.5d").unwrap(), Duration::from_secs(129_600));
        for bad in ["", "d", "-1d", "3y", "ten"] {
            assert!(parse_age(bad).is_err(), "{bad:?} parsed");
        }
    }
}
