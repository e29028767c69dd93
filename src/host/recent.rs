//! The model files runs have opened, with when: what `bmoe models` lists
//! beside the hub cache and the demo models. One line per model in
//! `~/.cache/bmoe/models-used.tsv` (seconds since 1970, a tab, the path);
//! best effort: a file that cannot be written costs the listing only.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The record's file.
fn record_file() -> PathBuf {
    crate::moe::copies::cache_root().join("models-used.tsv")
}

/// Models kept in the record.
const KEEP: usize = 200;

/// The models runs opened, most recent first.
pub fn models_used() -> Vec<(PathBuf, SystemTime)> {
    let text = std::fs::read_to_string(record_file()).unwrap_or_default();
    let mut used: Vec<(PathBuf, SystemTime)> = text
        .lines()
        .filter_map(|line| {
            let (secs, path) = line.split_once('\t')?;
            Some((PathBuf::from(path), UNIX_EPOCH + Duration::from_secs(secs.parse().ok()?)))
        })
        .collect();
    used.sort_by_key(|(_, at)| std::cmp::Reverse(*at));
    used
}

/// Records that a run opened `model` now.
pub fn record_use(model: &Path) {
    let Ok(model) = std::fs::canonicalize(model).or_else(|_| std::path::absolute(model)) else { return };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut lines = vec![format!("{now}\t{}", model.display())];
    lines.extend(models_used().into_iter().filter(|(path, _)| *path != model).take(KEEP - 1).map(|(path, at)| {
        format!("{}\t{}", at.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0), path.display())
    }));
    let file = record_file();
    let temp = file.with_extension(format!("tmp{}", std::process::id()));
    let written = std::fs::create_dir_all(file.parent().unwrap_or(Path::new(".")))
        .and_then(|()| std::fs::write(&temp, lines.join("\n") + "\n"))
        .and_then(|()| std::fs::rename(&temp, &file));
    if written.is_err() {
        let _ = std::fs::remove_file(&temp);
    }
}
