//! The command line: `generate`, `make-model`, `inspect`, `archs`, `trace-stats`.

use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::{Args, Parser, Subcommand};

use crate::config::{RunConfig, parse_params};
use crate::policy::wasm::{Limits, Source, WasmDrafter, WasmDropper};
use crate::policy::{Drafter, Dropper};
use crate::engine::{Event, GenerateRequest, Session};
use crate::gguf::{GgmlType, ModelFiles};
use crate::moe::recipe::{self, EXPERT_SUFFIXES, parse_expert_tensor};
use crate::synth::{self, Arch, ModelSpec, Preset};
use crate::telemetry::csv::CsvSink;
use crate::telemetry::trace::{self, RouteTraceSink};

/// bmoe runs Mixture-of-Experts models larger than RAM by reading only the
/// routed experts from disk, with output identical to a fully resident run.
#[derive(Parser, Debug)]
#[command(name = "bmoe", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text from a prompt (stdout carries only the generated text).
    Generate(GenerateArgs),
    /// Write a synthetic MoE model (random weights, real architecture).
    MakeModel(MakeModelArgs),
    /// Describe a GGUF model and whether bmoe can stream it.
    Inspect {
        /// Model file (first shard of a split set).
        file: PathBuf,
    },
    /// List the architectures bmoe can stream.
    Archs,
    /// Measure routing skew and stability in route traces.
    TraceStats {
        /// Route trace files (from --route-trace, or the reference engine's).
        files: Vec<PathBuf>,
        /// Decode tokens to analyse from each trace.
        #[arg(long, default_value_t = 128)]
        tokens: usize,
    },
}

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

/// `bmoe make-model`
#[derive(Args, Debug)]
pub struct MakeModelArgs {
    /// Output file (with --split N: the name before -0000i-of-0000N.gguf).
    #[arg(short, long)]
    pub output: PathBuf,
    /// Starting shape: tiny (<5 MB, tests), demo (~220 MB), bench (Qwen3-30B-A3B layers, >5 GB).
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Architecture: qwen3moe (split experts), gemma4 (fused gate_up) or gpt-oss (expert biases).
    #[arg(long, default_value = "qwen3moe")]
    pub arch: String,
    /// Transformer layers.
    #[arg(long)]
    pub layers: Option<u32>,
    /// Embedding width.
    #[arg(long)]
    pub embd: Option<u32>,
    /// Experts per layer.
    #[arg(long)]
    pub experts: Option<u32>,
    /// Experts routed per token.
    #[arg(long)]
    pub experts_used: Option<u32>,
    /// Hidden width of one expert.
    #[arg(long)]
    pub expert_ff: Option<u32>,
    /// Expert tensor type: f32, f16, q8_0 or q4_0.
    #[arg(long)]
    pub quant: Option<String>,
    /// Random seed (same seed, same bytes).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Write N shard files (llama.cpp's split format).
    #[arg(long)]
    pub split: Option<u32>,
    /// Routing shape: correlation of consecutive tokens' embeddings, in [0, 1).
    #[arg(long, help_heading = "Routing shape")]
    pub token_corr: Option<f32>,
    /// Routing shape: spread of per-expert popularity from a quarter of the depth on.
    #[arg(long, help_heading = "Routing shape")]
    pub skew: Option<f32>,
    /// Routing shape: spread of per-expert popularity in the first MoE layer.
    #[arg(long, help_heading = "Routing shape")]
    pub skew_first: Option<f32>,
    /// Routing shape: size of attention and expert outputs relative to the residual stream.
    #[arg(long, help_heading = "Routing shape")]
    pub mix: Option<f32>,
}

/// Runs the command line; returns the process exit code.
pub fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Generate(args) => generate(args),
        Command::MakeModel(args) => make_model(args),
        Command::Inspect { file } => inspect(&file),
        Command::Archs => {
            archs();
            Ok(())
        }
        Command::TraceStats { files, tokens } => trace_stats(&files, tokens),
    }
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

fn progress_bar(total: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    bar.set_style(
        indicatif::ProgressStyle::with_template("{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_message(what.to_string());
    bar
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
        let mut bar = None;
        synth::write_model(&spec, &path, &mut |done, total| {
            bar.get_or_insert_with(|| progress_bar(total, "generating demo model")).set_position(done);
        })
        .context("generating the demo model")?;
        if let Some(b) = bar {
            b.finish_and_clear();
        }
    }
    Ok(path)
}

fn generate(args: GenerateArgs) -> Result<()> {
    let config = resolve_config(&args)?;
    crate::llama::set_verbose(config.telemetry.verbose);
    let model = if config.model.path.as_os_str().is_empty() { demo_model()? } else { config.model.path.clone() };
    if !config.telemetry.route_trace.as_os_str().is_empty() && !config.moe.stream {
        bail!("--route-trace needs --moe-stream (routing is only observed while streaming)");
    }
    let mut session = Session::open(config.session_options(&model))?;
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
    let generation = session.generate(&request, &mut |event| match event {
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
    Ok(())
}

/// Loads the configured draft and drop plugins into the session.
fn attach_plugins(session: &mut Session, config: &RunConfig) -> Result<()> {
    let p = &config.plugins;
    let limits = Limits { call_ms: p.call_ms, memory_bytes: (p.memory_mb as usize) << 20 };
    if !p.draft_plugin.is_empty() {
        let params = parse_params("plugins.draft_params", &p.draft_params)?;
        let plugin = WasmDrafter::load(&Source::parse(&p.draft_plugin), &params, limits).map_err(|e| anyhow!(e))?;
        let i = plugin.info().clone();
        eprintln!("bmoe: draft plugin {} {} ({}), up to {} tokens per step", i.name, i.version, i.source, p.draft);
        session.set_drafter(Some(Drafter::new(&i.name, Box::new(plugin), session.n_vocab())), p.draft);
    }
    if !p.drop_plugin.is_empty() {
        let params = parse_params("plugins.drop_params", &p.drop_params)?;
        let plugin = WasmDropper::load(&Source::parse(&p.drop_plugin), &params, limits).map_err(|e| anyhow!(e))?;
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

fn make_model(a: MakeModelArgs) -> Result<()> {
    let preset =
        Preset::from_name(&a.preset).ok_or_else(|| anyhow!("--preset {}: expected tiny, demo or bench", a.preset))?;
    let arch = Arch::from_name(&a.arch)
        .ok_or_else(|| anyhow!("--arch {}: the generator makes {}", a.arch, Arch::ALL.map(Arch::name).join(", ")))?;
    let mut spec = ModelSpec::preset(preset, arch);
    if let Some(q) = &a.quant {
        let supported = [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0];
        spec.expert_type = GgmlType::from_name(q)
            .filter(|t| supported.contains(t))
            .ok_or_else(|| anyhow!("--quant {q}: the generator writes f32, f16, q8_0 or q4_0 experts"))?;
    }
    let set = |dst: &mut u32, v: Option<u32>| {
        if let Some(v) = v {
            *dst = v;
        }
    };
    set(&mut spec.layers, a.layers);
    set(&mut spec.embd, a.embd);
    set(&mut spec.experts, a.experts);
    set(&mut spec.experts_used, a.experts_used);
    set(&mut spec.expert_ff, a.expert_ff);
    set(&mut spec.split, a.split);
    if let Some(s) = a.seed {
        spec.seed = s;
    }
    let r = &mut spec.routing;
    for (dst, v) in [
        (&mut r.token_corr, a.token_corr),
        (&mut r.skew, a.skew),
        (&mut r.skew_first, a.skew_first),
        (&mut r.mix, a.mix),
    ] {
        if let Some(v) = v {
            *dst = v;
        }
    }
    let mut bar = None;
    let report = synth::write_model(&spec, &a.output, &mut |done, total| {
        bar.get_or_insert_with(|| progress_bar(total, "writing")).set_position(done);
    })?;
    if let Some(b) = bar {
        b.finish_and_clear();
    }
    for p in &report.paths {
        eprintln!("wrote {}", p.display());
    }
    eprintln!(
        "{} {} layers, {} experts (top-{}), {} experts: {:.1} MiB in {:.2} s ({:.0} MiB/s); random weights",
        arch.name(),
        spec.layers,
        spec.experts,
        spec.experts_used,
        spec.expert_type,
        report.bytes as f64 / 1048576.0,
        report.seconds,
        report.bytes as f64 / 1048576.0 / report.seconds.max(1e-9)
    );
    Ok(())
}

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / 1048576.0)
}

fn inspect(file: &Path) -> Result<()> {
    let files = ModelFiles::open(file)?;
    let meta = files.meta();
    let arch = meta.architecture().unwrap_or("(none)");
    let mut out = String::new();
    use std::fmt::Write as _;
    let n_layer = meta.arch_u64("block_count");
    let n_expert = meta.arch_u64("expert_count").unwrap_or(0);
    let k = meta.arch_u64("expert_used_count");
    let _ = writeln!(out, "file:          {}", file.display());
    if files.paths().len() > 1 {
        let _ = writeln!(out, "shards:        {}", files.paths().len());
    }
    let _ = writeln!(
        out,
        "gguf:          v{}, alignment {}, {} tensors",
        meta.version,
        meta.alignment,
        files.tensors().count()
    );
    let _ = writeln!(out, "architecture:  {arch}");
    let _ = writeln!(out, "layers:        {}", n_layer.map_or("?".into(), |v| v.to_string()));
    let _ = writeln!(
        out,
        "experts:       {n_expert} per layer, {} routed per token",
        k.map_or("?".into(), |v| v.to_string())
    );
    let (mut expert_bytes, mut dense_bytes) = (0u64, 0u64);
    // (layer) -> (slice bytes per expert over all projections, projections, types, aligned)
    let mut layers: std::collections::BTreeMap<u32, (u64, Vec<String>, bool)> = Default::default();
    for t in files.tensors() {
        match parse_expert_tensor(&t.info.name) {
            Some((layer, suffix)) if t.info.dims.len() == 3 && n_expert > 0 => {
                expert_bytes += t.info.size;
                let slice = t.info.size / n_expert;
                let e = layers.entry(layer).or_insert((0, Vec::new(), true));
                e.0 += slice;
                e.1.push(format!("{} {}", EXPERT_SUFFIXES[suffix], t.info.ty));
                e.2 &= t.file_offset % 4096 == 0 && slice % 4096 == 0;
            }
            _ => dense_bytes += t.info.size,
        }
    }
    let total = expert_bytes + dense_bytes;
    let _ = writeln!(
        out,
        "expert bytes:  {} ({:.1}% of weights)",
        mib(expert_bytes),
        100.0 * expert_bytes as f64 / total.max(1) as f64
    );
    let _ = writeln!(out, "dense bytes:   {} (stay resident while streaming)", mib(dense_bytes));
    if let Some((first, (slice, projs, _))) = layers.iter().next() {
        let uniform = layers.values().all(|(s, _, _)| s == slice);
        let _ = writeln!(
            out,
            "expert slice:  {} per expert per layer{} ({})",
            mib(*slice),
            if uniform { String::new() } else { format!(" in layer {first}; varies by layer") },
            projs.join(", ")
        );
        let _ = writeln!(out, "moe layers:    {} of {}", layers.len(), n_layer.unwrap_or(0));
        if let Some(k) = k {
            let per_token: u64 = layers.values().map(|(s, _, _)| s * k.min(n_expert)).sum();
            let _ = writeln!(out, "token demand:  {} read per token with no cache", mib(per_token));
        }
        let aligned = layers.values().all(|(_, _, a)| *a);
        let _ = writeln!(out, "page-aligned:  {}", if aligned { "yes" } else { "no (O_DIRECT reads aligned windows)" });
    }
    let verdict = match recipe::recipe_for(arch) {
        None => format!("no: architecture {arch} has no recipe (see `bmoe archs`)"),
        Some(_) if layers.is_empty() => "no: no expert tensors found".to_string(),
        Some(r) => {
            format!("yes ({:?} layout{})", r.layout, if r.gated { ", covered by byte-identity gates" } else { "" })
        }
    };
    let _ = writeln!(out, "streamable:    {verdict}");
    print!("{out}");
    Ok(())
}

fn archs() {
    println!("{:<12} {:<7} {:<6} {:<45} expert tensors", "arch", "layout", "gated", "models");
    for r in recipe::RECIPES {
        let tensors = match r.layout {
            recipe::Layout::Split => "ffn_{gate,up,down}_exps",
            recipe::Layout::Fused => "ffn_gate_up_exps + ffn_down_exps (or split)",
        };
        println!(
            "{:<12} {:<7} {:<6} {:<45} {tensors}",
            r.arch,
            format!("{:?}", r.layout).to_lowercase(),
            if r.gated { "yes" } else { "no" },
            r.models
        );
    }
    println!("\nStreamed: blk.<il>.<tensor>.weight whose dimension 2 indexes the expert. Everything else");
    println!("(attention, norms, routers, shared experts, .scale/.bias companions) stays resident.");
}

fn trace_stats(files: &[PathBuf], tokens: usize) -> Result<()> {
    if files.is_empty() {
        bail!("give at least one route-trace file");
    }
    println!(
        "{:<40} {:>6} {:>4} {:>6} {:>14} {:>8} {:>7} {:>7} {:>7} {:>7}",
        "trace", "layers", "k", "tokens", "distinct/layer", "overlap", "top10%", "lru10%", "lru25%", "lru50%"
    );
    for f in files {
        let text = std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?;
        let s = trace::analyze(&text, tokens, &[0.10, 0.25, 0.50]).map_err(|e| anyhow!("{}: {e}", f.display()))?;
        let name = f.file_name().map_or_else(|| f.display().to_string(), |n| n.to_string_lossy().into_owned());
        println!(
            "{:<40} {:>6} {:>4} {:>6} {:>6.1} [{:>2}-{:>3}] {:>8.3} {:>7.3} {:>7.3} {:>7.3} {:>7.3}",
            name,
            s.layers,
            s.k,
            s.decode_tokens,
            s.distinct_mean,
            s.distinct_min,
            s.distinct_max,
            s.prev_overlap,
            s.top10_share,
            s.lru_hits[0].1,
            s.lru_hits[1].1,
            s.lru_hits[2].1
        );
    }
    Ok(())
}
