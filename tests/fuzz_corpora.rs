//! Replays the fuzz corpora saved in `fuzz/corpus/` and the inputs of fixed
//! fuzz findings in `fuzz/regressions/` through the same entry points the
//! fuzz targets use (`bmoe::fuzz`): every input must be handled without a
//! panic. Needs no nightly; `scripts/fuzz.sh` grows the corpora.

use std::path::Path;

fn replay(target: &str, run: fn(&[u8])) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz");
    let mut replayed = 0;
    for kind in ["corpus", "regressions"] {
        let Ok(entries) = std::fs::read_dir(root.join(kind).join(target)) else { continue };
        for entry in entries {
            let path = entry.unwrap().path();
            let data = std::fs::read(&path).unwrap();
            if std::panic::catch_unwind(|| run(&data)).is_err() {
                panic!("{target}: {} makes the parser panic", path.display());
            }
            replayed += 1;
        }
    }
    assert!(replayed > 0, "{target}: no saved inputs under fuzz/corpus or fuzz/regressions");
}

#[test]
fn gguf_file_corpus() {
    replay("gguf_file", bmoe::fuzz::gguf_file);
}

#[test]
fn gguf_split_corpus() {
    replay("gguf_split", bmoe::fuzz::gguf_split);
}

#[test]
fn route_trace_corpus() {
    replay("route_trace", bmoe::fuzz::route_trace);
}

#[test]
fn config_corpus() {
    replay("config", bmoe::fuzz::config);
}
