//! `bmoe generate`: configuration, the demo model, plugins, telemetry sinks.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Args;

use super::interrupt::{self, Forward};
use super::write_model_with_progress;
use crate::config::{RunConfig, parse_params};
use crate::engine::{Event, GenerateRequest, Session};
use crate::policy::wasm::{Limits, Source, WasmDrafter, WasmDropper};
use crate::policy::{Drafter, Dropper};
use crate::synth::{self, Arch, ModelSpec, Preset};
use crate::telemetry::csv::CsvSink;
use crate::telemetry::trace::RouteTraceSink;

/// `bmoe generate`
#[derive(Args, Debug, Default)]
pub struct GenerateArgs {
    /// Model file; without one, a random-weight demo model is generated once and used.
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// Prompt text.
    #[arg(short, long, default_value = "The capital of Japan is")]
    pub prompt: String,
    /// Tokens to generate [config: generate.n_predict, default 128].
    #[arg(short = 'n', long)]
    pub n_predict: Option<u32>,
    /// Read a bmoe.toml; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Stream routed experts from disk instead of keeping the model mapped.
    #[arg(long)]
    pub moe_stream: bool,
    /// Expert LRU cache budget in MiB, fractions allowed (0 = re-read routed experts every token).
    #[arg(long)]
    pub cache_mb: Option<f64>,
    /// Parallel read lanes [default 4].
    #[arg(long)]
    pub io_threads: Option<u32>,
    /// Read experts through the page cache instead of O_DIRECT.
    #[arg(long)]
    pub no_odirect: bool,
    /// Experts routed per token (fewer than the model's own is lossy).
    #[arg(long)]
    pub n_expert_used: Option<u32>,
    /// Compute threads (0 = one per core).
    #[arg(short, long)]
    pub threads: Option<u32>,
    /// Context length.
    #[arg(short = 'c', long)]
    pub ctx_size: Option<u32>,
    /// Most prompt tokens per decode call.
    #[arg(long)]
    pub batch: Option<u32>,
    /// Most tokens per graph computation.
    #[arg(long)]
    pub ubatch: Option<u32>,
    /// Sampling temperature (0 = greedy).
    #[arg(long)]
    pub temp: Option<f64>,
    /// Top-k sampling stage.
    #[arg(long)]
    pub top_k: Option<i32>,
    /// Top-p sampling stage.
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Sampling seed.
    #[arg(long)]
    pub seed: Option<u32>,
    /// Speculative decoding with this draft plugin: ngram, ngram-multi, suffix, or a .wasm file.
    #[arg(long, help_heading = "Plugins")]
    pub draft_plugin: Option<String>,
    /// Most tokens drafted per step [default 3].
    #[arg(long, help_heading = "Plugins")]
    pub draft: Option<u32>,
    /// A draft-plugin parameter, name=value (repeatable).
    #[arg(long = "draft-param", value_name = "NAME=VALUE", help_heading = "Plugins")]
    pub draft_params: Vec<String>,
    /// Drop routed experts with this plugin (lossy): drop-cold, or a .wasm file.
    #[arg(long, help_heading = "Plugins")]
    pub drop_plugin: Option<String>,
    /// A drop-plugin parameter, name=value (repeatable), e.g. F=0.75.
    #[arg(long = "drop-param", value_name = "NAME=VALUE", help_heading = "Plugins")]
    pub drop_params: Vec<String>,
    /// Write per-token metrics to this CSV file.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write per-token routing to this route-trace file (needs --moe-stream).
    #[arg(long)]
    pub route_trace: Option<PathBuf>,
    /// Show llama.cpp's log.
    #[arg(short, long)]
    pub verbose: bool,
}

/// The configuration after the file (if any) and the flags.
pub fn resolve_config(args: &GenerateArgs) -> Result<RunConfig> {
    let mut c = match &args.config {
        Some(p) => RunConfig::from_file(p).map_err(|e| anyhow!(e))?,
        None => RunConfig::default(),
    };
    let g = &mut c.generate;
    if let Some(m) = &args.model {
        c.model.path = m.clone();
    }
    macro_rules! set {
        ($($flag:ident => $field:expr),* $(,)?) => { $( if let Some(v) = args.$flag.clone() { $field = v; } )* };
    }
    set!(n_predict => g.n_predict, threads => g.threads, ctx_size => g.ctx_size, batch => g.batch,
         ubatch => g.ubatch, temp => g.temp, top_k => g.top_k, top_p => g.top_p, seed => g.seed);
    let m = &mut c.moe;
    set!(cache_mb => m.cache_mb, io_threads => m.io_threads, n_expert_used => m.n_expert_used);
    if args.moe_stream {
        m.stream = true;
    }
    if args.no_odirect {
        m.o_direct = false;
    }
    let p = &mut c.plugins;
    set!(draft_plugin => p.draft_plugin, draft => p.draft, drop_plugin => p.drop_plugin);
    if !args.draft_params.is_empty() {
        p.draft_params = args.draft_params.clone();
    }
    if !args.drop_params.is_empty() {
        p.drop_params = args.drop_params.clone();
    }
    let t = &mut c.telemetry;
    set!(csv => t.csv, route_trace => t.route_trace);
    if args.verbose {
        t.verbose = true;
    }
    c.validate()?;
    Ok(c)
}

/// The demo model's path, generating it on first use.
fn demo_model() -> Result<PathBuf> {
    let dir = dirs::cache_dir().unwrap_or_else(std::env::temp_dir).join("bmoe");
    let path = dir.join(format!("demo-qwen3moe-v{}.gguf", synth::GENERATOR_VERSION));
    eprintln!(
        "bmoe: no model given: using the built-in demo, a synthetic qwen3moe with RANDOM weights \
         (its text is gibberish by design): {}",
        path.display()
    );
    if !path.exists() {
        let spec = ModelSpec::preset(Preset::Demo, Arch::Qwen3Moe);
        write_model_with_progress(&spec, &path, "generating demo model").context("generating the demo model")?;
    }
    Ok(path)
}

pub fn generate(args: GenerateArgs) -> Result<()> {
    let config = resolve_config(&args)?;
    interrupt::install()?;
    crate::llama::set_verbose(config.telemetry.verbose);
    let model = if config.model.path.as_os_str().is_empty() { demo_model()? } else { config.model.path.clone() };
    if !config.telemetry.route_trace.as_os_str().is_empty() && !config.moe.stream {
        bail!("--route-trace needs --moe-stream (routing is only observed while streaming)");
    }
    let mut session = Session::open(config.session_options(&model))?;
    // Ctrl-C from here on stops the decode at its next graph node.
    let _forward = Forward::to(session.abort_handle().flag())?;
    interrupt::check()?;
    let info = session.info().clone();
    for notice in &info.notices {
        eprintln!("bmoe: note: {notice}");
    }
    attach_plugins(&mut session, &config)?;
    let mut csv = match &config.telemetry.csv {
        p if p.as_os_str().is_empty() => None,
        p => Some(
            CsvSink::create(p, &config.resolved_pairs(), &info).with_context(|| format!("creating {}", p.display()))?,
        ),
    };
    let mut route = match &config.telemetry.route_trace {
        p if p.as_os_str().is_empty() => None,
        p => Some(RouteTraceSink::create(p, &model, &info).with_context(|| format!("creating {}", p.display()))?),
    };
    let request = GenerateRequest {
        prompt: args.prompt.clone(),
        n_predict: config.generate.n_predict,
        sampling: config.sampling(),
        continue_context: false,
        keep_logits: false,
    };
    let stdout = std::io::stdout();
    let abort = session.abort_handle();
    let mut out_error: Option<std::io::Error> = None;
    let mut sink_error: Option<std::io::Error> = None;
    let generation = session.generate(&request, &mut |event| {
        // The generation clears its abort flag when it starts: a Ctrl-C
        // that landed just before is raised again here.
        if interrupt::requested() {
            abort.abort();
        }
        match event {
            Event::Token { text, .. } => {
                let mut out = stdout.lock();
                if let Err(e) = out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
                    // Nobody reads the text any more (e.g. a closed pipe): stop generating.
                    out_error.get_or_insert(e);
                    abort.abort();
                }
            }
            Event::Prefill(report) | Event::Step(report) => {
                let r = csv.as_mut().map_or(Ok(()), |c| c.row(report));
                if let Err(e) = r.and_then(|()| route.as_mut().map_or(Ok(()), |t| t.rows(report))) {
                    sink_error.get_or_insert(e);
                }
            }
            Event::Notice(text) => eprintln!("\nbmoe: note: {text}"),
        }
    })?;
    match out_error {
        // The reader went away (`bmoe generate | head`): not an error.
        Some(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        Some(e) => bail!("writing the generated text to stdout: {e}"),
        None => {}
    }
    println!();
    if let Some(e) = sink_error {
        bail!("writing telemetry: {e}");
    }
    if let Some(c) = csv {
        c.finish(&generation.summary)?;
    }
    if let Some(t) = route {
        t.finish()?;
    }
    eprint!("{}", generation.summary);
    // Stopped by Ctrl-C: everything generated so far is printed and saved.
    interrupt::check()?;
    Ok(())
}

/// Loads a plugin; a file that is not a usable plugin (not Wasm, another
/// interface version, imports) is refused with a note and the run goes on
/// without it. Rejected parameters are the user's error and stop the run.
fn load_or_skip<P>(what: &str, load: Result<P, String>) -> Result<Option<P>> {
    match load {
        Ok(p) => Ok(Some(p)),
        Err(e) if e.contains("rejected its parameters") => bail!(e),
        Err(e) => {
            eprintln!("bmoe: note: {what} plugin refused, running without it: {e}");
            Ok(None)
        }
    }
}

/// Loads the configured draft and drop plugins into the session.
fn attach_plugins(session: &mut Session, config: &RunConfig) -> Result<()> {
    let p = &config.plugins;
    let limits = Limits { call_ms: p.call_ms, memory_bytes: (p.memory_mb as usize) << 20 };
    if !p.draft_plugin.is_empty() {
        let params = parse_params("plugins.draft_params", &p.draft_params)?;
        let source = Source::resolve(&p.draft_plugin).map_err(|e| anyhow!(e))?;
        if let Some(plugin) = load_or_skip("draft", WasmDrafter::load(&source, &params, limits))? {
            let i = plugin.info().clone();
            eprintln!("bmoe: draft plugin {} {} ({}), up to {} tokens per step", i.name, i.version, i.source, p.draft);
            session.set_drafter(Some(Drafter::new(&i.name, Box::new(plugin), session.n_vocab())), p.draft);
        }
    }
    if !p.drop_plugin.is_empty() {
        let params = parse_params("plugins.drop_params", &p.drop_params)?;
        let source = Source::resolve(&p.drop_plugin).map_err(|e| anyhow!(e))?;
        let Some(plugin) = load_or_skip("drop", WasmDropper::load(&source, &params, limits))? else { return Ok(()) };
        let i = plugin.info().clone();
        eprintln!("bmoe: drop plugin {} {} ({}): lossy, output depends on cache state", i.name, i.version, i.source);
        if config.moe.cache_mb == 0.0 {
            eprintln!("bmoe: note: without --cache-mb every expert is a cache miss to the drop plugin");
        }
        let n_expert = session.info().n_expert;
        session.set_dropper(Some(Dropper::new(&i.name, Box::new(plugin), n_expert)))?;
    }
    Ok(())
}
