//! Entry points for the fuzz targets in `fuzz/` and for the test that
//! replays their saved corpora (`tests/fuzz_corpora.rs`). Each takes
//! arbitrary bytes, runs one parser of untrusted input on them the way bmoe
//! does, and checks what it returns. Whatever the bytes, none may panic,
//! hang, or allocate without bound; bad input must come back as an error.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::{RunConfig, parse_params};
use crate::gguf::{GgufFile, ModelFiles, RunShape, split_path};
use crate::telemetry::trace;

/// Separates the shards of a split set inside one [`gguf_split`] input.
pub const SHARD_SEPARATOR: &[u8] = b"\n--bmoe-fuzz-next-shard--\n";

/// The GGUF reader on one file image, then what `bmoe inspect` and the
/// session derive from it.
pub fn gguf_file(data: &[u8]) {
    let Ok(file) = GgufFile::parse(data) else { return };
    check_file(&file, data.len() as u64);
    // The same bytes on disk go through the model-level reader too.
    with_files(&[data], |first| {
        if let Ok(files) = ModelFiles::open(first) {
            check_model(&files, first);
        }
    });
}

/// The split-set reader: the input is up to 8 shard images separated by
/// [`SHARD_SEPARATOR`], written as `m-0000i-of-0000N.gguf`.
pub fn gguf_split(data: &[u8]) {
    let shards: Vec<&[u8]> = split(data, SHARD_SEPARATOR).take(8).collect();
    with_files(&shards, |first| {
        if let Ok(files) = ModelFiles::open(first) {
            check_model(&files, first);
        }
    });
}

/// The route-trace parser and analyser (`bmoe trace-stats`).
pub fn route_trace(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(stats) = trace::analyze(&text, 128, &[0.1, 0.25, 0.5]) {
        assert!(stats.layers > 0, "an analysed trace has layers");
        for (frac, hit) in &stats.lru_hits {
            assert!((0.0..=1.0).contains(hit), "LRU hit rate {hit} at {frac}");
        }
    }
}

/// `bmoe.toml`: parse, validate, and everything derived from a valid config
/// (session options, sampling, the resolved pairs, plugin parameters).
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let Ok(config) = RunConfig::from_toml(text) else { return };
    if config.validate().is_err() {
        return;
    }
    let _ = config.session_options(Path::new("model.gguf"), config.stream_needed_by().is_some());
    let _ = config.sampling();
    let pairs = config.resolved_pairs();
    assert!(!pairs.is_empty());
    let _ = parse_params("plugins.draft_params", &config.plugins.draft_params);
    let _ = parse_params("plugins.drop_params", &config.plugins.drop_params);
}

/// Invariants of a parsed file: every tensor lies inside the file (a file
/// without tensors may end before its padded data section would start).
fn check_file(file: &GgufFile, len: u64) {
    assert!(file.data_offset <= len || file.tensors().is_empty(), "data section starts past the end");
    assert_eq!(file.file_size, len);
    for t in file.tensors() {
        let end = file.data_offset.checked_add(t.offset).and_then(|o| o.checked_add(t.size));
        assert!(end.is_some_and(|e| e <= len), "tensor {} runs past the end", t.name);
    }
}

/// Invariants of an opened model, and the reports built from it.
fn check_model(files: &ModelFiles, first: &Path) {
    for (shard, file) in files.shards().iter().enumerate() {
        let len = std::fs::metadata(&files.paths()[shard]).map(|m| m.len()).unwrap_or(0);
        check_file(file, len);
    }
    for t in files.tensors() {
        let found = files.locate(&t.info.name).expect("every listed tensor can be located");
        assert_eq!(found.file_offset, t.file_offset);
    }
    check_load_rules(files);
    let _ = crate::moe::inspect::inspect_report(files, first);
    let n_expert = files.meta().arch_u64("expert_count").unwrap_or(0);
    let _ = trace::layer_bytes(files, n_expert);
}

/// The load check ([`crate::gguf::check_model`]) on the header fields
/// llama.cpp trusts: under any run it answers with one line or passes, and
/// what it passes holds the counts llama.cpp divides by and asserts on.
fn check_load_rules(files: &ModelFiles) {
    let runs = [RunShape::default(), RunShape { expert_used_count: Some(1), mtp: true }];
    for run in &runs {
        match crate::gguf::check_model(files, run) {
            Err(e) => assert!(!e.is_empty() && !e.contains('\n'), "a load-check error is one line: {e:?}"),
            Ok(()) => {
                let meta = files.meta();
                // A missing block_count is llama.cpp's to name; any other passes in range.
                if let Some(n_layer) = meta.arch_u64("block_count") {
                    assert!((1..=crate::gguf::MAX_LAYERS).contains(&n_layer), "passed with block_count {n_layer}");
                    let mtp = meta.arch_u64("nextn_predict_layers").unwrap_or(0);
                    assert!(mtp < n_layer, "passed with every layer MTP");
                }
                assert!(files.shards().iter().all(|s| s.alignment >= 32), "passed with alignment below 32");
                let n_expert = meta.arch_u64("expert_count").unwrap_or(0);
                if n_expert > 0 {
                    let groups = meta.arch_u64("expert_group_count").unwrap_or(0);
                    assert!(groups < n_expert, "passed with {groups} expert groups for {n_expert} experts");
                    assert!(groups <= 1 || n_expert.is_multiple_of(groups), "passed with groups that do not divide");
                }
                for t in files.tensors() {
                    assert!(crate::gguf::has_cpu_kernel(t.info.ty), "passed {} of type {}", t.info.name, t.info.ty);
                }
            }
        }
    }
}

/// Writes `images` as a split set (or one file) in a fresh directory, runs
/// `f` on the first path, and removes the directory.
fn with_files(images: &[&[u8]], f: impl FnOnce(&Path)) {
    static RUN: AtomicU64 = AtomicU64::new(0);
    let dir =
        std::env::temp_dir().join(format!("bmoe-fuzz-{}-{}", std::process::id(), RUN.fetch_add(1, Ordering::Relaxed)));
    if std::fs::create_dir_all(&dir).is_err() {
        return;
    }
    let n = images.len() as u32;
    let paths: Vec<PathBuf> =
        if n == 1 { vec![dir.join("m.gguf")] } else { (1..=n).map(|i| split_path(&dir.join("m"), i, n)).collect() };
    if paths.iter().zip(images).all(|(p, bytes)| std::fs::write(p, bytes).is_ok()) {
        f(&paths[0]);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `data` cut at every occurrence of `sep`.
fn split<'a>(data: &'a [u8], sep: &'a [u8]) -> impl Iterator<Item = &'a [u8]> + 'a {
    let mut rest = Some(data);
    std::iter::from_fn(move || {
        let r = rest?;
        match r.windows(sep.len()).position(|w| w == sep) {
            Some(i) => {
                rest = Some(&r[i + sep.len()..]);
                Some(&r[..i])
            }
            None => {
                rest = None;
                Some(r)
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_cuts_at_each_separator() {
        let parts: Vec<&[u8]> = split(b"a--b----c", b"--").collect();
        assert_eq!(parts, [&b"a"[..], b"b", b"", b"c"]);
        assert_eq!(split(b"abc", b"--").count(), 1);
    }
}
