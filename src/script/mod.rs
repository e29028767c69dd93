//! Rhai experiment scripts (`bmoe run FILE.rhai`, `:run` in the REPL): a
//! script opens models on session hosts, runs them through configurations,
//! replays route traces through cache policies, and leaves CSV files,
//! charts and tables behind. The API is documented in `docs/scripting.md`.
//!
//! Scripts are sandboxed (`sandbox.rs`): operation, call-depth and size
//! limits, no modules, no `eval`, writes only under the output directory,
//! no other file or process access; Ctrl-C stops them.

mod output;
mod sandbox;
mod session;

use std::path::{Path, PathBuf};
use std::rc::Rc;

use rhai::{Array, Dynamic, Engine, EvalAltResult, Map, NativeCallContext, Scope};

pub use sandbox::{Limits, OutDir, harden};
pub use session::{Session, csv_row};

use crate::config::RunConfig;
use crate::replay::{Policy, Trace, replay};
use session::{Fallible, fail};

/// How a script runs.
#[derive(Debug, Clone)]
pub struct ScriptOptions {
    /// Where the script may write (default `./bmoe-out`).
    pub out_dir: PathBuf,
    /// The script's arguments (`ARGS`).
    pub args: Vec<String>,
    /// The sandbox's limits.
    pub limits: Limits,
    /// Settings every `open` starts from (`--config`, flags).
    pub base: RunConfig,
    /// The folder of the script's file (`SCRIPT_DIR`), so it can name
    /// files beside it from any working directory; `.` for a script
    /// given as text.
    pub script_dir: PathBuf,
}

impl Default for ScriptOptions {
    fn default() -> ScriptOptions {
        ScriptOptions {
            out_dir: PathBuf::from("bmoe-out"),
            args: Vec::new(),
            limits: Limits::default(),
            base: RunConfig::default(),
            script_dir: PathBuf::from("."),
        }
    }
}

/// A script that failed: where (`file:line:column`, as far as known), and
/// why.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{}: {message}{context}", self.place())]
pub struct ScriptError {
    /// The script file.
    pub file: String,
    /// Line (1-based; 0 when unknown).
    pub line: usize,
    /// Column (1-based; 0 when unknown).
    pub column: usize,
    /// What went wrong.
    pub message: String,
    /// The offending line with a caret under the column (empty when unknown).
    pub context: String,
}

impl ScriptError {
    /// `file:line:column`, without the parts that are not known (a script
    /// that could not be read has neither line nor column).
    fn place(&self) -> String {
        match (self.line, self.column) {
            (0, _) => self.file.clone(),
            (line, 0) => format!("{}:{line}", self.file),
            (line, column) => format!("{}:{line}:{column}", self.file),
        }
    }

    fn new(file: &str, source: &str, mut err: EvalAltResult) -> ScriptError {
        let pos = err.take_position();
        let (line, column) = (pos.line().unwrap_or(0), pos.position().unwrap_or(0));
        let context = source
            .lines()
            .nth(line.wrapping_sub(1))
            .map(|text| format!("\n  {text}\n  {}^", " ".repeat(column.saturating_sub(1))))
            .unwrap_or_default();
        ScriptError { file: file.to_string(), line, column, message: describe(&err), context }
    }
}

/// The message of a script error, without its position.
fn describe(err: &EvalAltResult) -> String {
    match err {
        EvalAltResult::ErrorTooManyOperations(_) => {
            "stopped: the script ran past its operation limit (a runaway loop?); raise it with --max-ops".into()
        }
        EvalAltResult::ErrorTerminated(why, _) => format!("stopped: {why}"),
        EvalAltResult::ErrorRuntime(v, _) => v.to_string(),
        EvalAltResult::ErrorInFunctionCall(name, _, inner, _) => format!("in `{name}`: {}", describe(inner)),
        other => other.to_string(),
    }
}

/// Runs the script in `path`.
pub fn run_file(path: &Path, options: &ScriptOptions) -> Result<(), ScriptError> {
    let name = path.display().to_string();
    let source = std::fs::read_to_string(path).map_err(|e| ScriptError {
        file: name.clone(),
        line: 0,
        column: 0,
        message: format!("reading the script: {e}"),
        context: String::new(),
    })?;
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let script_dir = std::path::absolute(dir).unwrap_or_else(|_| dir.to_path_buf());
    run_source(&name, &source, &ScriptOptions { script_dir, ..options.clone() })
}

/// Runs `source` (named `name` in errors).
pub fn run_source(name: &str, source: &str, options: &ScriptOptions) -> Result<(), ScriptError> {
    let sessions = Rc::new(std::cell::RefCell::new(Vec::<Session>::new()));
    let engine = build_engine(options, sessions.clone());
    let mut scope = Scope::new();
    let args: Array = options.args.iter().map(|a| Dynamic::from(a.clone())).collect();
    scope.push_constant("ARGS", args);
    scope.push_constant("OUT_DIR", options.out_dir.display().to_string());
    scope.push_constant("SCRIPT_DIR", options.script_dir.display().to_string());
    let result = engine
        .compile(source)
        .map_err(EvalAltResult::from)
        .and_then(|ast| engine.run_ast_with_scope(&mut scope, &ast).map_err(|e| *e));
    // Close every session's telemetry files, whatever happened.
    for s in sessions.borrow().iter() {
        if let Err(e) = s.finish() {
            eprintln!("bmoe run: {e}");
        }
    }
    result.map_err(|e| ScriptError::new(name, source, e))
}

/// The engine with the sandbox and bmoe's API.
fn build_engine(options: &ScriptOptions, sessions: Rc<std::cell::RefCell<Vec<Session>>>) -> Engine {
    let mut engine = Engine::new();
    harden(&mut engine, &options.limits);
    engine.on_print(|s| println!("{s}"));
    engine.on_debug(|s, _, pos| eprintln!("[debug {pos}] {s}"));

    engine.register_type_with_name::<Session>("Session");
    let out = OutDir::new(options.out_dir.clone());
    // Every session opened is remembered, to close its telemetry files at the end.
    let (base, o) = (options.base.clone(), out.clone());
    let open = Rc::new(move |path: &str, settings: &Map| -> Fallible<Session> {
        let s = Session::open(path, settings, &base, &o)?;
        sessions.borrow_mut().push(s.clone());
        Ok(s)
    });
    let with = open.clone();
    engine.register_fn("open", move |path: &str, settings: Map| with(path, &settings));
    engine.register_fn("open", move |path: &str| open(path, &Map::new()));
    engine.register_fn("generate", |s: &mut Session, prompt: &str, n: i64| s.generate(prompt, n, &Map::new()));
    engine.register_fn("generate", |s: &mut Session, prompt: &str, n: i64, o: Map| s.generate(prompt, n, &o));
    engine.register_fn("chat", |ctx: NativeCallContext, s: &mut Session, message: &str| {
        s.chat_with(&ctx, message, &Map::new())
    });
    engine.register_fn("chat", |ctx: NativeCallContext, s: &mut Session, message: &str, options: Map| {
        s.chat_with(&ctx, message, &options)
    });
    engine.register_fn("messages", Session::messages);
    engine.register_fn("set", |s: &mut Session, key: &str, value: Dynamic| s.set(key, &value));
    engine.register_fn("reset", Session::reset);
    engine.register_fn("config", Session::config);
    engine.register_fn("info", Session::info);
    engine.register_fn("max_abs_diff", |a: Array, b: Array| session::max_abs_diff(&a, &b));
    engine.register_type_with_name::<session::Scores>("Scores");
    engine.register_fn("score", |s: &mut Session, text: &str, n: i64| s.score(text, n));
    engine.register_get("positions", session::Scores::len);
    engine.register_fn("kl", session::kl);
    engine.register_fn("sample_text", || crate::eval::text::SAMPLE.to_string());
    let o = out.clone();
    engine.register_fn("make_model", move |path: &str, spec: Map| make_model(&o, path, &spec));
    let o = out.clone();
    engine.register_fn("make_model", move |path: &str| make_model(&o, path, &Map::new()));
    engine.register_fn("replay", |trace: &str, options: Map| replay_map(trace, &options));
    let o = out.clone();
    engine.register_fn("write_csv", move |path: &str, rows: Array| -> Fallible<String> {
        let full = o.resolve(path).map_err(|e| fail("write_csv", e))?;
        let rows = output::maps(&rows, "write_csv")?;
        output::write_csv(&full, &rows).map_err(|e| fail("write_csv", e))?;
        crate::notes::note("bmoe run", &format!("wrote {}", full.display()));
        Ok(full.display().to_string())
    });
    let o = out;
    engine.register_fn("chart", move |path: &str, spec: Map| -> Fallible<String> {
        let full = o.resolve(path).map_err(|e| fail("chart", e))?;
        if full.extension().is_none_or(|e| e != "svg" && e != "png") {
            return Err(fail("chart", format!("`{path}`: charts are SVG or PNG; name the file .svg or .png")));
        }
        let chart = output::ChartSpec::from_map(&spec).map_err(|e| fail("chart", e))?;
        chart.draw(&full).map_err(|e| fail("chart", e))?;
        crate::notes::note("bmoe run", &format!("wrote {}", full.display()));
        Ok(full.display().to_string())
    });
    engine.register_fn("table", |rows: Array| -> Fallible<()> {
        let rows = output::maps(&rows, "table")?;
        print!("{}", output::table(&rows));
        Ok(())
    });
    engine
}

/// `make_model(path, #{preset, arch, layers, embd, experts, experts_used,
/// expert_ff, shared_experts, dense_layers, mtp_layers, vocab,
/// tied_embeddings, quant, quant_mix, seed, chat_template, token_corr,
/// skew, skew_first, mix, expert_mix, mtp_head})`: what `bmoe make-model` writes, under the output directory;
/// returns its path.
fn make_model(out: &OutDir, path: &str, spec: &Map) -> Fallible<String> {
    let full = out.resolve(path).map_err(|e| fail("make_model", e))?;
    let text = |k: &str| spec.get(k).map(|v| v.to_string());
    let int = |k: &str| -> Fallible<Option<u32>> {
        spec.get(k)
            .map(|v| {
                v.as_int()
                    .ok()
                    .and_then(|i| u32::try_from(i).ok())
                    .ok_or_else(|| fail("make_model", format!("{k} = {v}: want a non-negative integer")))
            })
            .transpose()
    };
    let float = |k: &str| -> Fallible<Option<f32>> {
        spec.get(k)
            .map(|v| {
                v.as_float().map(|f| f as f32).map_err(|_| fail("make_model", format!("{k} = {v}: want a number")))
            })
            .transpose()
    };
    let options = crate::synth::ModelOptions {
        preset: text("preset").unwrap_or_else(|| "tiny".into()),
        arch: text("arch"),
        layers: int("layers")?,
        embd: int("embd")?,
        experts: int("experts")?,
        experts_used: int("experts_used")?,
        expert_ff: int("expert_ff")?,
        shared_experts: int("shared_experts")?,
        dense_layers: int("dense_layers")?,
        mtp_layers: int("mtp_layers")?,
        vocab: int("vocab")?,
        tied_embeddings: match spec.get("tied_embeddings") {
            None => false,
            Some(v) => {
                v.as_bool().map_err(|_| fail("make_model", format!("tied_embeddings = {v}: want true or false")))?
            }
        },
        quant: text("quant"),
        quant_mix: text("quant_mix"),
        seed: int("seed")?.map(u64::from),
        split: None,
        token_corr: float("token_corr")?,
        skew: float("skew")?,
        skew_first: float("skew_first")?,
        mix: float("mix")?,
        expert_mix: float("expert_mix")?,
        chat_template: text("chat_template"),
        mtp_head: text("mtp_head"),
    };
    let m = crate::synth::model_spec(&options).map_err(|e| fail("make_model", format!("{e:#}")))?;
    let written = crate::synth::write_model(&m, &full, &mut |_, _| {
        if crate::interrupt::requested() {
            std::ops::ControlFlow::Break(())
        } else {
            std::ops::ControlFlow::Continue(())
        }
    })
    .map_err(|e| fail("make_model", format!("{e:#}")))?;
    if let Some(share) = options.mtp_agreement().map_err(|e| fail("make_model", format!("{e:#}")))? {
        crate::mtp_head::write_agreeing_head(&written.paths[0], share, m.seed, 1)
            .map_err(|e| fail("make_model", format!("mtp_head: {e}")))?;
    }
    Ok(written.paths[0].display().to_string())
}

/// `replay(trace, #{cache_mb | fraction, policy})`: the trace's loads
/// through an expert cache; a map of the hit rate, bytes read and per-layer hits.
fn replay_map(path: &str, options: &Map) -> Fallible<Map> {
    let text = std::fs::read_to_string(path).map_err(|e| fail("replay", format!("reading {path}: {e}")))?;
    let trace = Trace::parse(&text).map_err(|e| fail("replay", format!("{path}: {e}")))?;
    let number = |k: &str| options.get(k).and_then(|v| v.as_float().ok().or_else(|| v.as_int().ok().map(|i| i as f64)));
    let bank = trace.bank_bytes();
    let budget = match (number("cache_mb"), number("fraction")) {
        (Some(mib), None) if mib >= 0.0 => (mib * 1048576.0) as u64,
        (None, Some(f)) if (0.0..=1.0).contains(&f) => (f * bank as f64) as u64,
        _ => return Err(fail("replay", "give one budget: cache_mb (MiB, >= 0) or fraction (of the bank, 0..1)")),
    };
    let policy: Policy = options
        .get("policy")
        .map_or(Ok(Policy::Decay), |p| p.to_string().parse())
        .map_err(|e: String| fail("replay", e))?;
    let r = replay(&trace, budget, policy);
    let tokens = trace.decode_tokens().max(1) as f64;
    let mib = |b: u64| b as f64 / 1048576.0;
    let mut m = Map::new();
    m.insert("policy".into(), policy.name().into());
    m.insert("budget_mib".into(), Dynamic::from_float(mib(budget)));
    m.insert("bank_mib".into(), Dynamic::from_float(mib(bank)));
    m.insert("hit_rate".into(), Dynamic::from_float(100.0 * r.decode_hit_rate()));
    m.insert("lookups".into(), (r.decode_lookups as i64).into());
    m.insert("hits".into(), (r.decode_hits as i64).into());
    m.insert("bytes_read".into(), ((r.decode_bytes + r.prefill_bytes) as i64).into());
    m.insert("mib_per_token".into(), Dynamic::from_float(mib(r.decode_bytes) / tokens));
    m.insert("evictions".into(), (r.evictions as i64).into());
    let layers: Array = r
        .per_layer
        .iter()
        .map(|&(layer, lookups, hits)| {
            let mut l = Map::new();
            l.insert("layer".into(), i64::from(layer).into());
            l.insert("lookups".into(), (lookups as i64).into());
            l.insert("hits".into(), (hits as i64).into());
            l.insert("hit_rate".into(), Dynamic::from_float(100.0 * hits as f64 / lookups.max(1) as f64));
            Dynamic::from_map(l)
        })
        .collect();
    m.insert("per_layer".into(), layers.into());
    Ok(m)
}
