//! Rhai experiment scripts: every example runs and leaves its CSV and
//! charts; every example in docs/scripting.md runs; the sandbox stops a
//! runaway loop and refuses writes outside the output directory; errors
//! point at the right line and column; a run's result map carries the same
//! numbers as the CSV telemetry of the same run.

mod common;

use std::path::{Path, PathBuf};

use bmoe::config::RunConfig;
use bmoe::script::{Limits, OutDir, ScriptOptions, Session, run_file, run_source};
use common::*;
use rhai::{Dynamic, Map};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Options for a test script: one compute thread, output under `out`.
fn options(out: &Path, args: &[&str]) -> ScriptOptions {
    let mut base = RunConfig::default();
    base.generate.threads = 1;
    ScriptOptions {
        out_dir: out.to_path_buf(),
        args: args.iter().map(|a| a.to_string()).collect(),
        base,
        ..ScriptOptions::default()
    }
}

fn files(dir: &Path, ext: &str) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(ext))
        .collect();
    v.sort();
    v
}

/// `SCRIPT_DIR` is the script's own folder, absolute, whatever the working
/// directory (the script throws otherwise, and `run_file` returns the error).
#[test]
fn script_dir_is_the_folder_of_the_script() {
    let dir = tempdir();
    let script = dir.path().join("where.rhai");
    let want = std::fs::canonicalize(dir.path()).unwrap();
    std::fs::write(
        &script,
        format!("if SCRIPT_DIR != {:?} {{ throw `SCRIPT_DIR is ${{SCRIPT_DIR}}`; }}", want.display().to_string()),
    )
    .unwrap();
    let canonical = want.join("where.rhai");
    run_file(&canonical, &options(dir.path(), &[])).unwrap();
    let e = run_source("inline.rhai", "if SCRIPT_DIR != \".\" { throw \"not .\"; }", &options(dir.path(), &[]));
    assert!(e.is_ok(), "{e:?}");
}

#[test]
fn every_example_runs_and_leaves_its_csv_and_charts() {
    // Examples open paths relative to the repository root.
    std::env::set_current_dir(root()).unwrap();
    let mut examples: Vec<PathBuf> = std::fs::read_dir(root().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "rhai"))
        .collect();
    examples.sort();
    assert_eq!(examples.len(), 6, "{examples:?}");
    let _serial = llama_lock();
    for example in examples {
        let dir = tempdir();
        let out = dir.path().join("out");
        run_file(&example, &options(&out, &[])).unwrap_or_else(|e| panic!("{}: {e}", example.display()));
        let csvs = files(&out, ".csv");
        let svgs = files(&out, ".svg");
        assert!(!csvs.is_empty() && !svgs.is_empty(), "{}: {csvs:?} {svgs:?}", example.display());
        for csv in csvs {
            let text = std::fs::read_to_string(out.join(&csv)).unwrap();
            assert!(text.lines().count() >= 3, "{csv} has too few rows:\n{text}");
        }
        for svg in svgs {
            let text = std::fs::read_to_string(out.join(&svg)).unwrap();
            assert!(text.starts_with("<svg") && text.contains("</svg>"), "{svg}");
        }
    }
}

#[test]
fn every_example_in_the_scripting_docs_runs() {
    std::env::set_current_dir(root()).unwrap();
    let doc = std::fs::read_to_string(root().join("docs/scripting.md")).unwrap();
    let blocks: Vec<&str> = doc.split("```rhai\n").skip(1).map(|b| b.split("```").next().unwrap()).collect();
    assert!(blocks.len() >= 10, "only {} rhai blocks", blocks.len());
    let _serial = llama_lock();
    let dir = tempdir();
    for (i, block) in blocks.iter().enumerate() {
        let out = dir.path().join(format!("block{i}"));
        run_source(&format!("docs/scripting.md block {i}"), block, &options(&out, &["x"]))
            .unwrap_or_else(|e| panic!("block {i}:\n{block}\n{e}"));
    }
}

#[test]
fn a_runaway_loop_is_stopped_by_the_operation_limit() {
    let dir = tempdir();
    let mut o = options(dir.path(), &[]);
    o.limits = Limits { max_operations: 100_000, ..Limits::default() };
    let e = run_source("loop.rhai", "let x = 0;\nloop {\n    x += 1;\n}\n", &o).unwrap_err();
    assert!(e.message.contains("operation limit"), "{e}");
    assert_eq!(e.file, "loop.rhai");
    assert!((2..=3).contains(&e.line), "{e}");
    // Deep recursion and huge strings hit their own limits.
    let e = run_source("deep.rhai", "fn f(n) { f(n + 1) }\nf(0);\n", &o).unwrap_err();
    assert!(e.to_string().to_lowercase().contains("stack") || e.to_string().contains("call"), "{e}");
    let e = run_source("big.rhai", "let s = \"x\";\nloop { s += s; }\n", &options(dir.path(), &[])).unwrap_err();
    assert!(e.to_string().to_lowercase().contains("length") || e.to_string().contains("size"), "{e}");
}

#[test]
fn writes_outside_the_output_directory_are_refused() {
    let dir = tempdir();
    let out = dir.path().join("out");
    for (call, path) in [
        ("write_csv(\"../escape.csv\", [#{a: 1}]);", "../escape.csv"),
        ("chart(\"/tmp/escape.svg\", #{kind: \"line\", x: [1], series: #{a: [1]}});", "/tmp/escape.svg"),
        ("make_model(\"../m.gguf\");", "../m.gguf"),
    ] {
        let e = run_source("w.rhai", call, &options(&out, &[])).unwrap_err();
        assert!(e.message.contains("outside the output directory") && e.message.contains(path), "{e}");
    }
    assert!(!dir.path().join("escape.csv").exists() && !dir.path().join("m.gguf").exists());
    // A telemetry file named by a script lands in the output directory too.
    let e = run_source("t.rhai", "open(\"\", #{csv: \"../x.csv\"});", &options(&out, &[])).unwrap_err();
    assert!(e.message.contains("outside the output directory"), "{e}");
    // Modules and eval are not available.
    let e = run_source("m.rhai", "import \"other\" as o;", &options(&out, &[])).unwrap_err();
    assert!(e.message.to_lowercase().contains("module"), "{e}");
    assert!(run_source("e.rhai", "eval(\"1\");", &options(&out, &[])).is_err());
}

#[test]
fn errors_point_at_the_line_and_column() {
    let dir = tempdir();
    let e = run_source("syntax.rhai", "let x = 1;\nlet y = x +;\n", &options(dir.path(), &[])).unwrap_err();
    assert_eq!((e.line, e.column), (2, 12), "{e}");
    assert!(e.to_string().starts_with("syntax.rhai:2:12: "), "{e}");
    assert!(e.to_string().contains("let y = x +;"), "the offending line is shown: {e}");
    // A failing call names itself.
    let e = run_source("call.rhai", "\n  replay(\"no-such.csv\", #{fraction: 0.1});\n", &options(dir.path(), &[]))
        .unwrap_err();
    assert_eq!((e.line, e.column), (2, 3), "{e}");
    assert!(e.message.starts_with("replay: reading no-such.csv"), "{e}");
}

fn number(v: &Dynamic) -> f64 {
    v.as_float().or_else(|_| v.as_int().map(|i| i as f64)).unwrap_or(f64::NAN)
}

#[test]
fn a_result_map_carries_the_numbers_of_the_csv_telemetry() {
    let dir = tempdir();
    let out = OutDir::new(dir.path().join("out"));
    let model = {
        let template = bmoe::chat::named_template("qwen3").map(str::to_string);
        write_tiny(dir.path(), "tiny.gguf", bmoe::synth::Arch::Qwen3Moe, |s| s.chat_template = template)
    };
    let mut settings = Map::new();
    for (k, v) in [("stream", "true"), ("cache_mb", "0.5"), ("threads", "1"), ("csv", "run.csv")] {
        settings.insert(k.into(), v.into());
    }
    let _serial = llama_lock();
    let mut s = Session::open(model.to_str().unwrap(), &settings, &RunConfig::default(), &out).unwrap();
    let r = s.generate("The capital of Japan is", 12, &Map::new()).unwrap();
    s.finish().unwrap();
    let csv = std::fs::read_to_string(out.root().join("run.csv")).unwrap();
    let header: Vec<&str> = csv.lines().find(|l| l.starts_with("turn,")).unwrap().split(',').collect();
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .filter(|l| !l.starts_with('#') && !l.starts_with("turn,"))
        .map(|l| l.split(',').collect())
        .collect();
    let per_token = r["per_token"].clone().into_array().unwrap();
    assert_eq!(per_token.len(), rows.len());
    for (map, row) in per_token.iter().zip(&rows) {
        let map = map.clone().try_cast::<Map>().unwrap();
        for (col, field) in header.iter().zip(row) {
            let (a, b) = (number(&map[*col]), field.parse::<f64>().unwrap());
            assert!(a == b || (a.is_nan() && b.is_nan()), "{col}: map {a}, csv {b}");
        }
    }
    let summary = csv.lines().find(|l| l.starts_with("# summary")).unwrap();
    let field = |k: &str| -> f64 {
        summary.split_whitespace().find_map(|kv| kv.strip_prefix(&format!("{k}="))).unwrap().parse().unwrap()
    };
    // The CSV counts decoded tokens: the first token comes out of the prefill.
    assert_eq!(number(&r["decode_tokens"]), field("tokens"));
    assert_eq!(number(&r["tokens"]), field("tokens") + 1.0);
    for (key, csv_key) in
        [("decode_tps", "decode_tok_s"), ("mib_per_token", "read_mib_per_token"), ("hit_rate", "hit_pct")]
    {
        assert!((number(&r[key]) - field(csv_key)).abs() < 5e-4, "{key}: {} vs {}", r[key], field(csv_key));
    }
}

#[test]
fn live_settings_change_and_reopen_settings_are_refused_with_why() {
    let dir = tempdir();
    let out = dir.path().join("out");
    let script = r#"
        let m = make_model("m.gguf", #{ chat_template: "qwen3" });
        let s = open(m, #{ stream: true, cache_mb: 1.5 });
        s.set("temp", 0.0);
        s.set("cache_mb", 1.0);
        if s.config()["moe.cache_mb"] != 1.0 { throw "cache_mb not applied"; }
        s.set("ctx_size", 1024);
    "#;
    let _serial = llama_lock();
    let e = run_source("set.rhai", script, &options(&out, &[])).unwrap_err();
    assert!(e.message.contains("generate.ctx_size` needs the model opened again"), "{e}");
    assert_eq!(e.line, 7, "{e}");
}

#[test]
fn kl_is_zero_for_an_exact_setting_and_above_zero_for_a_lossy_one() {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", bmoe::synth::Arch::Qwen3Moe, |_| {});
    let script = r#"
        let exact = open(ARGS[0]).score("", 24);
        if exact.positions != 24 { throw `positions: ${exact.positions}`; }
        let streamed = open(ARGS[0], #{ stream: true, cache_mb: 0 }).score("", 24);
        let same = kl(exact, streamed);
        if same.mean != 0.0 || same.max != 0.0 || same.top1 != 1.0 { throw `streamed: ${same}`; }
        let lossy = open(ARGS[0], #{ n_expert_used: 1 });
        let cost = exact.kl(lossy.score("", 24));
        if !(cost.max > 0.0) || cost.positions != 24 || cost.p99 > cost.max { throw `lossy: ${cost}`; }
        kl(exact, lossy.score("A different text altogether.", 24));
    "#;
    let _serial = llama_lock();
    let e = run_source("kl.rhai", script, &options(dir.path(), &[m.to_str().unwrap()])).unwrap_err();
    // Only the last line fails: two runs of different texts cannot be compared.
    assert_eq!(e.line, 10, "{e}");
    assert!(e.message.contains("different tokens"), "{e}");
}
