//! `bmoe plugin`: list the bundled plugins, check and benchmark a plugin,
//! scaffold a new one.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Subcommand;

use crate::policy::wasm::{self, Limits, PluginInfo, Source, WasmDrafter, WasmDropper};
use crate::policy::{DraftPolicy, Drafter, DropCall, DropPolicy, Dropper, PluginKind, scaffold};

/// `bmoe plugin ...`
#[derive(Subcommand, Debug)]
pub enum PluginCommand {
    /// List the plugins built into bmoe.
    List,
    /// Load a plugin (bundled name or .wasm file), show what it declares and make a test call.
    Check {
        /// Bundled name or file.
        plugin: String,
        /// Parameters, name=value.
        #[arg(long = "param", value_name = "NAME=VALUE")]
        params: Vec<String>,
    },
    /// Time a plugin's calls: draft with a 4096-token context, or decide on a top-8 routing.
    Bench {
        /// Bundled name or file.
        plugin: String,
        /// Calls to time.
        #[arg(long, default_value_t = 20_000)]
        calls: usize,
        /// Context length for a drafter.
        #[arg(long, default_value_t = 4096)]
        context: usize,
        /// Parameters, name=value.
        #[arg(long = "param", value_name = "NAME=VALUE")]
        params: Vec<String>,
        /// For a drop plugin: also run it on this model (streamed, cache off, so every routed
        /// expert is a read it may avoid) and report the reads it avoided against the KL
        /// divergence from the exact run, teacher-forced over the bundled sample text.
        #[arg(short, long)]
        model: Option<PathBuf>,
        /// Positions of the sample text scored with --model.
        #[arg(long, default_value_t = 128)]
        tokens: usize,
    },
    /// Wrap a core module built with wit-bindgen into a component and check that it loads.
    Wrap {
        /// The core module (`target/wasm32-unknown-unknown/release/NAME.wasm`).
        core: PathBuf,
        /// Where to write the component.
        #[arg(short, long)]
        output: PathBuf,
    },
    /// Create a new plugin crate to build for wasm32-unknown-unknown.
    New {
        /// Crate and plugin name (lowercase, digits, - or _).
        name: String,
        /// drafter or dropper.
        #[arg(long)]
        kind: String,
        /// Where to create it (default: ./NAME).
        #[arg(long)]
        dir: Option<PathBuf>,
    },
}

/// Runs a plugin subcommand.
pub fn run(cmd: PluginCommand) -> Result<()> {
    match cmd {
        PluginCommand::List => list(),
        PluginCommand::Check { plugin, params } => check(&plugin, &params),
        PluginCommand::Bench { plugin, calls, context, params, model, tokens } => {
            if model.is_some() && matches!(load(&plugin, &self::params(&params)?)?, Loaded::Drafter(_)) {
                bail!(
                    "--model measures what a drop plugin costs; a draft plugin changes no output (`bmoe generate \
                     --draft-plugin` reports how many drafts it gets accepted)"
                );
            }
            bench(&plugin, calls, context, &params)?;
            match model {
                Some(model) => quality(&plugin, &params, model, tokens),
                None => Ok(()),
            }
        }
        PluginCommand::Wrap { core, output } => wrap(&core, &output),
        PluginCommand::New { name, kind, dir } => new(&name, &kind, dir),
    }
}

fn params(raw: &[String]) -> Result<Vec<(String, String)>> {
    crate::config::parse_params("--param", raw).map_err(|e| anyhow!(e))
}

enum Loaded {
    Drafter(WasmDrafter),
    Dropper(WasmDropper),
}

impl Loaded {
    fn info(&self) -> &PluginInfo {
        match self {
            Loaded::Drafter(d) => d.info(),
            Loaded::Dropper(d) => d.info(),
        }
    }
}

fn load(spec: &str, params: &[(String, String)]) -> Result<Loaded> {
    let source = Source::resolve(spec).map_err(|e| anyhow!(e))?;
    let limits = Limits::default();
    Ok(match wasm::kind_of(&source).map_err(|e| anyhow!(e))? {
        PluginKind::Drafter => Loaded::Drafter(WasmDrafter::load(&source, params, limits).map_err(|e| anyhow!(e))?),
        PluginKind::Dropper => Loaded::Dropper(WasmDropper::load(&source, params, limits).map_err(|e| anyhow!(e))?),
    })
}

fn wrap(core: &std::path::Path, output: &std::path::Path) -> Result<()> {
    let bytes = std::fs::read(core).with_context(|| format!("reading {}", core.display()))?;
    if !wasm::is_core_module(&bytes) {
        bail!("{} is not a core Wasm module", core.display());
    }
    let component = wasm::wrap_core_module(&bytes).map_err(|e| anyhow!("{} {e}", core.display()))?;
    std::fs::write(output, &component).with_context(|| format!("writing {}", output.display()))?;
    // Say whether this bmoe will load it (a plugin built for another
    // interface version is still a valid component).
    match wasm::kind_of(&Source::File(output.to_path_buf())) {
        Ok(kind) => println!("{}: {} plugin component, {} bytes", output.display(), kind.name(), component.len()),
        Err(e) => eprintln!("bmoe: note: wrote {}, but this bmoe will not load it: {e}", output.display()),
    }
    Ok(())
}

fn list() -> Result<()> {
    println!("{:<12} {:<8} {:<8} description", "name", "kind", "version");
    for name in wasm::bundled_names() {
        let loaded = load(name, &[])?;
        let i = loaded.info();
        println!("{:<12} {:<8} {:<8} {}", i.name, i.kind.name(), i.version, i.description);
        for (p, default, what) in &i.params {
            println!("{:<12}   {p} = {default}: {what}", "");
        }
    }
    println!("\nUse: bmoe generate --draft-plugin NAME [--draft-param k=v] | --drop-plugin NAME [--drop-param k=v]");
    Ok(())
}

fn check(spec: &str, raw: &[String]) -> Result<()> {
    let loaded = load(spec, &params(raw)?)?;
    let i = loaded.info().clone();
    println!("plugin:     {} {} ({})", i.name, i.version, i.source);
    println!("world:      {} (bmoe:policy@{})", i.kind.name(), i.interface);
    println!("about:      {}", i.description);
    for (p, default, what) in &i.params {
        println!("param:      {p} = {default}: {what}");
    }
    match loaded {
        Loaded::Drafter(d) => {
            let mut g = Drafter::new(&i.name, Box::new(d), 1 << 20);
            g.reset(&[10, 11, 12, 13, 10, 11, 12]);
            let out = g.draft(4);
            match g.take_notice() {
                Some(fault) => bail!("test call failed: {fault}"),
                None => println!("test call:  draft(4) after [10 11 12 13 10 11 12] -> {out:?}"),
            }
        }
        Loaded::Dropper(d) => {
            let mut g = Dropper::new(&i.name, Box::new(d), 8);
            let call = DropCall {
                layer: 0,
                experts: &[3, 1, 4, 6],
                weights: &[0.5, 0.3, 0.15, 0.05],
                resident: &[true, false, false, true],
                k: 4,
            };
            let out = g.decide(&call);
            match g.take_notice() {
                Some(fault) => bail!("test call failed: {fault}"),
                None => println!(
                    "test call:  decide(experts [3 1 4 6], weights [0.5 0.3 0.15 0.05], resident [y n n y]) -> drop {:?}",
                    out.map(|m| call.experts.iter().zip(m).filter(|(_, d)| *d).map(|(e, _)| *e).collect::<Vec<_>>())
                        .unwrap_or_default()
                ),
            }
        }
    }
    println!("result:     ok");
    Ok(())
}

/// A source-code-like token stream: blocks that recur with small edits.
fn repetitive_context(len: usize) -> Vec<i32> {
    let mut seed = 0x2545_f491_4f6c_dd1du64;
    let mut next = |m: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % m
    };
    let blocks: Vec<Vec<i32>> = (0..24).map(|_| (0..(8 + next(24))).map(|_| next(900) as i32).collect()).collect();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        let b = &blocks[next(blocks.len() as u64) as usize];
        out.extend(b.iter().map(|&t| if next(10) == 0 { next(900) as i32 } else { t }));
    }
    out.truncate(len);
    out
}

fn percentiles(mut ns: Vec<u64>) -> (f64, f64) {
    ns.sort_unstable();
    let at = |q: f64| ns[((ns.len() - 1) as f64 * q) as usize] as f64 / 1000.0;
    (at(0.5), at(0.9))
}

fn bench(spec: &str, calls: usize, context: usize, raw: &[String]) -> Result<()> {
    if calls == 0 {
        bail!("--calls must be at least 1");
    }
    let loaded = load(spec, &params(raw)?)?;
    let name = loaded.info().name.clone();
    match loaded {
        Loaded::Drafter(mut d) => {
            let ctx = repetitive_context(context + calls);
            d.reset(&ctx[..context]).map_err(|e| anyhow!(e))?;
            let (mut draft_ns, mut observe_ns, mut drafted) = (Vec::with_capacity(calls), Vec::with_capacity(calls), 0);
            for i in 0..calls {
                let t = Instant::now();
                drafted += d.draft(4).map_err(|e| anyhow!(e))?.len();
                draft_ns.push(t.elapsed().as_nanos() as u64);
                let t = Instant::now();
                d.observe(&ctx[context + i..context + i + 1]).map_err(|e| anyhow!(e))?;
                observe_ns.push(t.elapsed().as_nanos() as u64);
            }
            let (d50, d90) = percentiles(draft_ns);
            let (o50, o90) = percentiles(observe_ns);
            println!(
                "{name}: draft(4) with a {context}-token context: median {d50:.2} us, p90 {d90:.2} us ({calls} calls)"
            );
            println!("{name}: observe(1 token): median {o50:.2} us, p90 {o90:.2} us");
            println!("{name}: {:.2} tokens drafted per call on this repetitive stream", drafted as f64 / calls as f64);
        }
        Loaded::Dropper(mut d) => {
            let mut seed = 7u64;
            let mut ns = Vec::with_capacity(calls);
            let mut dropped = 0;
            for i in 0..calls {
                seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let experts: Vec<u32> = (0..8).map(|s| ((seed >> (s * 7)) % 16) as u32 * 8 + s as u32).collect();
                let mut weights: Vec<f32> = (0..8).map(|s| 1.0 / (s as f32 + 1.0)).collect();
                let sum: f32 = weights.iter().sum();
                weights.iter_mut().for_each(|w| *w /= sum);
                let resident: Vec<bool> = (0..8).map(|s| (seed >> (40 + s)) & 1 == 1).collect();
                let call = DropCall {
                    layer: (i % 48) as u32,
                    experts: &experts,
                    weights: &weights,
                    resident: &resident,
                    k: 8,
                };
                let t = Instant::now();
                dropped += d.decide(&call).map_err(|e| anyhow!(e))?.len();
                ns.push(t.elapsed().as_nanos() as u64);
            }
            let (m50, m90) = percentiles(ns);
            println!("{name}: decide(top-8 of 128): median {m50:.2} us, p90 {m90:.2} us ({calls} calls)");
            println!("{name}: {:.2} experts dropped per call on random routings", dropped as f64 / calls as f64);
        }
    }
    Ok(())
}

/// What a drop plugin costs on a model: the exact streamed run against
/// the same run with the plugin, by `bmoe eval`'s measure.
fn quality(spec: &str, raw: &[String], model: PathBuf, tokens: usize) -> Result<()> {
    let base = super::generate::RunFlags {
        model: Some(model),
        moe_stream: Some(crate::config::StreamMode::On),
        cache_mb: Some(crate::config::CacheMb::Mib(0.0)),
        ..Default::default()
    };
    let with_plugin = super::generate::RunFlags {
        drop_plugin: Some(spec.to_string()),
        drop_params: raw.to_vec(),
        ..Default::default()
    }
    .over(&base);
    let settings = [super::eval::Setting { name: spec.to_string(), flags: with_plugin }];
    let results = super::eval::measure(&base, &settings, crate::eval::text::SAMPLE, tokens, None)?;
    super::eval::print_table(&results)
}

fn new(name: &str, kind: &str, dir: Option<PathBuf>) -> Result<()> {
    if !scaffold::valid_name(name) {
        bail!("plugin name `{name}`: use lowercase letters, digits, - and _, starting with a letter");
    }
    let kind = match kind {
        "drafter" => PluginKind::Drafter,
        "dropper" => PluginKind::Dropper,
        other => bail!("--kind {other}: expected drafter or dropper"),
    };
    let dir = dir.unwrap_or_else(|| PathBuf::from(name));
    if dir.exists() && dir.read_dir().map(|mut d| d.next().is_some()).unwrap_or(true) {
        bail!("{} already exists and is not empty", dir.display());
    }
    for (path, text) in scaffold::files(name, kind) {
        let p = dir.join(path);
        if let Some(parent) = p.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&p, text)?;
    }
    eprintln!("created {} plugin `{name}` in {}", kind.name(), dir.display());
    eprintln!(
        "next: cd {} && cargo build --release && bmoe plugin check target/wasm32-unknown-unknown/release/{}.wasm",
        dir.display(),
        name.replace('-', "_")
    );
    Ok(())
}
