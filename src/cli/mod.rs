//! The command line: `generate`, `repl`, `template`, `make-model`,
//! `inspect`, `archs`, `trace-stats`, `plugin` and `rpc-server`.

mod bench;
mod cache;
mod eval;
mod fit;
mod generate;
mod kernels;
mod model;
mod models;
mod plugin;
mod pull;
mod replay;
mod rpc_server;
mod run;
mod serve;
mod template;

use std::path::PathBuf;

use anyhow::Result;
use clap::{Parser, Subcommand};

use crate::interrupt;

pub use crate::host::resolve_model;
pub use generate::{GenerateArgs, RunFlags, SessionFlags, TurnFlags, open_host, resolve_config};
pub use model::MakeModelArgs;
pub use plugin::PluginCommand;

/// bmoe runs Mixture-of-Experts models larger than RAM by reading only the
/// routed experts from disk, with output identical to a fully resident run.
#[derive(Parser, Debug)]
#[command(name = "bmoe", version, long_version = LONG_VERSION.as_str(), about, long_about = None)]
pub struct Cli {
    /// No notes on stderr (errors and the run's summary stay).
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// `bmoe --version`: the version, then how its llama.cpp was built for this
/// CPU (the features it uses), so a slow build shows itself.
static LONG_VERSION: std::sync::LazyLock<String> = std::sync::LazyLock::new(long_version);

fn long_version() -> String {
    let build = match (env!("BMOE_GGML_NATIVE"), env!("BMOE_GGML_ARM_ARCH")) {
        ("ON", _) => "for this host's CPU (GGML_NATIVE=ON)".to_string(),
        ("OFF", "") => "portable (GGML_NATIVE=OFF; see the README to build for the host CPU)".to_string(),
        ("OFF", arch) => {
            format!("portable for -march={arch} (GGML_NATIVE=OFF; docs/edge.md builds for the device's CPU)")
        }
        _ => "unknown".to_string(),
    };
    let layouts = crate::llama::cpu_layouts::repacked_layouts();
    let layouts = if layouts.is_empty() { "none on this CPU".to_string() } else { layouts.join(", ") };
    format!(
        "{}\nllama.cpp build: {build}\nllama.cpp CPU: {}\nrepacked layouts: {layouts} (--repack)",
        env!("CARGO_PKG_VERSION"),
        crate::llama::cpu_features()
    )
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub enum Command {
    /// Generate text from a prompt (stdout carries only the generated text).
    Generate(GenerateArgs),
    /// Chat with a model in a full-screen terminal app with a live expert-routing panel
    /// (`?` shows the keys); without a model, the demo model with streaming on.
    Chat(SessionFlags),
    /// Chat with a model in a line REPL (`:help` lists its commands); reads a pipe too.
    Repl(SessionFlags),
    /// Print the prompt a chat template renders for a conversation.
    Template(template::TemplateArgs),
    /// Write a synthetic MoE model (random weights, real architecture).
    MakeModel(MakeModelArgs),
    /// Download a model from the Hugging Face Hub (OWNER/NAME[:QUANT]) into the hub cache, resumably
    /// and checked against the hub's SHA-256; prints the file to pass as -m (or use -hf OWNER/NAME).
    Pull(pull::PullArgs),
    /// Whether a model runs on this machine, resident or streamed, with which cache, reading how
    /// much a token and how fast (estimated from its header and probes of this machine's memory,
    /// disk and compute); from the hub before pulling (headers by range requests), with the
    /// repository's other quantizations.
    Fit(fit::FitArgs),
    /// The GGUF models on this machine (hub cache, demo models, files runs opened): size,
    /// architecture, type, whether they stream, copies, last use; `models rm` removes one.
    Models {
        /// What to do (default: list).
        #[command(subcommand)]
        command: Option<models::ModelsCommand>,
    },
    /// Describe a GGUF model and whether bmoe can stream it.
    Inspect {
        /// The model: a file (the first shard of a split set), or a hub model as `pull` takes it
        /// (OWNER/NAME[:QUANT], hf: in front or not) or as `bmoe models` lists it, from the hub cache.
        #[arg(value_name = "MODEL", required_unless_present_any = ["model", "hf"])]
        file: Option<String>,
        /// The model, as the other commands take it with -m.
        #[arg(short, long, conflicts_with = "file")]
        model: Option<String>,
        /// A hub model, OWNER/NAME[:QUANT] (also written -hf), from the hub cache.
        #[arg(long = "hf", value_name = "OWNER/NAME[:QUANT]", conflicts_with_all = ["file", "model"])]
        hf: Option<String>,
    },
    /// List the MoE architectures of the pinned llama.cpp and whether bmoe streams them: gated
    /// `yes` (a synthetic model of each streams bit-identical to resident in the tests), `-`
    /// (streams by capability, with a notice), `NO` (not a left-to-right text generator bmoe can run:
    /// the reason is listed under the table).
    Archs,
    /// Measure routing skew and stability in route traces.
    TraceStats {
        /// Route trace files (from --route-trace, or the reference engine's).
        files: Vec<PathBuf>,
        /// Decode tokens to analyse from each trace.
        #[arg(long, default_value_t = 128)]
        tokens: usize,
    },
    /// Answer the OpenAI (chat and text completions, Responses), Anthropic Messages and Ollama HTTP
    /// APIs and serve a chat page, for any client, editor or agent; without a model, the demo model.
    Serve(serve::ServeArgs),
    /// Run a Rhai experiment script: sweeps, A/B runs, trace replays, CSV and charts.
    Run(run::RunArgs),
    /// Replay route traces through the expert cache under several policies and budgets (what-if).
    Replay(replay::ReplayArgs),
    /// Measure what lossy settings cost: KL divergence from the exact run and top-1 agreement,
    /// teacher-forced over a text, beside each setting's speed and bytes read.
    #[command(
        override_usage = "bmoe eval [-m MODEL] [EXACT RUN'S FLAGS] (--against [NAME=]FLAGS... | --branches) [OPTIONS]"
    )]
    Eval(eval::EvalArgs),
    /// Benchmark a model under a memory cap: a matrix of configurations, repeated, as a table and CSV.
    Bench(bench::BenchArgs),
    /// Draft and drop policy plugins: list, check, bench, wrap, scaffold a new one.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// List and remove what bmoe keeps in its cache directory: the lean and repacked copies of
    /// streamed models and the demo models, with their room on disk and last use.
    Cache {
        /// What to do (default: list).
        #[command(subcommand)]
        command: Option<cache::CacheCommand>,
    },
    /// Lend this machine's CPU to a client that holds some of a model's layers here
    /// (`--rpc HOST:PORT` on the client; llama.cpp's RPC protocol, no authentication).
    RpcServer(rpc_server::RpcServerArgs),
    /// Probe which CPU matmul kernels of the linked llama.cpp give a column the same bits whatever
    /// the width of the call (what batch invariance rests on; docs/architecture.md).
    Kernels(kernels::KernelsArgs),
}

/// Runs the command line.
pub fn run(cli: Cli) -> Result<()> {
    if cli.quiet {
        crate::notes::set_verbosity(crate::notes::Verbosity::Quiet);
    }
    match cli.command {
        Command::Generate(args) => generate::generate(args),
        Command::Chat(flags) => chat(&flags),
        Command::Repl(flags) => repl(&flags),
        Command::Template(args) => template::template(args),
        Command::MakeModel(args) => model::make_model(args),
        Command::Pull(args) => pull::pull(args),
        Command::Fit(args) => fit::fit(args),
        Command::Models { command } => models::models(command),
        Command::Inspect { file, model, hf } => {
            let name = file.or(model).or(hf.map(|h| format!("hf:{}", h.trim_start_matches("hf:"))));
            model::inspect(&local_model(name.as_deref().unwrap_or_default())?)
        }
        Command::Archs => print_stdout(&model::archs()),
        Command::Kernels(args) => kernels::kernels(args),
        Command::TraceStats { files, tokens } => model::trace_stats(&files, tokens),
        Command::Plugin(cmd) => plugin::run(cmd),
        Command::Bench(args) => bench::bench(args),
        Command::Eval(args) => eval::eval(args),
        Command::Replay(args) => replay::replay_traces(args),
        Command::Run(args) => run::run(args),
        Command::Serve(args) => serve::serve(args),
        Command::RpcServer(args) => rpc_server::rpc_server(args),
        Command::Cache { command } => cache::cache(command),
    }
}

/// The demo's cache budget in `bmoe chat`: a quarter of its expert bank,
/// about two tokens' working set, so hits and reads are both visible.
const DEMO_CHAT_CACHE_MIB: f64 = 64.0;

/// `bmoe chat`: a host (the demo model, streaming with a small cache, when
/// no model is given), then the full-screen chat.
fn chat(flags: &SessionFlags) -> Result<()> {
    use std::io::IsTerminal;
    if !std::io::stdout().is_terminal() || !std::io::stdin().is_terminal() {
        anyhow::bail!("bmoe chat needs a terminal; `bmoe repl` reads and writes pipes");
    }
    let mut config = resolve_config(&flags.run, &flags.turn)?;
    let demo = config.model.path.as_os_str().is_empty();
    if demo && flags.run.config.is_none() && flags.run.cache_mb.is_none() && flags.run.moe_stream.is_none() {
        config.moe.stream = crate::config::StreamMode::On;
        config.moe.cache_mb = crate::config::CacheMb::Mib(DEMO_CHAT_CACHE_MIB);
    }
    let host = open_host(config, true)?;
    crate::ui::chat::run(host, demo)
}

/// `bmoe repl`: a host, Ctrl-C wired to stop replies, the REPL loop.
fn repl(flags: &SessionFlags) -> Result<()> {
    let config = resolve_config(&flags.run, &flags.turn)?;
    let mut host = open_host(config, true)?;
    let _forward = interrupt::Forward::to(host.abort_handle().flag())?;
    crate::ui::repl::run(&mut host)
}

/// Prints a report on stdout; a reader that went away (`bmoe archs | head`)
/// is not an error.
fn print_stdout(text: &str) -> Result<()> {
    use std::io::Write as _;
    match std::io::stdout().lock().write_all(text.as_bytes()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(anyhow::anyhow!("writing to stdout: {e}")),
        _ => Ok(()),
    }
}

/// A model named as every command takes it (a file, or a hub model as
/// `pull` takes it or `models` lists it), as a file on this machine:
/// nothing is downloaded.
pub(super) fn local_model(name: &str) -> Result<PathBuf> {
    let named = crate::hub::ModelRef::parse(name).map_err(anyhow::Error::msg)?;
    named.local(&crate::hub::HubSettings::from_env()).map_err(anyhow::Error::msg)
}
