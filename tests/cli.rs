//! The `bmoe` binary end to end: models made on disk, text on stdout only,
//! telemetry files, and one clear line for bad input.

mod common;

use std::io::Write as _;
use std::path::Path;
use std::process::{Command, Output};

use common::tempdir;

/// Runs bmoe; `generate` gets one compute thread unless the test sets its
/// own (see `common::options` for why).
fn bmoe(args: &[&str]) -> Output {
    let _serial = common::llama_lock();
    let mut args = args.to_vec();
    if args.first() == Some(&"generate") && !args.iter().any(|a| *a == "-t" || *a == "--threads") {
        args.extend(["-t", "1"]);
    }
    Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(&args)
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .expect("run bmoe")
}

fn ok(args: &[&str]) -> Output {
    let out = bmoe(args);
    assert!(out.status.success(), "bmoe {args:?} failed:\n{}", String::from_utf8_lossy(&out.stderr));
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8(o.stderr.clone()).unwrap()
}

/// Runs bmoe expecting failure with exactly one stderr line containing
/// `expect` (notes from the open before it aside, such as the line saying
/// whether the run streams).
fn fails_with_one_line(args: &[&str], expect: &str) -> String {
    let out = bmoe(args);
    let err = stderr(&out);
    assert!(!out.status.success(), "bmoe {args:?} succeeded");
    let err: String = err.lines().filter(|l| !l.starts_with("bmoe: note: ")).map(|l| format!("{l}\n")).collect();
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with("bmoe: error: ") && err.contains(expect), "{err}");
    assert!(stdout(&out).is_empty());
    err
}

fn make_tiny(dir: &Path, name: &str, extra: &[&str]) -> String {
    let p = dir.join(name).to_string_lossy().into_owned();
    let mut args = vec!["make-model", "--preset", "tiny", "-o", &p];
    args.extend_from_slice(extra);
    ok(&args);
    p
}

/// Runs `bmoe generate ARGS --logits-digest FILE` (FILE under `dir`) and
/// returns its text with the digest of every step's logits: a setting that
/// claims to be exact must match both, since the synthetic models' text
/// alone can hide a difference.
fn text_and_logits(dir: &Path, args: &[&str]) -> (String, String) {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let file = dir.join(format!("logits-{n}.txt"));
    let mut all = args.to_vec();
    all.extend_from_slice(&["--logits-digest", file.to_str().unwrap()]);
    let out = ok(&all);
    (stdout(&out), std::fs::read_to_string(&file).unwrap())
}

#[test]
fn tiny_model_is_small_and_deterministic() {
    let dir = tempdir();
    let a = make_tiny(dir.path(), "a.gguf", &[]);
    let b = make_tiny(dir.path(), "b.gguf", &[]);
    let c = make_tiny(dir.path(), "c.gguf", &["--seed", "43"]);
    let (a, b, c) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap(), std::fs::read(c).unwrap());
    assert!(a.len() < 5_000_000, "tiny preset is {} bytes", a.len());
    assert_eq!(a, b, "same seed, same bytes");
    assert_ne!(a, c, "another seed, other bytes");
}

#[test]
fn streamed_and_resident_print_the_same_text() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "m.gguf", &[]);
    let base = ["generate", "-m", m.as_str(), "-p", "hello", "-n", "32"];
    let resident = text_and_logits(dir.path(), &base);
    let text = resident.0.clone();
    assert!(text.trim_end().chars().count() >= 16, "{text:?}");
    for extra in [
        &["--moe-stream"][..],
        &["--moe-stream", "--cache-mb", "1"],
        &["--moe-stream", "--no-odirect", "--io-threads", "1"],
    ] {
        let mut args = base.to_vec();
        args.extend_from_slice(extra);
        assert_eq!(text_and_logits(dir.path(), &args), resident, "{extra:?}: text and logits");
        let out = ok(&args);
        assert!(stderr(&out).contains("MiB/token read"), "summary on stderr: {}", stderr(&out));
        // The RPC line belongs to runs with layers on servers only.
        assert!(!stderr(&out).contains("rpc:"), "{}", stderr(&out));
    }
    // A cache small enough to evict (the tiny bank is 1.5 MiB), below one
    // token's working set (0.375 MiB): refused unless forced.
    let mut args = base.to_vec();
    args.extend_from_slice(&["--moe-stream", "--cache-mb", "0.2"]);
    let refused = bmoe(&args);
    assert!(!refused.status.success() && stderr(&refused).contains("below one token's working set (0.38 MiB)"));
    args.push("--force-cache");
    assert_eq!(text_and_logits(dir.path(), &args), resident, "evicting cache: text and logits");
    let out = ok(&args);
    let evictions: u64 = stderr(&out)
        .split_once(" evictions")
        .and_then(|(before, _)| before.rsplit(' ').next()?.parse().ok())
        .expect("summary reports evictions");
    assert!(evictions > 0, "{}", stderr(&out));
    // stdout carries only the generated text: no summary, no log lines.
    assert!(!text.contains("tok/s") && !text.contains("llama"));
}

#[test]
fn csv_and_route_trace_are_written() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "m.gguf", &[]);
    let csv = dir.path().join("run.csv").to_string_lossy().into_owned();
    let trace = dir.path().join("run.trace").to_string_lossy().into_owned();
    ok(&[
        "generate",
        "-m",
        &m,
        "-p",
        "hello",
        "-n",
        "20",
        "--moe-stream",
        "--cache-mb",
        "1",
        "--csv",
        &csv,
        "--route-trace",
        &trace,
    ]);
    let csv = std::fs::read_to_string(csv).unwrap();
    assert!(csv.starts_with("# bmoe_metrics v1\n# engine=bmoe_"));
    assert!(csv.contains("moe.cache_mb=1.0") && csv.contains("moe.stream=true"), "config in the preamble");
    let header = csv.lines().find(|l| !l.starts_with('#')).unwrap();
    assert!(header.starts_with("turn,phase,step,pos,tokens,wall_ms,read_ms,mgmt_ms,compute_ms_residual"));
    let rows: Vec<&str> = csv.lines().filter(|l| !l.starts_with('#')).skip(1).collect();
    assert_eq!(rows.len(), 1 + 19, "one prefill row and 19 decode rows");
    assert!(csv.lines().last().unwrap().starts_with("# summary tokens=19"));
    let trace = std::fs::read_to_string(&trace).unwrap();
    assert!(trace.starts_with("# route_trace v1"));
    assert!(trace.contains("n_expert=8 n_expert_used=2"));
    assert!(trace.contains("turn,phase,step,layer,slot,expert,weight,residency,expert_bytes,dropped\n"));
    // 19 decode tokens x 4 layers x 2 slots.
    let decode_rows = trace.lines().filter(|l| l.starts_with("0,1,")).count();
    assert_eq!(decode_rows, 19 * 4 * 2);
    // Weights of a token's slots are normalized (qwen3moe) and sorted.
    let w: Vec<f64> = trace
        .lines()
        .filter(|l| l.starts_with("0,1,"))
        .take(2)
        .map(|l| l.split(',').nth(6).unwrap().parse().unwrap())
        .collect();
    assert!((w[0] + w[1] - 1.0).abs() < 1e-4 && w[0] >= w[1], "{w:?}");
    let stats = ok(&["trace-stats", dir.path().join("run.trace").to_str().unwrap()]);
    assert!(stdout(&stats).contains("run.trace"));
}

#[test]
fn missing_and_corrupt_models_fail_with_one_line() {
    let dir = tempdir();
    let missing = dir.path().join("missing.gguf").to_string_lossy().into_owned();
    let e = fails_with_one_line(&["generate", "-m", &missing, "-n", "4"], "missing.gguf");
    assert_eq!(e.matches("no such file").count(), 1, "said once: {e}");
    assert!(e.contains("pass -m a GGUF model file") && e.contains("built-in demo"), "what to pass: {e}");

    let m = make_tiny(dir.path(), "m.gguf", &[]);
    let bytes = std::fs::read(&m).unwrap();
    let truncated = dir.path().join("truncated.gguf");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    fails_with_one_line(
        &["generate", "-m", truncated.to_str().unwrap(), "-n", "4", "--moe-stream"],
        "past end of file",
    );

    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, b"this is not a model at all").unwrap();
    let e = fails_with_one_line(&["generate", "-m", garbage.to_str().unwrap(), "-n", "4"], "magic");
    assert!(e.contains(r#"found "this" (74 68 69 73)"#), "the magic as text and hex: {e}");
    // A script that is not there: its name, no made-up line and column.
    let e = fails_with_one_line(&["run", "nosuch.rhai"], "nosuch.rhai: reading the script");
    assert!(!e.contains(":0"), "{e}");
}

#[test]
fn model_llama_cpp_rejects_is_one_clear_line() {
    // Structurally valid GGUF with an architecture llama.cpp does not know.
    let dir = tempdir();
    let mut w = bmoe::gguf::GgufWriter::new();
    w.set("general.architecture", bmoe::gguf::Value::String("not-an-arch".into()));
    let p = dir.path().join("odd.gguf");
    let mut f = std::fs::File::create(&p).unwrap();
    w.write(&mut f, &mut |_| Ok(Vec::new())).unwrap();
    fails_with_one_line(&["generate", "-m", p.to_str().unwrap(), "-n", "4"], "llama.cpp could not load");
}

#[test]
fn config_file_flags_and_bad_values() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "m.gguf", &[]);
    let cfg = dir.path().join("bmoe.toml");
    std::fs::write(&cfg, format!("[model]\npath = \"{m}\"\n[generate]\nn_predict = 5\n[moe]\nstream = true\n"))
        .unwrap();
    let csv = dir.path().join("c.csv");
    ok(&["generate", "--config", cfg.to_str().unwrap(), "-p", "hi", "-n", "7", "--csv", csv.to_str().unwrap()]);
    let text = std::fs::read_to_string(&csv).unwrap();
    assert!(text.contains("generate.n_predict=7"), "the flag overrides the file");
    assert!(text.contains("moe.stream=true"), "the file applies");

    std::fs::write(&cfg, "[moe]\nio_threads = 0\n").unwrap();
    let out = bmoe(&["generate", "--config", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("moe.io_threads: must be between 1 and 64"), "{}", stderr(&out));

    std::fs::write(&cfg, "[moe]\ncahce_mb = 10\n").unwrap();
    let out = bmoe(&["generate", "--config", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("cahce_mb"), "{}", stderr(&out));

    let out = bmoe(&["generate", "-m", &m, "--cache-mb", "10", "--moe-stream=off"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("moe.cache_mb") && stderr(&out).contains("moe.stream is off"), "{}", stderr(&out));
}

#[test]
fn version_names_the_cpu_features_and_repacked_layouts() {
    let out = stdout(&ok(&["--version"]));
    let cpu = out.lines().find_map(|l| l.strip_prefix("llama.cpp CPU: ")).unwrap_or_default();
    // Every aarch64 build has NEON; an x86 build's features depend on how it was built.
    assert!(!cpu.is_empty() && (!cfg!(target_arch = "aarch64") || cpu.contains("NEON")), "{out}");
    let layouts = bmoe::llama::cpu_layouts::repacked_layouts();
    let line = out.lines().find_map(|l| l.strip_prefix("repacked layouts: ")).unwrap_or_default();
    if layouts.is_empty() {
        assert!(line.starts_with("none on this CPU"), "{out}");
    } else {
        assert!(line.starts_with(&layouts.join(", ")), "{out}");
    }
    // A build with dotprod repacks q4_0 in a 4-row layout on ARM, 8 rows with AVX2.
    if cpu.contains("DOTPROD") || cpu.contains("AVX2") {
        assert!(layouts.iter().any(|l| l.starts_with("q4_0 ")), "{layouts:?}");
    }
}

#[test]
fn inspect_archs_and_split() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "m.gguf", &["--quant", "q4_0"]);
    let out = stdout(&ok(&["inspect", &m]));
    assert!(out.contains("architecture:  qwen3moe"));
    assert!(out.contains("experts:       8 per layer, 2 routed per token"));
    assert!(out.contains("ffn_gate_exps q4_0"));
    assert!(out.contains("streamable:    yes"));
    // Four layers of three q4_0 banks, each with a repacked kernel where the CPU has one.
    let kernel = bmoe::llama::Repacker::new(bmoe::gguf::GgmlType::Q4_0.id(), 64, 64).is_some();
    let expected = if kernel { "repacked:      12 of 12 expert banks" } else { "repacked:      0 of 12 expert banks" };
    assert!(out.contains(expected), "{out}");
    if let Some(layout) = bmoe::llama::cpu_layouts::layout_of_type(bmoe::gguf::GgmlType::Q4_0) {
        assert!(out.contains(&format!("(q4_0 as {layout}; --repack)")), "{out}");
    }
    let archs = stdout(&ok(&["archs"]));
    for a in ["qwen3moe", "qwen2moe", "qwen35moe", "gemma4", "gpt-oss", "lfm2moe", "deepseek4", "bailingmoe3"] {
        assert!(archs.contains(a), "{a}");
    }
    assert!(archs.contains("63 MoE architectures in the pinned llama.cpp; 20 gated"), "{archs}");
    let row = |arch: &str| archs.lines().find(|l| l.starts_with(&format!("{arch} "))).unwrap_or_default().to_string();
    assert!(row("glm4moe").contains(" yes ") && row("glm4moe").contains("glm-4.7"), "{}", row("glm4moe"));
    assert!(row("dbrx").contains(" - "), "{}", row("dbrx"));
    assert!(archs.contains("grovemoe: a second expert set"), "{archs}");
    // Features bmoe finds in a file.
    let d = make_tiny(dir.path(), "d.gguf", &["--arch", "deepseek2"]);
    let out = stdout(&ok(&["inspect", &d]));
    for feature in
        ["shared experts", "1 leading dense layer(s)", "expert-selection bias", "MLA attention", "1 MTP layer(s)"]
    {
        assert!(out.contains(feature), "{feature}: {out}");
    }
    assert!(out.contains("streamable:    yes (covered by byte-identity gates)"), "{out}");
    let n = make_tiny(dir.path(), "n.gguf", &["--arch", "nemotron_h_moe"]);
    let out = stdout(&ok(&["inspect", &n]));
    assert!(
        out.contains("up/down (no gate)") && out.contains("Mamba-2 hybrid") && out.contains("MoE on some layers only"),
        "{out}"
    );
    let q = make_tiny(dir.path(), "q.gguf", &["--arch", "qwen35moe"]);
    assert!(stdout(&ok(&["inspect", &q])).contains("gated delta-net hybrid"));
    let l = make_tiny(dir.path(), "l.gguf", &["--arch", "lfm2moe"]);
    assert!(stdout(&ok(&["inspect", &l])).contains("short conv hybrid"));
    let out = bmoe(&["make-model", "--arch", "olmoe", "--shared-experts", "1", "-o", &d]);
    assert!(!out.status.success() && stderr(&out).contains("olmoe has no shared experts"), "{}", stderr(&out));
    // --plan prints the plan and writes nothing; its file size is the written file's.
    let plan = stdout(&ok(&["make-model", "--preset", "tiny", "--arch", "deepseek2", "--plan"]));
    for group in ["routed experts", "shared experts", "vocabulary matrices", "attention", "file "] {
        assert!(plan.contains(group), "{group}: {plan}");
    }
    let size = std::fs::metadata(&d).unwrap().len() as f64 / 1048576.0;
    assert!(plan.contains(&format!("file {size:.2} MiB")), "{size}: {plan}");
    let mix = stdout(&ok(&["make-model", "--embd", "256", "--expert-ff", "256", "--quant-mix", "q4_k_m", "--plan"]));
    assert!(mix.contains("q4_k_m mix") && mix.contains("q6_K"), "{mix}");
    // A full-size preset: its real vocabulary, its release mix, compared with the release file.
    let full = stdout(&ok(&["make-model", "--preset", "qwen3-30b-a3b", "--plan"]));
    assert!(full.contains("151936 tokens in the vocabulary") && full.contains("30.53 B parameters"), "{full}");
    assert!(full.contains("release: Qwen3-30B-A3B-Q4_K_M.gguf"), "{full}");
    let out = bmoe(&["make-model", "--preset", "gpt-oss-20b", "--arch", "qwen3moe", "--plan"]);
    assert!(!out.status.success() && stderr(&out).contains("is a gpt-oss model"), "{}", stderr(&out));
    let out = bmoe(&["make-model", "--preset", "qwen3-31b", "--plan"]);
    assert!(!out.status.success() && stderr(&out).contains("deepseek-v2-lite"), "{}", stderr(&out));
    let v = make_tiny(dir.path(), "v.gguf", &["--vocab", "20000"]);
    let out = stdout(&ok(&["inspect", &v]));
    assert!(out.contains("vocabulary:    20000 tokens: token_embd"), "{out}");
    let out = bmoe(&["make-model", "--quant", "q4_K", "--quant-mix", "q4_k_m", "--plan"]);
    assert!(!out.status.success() && stderr(&out).contains("not both"), "{}", stderr(&out));
    let out = bmoe(&["make-model", "--arch", "grovemoe", "-o", &d]);
    assert!(!out.status.success() && stderr(&out).contains("deepseek2"), "{}", stderr(&out));
    let split = dir.path().join("s.gguf").to_string_lossy().into_owned();
    ok(&["make-model", "--preset", "tiny", "--split", "3", "-o", &split]);
    let first = dir.path().join("s-00001-of-00003.gguf");
    assert!(stdout(&ok(&["inspect", first.to_str().unwrap()])).contains("shards:        3"));
    let g = make_tiny(dir.path(), "g.gguf", &["--arch", "gemma4"]);
    assert!(stdout(&ok(&["inspect", &g])).contains("ffn_gate_up_exps"));
    // A type releases do not use for experts, and a K-quant whose blocks do not fit the widths.
    let out = bmoe(&["make-model", "--preset", "tiny", "--quant", "q8_1", "-o", &split]);
    assert!(!out.status.success() && stderr(&out).contains("--quant q8_1"), "{}", stderr(&out));
    let out = bmoe(&["make-model", "--preset", "tiny", "--quant", "q5_k", "-o", &split]);
    assert!(!out.status.success() && stderr(&out).contains("must be a multiple of 256 for q5_K"), "{}", stderr(&out));
}

#[test]
fn demo_model_is_generated_once_when_no_model_is_given() {
    let out = ok(&["generate", "-p", "hi", "-n", "8", "--moe-stream", "--cache-mb", "64"]);
    let err = stderr(&out);
    assert!(err.contains("RANDOM weights"), "{err}");
    let demo = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("bmoe/demo-qwen3moe-v{}.gguf", bmoe::synth::GENERATOR_VERSION));
    assert!(demo.exists());
    assert!(!stdout(&out).trim().is_empty());
}

#[test]
fn plugin_list_check_and_bench() {
    let list = stdout(&ok(&["plugin", "list"]));
    for name in ["ngram", "ngram-multi", "suffix", "drop-cold"] {
        assert!(list.contains(name), "{list}");
    }
    let check = stdout(&ok(&["plugin", "check", "suffix"]));
    assert!(check.contains("world:      drafter (bmoe:policy@0.1.0)") && check.contains("result:     ok"), "{check}");
    let check = stdout(&ok(&["plugin", "check", "drop-cold", "--param", "F=1"]));
    assert!(check.contains("world:      dropper") && check.contains("drop [4]"), "{check}");
    let bench = stdout(&ok(&["plugin", "bench", "ngram", "--calls", "200"]));
    assert!(bench.contains("draft(4) with a 4096-token context: median"), "{bench}");
    let bench = stdout(&ok(&["plugin", "bench", "drop-cold", "--calls", "200"]));
    assert!(bench.contains("decide(top-8 of 128): median"), "{bench}");
    let future = bmoe::policy::wasm::fixture("future-drafter");
    let out = bmoe(&["plugin", "check", future.to_str().unwrap()]);
    assert!(!out.status.success() && stderr(&out).contains("bmoe:policy@1.0.0"), "{}", stderr(&out));
    let out = bmoe(&["plugin", "check", "ngramm"]);
    assert!(
        !out.status.success() && stderr(&out).contains("no bundled plugin or file named `ngramm`"),
        "{}",
        stderr(&out)
    );
    let hostile = bmoe::policy::wasm::fixture("hostile-drafter");
    let out = bmoe(&["plugin", "check", hostile.to_str().unwrap(), "--param", "mode=trap"]);
    assert!(!out.status.success() && stderr(&out).contains("trapped"), "{}", stderr(&out));
}

#[test]
fn generate_with_plugins_and_refused_plugins() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "m.gguf", &[]);
    let exact = text_and_logits(dir.path(), &["generate", "-m", &m, "-p", "hello", "-n", "24"]);
    let plain = exact.0.clone();
    // A run that asks for a draft plugin takes the batch-invariant kernels
    // (its verify batches must equal decoding one token at a time), even if
    // the plugin is then refused: the same text, the invariant run's logits.
    let exact_invariant =
        text_and_logits(dir.path(), &["generate", "-m", &m, "-p", "hello", "-n", "24", "--batch-invariant"]);
    assert_eq!(exact_invariant.0, plain);
    let out = ok(&["generate", "-m", &m, "-p", "hello", "-n", "24", "--draft-plugin", "suffix", "--draft", "4"]);
    assert_eq!(stdout(&out), plain);
    assert!(stderr(&out).contains("draft plugin suffix") && stderr(&out).contains("tokens per verify step"));
    let out = ok(&[
        "generate",
        "-m",
        &m,
        "-p",
        "hello",
        "-n",
        "24",
        "--moe-stream",
        "--cache-mb",
        "0.5",
        "--drop-plugin",
        "drop-cold",
        "--drop-param",
        "F=0",
    ]);
    assert_eq!(stdout(&out), plain, "F=0 drops nothing");
    let keep_all = ["--moe-stream", "--cache-mb", "0.5", "--drop-plugin", "drop-cold", "--drop-param", "F=0"];
    let args: Vec<&str> = ["generate", "-m", &m, "-p", "hello", "-n", "24"].iter().chain(&keep_all).copied().collect();
    assert_eq!(text_and_logits(dir.path(), &args), exact, "F=0 drops nothing: text and logits");
    assert!(stderr(&out).contains("0 of ") && stderr(&out).contains("routings dropped"), "{}", stderr(&out));
    // A hostile plugin is disabled with one note naming it; the text is unchanged.
    let hostile = bmoe::policy::wasm::fixture("hostile-drafter");
    let out = ok(&[
        "generate",
        "-m",
        &m,
        "-p",
        "hello",
        "-n",
        "24",
        "--draft-plugin",
        hostile.to_str().unwrap(),
        "--draft-param",
        "mode=loop",
    ]);
    assert_eq!(stdout(&out), plain);
    assert!(
        stderr(&out).contains("draft plugin `hostile-drafter` disabled for the rest of the run: ran past"),
        "{}",
        stderr(&out)
    );
    // Files that are not usable plugins are refused; the run goes on without them.
    let text = dir.path().join("notes.wasm");
    std::fs::write(&text, "not wasm").unwrap();
    let future = bmoe::policy::wasm::fixture("future-drafter");
    for (file, expect) in
        [(text.to_str().unwrap(), "not a WebAssembly file"), (future.to_str().unwrap(), "bmoe:policy@1.0.0")]
    {
        let out = ok(&["generate", "-m", &m, "-p", "hello", "-n", "24", "--draft-plugin", file]);
        assert_eq!(stdout(&out), plain, "{file}");
        let refused =
            text_and_logits(dir.path(), &["generate", "-m", &m, "-p", "hello", "-n", "24", "--draft-plugin", file]);
        assert_eq!(refused, exact_invariant, "{file}: text and logits");
        assert!(stderr(&out).contains("plugin refused") && stderr(&out).contains(expect), "{}", stderr(&out));
    }
    // A name that is neither bundled nor a file is a usage error.
    let out = bmoe(&["generate", "-m", &m, "-p", "hello", "--draft-plugin", "ngramm"]);
    assert!(!out.status.success() && stderr(&out).contains("ngramm"), "{}", stderr(&out));
}

#[test]
fn scaffolded_plugins_build_and_load() {
    if !common::requires::wasm_target("scaffolded_plugins_build_and_load") {
        return;
    }
    let dir = tempdir();
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    // A target directory kept between runs, so wit-bindgen compiles once.
    let target = Path::new(env!("CARGO_TARGET_TMPDIR")).join("scaffold-target");
    for (name, kind, flag) in [("my-drafter", "drafter", "--draft-plugin"), ("my-dropper", "dropper", "--drop-plugin")]
    {
        let crate_dir = dir.path().join(name);
        ok(&["plugin", "new", name, "--kind", kind, "--dir", crate_dir.to_str().unwrap()]);
        let status = Command::new(&cargo)
            .args(["build", "--release"])
            .current_dir(&crate_dir)
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("RUSTFLAGS")
            .env_remove("CARGO_ENCODED_RUSTFLAGS")
            .status()
            .unwrap();
        assert!(status.success(), "building the scaffolded {kind}");
        let wasm = target.join(format!("wasm32-unknown-unknown/release/{}.wasm", name.replace('-', "_")));
        let check = stdout(&ok(&["plugin", "check", wasm.to_str().unwrap()]));
        assert!(check.contains(&format!("plugin:     {name} 0.1.0")) && check.contains("result:     ok"), "{check}");
        // Wrapped into a component, it loads the same way.
        let component = dir.path().join(format!("{name}.wasm"));
        let wrapped = stdout(&ok(&["plugin", "wrap", wasm.to_str().unwrap(), "-o", component.to_str().unwrap()]));
        assert!(wrapped.contains(&format!("{kind} plugin component")), "{wrapped}");
        let m = make_tiny(dir.path(), "m.gguf", &[]);
        // A drafter's run takes the batch-invariant kernels; a dropper's does not.
        let invariance = if kind == "drafter" { "--batch-invariant" } else { "--no-batch-invariant" };
        let plain =
            text_and_logits(dir.path(), &["generate", "-m", &m, "-p", "hello", "-n", "16", "--moe-stream", invariance]);
        let with = text_and_logits(
            dir.path(),
            &["generate", "-m", &m, "-p", "hello", "-n", "16", "--moe-stream", flag, component.to_str().unwrap()],
        );
        assert_eq!(with, plain, "{kind}: the template policy keeps the text and the logits");
    }
    let out = bmoe(&["plugin", "new", "Bad Name", "--kind", "drafter"]);
    assert!(!out.status.success());
}

/// A long `bmoe generate` on `model` (far more tokens than can be
/// generated before a test's signal arrives), started with piped output,
/// for the Ctrl-C tests.
fn spawn_long_generate(model: &str, extra: &[&str]) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["generate", "-m", model, "-p", "hello", "-n", "15000", "-c", "16384", "-t", "1"])
        .args(extra)
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start bmoe")
}

fn sigint(child: &std::process::Child) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::INT).unwrap();
}

/// Waits until `child` has written some text, sends it SIGINT, and reads
/// its stdout to the end.
fn sigint_once_text_streams(child: &mut std::process::Child) {
    let mut stdout = child.stdout.take().unwrap();
    let mut text = Vec::new();
    let mut buf = [0u8; 256];
    while text.len() < 32 {
        let n = std::io::Read::read(&mut stdout, &mut buf).unwrap();
        assert!(n > 0, "bmoe ended before writing any text");
        text.extend_from_slice(&buf[..n]);
    }
    sigint(child);
    std::io::Read::read_to_end(&mut stdout, &mut text).unwrap();
}

/// Lines of a telemetry file that are not `#` comments, each checked to be
/// a whole row of `fields` fields.
fn whole_rows(path: &Path, fields: usize) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.ends_with('\n'), "{} ends inside a row", path.display());
    let rows: Vec<String> = text.lines().filter(|l| !l.starts_with('#')).skip(1).map(str::to_string).collect();
    for r in &rows {
        assert_eq!(r.split(',').count(), fields, "{}: a cut row: {r:?}", path.display());
    }
    rows
}

#[test]
fn ctrl_c_stops_generate_with_a_summary_and_whole_files() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "m.gguf", &[]);
    let csv = dir.path().join("run.csv");
    let trace = dir.path().join("run.trace");
    let _serial = common::llama_lock();
    let mut child = spawn_long_generate(
        &m,
        &[
            "--moe-stream",
            "--cache-mb",
            "0.5",
            "--csv",
            csv.to_str().unwrap(),
            "--route-trace",
            trace.to_str().unwrap(),
        ],
    );
    sigint_once_text_streams(&mut child);
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(err.contains("bmoe: interrupted"), "{err}");
    // The summary of what was generated so far.
    let decoded: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("decode:  ")?.split(", ").nth(1)?.split(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no summary: {err}"));
    assert!(decoded > 0 && decoded < 15000, "{err}");
    // The CSV holds one whole row per decode call and the summary trailer.
    let rows = whole_rows(&csv, bmoe::telemetry::csv::COLUMNS.len());
    let decode_rows = rows.iter().filter(|r| r.split(',').nth(1) == Some("1")).count() as u64;
    assert_eq!(decode_rows, decoded, "one CSV row per decoded token");
    let csv_text = std::fs::read_to_string(&csv).unwrap();
    assert!(csv_text.contains(&format!("# summary tokens={decoded} ")), "{}", csv_text.lines().last().unwrap());
    // The route trace holds whole rows: k=2 slots on each of 4 layers per decode call.
    let routes = whole_rows(&trace, 10);
    let decode_routes = routes.iter().filter(|r| r.split(',').nth(1) == Some("1")).count() as u64;
    assert_eq!(decode_routes, decoded * 4 * 2);
    // Nothing else was left in the directory.
    let mut names: Vec<String> =
        std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["m.gguf", "run.csv", "run.trace"]);
}

#[test]
fn a_second_ctrl_c_exits_at_once() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "m.gguf", &[]);
    let csv = dir.path().join("run.csv");
    let _serial = common::llama_lock();
    let mut child = spawn_long_generate(&m, &["--csv", csv.to_str().unwrap()]);
    // Read nothing and shrink the pipe to one page: once it is full, bmoe
    // sleeps in the kernel writing text, where the first Ctrl-C cannot
    // finish the run. Wait until it sleeps there.
    let stdout = child.stdout.take().unwrap();
    rustix::pipe::fcntl_setpipe_size(&stdout, 4096).unwrap();
    let proc = format!("/proc/{}", child.id());
    // Asleep writing to the pipe, with no SIGINT waiting to be delivered.
    let blocked_in_write = |child: &mut std::process::Child| {
        assert!(child.try_wait().unwrap().is_none(), "bmoe ended while writing text");
        let wchan = std::fs::read_to_string(format!("{proc}/wchan")).unwrap_or_default();
        let status = std::fs::read_to_string(format!("{proc}/status")).unwrap_or_default();
        let field = |name: &str| status.lines().find_map(|l| l.strip_prefix(name)).unwrap_or("").trim().to_string();
        let pending = u64::from_str_radix(&field("ShdPnd:"), 16).unwrap_or(1)
            | u64::from_str_radix(&field("SigPnd:"), 16).unwrap_or(1);
        wchan.contains("pipe_write") && field("State:").starts_with('S') && pending & 0b10 == 0
    };
    let wait_until_blocked = |child: &mut std::process::Child| {
        while !blocked_in_write(child) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    };
    wait_until_blocked(&mut child);
    sigint(&child);
    // The first Ctrl-C is handled (two signals sent at once would merge into
    // one) and bmoe is back to waiting on the pipe: only a second one can end it.
    wait_until_blocked(&mut child);
    sigint(&child);
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(130), "{err}");
    assert!(!err.contains("decode:") && !err.contains("bmoe: interrupted"), "exited without the orderly stop: {err}");
    // Every finished decode call is in the CSV, in whole rows.
    let rows = whole_rows(&csv, bmoe::telemetry::csv::COLUMNS.len());
    assert!(rows.iter().filter(|r| r.split(',').nth(1) == Some("1")).count() > 100, "{} rows", rows.len());
    drop(stdout);
}

#[test]
fn chat_templates_from_the_command_line() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "q.gguf", &["--chat-template", "qwen3"]);
    let out = ok(&["template", &m]);
    let prompt = stdout(&out);
    assert!(prompt.starts_with("<|im_start|>system\nYou are a helpful assistant.<|im_end|>"), "{prompt}");
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");
    assert!(stderr(&out).contains("reasoning <think> tags, thinking control: template"), "{}", stderr(&out));
    let off = stdout(&ok(&["template", &m, "--no-think"]));
    assert!(off.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\n"), "{off}");
    // A conversation from a file, with a bundled family's template.
    let conv = dir.path().join("conv.json");
    std::fs::write(&conv, r#"[{"role":"user","content":"Hi there"}]"#).unwrap();
    let harmony = stdout(&ok(&["template", "gpt-oss", "--messages", conv.to_str().unwrap()]));
    assert!(
        harmony.contains("<|start|>user<|message|>Hi there<|end|>") && harmony.ends_with("<|start|>assistant"),
        "{harmony}"
    );
    // The example conversation: reasoning under the name other tools write
    // reaches the template; its final assistant message is continued.
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/conversation.json");
    let qwen = stdout(&ok(&["template", "qwen3", "--messages", example]));
    assert!(qwen.ends_with("<think>\nA geography question: Japan's capital is Tokyo.\n</think>\n\nTokyo."), "{qwen}");
    // A tool list reaches the template, which shows it to the model.
    let tools = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/tools.json");
    let with_tools = stdout(&ok(&["template", "qwen3", "--messages", example, "--tools", tools]));
    assert!(
        with_tools.contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\""),
        "{with_tools}"
    );
    // The switches bmoe sets, as JSON: Hunyuan's off word, gpt-oss's effort.
    let variables = |args: &[&str]| -> serde_json::Value {
        let args: Vec<&str> = ["template"].iter().chain(args).chain(&["--variables"]).copied().collect();
        serde_json::from_str(&stdout(&ok(&args))).unwrap()
    };
    let hunyuan = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/chat-templates/Hunyuan-Hy3.jinja");
    assert_eq!(
        variables(&[hunyuan, "--no-think"]),
        serde_json::json!({"enable_thinking": false, "reasoning_effort": "no_think"})
    );
    assert_eq!(
        variables(&["gpt-oss", "--reasoning-effort", "low"]),
        serde_json::json!({"enable_thinking": true, "reasoning_effort": "low"})
    );
    std::fs::write(&conv, r#"[{"type":"function","function":{}}]"#).unwrap();
    let conv_path = conv.to_str().unwrap();
    fails_with_one_line(&["template", "qwen3", "--tools", conv_path], "tool 1: no function.name");
    fails_with_one_line(&["generate", "-m", &m, "-p", "x", "--chat", "--tools", conv_path], "chat.tools:");
    // An unknown key is an error naming it and the message.
    std::fs::write(&conv, r#"[{"role":"user","content":"Hi","toolcalls":[]}]"#).unwrap();
    fails_with_one_line(
        &["template", "qwen3", "--messages", conv.to_str().unwrap()],
        "message 1: unknown field `toolcalls`",
    );
    std::fs::write(&conv, r#"[{"role":"user","content":"Hi there"}]"#).unwrap();
    // A model without a template: the documented fallback.
    let plain = make_tiny(dir.path(), "plain.gguf", &[]);
    let out = ok(&["template", &plain, "--messages", conv.to_str().unwrap()]);
    assert_eq!(stdout(&out), "User: Hi there\nAssistant:");
    assert!(stderr(&out).contains("plain fallback"), "{}", stderr(&out));
    // Bad templates: one line naming the file and line.
    let bad = dir.path().join("bad.jinja");
    std::fs::write(&bad, "ok\n{% if %}\n").unwrap();
    fails_with_one_line(&["template", bad.to_str().unwrap()], "bad.jinja, line 2: syntax error");
    fails_with_one_line(&["make-model", "-o", "x.gguf", "--chat-template", "nosuch"], "qwen3, qwen3.5");
    // generate --chat: the template applied to one user turn; the text goes to stdout.
    let out = ok(&["generate", "-m", &m, "-p", "hello", "-n", "8", "--chat", "--no-think"]);
    assert!(!stdout(&out).trim().is_empty());
    let raw = stdout(&ok(&["generate", "-m", &m, "-p", "hello", "-n", "8"]));
    assert_ne!(stdout(&out), raw, "the chat prompt differs from the raw one");
    // A `<think>` in the user's text opens no reasoning: the reply (thinking
    // on, the template opens no block) is the answer, on stdout; it ran to -n.
    let out = ok(&["generate", "-m", &m, "-p", "Explain literal <think> tags", "-n", "8", "--chat"]);
    assert!(!stdout(&out).trim().is_empty(), "{}", stderr(&out));
    assert!(stderr(&out).contains("finish:  length"), "{}", stderr(&out));
    // qwen3.5 opens the reasoning block itself: -n ends the reply inside it, and says so.
    let out = ok(&["generate", "-m", &m, "-p", "hello", "-n", "4", "--chat", "--chat-template", "qwen3.5"]);
    assert!(stderr(&out).contains("cut off at 4 tokens inside its reasoning, before any answer"), "{}", stderr(&out));
    assert!(stderr(&out).contains("finish:  length (inside the reasoning)"), "{}", stderr(&out));
}

#[test]
fn ctrl_c_stops_a_repl_reply_not_the_repl() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "q.gguf", &["--chat-template", "qwen3"]);
    let _serial = common::llama_lock();
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["repl", "-m", &m, "-n", "15000", "-c", "16384", "-t", "1"])
        .env("XDG_DATA_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"a long reply please\n:set n_predict 8\nand a short one\n").unwrap();
    sigint_once_text_streams(&mut child);
    let done = child.wait_with_output().unwrap();
    let err = stderr(&done);
    assert!(done.status.success(), "{err}");
    assert!(err.contains("(stopped)"), "{err}");
    // The REPL went on: the next lines were read and answered.
    assert!(err.contains("generate.n_predict = 8"), "{err}");
    assert_eq!(err.lines().filter(|l| l.starts_with('[') && l.contains("tok/s")).count(), 2, "{err}");
}

/// Starts `bmoe run SCRIPT` with piped output.
fn spawn_script(dir: &Path, script: &str, extra: &[&str]) -> std::process::Child {
    let path = dir.join("s.rhai");
    std::fs::write(&path, script).unwrap();
    Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .arg("run")
        .arg(&path)
        .arg("--out")
        .arg(dir.join("out"))
        .args(extra)
        .current_dir(dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start bmoe")
}

/// Reads `child`'s stdout until `marker` appears.
fn read_until(child: &mut std::process::Child, marker: &str) -> std::process::ChildStdout {
    let mut stdout = child.stdout.take().unwrap();
    let mut text = Vec::new();
    let mut buf = [0u8; 256];
    while !String::from_utf8_lossy(&text).contains(marker) {
        let n = std::io::Read::read(&mut stdout, &mut buf).unwrap();
        assert!(n > 0, "bmoe ended before printing {marker}");
        text.extend_from_slice(&buf[..n]);
    }
    stdout
}

#[test]
fn ctrl_c_stops_a_script_in_a_loop_and_in_a_model_run() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "m.gguf", &[]);
    // A loop that never ends on its own (no operation limit).
    let mut child = spawn_script(dir.path(), "print(\"started\");\nloop { }\n", &["--max-ops", "0"]);
    let _stdout = read_until(&mut child, "started");
    sigint(&child);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("bmoe: interrupted"));

    // A long generation: Ctrl-C lands in the run or just before it; either way it stops.
    let script = format!(
        "let s = open(\"{m}\", #{{ threads: 1, ctx_size: 16384, csv: \"run.csv\" }});\nprint(\"opened\");\ns.generate(\"hello\", 15000);\nprint(\"not reached\");\n"
    );
    let _serial = common::llama_lock();
    let mut child = spawn_script(dir.path(), &script, &[]);
    let stdout = read_until(&mut child, "opened");
    sigint(&child);
    let out = child.wait_with_output().unwrap();
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut { stdout }, &mut rest).unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!rest.contains("not reached"));
    // The session's telemetry file was closed with its trailer.
    let csv = std::fs::read_to_string(dir.path().join("out/run.csv")).unwrap();
    assert!(csv.lines().any(|l| l.starts_with("# summary")), "{csv}");
}

#[test]
fn run_passes_arguments_and_reports_errors_with_their_place() {
    let dir = tempdir();
    let child = spawn_script(dir.path(), "print(`args ${ARGS}`);\n", &["--", "one", "two"]);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "args [\"one\", \"two\"]");
    let child = spawn_script(dir.path(), "let a = 1;\nlet b = [1, 2;\n", &[]);
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("s.rhai:2:") && err.contains("let b = [1, 2;"), "{err}");
}

/// Notes: the chat template's absence only where chat turns run, details of
/// the streaming setup only with -v, nothing with -q, and a script that
/// opens a model twice sees a note it already showed once.
#[test]
fn notes_once_where_they_matter_and_quiet_with_q() {
    let dir = tempdir();
    let plain = make_tiny(dir.path(), "plain.gguf", &[]);
    let base = ["generate", "-m", plain.as_str(), "-p", "hello", "-n", "4", "--moe-stream"];
    let err = stderr(&ok(&base));
    assert!(!err.contains("no chat template") && !err.contains("read-ahead:"), "{err}");
    assert!(err.contains("note: cache auto"), "the cache budget is a note: {err}");
    let chat = stderr(&ok(&[&base[..], &["--chat"]].concat()));
    assert!(chat.contains("note: the model has no chat template"), "{chat}");
    let verbose = stderr(&ok(&[&base[..], &["-v"]].concat()));
    assert!(verbose.contains("note: read-ahead: "), "{verbose}");
    let quiet = ok(&[&["-q"], &base[..], &["--chat", "-v"]].concat());
    assert!(!stderr(&quiet).contains("note:"), "{}", stderr(&quiet));
    assert!(!stdout(&quiet).is_empty() && stderr(&quiet).contains("decode:"), "the run and its summary stay");
    // A script opening the model twice: each note once.
    let script =
        format!("let a = open(\"{plain}\", #{{ stream: true }});\nlet b = open(\"{plain}\", #{{ stream: true }});\n");
    let out = spawn_script(dir.path(), &script, &[]).wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let template_notes = err.lines().filter(|l| l.contains("note: the model has no chat template")).count();
    assert_eq!(template_notes, 1, "{err}");
}

/// `--grammar FILE.gbnf`: the text follows it; a missing file, a grammar
/// that does not parse and a grammar with a draft plugin are one clear line.
#[test]
fn generate_under_a_grammar() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "m.gguf", &[]);
    let g = dir.path().join("letters.gbnf");
    std::fs::write(&g, "root ::= [a-e] [a-e] [a-e] \" end\"\n").unwrap();
    let g = g.to_str().unwrap();
    let text = stdout(&ok(&["generate", "-m", &m, "-p", "hello", "-n", "12", "--grammar", g, "--moe-stream"]));
    let text = text.trim_end_matches('\n');
    let letters = text.strip_suffix(" end").unwrap_or_else(|| panic!("the grammar ends in \" end\": {text:?}"));
    assert!(letters.len() == 3 && letters.chars().all(|c| ('a'..='e').contains(&c)), "{text:?}");
    fails_with_one_line(
        &["generate", "-m", &m, "-p", "x", "--grammar", "nope.gbnf"],
        "generate.grammar: nope.gbnf is not a file",
    );
    let bad = dir.path().join("bad.gbnf");
    std::fs::write(&bad, "root ::= [a-\n").unwrap();
    fails_with_one_line(&["generate", "-m", &m, "-p", "x", "--grammar", bad.to_str().unwrap()], "grammar was refused");
    fails_with_one_line(
        &["generate", "-m", &m, "-p", "x", "--grammar", g, "--draft-plugin", "ngram"],
        "a grammar and a draft plugin do not go together",
    );
    // A JSON schema, given inline: the text is that JSON.
    let schema = r#"{"type":"object","properties":{"ok":{"type":"boolean"}},"required":["ok"]}"#;
    let text = stdout(&ok(&["generate", "-m", &m, "-p", "hello", "-n", "24", "--json-schema", schema]));
    let value: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("{e}: {text:?}"));
    assert!(value["ok"].is_boolean(), "{value}");
    // Cut off before the schema is satisfied: the text stays, the exit status says it failed.
    let out = bmoe(&["generate", "-m", &m, "-p", "hello", "-n", "1", "--json-schema", schema]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(stderr(&out).contains("error: the output is incomplete"), "{}", stderr(&out));
    fails_with_one_line(
        &["generate", "-m", &m, "-p", "x", "--json-schema", r#"{"type":"string","not":{}}"#],
        r#"generate.json_schema: the schema cannot be used: Unimplemented keys: ["not"]"#,
    );
    fails_with_one_line(&["generate", "-m", &m, "-p", "x", "--grammar", g, "--json-schema", schema], "not both");
}

#[test]
fn eval_scores_an_exact_setting_at_zero_and_a_lossy_one_above() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "m.gguf", &[]);
    let csv = dir.path().join("kl.csv");
    let out = ok(&[
        "eval",
        "-m",
        &m,
        "-t",
        "1",
        "--tokens",
        "24",
        "--against",
        "streamed=--moe-stream --cache-mb 0",
        "--against",
        "--n-expert-used 1",
        "--csv",
        csv.to_str().unwrap(),
    ]);
    let table = stdout(&out);
    let row = |name: &str| -> Vec<String> {
        let line = table.lines().find(|l| l.starts_with(name)).unwrap_or_else(|| panic!("no {name} row:\n{table}"));
        line[name.len()..].split_whitespace().map(str::to_string).collect()
    };
    assert_eq!(row("exact")[..5], ["0", "0", "0", "0", "100.0%"], "{table}");
    assert_eq!(row("streamed")[..5], ["0", "0", "0", "0", "100.0%"], "{table}");
    assert_ne!(row("--n-expert-used 1")[0], "0", "{table}");
    assert!(stderr(&out).contains("24 positions of the bundled sample text"), "{}", stderr(&out));
    // Per position: the streamed run's KL is exactly zero everywhere; one
    // expert instead of two moves every distribution.
    let text = std::fs::read_to_string(&csv).unwrap();
    let kl = |setting: &str| -> Vec<f64> {
        text.lines()
            .filter(|l| l.starts_with(&format!("{setting},")))
            .map(|l| l.split(',').nth(2).unwrap().parse().unwrap())
            .collect()
    };
    assert_eq!(kl("streamed"), vec![0.0; 24]);
    let lossy = kl("--n-expert-used 1");
    assert_eq!(lossy.len(), 24);
    assert!(lossy.iter().all(|&k| k > 0.0), "{lossy:?}");
    // A setting that does not parse is refused before any model runs.
    fails_with_one_line(&["eval", "-m", &m, "--against", "--no-such-flag 3"], "--against");
}

/// The generator's experts decide the text: on the demo model a single
/// expert per layer changes greedy text within 16 tokens, one expert fewer
/// changes the top token somewhere in 400 positions (at about 4% of them),
/// and each MoE layer adds a branch of about a fifth of the residual
/// stream. A tied model (its head the token embedding) walks varied text
/// that one expert changes too. With `--expert-mix 0` (the negative
/// control) the experts write nothing, and one expert gives the same logits
/// bit for bit.
#[test]
fn experts_decide_the_text() {
    let dir = tempdir();
    let demo = dir.path().join("demo.gguf").to_string_lossy().into_owned();
    ok(&["make-model", "--preset", "demo", "-o", &demo]);
    let greedy = |k: &str| {
        stdout(&ok(&["generate", "-m", &demo, "-p", "The history of the river", "-n", "16", "--n-expert-used", k]))
    };
    assert_ne!(greedy("8"), greedy("1"), "one expert per layer left the greedy text unchanged");

    let prose = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/architecture.md");
    let table = stdout(&ok(&[
        "eval",
        "-m",
        &demo,
        "--text",
        prose,
        "--tokens",
        "400",
        "--branches",
        "--against",
        "k7=--n-expert-used 7",
    ]));
    let k7: Vec<&str> =
        table.lines().find(|l| l.starts_with("k7")).unwrap_or_else(|| panic!("{table}")).split_whitespace().collect();
    let top1: f64 = k7[5].trim_end_matches('%').parse().unwrap();
    assert!(top1 < 100.0, "one expert fewer never changed the top token:\n{table}");
    let mean: f64 = table
        .lines()
        .find(|l| l.trim_start().starts_with("mean"))
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    assert!((0.1..0.5).contains(&mean), "the MoE branch is {mean} of the residual stream:\n{table}");

    // A tied head (the token embedding, with its successor lookup) too.
    let tied = make_tiny(dir.path(), "tied.gguf", &["--arch", "lfm2moe", "--tied-embeddings"]);
    let tied_greedy = |k: &str| {
        stdout(&ok(&["generate", "-m", &tied, "-p", "The history of the river", "-n", "16", "--n-expert-used", k]))
    };
    let text = tied_greedy("2");
    assert_ne!(text, tied_greedy("1"), "one expert per layer left the tied model's greedy text unchanged");
    let distinct: std::collections::HashSet<char> = text.chars().collect();
    assert!(distinct.len() > 8, "the tied model's greedy text repeats itself: {text:?}");

    let silent = make_tiny(dir.path(), "silent.gguf", &["--expert-mix", "0"]);
    let digest = |k: &str| {
        let file = dir.path().join(format!("silent-{k}.txt"));
        ok(&["generate", "-m", &silent, "-n", "8", "--n-expert-used", k, "--logits-digest", file.to_str().unwrap()]);
        std::fs::read_to_string(file).unwrap()
    };
    assert_eq!(digest("2"), digest("1"), "experts that write nothing changed the logits");
}

#[test]
fn logits_digests_match_for_exact_settings_and_differ_for_lossy_ones() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "m.gguf", &[]);
    let digest = |name: &str, extra: &[&str]| -> String {
        let file = dir.path().join(name);
        let mut args = vec!["generate", "-m", &m, "-n", "8", "--logits-digest", file.to_str().unwrap()];
        args.extend_from_slice(extra);
        let out = ok(&args);
        assert!(stderr(&out).contains("logits:  digest "), "{}", stderr(&out));
        std::fs::read_to_string(&file).unwrap()
    };
    let resident = digest("resident.txt", &[]);
    assert_eq!(resident.lines().count(), 8, "{resident}");
    assert_eq!(digest("streamed.txt", &["--moe-stream", "--cache-mb", "0"]), resident);
    assert_ne!(digest("one-expert.txt", &["--n-expert-used", "1"]), resident);
}

/// A repacked copy over its disk budget is made partial, and written whole
/// once the budget allows; `bmoe cache` lists
/// the copies streamed runs wrote, with their models, and removes only what
/// it is told to: a copy whose model is gone, then everything; without a
/// filter it removes nothing.
#[test]
fn cache_lists_and_removes_copies() {
    let dir = tempdir();
    let home = dir.path().join("cache-home");
    let run = |args: &[&str]| {
        let _serial = common::llama_lock();
        Command::new(env!("CARGO_BIN_EXE_bmoe")).args(args).env("XDG_CACHE_HOME", &home).output().expect("run bmoe")
    };
    let kept = make_tiny(dir.path(), "kept.gguf", &["--quant", "q4_0"]);
    let gone = make_tiny(dir.path(), "gone.gguf", &["--quant", "q4_0", "--seed", "9"]);
    // A copy over its disk budget is partial: it takes the experts repacked
    // as they are read, up to the budget, and the run says so.
    let config = dir.path().join("small-copies.toml");
    std::fs::write(&config, "[moe]\nrepacked_copy_max_gb = 0.0001\n").unwrap();
    let config = config.to_str().unwrap();
    let over =
        run(&["generate", "-m", &kept, "-n", "2", "-t", "1", "--moe-stream", "--repack", "on", "--config", config]);
    assert!(over.status.success() && stderr(&over).contains("over its disk budget"), "{}", stderr(&over));
    // Its sizes in one unit.
    let said = stderr(&over);
    let line = said.lines().find(|l| l.contains("over its disk budget")).unwrap();
    assert!(line.matches(" MiB").count() == 3 && !line.contains("GiB"), "{line}");
    let listing = stdout(&run(&["cache"]));
    // The copy and the route profile the run learned, both of this model.
    assert!(listing.contains("repacked") && listing.contains(&kept) && listing.contains("2 entries"), "{listing}");
    assert!(listing.lines().any(|l| l.starts_with("profile") && l.contains(&kept)), "{listing}");
    for m in [&kept, &gone] {
        let out = run(&["generate", "-m", m, "-n", "2", "-t", "1", "--moe-stream", "--repack", "on"]);
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let listing = stdout(&run(&["cache"]));
    assert!(listing.contains("repacked") && listing.contains(&kept) && listing.contains(&gone), "{listing}");
    assert!(listing.contains("4 entries"), "{listing}");
    // Another model written over `kept`'s file: its copy and its profile
    // replace the old ones, so the listing names the file once a kind.
    make_tiny(dir.path(), "kept.gguf", &["--quant", "q4_0", "--seed", "5"]);
    let out = run(&["generate", "-m", &kept, "-n", "2", "-t", "1", "--moe-stream", "--repack", "on"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let listing = stdout(&run(&["cache"]));
    let mut kinds_of_kept: Vec<&str> =
        listing.lines().filter(|l| l.contains(&*kept)).filter_map(|l| l.split_whitespace().next()).collect();
    kinds_of_kept.sort();
    assert_eq!(kinds_of_kept, ["profile", "repacked"], "{listing}");
    assert!(listing.contains("4 entries"), "{listing}");

    std::fs::remove_file(&gone).unwrap();
    let refused = run(&["cache", "remove"]);
    assert!(!refused.status.success() && stderr(&refused).contains("say which entries"), "{}", stderr(&refused));
    let removed = stdout(&run(&["cache", "remove", "--gone"]));
    assert!(removed.contains("removed 2 entries") && removed.contains("(gone)"), "{removed}");
    let listing = stdout(&run(&["cache", "list"]));
    assert!(listing.contains(&kept) && !listing.contains(&gone), "{listing}");
    let removed = stdout(&run(&["cache", "rm", "--kind", "profile"]));
    assert!(removed.contains("removed 1 entry,"), "{removed}");
    assert!(std::fs::read_dir(home.join("bmoe/profiles")).unwrap().next().is_none());
    assert!(stdout(&run(&["cache", "remove", "--all"])).contains("removed 1 entry,"));
    assert!(stdout(&run(&["cache"])).contains("no copies"));
    assert!(std::fs::read_dir(home.join("bmoe/repacked")).unwrap().next().is_none());
}

/// With no budget set (`generate.n_predict = 0`, the default) a reply runs
/// until the model ends it or the context is full, and a reply a limit
/// ended is marked as cut on every front end, by which limit. (The old
/// default of 128 tokens stopped there.)
#[test]
fn replies_run_to_the_context_end_and_a_cut_is_marked() {
    let dir = tempdir();
    let m = make_tiny(dir.path(), "t.gguf", &["--chat-template", "qwen3"]);
    let out = ok(&["generate", "-m", &m, "-p", "hello", "-c", "256", "--batch", "32", "--ubatch", "32"]);
    let err = stderr(&out);
    assert!(err.contains("finish:  length"), "{err}");
    assert!(err.contains("the reply was cut off at ") && err.contains("it ran into the end of the context"), "{err}");
    let number =
        |after: &str| -> usize { err.split(after).nth(1).unwrap().split(' ').next().unwrap().parse().unwrap() };
    let (tokens, prompt) = (number("decode:  "), number("prefill: "));
    assert_eq!(tokens + prompt, 256, "the reply fills what the prompt left of a 256-token context:\n{err}");
    // A budget that ends the reply is named as the budget.
    let err = stderr(&ok(&["generate", "-m", &m, "-p", "hello", "-n", "5"]));
    assert!(err.contains("cut off at 5 tokens: it ran into the token limit; raise -n"), "{err}");
    // The REPL marks it too, on a line of its own.
    let _serial = common::llama_lock();
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["repl", "-m", &m, "-c", "256", "--batch", "32", "--ubatch", "32", "-t", "1", "--no-think"])
        .env("XDG_DATA_HOME", env!("CARGO_TARGET_TMPDIR"))
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let done = child.wait_with_output().unwrap();
    let err = stderr(&done);
    assert!(done.status.success(), "{err}");
    assert!(err.contains("note: the reply was cut off at ") && err.contains("end of the context"), "{err}");
}

/// `serve` with a model that cannot open exits non-zero with the reason:
/// a missing file before it takes a port, a corrupt one as soon as the
/// load fails (it used to keep answering 503 and exit 0 on Ctrl-C).
#[test]
fn serve_exits_with_an_error_when_the_model_does_not_open() {
    let dir = tempdir();
    let missing = dir.path().join("nosuch.gguf");
    let out = bmoe(&["serve", "-m", missing.to_str().unwrap(), "--port", "0"]);
    let err = stderr(&out);
    assert!(!out.status.success() && err.contains("no such file"), "{err}");
    assert!(!stdout(&out).contains("listening"), "it took a port first: {}", stdout(&out));
    let corrupt = dir.path().join("corrupt.gguf");
    std::fs::write(&corrupt, b"GGUF but not really a model file").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_bmoe"))
        .args(["serve", "-m", corrupt.to_str().unwrap(), "--port", "0"])
        .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Only a guard against hanging forever: the server exits by itself.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(300);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("serve kept running with a model that failed to load");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    let err = stderr(&out);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("the model failed to load"), "{err}");
}

/// `moe.stream = auto` (the default): a model that fits stays resident and
/// one over the memory the process may use streams, with no flag, each
/// saying why in one line; the two runs' logits are bitwise the same. The
/// limit is a real cgroup's (needs root; without it only the resident
/// side and the flags are checked).
#[test]
fn a_model_over_the_memory_limit_streams_by_default_and_says_why() {
    let dir = tempdir();
    let demo = dir.path().join("demo.gguf").to_string_lossy().into_owned();
    ok(&["make-model", "--preset", "demo", "-o", &demo]);
    let resident_digest = dir.path().join("resident.txt");
    let out = ok(&["generate", "-m", &demo, "-n", "4", "--logits-digest", resident_digest.to_str().unwrap()]);
    let err = stderr(&out);
    assert!(err.contains("resident (not streaming): the model (") && err.contains(" fit in the "), "{err}");
    let err = stderr(&ok(&["generate", "-m", &demo, "-n", "2", "--moe-stream"]));
    assert!(err.contains("streaming experts from disk: moe.stream is on"), "{err}");
    let err = stderr(&ok(&["generate", "-m", &demo, "-n", "2", "--moe-stream=off"]));
    assert!(err.contains("resident (not streaming): moe.stream is off"), "{err}");
    // A setting that needs streaming streams under auto, and is refused with it off.
    let err = stderr(&ok(&["generate", "-m", &demo, "-n", "2", "--cache-mb", "64"]));
    assert!(err.contains("streaming experts from disk: moe.cache_mb (an expert cache) needs it"), "{err}");
    let out = bmoe(&["generate", "-m", &demo, "-n", "2", "--cache-mb", "64", "--moe-stream=off"]);
    assert!(!out.status.success() && stderr(&out).contains("moe.stream is off"), "{}", stderr(&out));
    if !rustix::process::geteuid().is_root() {
        return;
    }
    // A cap of the file's own size: the file and its context cannot both fit.
    let size = std::fs::metadata(&demo).unwrap().len();
    let cgroup = bmoe::bench::cgroup::Cgroup::create(size).expect("a cgroup");
    let join: Vec<String> = cgroup.procs_files().iter().map(|f| format!("echo $$ > {}", f.display())).collect();
    let streamed_digest = dir.path().join("streamed.txt");
    let out = {
        let _serial = common::llama_lock();
        Command::new("sh")
            .arg("-c")
            .arg(format!("{} && exec \"$0\" \"$@\"", join.join(" && ")))
            .arg(env!("CARGO_BIN_EXE_bmoe"))
            .args(["generate", "-m", &demo, "-n", "4", "-t", "1", "--logits-digest"])
            .arg(&streamed_digest)
            .env("XDG_CACHE_HOME", env!("CARGO_TARGET_TMPDIR"))
            .output()
            .expect("run bmoe in the cgroup")
    };
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("streaming experts from disk: the model (") && err.contains("do not fit in"), "{err}");
    assert!(err.contains("cgroup limit"), "{err}");
    assert_eq!(
        std::fs::read_to_string(&streamed_digest).unwrap(),
        std::fs::read_to_string(&resident_digest).unwrap(),
        "the streamed run's logits differ from the resident run's"
    );
}

/// `bench --disk-mbps` throttles reads from the model's disk inside the
/// harness's cgroup: the harness's own check (O_DIRECT and buffered reads
/// by `dd` in the cgroup) and the runs' read speed stay under the limit,
/// which this machine's disk beats many times over. Needs root, as the
/// harness does; without it, only the refusal is checked.
#[test]
fn bench_throttles_the_disk() {
    let dir = tempdir();
    let demo = dir.path().join("demo.gguf").to_string_lossy().into_owned();
    ok(&["make-model", "--preset", "demo", "-o", &demo]);
    let work = dir.path().join("runs");
    let csv = dir.path().join("bench.csv");
    let out = bmoe(&[
        "bench",
        "-m",
        &demo,
        "--disk-mbps",
        "50",
        "--reps",
        "1",
        "-n",
        "4",
        "--setting",
        "c0=--moe-stream --cache-mb 0 -t 1",
        "--work",
        work.to_str().unwrap(),
        "--csv",
        csv.to_str().unwrap(),
    ]);
    let err = stderr(&out);
    if !rustix::process::geteuid().is_root() {
        assert!(!out.status.success() && err.contains("needs root"), "{err}");
        return;
    }
    assert!(out.status.success(), "{err}");
    let rate = |label: &str| -> f64 {
        let at = err.find(label).unwrap_or_else(|| panic!("no {label} in {err}")) + label.len();
        err[at..].split_whitespace().next().unwrap().parse().unwrap()
    };
    for label in ["O_DIRECT ", "buffered "] {
        assert!(rate(label) < 62.5, "{label}reads ran past the 50 MB/s throttle:\n{err}");
    }
    assert!(!err.contains("does not hold"), "{err}");
    // The run's own reads (the table's read MiB/s, after the read/mgmt/compute split): under
    // 50 MB/s (47.7 MiB/s) with some slack.
    let table = stdout(&out);
    let row = table.lines().find(|l| l.contains(" c0 ")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.contains("1/1"), "the throttled run failed:\n{table}\n{err}");
    let fields: Vec<&str> = row.split_whitespace().collect();
    let split = fields.iter().position(|f| f.matches('/').count() == 2).unwrap_or_else(|| panic!("{table}"));
    let read: f64 = fields[split + 1].parse().unwrap_or_else(|_| panic!("{table}"));
    assert!(read > 0.0 && read < 60.0, "the run read at {read} MiB/s under a 50 MB/s throttle:\n{table}");
}

/// The `--help` line of `flag` (its names, then its description).
fn help_line<'a>(help: &'a str, flag: &str) -> &'a str {
    help.lines()
        .find(|line| {
            let line = line.trim_start();
            let names = line.split("  ").next().unwrap_or_default();
            line.starts_with('-') && names.split([' ', ',']).any(|word| word == flag)
        })
        .unwrap_or_else(|| panic!("{flag} is not in the help:\n{help}"))
}

/// Every run flag with a default says it in `--help`, and it is the default
/// the engine uses (`RunConfig::default()`), not one a comment remembers.
#[test]
fn help_shows_each_flags_real_default() {
    let d = bmoe::config::RunConfig::default();
    let help = stdout(&ok(&["generate", "--help"]));
    let cases = [
        ("--n-predict", d.generate.n_predict.to_string()),
        ("--ctx-size", d.generate.ctx_size.to_string()),
        ("--batch", d.generate.batch.to_string()),
        ("--ubatch", d.generate.ubatch.to_string()),
        ("--temp", d.generate.temp.to_string()),
        ("--top-k", d.generate.top_k.to_string()),
        ("--top-p", d.generate.top_p.to_string()),
        ("--seed", d.generate.seed.to_string()),
        ("--min-p", d.generate.min_p.to_string()),
        ("--typical-p", d.generate.typical_p.to_string()),
        ("--repeat-penalty", d.generate.repeat_penalty.to_string()),
        ("--frequency-penalty", d.generate.frequency_penalty.to_string()),
        ("--presence-penalty", d.generate.presence_penalty.to_string()),
        ("--repeat-last-n", d.generate.repeat_last_n.to_string()),
        ("--threads", d.generate.threads.to_string()),
        ("--dense-weights", d.moe.dense_weights.clone()),
        ("--cache-policy", d.moe.cache_policy.clone()),
        ("--route-profile", d.moe.route_profile.clone()),
        ("--io-threads", d.moe.io_threads.to_string()),
        ("--repack", d.model.repack.clone()),
        ("--draft", d.plugins.draft.to_string()),
        ("--mtp-p-min", d.plugins.mtp_p_min.to_string()),
        ("--mtp-experts", d.plugins.mtp_experts.clone()),
    ];
    for (flag, value) in cases {
        let line = help_line(&help, flag);
        assert!(line.contains(&format!("default {value}]")), "{flag} should show [..., default {value}]:\n{line}");
    }
    // eval's example of a drop parameter is one the bundled drop plugin takes.
    let eval_help = stdout(&ok(&["eval", "--help"]));
    assert!(eval_help.contains("--drop-plugin drop-cold --drop-param F=0.6"), "{eval_help}");
    // eval scores given text: no generation, sampling or chat flags, one --csv, and its usage
    // says a setting (or --branches) is required.
    for absent in ["--n-predict", "--temp", "--top-k", "--tools", "--system", "--chat-template", "--route-trace"] {
        assert!(!eval_help.contains(absent), "eval --help shows {absent}:\n{eval_help}");
    }
    assert_eq!(eval_help.matches("--csv <").count(), 1, "{eval_help}");
    assert!(eval_help.contains("(--against [NAME=]FLAGS... | --branches)"), "{eval_help}");
    let out = bmoe(&["eval", "--temp", "0.5", "--against", "x=--n-expert-used 1"]);
    assert!(!out.status.success() && stderr(&out).contains("--temp"), "{}", stderr(&out));
}

/// `--tools` and `--tool-choice` do nothing without `--chat`, so they are an
/// error there, before any model is opened.
#[test]
fn tools_without_chat_are_refused() {
    let dir = common::tempdir();
    let tools = dir.path().join("tools.json");
    std::fs::write(&tools, "[]").unwrap();
    let tools = tools.to_str().unwrap();
    let missing = dir.path().join("never-opened.gguf");
    let missing = missing.to_str().unwrap();
    fails_with_one_line(&["generate", "-m", missing, "--tools", tools], "--tools needs --chat");
    fails_with_one_line(&["generate", "-m", missing, "--tool-choice", "required"], "--tool-choice needs --chat");
}

/// An unknown template name lists the bundled ones; `inspect` names the
/// file's chat template and its thinking switch, or says there is none;
/// `archs` keeps its columns whatever a name's length, and its help says
/// what each gate value means.
#[test]
fn templates_are_named_and_shown() {
    let e = fails_with_one_line(&["template", "qwen9"], "qwen9");
    assert!(e.contains("bundled template") && e.contains("qwen3.5") && e.contains("kimi-k2-thinking"), "{e}");
    let dir = tempdir();
    let with = make_tiny(dir.path(), "with.gguf", &["--chat-template", "qwen3"]);
    let without = make_tiny(dir.path(), "without.gguf", &[]);
    let shown = stdout(&ok(&["inspect", &with]));
    assert!(
        shown.contains(
            "chat template: the bundled qwen3; reasoning <think> tags, thinking control: template (enable_thinking)"
        ),
        "{shown}"
    );
    let shown = stdout(&ok(&["inspect", &without]));
    assert!(shown.contains("chat template: none in the file") && shown.contains("--chat-template"), "{shown}");

    let archs = stdout(&ok(&["archs"]));
    let mut lines = archs.lines().skip(1);
    let header = lines.next().unwrap();
    let columns: Vec<usize> = ["gated", "template", "moe features", "models"].map(|h| header.find(h).unwrap()).into();
    for row in lines.take_while(|l| !l.is_empty()) {
        for &at in &columns {
            // Each cell starts where its header does, after a space.
            assert!(row.len() > at && row.as_bytes()[at - 1] == b' ' && row.as_bytes()[at] != b' ', "{row}");
        }
    }
    let help = stdout(&ok(&["archs", "--help"]));
    assert!(help.contains("`NO`") && help.contains("`yes`") && help.contains("`-`"), "{help}");

    // An effort the template does not read is named; one it reads is not.
    let said = |name: &str| stderr(&ok(&["template", name, "--reasoning-effort", "low"]));
    let ignored = said("qwen3");
    assert!(ignored.contains("reasoning effort `low` changes nothing") && ignored.contains("qwen3"), "{ignored}");
    let read = said("gpt-oss");
    assert!(!read.contains("changes nothing"), "{read}");
}

/// `bmoe run` says each note once however often a loop causes it, and
/// names each file the script writes.
#[test]
fn a_script_says_each_note_once_and_names_its_files() {
    let dir = tempdir();
    let model = make_tiny(dir.path(), "m.gguf", &[]);
    let script = dir.path().join("loop.rhai");
    std::fs::write(
        &script,
        r#"
let s = open(ARGS[0], #{ stream: true, cache_mb: 0, threads: 1 });
let rows = [];
for f in [0.25, 0.5, 0.25, 0.5] {
    s.set("drop_plugin", "drop-cold");
    s.set("drop_params", `F=${f}`);
    let r = s.generate("hello", 2);
    rows.push(#{ F: f, tokens: r.tokens });
    s.set("drop_plugin", "");
}
write_csv("loop.csv", rows);
"#,
    )
    .unwrap();
    let out_dir = dir.path().join("out");
    let out = ok(&["run", script.to_str().unwrap(), "--out", out_dir.to_str().unwrap(), "--", &model]);
    let err = stderr(&out);
    let notes: Vec<&str> = err.lines().filter(|l| l.starts_with("bmoe run: note: ")).collect();
    let mut unique = notes.clone();
    unique.sort();
    unique.dedup();
    assert_eq!(notes.len(), unique.len(), "a note said twice:\n{err}");
    assert!(notes.len() >= 2, "the plugin's notes are missing:\n{err}");
    let csv = out_dir.join("loop.csv");
    assert!(csv.exists() && err.contains(&format!("bmoe run: note: wrote {}", csv.display())), "{err}");
}

#[test]
fn kernels_probes_each_type_and_family() {
    let out = stdout(&ok(&["kernels", "--types", "q4_0,f16", "--widths", "1,4,9", "--rows", "64", "--k", "512"]));
    for row in ["q4_0     dense   repacked", "q4_0     experts reference", "f16      dense   reference"] {
        assert!(out.contains(row), "{out}");
    }
    // vec_dot computes each column alone: the reference family never differs.
    for line in out.lines().filter(|l| l.split_whitespace().nth(2) == Some("reference")) {
        assert!(line.ends_with("same bits at every width"), "{line}");
    }
    assert!(out.contains("f16      dense   repacked   no repacked layout on this CPU"), "{out}");
    // The invariant sgemm, where the build has it, keeps a column's bits at every width.
    let sgemm = ["f16      dense   sgemm-all  same bits at every width", "f16      dense   sgemm-all  not taken"];
    assert!(sgemm.iter().any(|row| out.contains(row)), "{out}");
    assert!(out.contains("q4_0     dense   sgemm-all  not taken"), "{out}");
    let bad = bmoe(&["kernels", "--types", "q9_9"]);
    assert!(!bad.status.success() && stderr(&bad).contains("not a ggml type name"), "{}", stderr(&bad));
    let bad = bmoe(&["kernels", "--rows", "65536", "--k", "65536"]);
    assert!(!bad.status.success() && stderr(&bad).contains("must each stay within"), "{}", stderr(&bad));
    let bad = bmoe(&["kernels", "--widths", "0"]);
    assert!(!bad.status.success() && stderr(&bad).contains("a width must be 1 to 4096"), "{}", stderr(&bad));
}

#[test]
fn sampling_flags_and_keys_change_what_generate_writes() {
    let dir = common::tempdir();
    let m = make_tiny(dir.path(), "m.gguf", &[]);
    let run = |extra: &[&str]| {
        let out = ok(&[&["generate", "-q", "-m", &m, "-p", "The river", "-n", "64"], extra].concat());
        stdout(&out).trim_end_matches('\n').to_string()
    };
    let greedy = run(&[]);
    // A bias that forces one token: the reply is that token, 64 times.
    let forced = run(&["--logit-bias", "300=inf"]);
    let piece = &forced[..forced.len() / 64];
    assert!(!piece.is_empty() && forced == piece.repeat(64), "{forced:?}");
    assert_ne!(forced, greedy);
    // Each penalty changes the greedy reply (which repeats itself within 64
    // tokens); a window of none changes nothing.
    for flag in [&["--repeat-penalty", "3"][..], &["--presence-penalty", "2"], &["--frequency-penalty", "2"]] {
        assert_ne!(run(flag), greedy, "{flag:?} changed nothing");
    }
    assert_eq!(run(&["--repeat-penalty", "3", "--repeat-last-n", "0"]), greedy);
    // min_p 1 leaves only the favourite, at any temperature.
    assert_eq!(run(&["--temp", "1", "--top-k", "0", "--min-p", "1", "--seed", "4"]), greedy);
    // The same through bmoe.toml.
    let config = dir.path().join("bmoe.toml");
    std::fs::write(&config, "[generate]\nlogit_bias = \"300=inf\"\n").unwrap();
    assert_eq!(run(&["--config", config.to_str().unwrap()]), forced);
    std::fs::write(&config, "[generate]\npresence_penalty = 3.0\n").unwrap();
    fails_with_one_line(&["generate", "-m", &m, "--config", config.to_str().unwrap()], "generate.presence_penalty");
    fails_with_one_line(&["generate", "-m", &m, "--logit-bias", "300"], "generate.logit_bias");
}
