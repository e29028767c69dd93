//! `bmoe generate`: configuration, the demo model, plugins, telemetry sinks.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{Result, anyhow, bail};
use clap::Args;

use crate::chat::Kind;
use crate::config::{BatchInvariance, CacheMb, RunConfig};
use crate::host::{Cut, Host, HostEvent, StopScan};
use crate::interrupt::{self, Forward};

/// `bmoe generate`
#[derive(Args, Debug, Default)]
pub struct GenerateArgs {
    /// Prompt text.
    #[arg(short, long, default_value = "The capital of Japan is")]
    pub prompt: String,
    /// Apply the model's chat template to the prompt (one user turn); the
    /// answer goes to stdout, any reasoning to stderr.
    #[arg(long)]
    pub chat: bool,
    /// With --chat: begin the reply with TEXT, and let the model go on from it (stdout gets what it
    /// adds).
    #[arg(long, value_name = "TEXT", requires = "chat")]
    pub prefill: Option<String>,
    /// First decode the prompt for N tokens without output or telemetry and forget them (the
    /// expert cache stays filled): for measuring a warm run.
    #[arg(long, value_name = "N", default_value_t = 0)]
    pub warmup: u32,
    /// Write a digest of every generated token's logits to this file (`STEP HEX` lines; the
    /// run's digest goes to stderr): two runs are bit-identical when the files are, e.g.
    /// `cmp a.txt b.txt`. Keeps the run's logits in memory until it ends.
    #[arg(long, value_name = "FILE")]
    pub logits_digest: Option<PathBuf>,
    /// Model and engine settings.
    #[command(flatten)]
    pub run: RunFlags,
    /// Length, sampling, chat and telemetry settings.
    #[command(flatten)]
    pub turn: TurnFlags,
}

/// What `chat` and `repl` take: the model and engine settings, and what
/// each turn generates.
#[derive(Args, Debug, Default, Clone)]
pub struct SessionFlags {
    /// Model and engine settings.
    #[command(flatten)]
    pub run: RunFlags,
    /// Length, sampling, chat and telemetry settings.
    #[command(flatten)]
    pub turn: TurnFlags,
}

/// The model and engine settings every command that runs a model takes;
/// each overrides the `bmoe.toml` field in brackets.
#[derive(Args, Debug, Default, Clone)]
pub struct RunFlags {
    /// Model file (or hf:OWNER/NAME[:QUANT], pulled from the Hugging Face Hub); without one, a
    /// random-weight demo model is generated once and used.
    #[arg(short, long)]
    pub model: Option<PathBuf>,
    /// A model on the Hugging Face Hub, OWNER/NAME[:QUANT] (also written -hf): downloaded into the hub
    /// cache on first use (as `bmoe pull`), then opened from there.
    #[arg(long = "hf", value_name = "OWNER/NAME[:QUANT]", conflicts_with = "model")]
    pub hf: Option<String>,
    /// Read a bmoe.toml; flags override it.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Stream routed experts from disk instead of keeping the model mapped: alone or `on`, always;
    /// `off`, never; `auto`, when the model and its context do not fit the memory this process may
    /// use (the cgroup limit included), as `bmoe fit` judges it [moe.stream, default auto].
    #[arg(long, value_name = "auto|on|off", num_args = 0..=1, require_equals = true, default_missing_value = "on")]
    pub moe_stream: Option<crate::config::StreamMode>,
    /// Expert cache budget: auto (sized from the memory available and the cgroup limit), or MiB,
    /// fractions allowed (0 = re-read routed experts every token) [moe.cache_mb, default auto].
    #[arg(long, value_name = "auto|MIB")]
    pub cache_mb: Option<CacheMb>,
    /// Upper bound of an auto cache budget in MiB [moe.cache_ceil_mb].
    #[arg(long, value_name = "MIB")]
    pub cache_ceil_mb: Option<f64>,
    /// Accept a fixed cache budget below one token's working set [moe.force_cache].
    #[arg(long)]
    pub force_cache: bool,
    /// Which cached expert is evicted first: decay (fewest recent uses, halving every 12 tokens)
    /// or lru (least recently used) [moe.cache_policy, default decay].
    #[arg(long, value_name = "decay|lru")]
    pub cache_policy: Option<String>,
    /// The model's route profile, per-expert routing counts kept in bmoe's cache directory
    /// (`bmoe cache` lists them): update (its prior steers evictions and warms the cache at open;
    /// this run's routing is added), read (used, not changed) or off [moe.route_profile, default
    /// update].
    #[arg(long, value_name = "MODE")]
    pub route_profile: Option<String>,
    /// How dense weights are held while streaming: auto (anon when they take at most 64 MiB,
    /// mmap otherwise), mmap (llama.cpp's mapping), warm (touched once at open), anon (copied
    /// into bmoe's memory, safe from page-cache eviction) [moe.dense_weights, default auto].
    #[arg(long, value_name = "MODE")]
    pub dense_weights: Option<String>,
    /// Expert banks for the CPU's faster repacked kernels (types by CPU: `bmoe --version`):
    /// auto (resident: when the model file fits in the memory available; streamed: when read
    /// from a whole repacked copy, or the file fits), on, off [model.repack, default auto]. Output is identical
    /// streamed and resident with the same choice.
    #[arg(long, value_name = "auto|on|off")]
    pub repack: Option<String>,
    /// RPC servers (`bmoe rpc-server` on other machines) that hold the model's last layers and
    /// its output head, HOST:PORT[,HOST:PORT...]; the first layers stay here [model.rpc].
    #[arg(long, value_name = "HOST:PORT,...")]
    pub rpc: Option<String>,
    /// Layers on the RPC servers: one count per server, or one total split by their free memory
    /// [model.rpc_layers, default: as many as the servers' free memory holds].
    #[arg(long, value_name = "N[,N...]")]
    pub rpc_layers: Option<String>,
    /// Parallel read lanes [moe.io_threads, default 4].
    #[arg(long)]
    pub io_threads: Option<u32>,
    /// Read experts through the page cache instead of O_DIRECT.
    #[arg(long)]
    pub no_odirect: bool,
    /// Read experts with plain positioned reads instead of io_uring into cache memory
    /// registered at open (which pins no page per read) [moe.io_uring = false].
    #[arg(long)]
    pub no_io_uring: bool,
    /// Experts routed per token (fewer than the model's own is lossy).
    #[arg(long)]
    pub n_expert_used: Option<u32>,
    /// While a layer computes, read ahead the experts the previous token routed in the next N
    /// layers (lossless; needs the cache) [moe.prefetch, default 0].
    #[arg(long, value_name = "N")]
    pub prefetch: Option<u32>,
    /// Do not run the next layer's router early to read ahead the experts it will pick (on by
    /// default when the expert cache is on; lossless either way) [moe.predict = false].
    #[arg(long)]
    pub no_predict: bool,
    /// How many next layers' routers to run early (1-4; two let a layer's reads start a layer
    /// earlier, at some accuracy: the farther layer's guess is right less often)
    /// [moe.predict_layers, default 2].
    #[arg(long, value_name = "N")]
    pub predict_layers: Option<u32>,
    /// Do not read ahead while processing a prompt (by default the next layer's router runs on
    /// every prompt token of the micro-batch and the union of its choices is read while the
    /// layer computes; lossless either way) [moe.prefill_read_ahead = false].
    #[arg(long)]
    pub no_prefill_read_ahead: bool,
    /// While streaming, load the model file itself instead of a lean copy with the expert bytes
    /// left out (made when the model is larger than the memory available and has 1 GiB of
    /// experts or more, so opening reads only the dense weights; kept in the cache directory)
    /// [moe.lean_open = false].
    #[arg(long)]
    pub no_lean_open: bool,
    /// Release an evicted expert's memory and let the next read fault in fresh zeroed pages,
    /// instead of moving its pages under the next expert read (the default on Linux: it saves
    /// the kernel's page allocation and zeroing on every cache miss) [moe.recycle_pages = false].
    #[arg(long)]
    pub no_page_recycle: bool,
    /// Repack each streamed expert as it is read instead of reading it from a copy of the
    /// experts stored repacked in the cache directory (written once, the experts' size on disk)
    /// [moe.repacked_copy = false].
    #[arg(long)]
    pub no_repacked_copy: bool,
    /// Most disk a model's repacked copy may take, in GiB; past it the copy is partial (only the
    /// experts read so far) [moe.repacked_copy_max_gb, default 0: half the free space].
    #[arg(long, value_name = "GIB")]
    pub repacked_copy_max_gb: Option<f64>,
    /// Compute threads; 0 = tuned while decoding between 1 and one per core, together with
    /// read-ahead on or off, so a busy core elsewhere does not stall every step; a number fixes
    /// both [generate.threads, default 0].
    #[arg(short, long)]
    pub threads: Option<u32>,
    /// Context length in tokens [generate.ctx_size, default 4096].
    #[arg(short = 'c', long)]
    pub ctx_size: Option<u32>,
    /// Most prompt tokens per decode call [generate.batch, default 512].
    #[arg(long)]
    pub batch: Option<u32>,
    /// Most tokens per graph computation [generate.ubatch, default 512].
    #[arg(long)]
    pub ubatch: Option<u32>,
    /// Batch-invariant kernels: a reply's logits bitwise the same whatever else is decoded beside
    /// it and however its prompt is split (what `bmoe serve` and drafts use by default), at the
    /// cost of llama.cpp's fastest prompt kernels [generate.batch_invariant = true; default auto:
    /// on for serve and with drafts].
    #[arg(long, conflicts_with = "no_batch_invariant")]
    pub batch_invariant: bool,
    /// llama.cpp's fastest kernels even for a server or drafts (llamafile's sgemm, the tiled
    /// matmul, tiled and split flash attention, op fusion, one KV buffer for all of a server's
    /// slots): a server's greedy
    /// replies may then differ from the same request sent alone [generate.batch_invariant = false].
    #[arg(long)]
    pub no_batch_invariant: bool,
    /// Speculative decoding with this draft plugin: ngram, ngram-multi, suffix, or a .wasm file.
    #[arg(long, help_heading = "Plugins")]
    pub draft_plugin: Option<String>,
    /// Most tokens drafted per step [plugins.draft, default 3].
    #[arg(long, help_heading = "Plugins")]
    pub draft: Option<u32>,
    /// Speculative decoding with the model's own MTP layers (GLM-4.5+, DeepSeek-V3, ...) [plugins.mtp].
    #[arg(long, help_heading = "Plugins")]
    pub mtp: bool,
    /// An MTP draft stops before a token its head gives less probability than this [plugins.mtp_p_min, default 0.5].
    #[arg(long, value_name = "P", help_heading = "Plugins")]
    pub mtp_p_min: Option<f32>,
    /// Which routed experts a streamed MTP layer drafts with: cached (those in the expert cache, reading at most
    /// one per draft token) or all [plugins.mtp_experts, default cached].
    #[arg(long, value_name = "cached|all", help_heading = "Plugins")]
    pub mtp_experts: Option<String>,
    /// A draft-plugin parameter, name=value (repeatable).
    #[arg(long = "draft-param", value_name = "NAME=VALUE", help_heading = "Plugins")]
    pub draft_params: Vec<String>,
    /// Drop routed experts with this plugin (lossy): drop-cold, or a .wasm file.
    #[arg(long, help_heading = "Plugins")]
    pub drop_plugin: Option<String>,
    /// A drop-plugin parameter, name=value (repeatable), e.g. F=0.75.
    #[arg(long = "drop-param", value_name = "NAME=VALUE", help_heading = "Plugins")]
    pub drop_params: Vec<String>,
    /// Show llama.cpp's log.
    #[arg(short, long)]
    pub verbose: bool,
}

/// What a turn generates and where its records go: length, sampling,
/// constraints, the chat template's settings and the telemetry files;
/// each overrides the `bmoe.toml` field in brackets. `eval`, which scores
/// given text, takes none of them.
#[derive(Args, Debug, Default, Clone)]
pub struct TurnFlags {
    /// Most tokens a reply generates; 0 = no budget, the reply ends where the model ends it or the
    /// context is full (the demo model gets 128) [generate.n_predict, default 0].
    #[arg(short = 'n', long)]
    pub n_predict: Option<u32>,
    /// Sampling temperature (0 = greedy) [generate.temp, default 0].
    #[arg(long)]
    pub temp: Option<f64>,
    /// Top-k sampling stage (0 = off) [generate.top_k, default 40].
    #[arg(long)]
    pub top_k: Option<i32>,
    /// Top-p sampling stage (1 = off) [generate.top_p, default 0.95].
    #[arg(long)]
    pub top_p: Option<f64>,
    /// Min-p sampling stage: drop tokens less likely than this fraction of the top one (0 = off)
    /// [generate.min_p, default 0].
    #[arg(long, value_name = "P")]
    pub min_p: Option<f64>,
    /// Locally typical sampling's mass (1 = off) [generate.typical_p, default 1].
    #[arg(long, value_name = "P")]
    pub typical_p: Option<f64>,
    /// Divide the logits of tokens generated in the last --repeat-last-n tokens (1 = off; greedy
    /// too) [generate.repeat_penalty, default 1].
    #[arg(long, value_name = "R")]
    pub repeat_penalty: Option<f64>,
    /// Subtract this per time a token was generated lately, -2 to 2 [generate.frequency_penalty,
    /// default 0].
    #[arg(long, value_name = "F", allow_hyphen_values = true)]
    pub frequency_penalty: Option<f64>,
    /// Subtract this once from a token generated lately, -2 to 2 [generate.presence_penalty,
    /// default 0].
    #[arg(long, value_name = "P", allow_hyphen_values = true)]
    pub presence_penalty: Option<f64>,
    /// The penalties' window in generated tokens (0 = none, -1 = the context)
    /// [generate.repeat_last_n, default 64].
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub repeat_last_n: Option<i32>,
    /// Add to tokens' logits by id: ID=BIAS[,ID=BIAS...] (-inf bans a token) [generate.logit_bias].
    #[arg(long, value_name = "ID=BIAS,...")]
    pub logit_bias: Option<String>,
    /// Sampling seed [generate.seed, default 0].
    #[arg(long)]
    pub seed: Option<u32>,
    /// A GBNF grammar file the generated text must follow (llama.cpp's grammar sampler) [generate.grammar].
    #[arg(long, value_name = "FILE.gbnf")]
    pub grammar: Option<PathBuf>,
    /// A JSON schema the generated text must follow: a file, or the schema itself ({...}) [generate.json_schema].
    #[arg(long, value_name = "FILE|JSON")]
    pub json_schema: Option<String>,
    /// Write per-token metrics to this CSV file.
    #[arg(long)]
    pub csv: Option<PathBuf>,
    /// Write per-token routing to this route-trace file (needs --moe-stream).
    #[arg(long)]
    pub route_trace: Option<PathBuf>,
    /// Turn the model's reasoning off in chat turns [chat.think].
    #[arg(long, help_heading = "Chat")]
    pub no_think: bool,
    /// How much to think, where the template takes it (gpt-oss, Hunyuan, Kimi-K3) [chat.reasoning_effort].
    #[arg(long, value_name = "low|medium|high", help_heading = "Chat")]
    pub reasoning_effort: Option<String>,
    /// A JSON file of functions the model may call (OpenAI-style tool list), shown by its chat template [chat.tools].
    #[arg(long, value_name = "FILE.json", help_heading = "Chat")]
    pub tools: Option<PathBuf>,
    /// `required`: a reply to a user message must be one tool call, in the template's format [chat.tool_choice].
    #[arg(long, value_name = "auto|required", help_heading = "Chat")]
    pub tool_choice: Option<String>,
    /// A .jinja chat template (or a bundled one's name, e.g. glm-4.7) instead of the model's own [chat.template].
    #[arg(long, value_name = "FILE|NAME", help_heading = "Chat")]
    pub chat_template: Option<PathBuf>,
    /// System prompt of chat turns [chat.system].
    #[arg(long, help_heading = "Chat")]
    pub system: Option<String>,
    /// Read special-token markers written in a message's text (`<|im_start|>`...) as control
    /// tokens, as llama-server does; by default a message's text is text, so a user cannot forge a
    /// turn [chat.markers_in_content].
    #[arg(long, help_heading = "Chat")]
    pub markers_in_content: bool,
}

impl RunFlags {
    /// These flags given on top of `base`: each flag given here wins, the
    /// others keep `base`'s value (switches stay on where either turns
    /// them on; a list given here replaces `base`'s).
    pub fn over(self, base: &RunFlags) -> RunFlags {
        // Every field named, so a new flag cannot be forgotten here.
        let RunFlags {
            model,
            hf,
            config,
            moe_stream,
            cache_mb,
            cache_ceil_mb,
            force_cache,
            cache_policy,
            route_profile,
            dense_weights,
            repack,
            rpc,
            rpc_layers,
            io_threads,
            no_odirect,
            no_io_uring,
            n_expert_used,
            prefetch,
            no_predict,
            predict_layers,
            no_prefill_read_ahead,
            no_lean_open,
            no_page_recycle,
            no_repacked_copy,
            repacked_copy_max_gb,
            threads,
            ctx_size,
            batch,
            ubatch,
            batch_invariant,
            no_batch_invariant,
            draft_plugin,
            draft,
            mtp,
            mtp_p_min,
            mtp_experts,
            draft_params,
            drop_plugin,
            drop_params,
            verbose,
        } = self;
        RunFlags {
            model: model.or_else(|| base.model.clone()),
            hf: hf.or_else(|| base.hf.clone()),
            config: config.or_else(|| base.config.clone()),
            moe_stream: moe_stream.or(base.moe_stream),
            cache_mb: cache_mb.or(base.cache_mb),
            cache_ceil_mb: cache_ceil_mb.or(base.cache_ceil_mb),
            force_cache: force_cache || base.force_cache,
            cache_policy: cache_policy.or_else(|| base.cache_policy.clone()),
            route_profile: route_profile.or_else(|| base.route_profile.clone()),
            dense_weights: dense_weights.or_else(|| base.dense_weights.clone()),
            repack: repack.or_else(|| base.repack.clone()),
            rpc: rpc.or_else(|| base.rpc.clone()),
            rpc_layers: rpc_layers.or_else(|| base.rpc_layers.clone()),
            io_threads: io_threads.or(base.io_threads),
            no_odirect: no_odirect || base.no_odirect,
            no_io_uring: no_io_uring || base.no_io_uring,
            n_expert_used: n_expert_used.or(base.n_expert_used),
            prefetch: prefetch.or(base.prefetch),
            no_predict: no_predict || base.no_predict,
            predict_layers: predict_layers.or(base.predict_layers),
            no_prefill_read_ahead: no_prefill_read_ahead || base.no_prefill_read_ahead,
            no_lean_open: no_lean_open || base.no_lean_open,
            no_page_recycle: no_page_recycle || base.no_page_recycle,
            no_repacked_copy: no_repacked_copy || base.no_repacked_copy,
            repacked_copy_max_gb: repacked_copy_max_gb.or(base.repacked_copy_max_gb),
            threads: threads.or(base.threads),
            ctx_size: ctx_size.or(base.ctx_size),
            batch: batch.or(base.batch),
            ubatch: ubatch.or(base.ubatch),
            batch_invariant: batch_invariant || base.batch_invariant,
            no_batch_invariant: no_batch_invariant || base.no_batch_invariant,
            draft_plugin: draft_plugin.or_else(|| base.draft_plugin.clone()),
            draft: draft.or(base.draft),
            mtp: mtp || base.mtp,
            mtp_p_min: mtp_p_min.or(base.mtp_p_min),
            mtp_experts: mtp_experts.or_else(|| base.mtp_experts.clone()),
            draft_params: if draft_params.is_empty() { base.draft_params.clone() } else { draft_params },
            drop_plugin: drop_plugin.or_else(|| base.drop_plugin.clone()),
            drop_params: if drop_params.is_empty() { base.drop_params.clone() } else { drop_params },
            verbose: verbose || base.verbose,
        }
    }
}

/// The configuration after the file (if any) and the flags.
pub fn resolve_config(args: &RunFlags, turn: &TurnFlags) -> Result<RunConfig> {
    let mut c = match &args.config {
        Some(p) => RunConfig::from_file(p).map_err(|e| anyhow!(e))?,
        None => RunConfig::default(),
    };
    let g = &mut c.generate;
    if let Some(m) = &args.model {
        c.model.path = m.clone();
    }
    if let Some(spec) = &args.hf {
        c.model.path = PathBuf::from(format!("hf:{spec}"));
    }
    if let Some(r) = &args.repack {
        c.model.repack = r.clone();
    }
    if let Some(r) = &args.rpc {
        c.model.rpc = r.clone();
    }
    if let Some(r) = &args.rpc_layers {
        c.model.rpc_layers = r.clone();
    }
    macro_rules! set {
        ($from:ident: $($flag:ident => $field:expr),* $(,)?) => {
            $( if let Some(v) = $from.$flag.clone() { $field = v; } )*
        };
    }
    set!(args: threads => g.threads, ctx_size => g.ctx_size, batch => g.batch, ubatch => g.ubatch);
    set!(turn: n_predict => g.n_predict, temp => g.temp, top_k => g.top_k, top_p => g.top_p, seed => g.seed,
         grammar => g.grammar, json_schema => g.json_schema, min_p => g.min_p, typical_p => g.typical_p,
         repeat_penalty => g.repeat_penalty, frequency_penalty => g.frequency_penalty,
         presence_penalty => g.presence_penalty, repeat_last_n => g.repeat_last_n, logit_bias => g.logit_bias);
    if args.no_batch_invariant {
        g.batch_invariant = BatchInvariance::Off;
    }
    if args.batch_invariant {
        g.batch_invariant = BatchInvariance::On;
    }
    let m = &mut c.moe;
    set!(args: cache_mb => m.cache_mb, cache_ceil_mb => m.cache_ceil_mb, repacked_copy_max_gb => m.repacked_copy_max_gb, cache_policy => m.cache_policy, route_profile => m.route_profile, dense_weights => m.dense_weights,
         io_threads => m.io_threads,
         n_expert_used => m.n_expert_used, prefetch => m.prefetch, predict_layers => m.predict_layers);
    if args.no_predict {
        m.predict = false;
    }
    if args.no_prefill_read_ahead {
        m.prefill_read_ahead = false;
    }
    if args.no_lean_open {
        m.lean_open = false;
    }
    if args.no_page_recycle {
        m.recycle_pages = false;
    }
    if args.no_repacked_copy {
        m.repacked_copy = false;
    }
    if args.force_cache {
        m.force_cache = true;
    }
    if let Some(stream) = args.moe_stream {
        m.stream = stream;
    }
    if args.no_odirect {
        m.o_direct = false;
    }
    if args.no_io_uring {
        m.io_uring = false;
    }
    let p = &mut c.plugins;
    set!(args: draft_plugin => p.draft_plugin, draft => p.draft, drop_plugin => p.drop_plugin, mtp_p_min => p.mtp_p_min,
        mtp_experts => p.mtp_experts);
    if args.mtp {
        p.mtp = true;
    }
    if !args.draft_params.is_empty() {
        p.draft_params = args.draft_params.clone();
    }
    if !args.drop_params.is_empty() {
        p.drop_params = args.drop_params.clone();
    }
    let t = &mut c.telemetry;
    set!(turn: csv => t.csv, route_trace => t.route_trace);
    if args.verbose {
        t.verbose = true;
    }
    let ch = &mut c.chat;
    set!(turn: chat_template => ch.template, system => ch.system, reasoning_effort => ch.reasoning_effort, tools => ch.tools,
         tool_choice => ch.tool_choice);
    if turn.no_think {
        ch.think = false;
    }
    if turn.markers_in_content {
        ch.markers_in_content = true;
    }
    c.validate()?;
    Ok(c)
}

/// Opens a host for `config` (the demo model when it names none) and prints
/// its notes (the chat template's absence only when `chatting`); Ctrl-C
/// during the open ends the command.
pub fn open_host(mut config: RunConfig, chatting: bool) -> Result<Host> {
    interrupt::install()?;
    crate::notes::raise_to_verbose(config.telemetry.verbose);
    let model = crate::host::resolve_model(&config)?;
    crate::host::demo_budget(&mut config);
    let _bar = CopyBar::show();
    let mut host = Host::open(config, &model)?;
    host.print_open_notes("bmoe", chatting);
    interrupt::check()?;
    Ok(host)
}

/// A progress bar on stderr for a repacked copy of the experts written
/// while a model opens (the first streamed open of a model); Ctrl-C stops
/// the copy. Shown while it lives.
pub(super) struct CopyBar;

impl CopyBar {
    /// Shows the bar, from the copy's first progress until this is dropped.
    pub(super) fn show() -> CopyBar {
        let mut bar: Option<indicatif::ProgressBar> = None;
        crate::moe::repacked::report_progress(Some(Box::new(move |done, total| {
            let b = bar.get_or_insert_with(|| {
                crate::notes::note("bmoe", &crate::moe::repacked::copy_announcement(total));
                crate::progress::progress_bar(total, "writing the repacked copy of the experts")
            });
            b.set_position(done);
            if done >= total {
                b.finish_and_clear();
            }
            if interrupt::requested() { ControlFlow::Break(()) } else { ControlFlow::Continue(()) }
        })));
        CopyBar
    }
}

impl Drop for CopyBar {
    fn drop(&mut self) {
        crate::moe::repacked::report_progress(None);
    }
}

/// The texts a tool call can begin with, when `chat` turns show tools in
/// a format bmoe parses.
fn call_openings(host: &Host, chat: bool) -> Option<Vec<String>> {
    let format = host.chat_format();
    let tools = format.tool_format().filter(|_| chat && format.tools().is_some())?;
    Some(tools.openings().into_iter().map(str::to_string).collect())
}

/// Runs `bmoe generate`: the text on stdout, everything else on stderr.
pub fn generate(args: GenerateArgs) -> Result<()> {
    // Tools reach the model through its chat template, which only --chat applies.
    for (flag, given) in [("--tools", args.turn.tools.is_some()), ("--tool-choice", args.turn.tool_choice.is_some())] {
        if given && !args.chat {
            bail!("{flag} needs --chat: tools are shown to the model by its chat template, which only --chat applies");
        }
    }
    let config = resolve_config(&args.run, &args.turn)?;
    let mut host = open_host(config, args.chat)?;
    // Ctrl-C from here on stops the decode at its next graph node.
    let _forward = Forward::to(host.abort_handle().flag())?;
    let abort = host.abort_handle();
    let stdout = std::io::stdout();
    let mut out_error: Option<std::io::Error> = None;
    let mut shown_reasoning = false;
    // With tools shown, answer text is held back from where a call can
    // begin: a call goes to stderr parsed, never to stdout as markup.
    let mut calls_held = call_openings(&host, args.chat).map(|openings| StopScan::new(&openings));
    let mut sent = String::new();
    // Whether stdout's last byte ended a line (a tool call starts on its own).
    let mut at_line_start = true;
    let mut calls_made = 0;
    let write_out = |text: &str, at_line_start: &mut bool| -> std::io::Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let mut out = stdout.lock();
        out.write_all(text.as_bytes())?;
        *at_line_start = text.ends_with('\n');
        out.flush()
    };
    let mut on_event = |event: HostEvent<'_>| {
        // A generation clears its abort flag when it starts: a Ctrl-C
        // that landed just before is raised again here.
        if interrupt::requested() {
            abort.abort();
        }
        match event {
            HostEvent::Text { kind: Kind::Answer, text } => {
                let text = match calls_held.as_mut() {
                    Some(held) => held.push(text),
                    None => text.to_string(),
                };
                sent.push_str(&text);
                if let Err(e) = write_out(&text, &mut at_line_start) {
                    // Nobody reads the text any more (e.g. a closed pipe): stop generating.
                    out_error.get_or_insert(e);
                    abort.abort();
                }
            }
            // With --chat, reasoning goes to stderr: stdout carries the answer only.
            HostEvent::Text { kind: Kind::Reasoning, text } => {
                if !shown_reasoning {
                    eprint!("bmoe: reasoning: ");
                    shown_reasoning = true;
                }
                eprint!("{text}");
            }
            // On a line of its own, after the text streamed so far.
            HostEvent::Notice(text) => crate::notes::note("\nbmoe", text),
            // A call is one JSON object on a line of its own on stdout (the
            // OpenAI `tool_calls` entry), and a line on stderr unless -q.
            HostEvent::ToolCall(call) => {
                if crate::notes::verbosity() != crate::notes::Verbosity::Quiet {
                    eprintln!("\nbmoe: tool call: {call}");
                }
                let json = call.to_api(calls_made).to_string();
                calls_made += 1;
                let line = if at_line_start { format!("{json}\n") } else { format!("\n{json}\n") };
                if let Err(e) = write_out(&line, &mut at_line_start) {
                    out_error.get_or_insert(e);
                    abort.abort();
                }
            }
            HostEvent::Prefill(_) | HostEvent::Step(_) => {}
        }
    };
    if args.warmup > 0 {
        eprint!("bmoe: warm-up: {} tokens... ", args.warmup);
        let warm = host.warm_up(&args.prompt, args.warmup)?;
        let speed = warm.summary.decode_tps().map_or_else(|| "-".into(), |t| format!("{t:.2} tok/s"));
        eprintln!("{speed}");
        if warm.aborted {
            interrupt::check()?;
        }
    }
    // A digest file that cannot be written is said before the run, not after it.
    if let Some(path) = &args.logits_digest {
        std::fs::File::create(path).map_err(|e| anyhow!("--logits-digest {}: {e}", path.display()))?;
    }
    host.keep_logits(args.logits_digest.is_some());
    let generation = if args.chat {
        let turn = host.chat_from(&args.prompt, args.prefill.as_deref().unwrap_or(""), &mut on_event)?;
        // Answer text held back that was no call (the turn's answer has the calls taken out).
        if calls_held.is_some()
            && out_error.is_none()
            && let Some(rest) = turn.answer.trim_start().strip_prefix(sent.trim_start()).filter(|r| !r.is_empty())
            && let Err(e) = write_out(rest, &mut at_line_start)
        {
            out_error = Some(e);
        }
        turn.generation
    } else {
        host.complete(&args.prompt, false, &mut on_event)?
    };
    if shown_reasoning {
        eprintln!();
    }
    match out_error {
        // The reader went away (`bmoe generate | head`): not an error.
        Some(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        Some(e) => bail!("writing the generated text to stdout: {e}"),
        None => {}
    }
    // The text ends its line; a reply of calls alone, or of nothing, adds no blank line.
    if !at_line_start {
        println!();
    }
    let ending = host.last_ending();
    if let Some(notice) = ending.and_then(|e| e.cut_notice()) {
        eprintln!("bmoe: {notice}");
    }
    host.finish()?;
    eprint!("{}", generation.summary);
    if let Some(path) = &args.logits_digest {
        let run = crate::telemetry::digest::write_digests(path, &generation.logits)
            .map_err(|e| anyhow!("writing the logits digests to {}: {e}", path.display()))?;
        eprintln!("logits:  digest {run:016x} over {} steps (per step in {})", generation.logits.len(), path.display());
    }
    if let Some(ending) = ending {
        let cut = match ending.cut {
            Some(Cut::Reasoning) => " (inside the reasoning)",
            Some(Cut::ToolCall) => " (inside a tool call)",
            Some(Cut::Constrained) => " (the constrained output incomplete)",
            None => "",
        };
        eprintln!("finish:  {}{cut}", ending.reason.as_str());
    }
    // Stopped by Ctrl-C: everything generated so far is printed and saved.
    interrupt::check()?;
    // Output that had to follow a grammar or schema and does not is a
    // failure a script must see (the text printed stays for inspection).
    if let Some(ending) = ending.filter(|e| e.cut == Some(Cut::Constrained)) {
        bail!(
            "the output is incomplete: a limit cut it off at {} tokens before the grammar or JSON schema was \
             satisfied",
            ending.tokens
        );
    }
    Ok(())
}
