//! Run configuration: `bmoe.toml` (every field optional, with a default),
//! command-line flags on top, and [`RunConfig::validate`] to reject bad values
//! and combinations with a message naming the field.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::engine::{CacheBudget, DenseWeights, LeanOpen, RouteProfileOpen, RpcOptions, SessionOptions, StreamOptions};
use crate::llama::{MtpExperts, MtpParams, Sampling};
use crate::moe::evict::CachePolicy;
use crate::moe::predict::ReadAhead;
use crate::moe::profile::ProfileMode;
use crate::moe::repack::Repack;
use crate::moe::repacked::repacked_dir;

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct RunConfig {
    /// Which model.
    pub model: ModelConfig,
    /// Generation settings.
    pub generate: GenerateConfig,
    /// Expert streaming.
    pub moe: MoeConfig,
    /// Policy plugins.
    pub plugins: PluginConfig,
    /// Chat turns.
    pub chat: ChatConfig,
    /// Telemetry outputs.
    pub telemetry: TelemetryConfig,
    /// The HTTP server (`bmoe serve`).
    pub serve: ServeConfig,
}

/// `serve.step_target`'s default: a running stream's step at most this
/// many times its plain decode step while prompts join it.
pub const DEFAULT_STEP_TARGET: f64 = 3.0;

/// `[serve]`: read by `bmoe serve` when it starts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ServeConfig {
    /// Address to listen on; anything but loopback without an API key is
    /// open to whoever can reach the port.
    pub host: String,
    /// Port to listen on.
    pub port: u16,
    /// Key a client must send (`Authorization: Bearer KEY`); empty = none.
    /// `BMOE_API_KEY` in the environment is read when this is empty.
    pub api_key: String,
    /// Requests that may wait for the model; more are refused (429).
    pub queue: u32,
    /// Largest request body, in MiB.
    pub body_mb: u32,
    /// Requests decoded together, each in its own slot with the whole
    /// `generate.ctx_size` (1 with a draft plugin or MTP).
    pub parallel: u32,
    /// Seconds the requests running when SIGTERM or Ctrl-C arrives get to
    /// finish; those still running then end with an error chunk.
    pub shutdown_grace_s: f64,
    /// Origins of browser apps allowed to call the API from another
    /// origin (CORS), comma-separated (`*`: any); empty = none.
    pub cors: String,
    /// While streams are running, newcomers' prompt tokens per step are
    /// held to a budget that keeps a running stream's step within this
    /// many times its plain decode step (sized from measured step times);
    /// 0 = no budget (a prompt takes the whole batch).
    pub step_target: f64,
}

impl Default for ServeConfig {
    fn default() -> ServeConfig {
        ServeConfig {
            host: "127.0.0.1".into(),
            port: 8080,
            api_key: String::new(),
            queue: 16,
            body_mb: 8,
            parallel: 4,
            shutdown_grace_s: 5.0,
            cors: String::new(),
            step_target: DEFAULT_STEP_TARGET,
        }
    }
}

/// `[plugins]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PluginConfig {
    /// Draft plugin for speculative decoding: a bundled name or a .wasm path; empty = off.
    pub draft_plugin: String,
    /// Most tokens drafted per step.
    pub draft: u32,
    /// Draft with the model's own MTP (next-token-prediction) layers.
    pub mtp: bool,
    /// An MTP draft stops before a token its head gives less probability than this.
    pub mtp_p_min: f32,
    /// Which routed experts a streamed MTP layer drafts with: `cached` or `all`.
    pub mtp_experts: String,
    /// `name=value` parameters for the draft plugin.
    pub draft_params: Vec<String>,
    /// Expert-drop plugin: a bundled name or a .wasm path; empty = off.
    pub drop_plugin: String,
    /// `name=value` parameters for the drop plugin.
    pub drop_params: Vec<String>,
    /// CPU time one plugin call may use, in milliseconds.
    pub call_ms: u64,
    /// Linear-memory limit of one plugin, in MiB.
    pub memory_mb: u64,
}

impl Default for PluginConfig {
    fn default() -> PluginConfig {
        PluginConfig {
            draft_plugin: String::new(),
            draft: 3,
            mtp: false,
            mtp_p_min: 0.5,
            mtp_experts: MtpExperts::default().name().into(),
            draft_params: Vec::new(),
            drop_plugin: String::new(),
            drop_params: Vec::new(),
            call_ms: 50,
            memory_mb: 64,
        }
    }
}

/// Splits `name=value` parameters.
pub fn parse_params(field: &'static str, params: &[String]) -> Result<Vec<(String, String)>, ConfigError> {
    params
        .iter()
        .map(|p| match p.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => Err(bad(field, format!("`{p}` is not name=value"))),
        })
        .collect()
}

/// `[chat]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ChatConfig {
    /// A Jinja chat template file (or the name of one bmoe carries, e.g.
    /// `glm-4.7`) to use instead of the model's own; empty = the model's.
    pub template: PathBuf,
    /// System prompt of new conversations; empty = none.
    pub system: String,
    /// Let the model reason before answering (where it can).
    pub think: bool,
    /// How much to think (low, medium, high), for templates with an effort
    /// switch (gpt-oss and Hunyuan `reasoning_effort`, Kimi-K3
    /// `thinking_effort`); empty = the template's default.
    pub reasoning_effort: String,
    /// A JSON file of functions the model may call (OpenAI-style tool
    /// list), shown to the model by its chat template; empty = none.
    pub tools: PathBuf,
    /// Whether a reply to a user message must call a tool: `auto` (the
    /// model decides) or `required` (a grammar makes the reply one call in
    /// the template's own format; replies to tool results stay free).
    pub tool_choice: String,
    /// Read special-token markers written in a message's own text (such
    /// as `<|im_start|>`) as control tokens, as llama-server does; off, a
    /// message's text is text and only the template's markers are special.
    pub markers_in_content: bool,
}

impl ChatConfig {
    /// The tool list `tools` names, read and checked; `None` when unset.
    pub fn tool_list(&self) -> Result<Option<serde_json::Value>, String> {
        if self.tools.as_os_str().is_empty() {
            return Ok(None);
        }
        let text =
            std::fs::read_to_string(&self.tools).map_err(|e| format!("reading {}: {e}", self.tools.display()))?;
        crate::chat::parse_tools(&text).map(Some).map_err(|e| format!("{}: {e}", self.tools.display()))
    }
}

impl Default for ChatConfig {
    fn default() -> ChatConfig {
        ChatConfig {
            template: PathBuf::new(),
            system: String::new(),
            think: true,
            reasoning_effort: String::new(),
            tools: PathBuf::new(),
            tool_choice: "auto".into(),
            markers_in_content: false,
        }
    }
}

/// `[model]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelConfig {
    /// GGUF file (first shard of a split set); empty = the built-in demo model.
    pub path: PathBuf,
    /// Expert banks for the CPU's repacked kernels: `auto` (resident when the
    /// file fits in memory; streamed from a repacked copy, or when it
    /// fits), `on` or `off`.
    pub repack: String,
    /// RPC servers holding some of the layers, `HOST:PORT[,HOST:PORT...]`
    /// (`bmoe rpc-server` on each); empty = every layer here.
    pub rpc: String,
    /// Layers on the RPC servers: one count per server, or one total split
    /// by the servers' free memory; empty = as many as their memory holds.
    pub rpc_layers: String,
}

impl Default for ModelConfig {
    fn default() -> ModelConfig {
        ModelConfig {
            path: PathBuf::new(),
            repack: Repack::default().name().into(),
            rpc: String::new(),
            rpc_layers: String::new(),
        }
    }
}

/// The reply budget of a run on the demo model that sets none: its random
/// weights rarely write an end-of-reply token.
pub const DEMO_REPLY_TOKENS: u32 = 128;

/// `[generate]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GenerateConfig {
    /// Most tokens a reply generates; 0 = no budget: it ends where the
    /// model ends it or the context is full (the demo model, whose random
    /// weights rarely end a reply: [`DEMO_REPLY_TOKENS`]).
    pub n_predict: u32,
    /// Compute threads; 0 = tuned while decoding, between 1 and one per core.
    pub threads: u32,
    /// Context length in tokens.
    pub ctx_size: u32,
    /// Most prompt tokens per decode call.
    pub batch: u32,
    /// Most tokens per graph computation.
    pub ubatch: u32,
    /// Batch-invariant kernels: a sequence's logits are bitwise the same
    /// whatever else is decoded beside it and however its prompt is split
    /// into chunks, at the cost of llama.cpp's fastest kernels. `auto`: on
    /// for `bmoe serve` and with a draft plugin or MTP (whose verify
    /// batches must equal decoding one token at a time), off otherwise.
    pub batch_invariant: BatchInvariance,
    /// Temperature; 0 = greedy.
    pub temp: f64,
    /// Top-k stage of sampling (0 = off).
    pub top_k: i32,
    /// Top-p stage of sampling.
    pub top_p: f64,
    /// Min-p stage of sampling: drop tokens less likely than this fraction
    /// of the most likely one (0 = off).
    pub min_p: f64,
    /// Locally typical sampling's mass (1 = off).
    pub typical_p: f64,
    /// Divides the logit of a token generated in the last `repeat_last_n`
    /// tokens (1 = off; greedy too).
    pub repeat_penalty: f64,
    /// Subtracted from a token's logit per time it was generated in the
    /// window (0 = off).
    pub frequency_penalty: f64,
    /// Subtracted from the logit of a token generated in the window (0 = off).
    pub presence_penalty: f64,
    /// The penalties' window: the last N generated tokens (0 = none, -1 =
    /// the whole context).
    pub repeat_last_n: i32,
    /// Added to tokens' logits by id: `ID=BIAS` pairs, comma-separated
    /// (`-inf` bans a token); empty = none.
    pub logit_bias: String,
    /// Sampling seed.
    pub seed: u32,
    /// A GBNF grammar file the generated text must follow (llama.cpp's
    /// grammar sampler); empty = none.
    pub grammar: PathBuf,
    /// A JSON schema the generated text must follow: a file, or the schema
    /// itself when it starts with `{`; empty = none.
    pub json_schema: String,
}

impl Default for GenerateConfig {
    fn default() -> GenerateConfig {
        GenerateConfig {
            n_predict: 0,
            threads: 0,
            ctx_size: 4096,
            batch: 512,
            ubatch: 512,
            batch_invariant: BatchInvariance::Auto,
            temp: 0.0,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.0,
            typical_p: 1.0,
            repeat_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            repeat_last_n: 64,
            logit_bias: String::new(),
            seed: 0,
            grammar: PathBuf::new(),
            json_schema: String::new(),
        }
    }
}

impl GenerateConfig {
    /// What the output must follow, if anything: the `json_schema` (the
    /// schema itself when it starts with `{`, else the file it names),
    /// checked, or the `grammar` file's text. Errors name the setting.
    pub fn constraint(&self) -> Result<Option<crate::llama::Constraint>, ConfigError> {
        if !self.json_schema.is_empty() {
            let text = if self.json_schema.trim_start().starts_with('{') {
                Ok(self.json_schema.clone())
            } else {
                std::fs::read_to_string(&self.json_schema).map_err(|e| format!("reading {}: {e}", self.json_schema))
            };
            let schema = text.and_then(|t| crate::llama::Constraint::json_schema(&t));
            return schema.map(Some).map_err(|e| bad("generate.json_schema", e));
        }
        if self.grammar.as_os_str().is_empty() {
            return Ok(None);
        }
        let text = std::fs::read_to_string(&self.grammar);
        text.map(|t| Some(crate::llama::Constraint::Grammar(t)))
            .map_err(|e| bad("generate.grammar", format!("reading {}: {e}", self.grammar.display())))
    }
}

/// A setting that is on, off, or decided by bmoe: `auto`, `true` (also
/// `on`) or `false` (also `off`). `generate.batch_invariant` and
/// `moe.stream` are such settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum AutoSwitch {
    /// bmoe decides (each setting says how).
    #[default]
    Auto,
    /// Always.
    On,
    /// Never.
    Off,
}

/// `generate.batch_invariant`: `auto` is on for a server and for
/// speculative decoding, off otherwise; on, every run is bitwise equal to
/// the same request alone however batched; off, llama.cpp's fastest
/// kernels everywhere.
pub type BatchInvariance = AutoSwitch;

/// `moe.stream`: `auto` streams when the model and its context do not fit
/// the memory bmoe may use (or a setting needs streaming), on and off
/// force it ([`crate::fit::choose_streaming`]).
pub type StreamMode = AutoSwitch;

impl AutoSwitch {
    /// Whether it is on, `auto` deciding `when_auto`.
    pub fn resolve(self, when_auto: bool) -> bool {
        match self {
            AutoSwitch::Auto => when_auto,
            AutoSwitch::On => true,
            AutoSwitch::Off => false,
        }
    }

    /// The value as a user writes it: `auto`, `on` or `off`.
    pub fn name(self) -> &'static str {
        match self {
            AutoSwitch::Auto => "auto",
            AutoSwitch::On => "on",
            AutoSwitch::Off => "off",
        }
    }
}

impl std::str::FromStr for AutoSwitch {
    type Err = String;

    fn from_str(s: &str) -> Result<AutoSwitch, String> {
        match s.trim() {
            "auto" => Ok(AutoSwitch::Auto),
            "true" | "on" => Ok(AutoSwitch::On),
            "false" | "off" => Ok(AutoSwitch::Off),
            _ => Err(format!("`{s}` is not `auto`, `true` (on) or `false` (off)")),
        }
    }
}

impl Serialize for AutoSwitch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            AutoSwitch::Auto => s.serialize_str("auto"),
            AutoSwitch::On => s.serialize_bool(true),
            AutoSwitch::Off => s.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for AutoSwitch {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<AutoSwitch, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Switch(bool),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Switch(true) => Ok(AutoSwitch::On),
            Raw::Switch(false) => Ok(AutoSwitch::Off),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// `moe.cache_mb`: `auto`, or a budget in MiB (fractions allowed; 0 = no cache).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CacheMb {
    /// Sized at open from the memory the machine and the cgroup allow.
    Auto,
    /// This many MiB.
    Mib(f64),
}

impl std::str::FromStr for CacheMb {
    type Err = String;

    fn from_str(s: &str) -> Result<CacheMb, String> {
        match s.trim() {
            "auto" => Ok(CacheMb::Auto),
            n => n.parse().map(CacheMb::Mib).map_err(|_| format!("`{s}` is not a number of MiB or `auto`")),
        }
    }
}

impl std::fmt::Display for CacheMb {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CacheMb::Auto => f.write_str("auto"),
            CacheMb::Mib(m) => write!(f, "{m}"),
        }
    }
}

impl Serialize for CacheMb {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            CacheMb::Auto => s.serialize_str("auto"),
            CacheMb::Mib(m) => s.serialize_f64(*m),
        }
    }
}

impl<'de> Deserialize<'de> for CacheMb {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<CacheMb, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Number(f64),
            Int(i64),
            Text(String),
        }
        match Raw::deserialize(d)? {
            Raw::Number(m) => Ok(CacheMb::Mib(m)),
            Raw::Int(m) => Ok(CacheMb::Mib(m as f64)),
            Raw::Text(t) => t.parse().map_err(serde::de::Error::custom),
        }
    }
}

/// `[moe]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MoeConfig {
    /// Stream routed experts from disk: `auto` (when the model with its
    /// context does not fit the memory bmoe may use, or a setting below
    /// needs streaming), `true` or `false`.
    pub stream: StreamMode,
    /// Expert LRU budget: `auto` or MiB (fractions allowed); 0 = no cache.
    pub cache_mb: CacheMb,
    /// Upper bound of an `auto` budget in MiB; 0 = none.
    pub cache_ceil_mb: f64,
    /// Which cached expert goes first when the budget is full: `decay`
    /// (fewest recent uses, halving every 12 tokens) or `lru`.
    pub cache_policy: String,
    /// Accept a fixed budget below one token's working set.
    pub force_cache: bool,
    /// How dense weights are held while streaming: auto, mmap, warm or anon.
    pub dense_weights: String,
    /// Read lanes.
    pub io_threads: u32,
    /// Use O_DIRECT for expert reads (verified at open).
    pub o_direct: bool,
    /// Read through io_uring into cache memory registered at open (no page
    /// pinned per read); falls back by itself where io_uring is refused.
    pub io_uring: bool,
    /// Experts per token; 0 = the model's own.
    pub n_expert_used: u32,
    /// Read ahead the previous token's experts of this many next layers
    /// while a layer computes (needs the cache); 0 = off.
    pub prefetch: u32,
    /// Run the next layer's router early and read ahead its choice; applies
    /// when the cache is on and there are two lanes or more.
    pub predict: bool,
    /// How many next layers' routers `predict` runs (1-4): two let the
    /// reads of a layer start one layer earlier.
    pub predict_layers: u32,
    /// With `predict` on, read ahead during prompt processing too: the next
    /// layer's router runs on every token of the ubatch and the union of
    /// its choices is read while the layer computes.
    pub prefill_read_ahead: bool,
    /// While streaming a model larger than the memory available, load a
    /// lean copy of it (expert bytes left as holes, kept in the cache
    /// directory) so opening reads only the dense weights.
    pub lean_open: bool,
    /// Move an evicted expert's pages under the next one read instead of
    /// releasing them and faulting zeroed pages in again (Linux).
    pub recycle_pages: bool,
    /// With repacked expert banks (`model.repack`), stream them from a copy
    /// stored repacked in the cache directory (written once) rather than
    /// repacking each expert as it is read.
    pub repacked_copy: bool,
    /// Most GiB a new repacked copy may take on disk (0: half the free
    /// space of the cache directory's file system).
    pub repacked_copy_max_gb: f64,
    /// The model's route profile (per-expert routing counts kept in the
    /// cache directory): `update` (use it and add this run's routing), `read`
    /// (use it only) or `off`.
    pub route_profile: String,
}

impl Default for MoeConfig {
    fn default() -> MoeConfig {
        MoeConfig {
            stream: StreamMode::Auto,
            cache_mb: CacheMb::Auto,
            cache_ceil_mb: 0.0,
            cache_policy: CachePolicy::default().name().into(),
            force_cache: false,
            dense_weights: "auto".into(),
            io_threads: 4,
            o_direct: true,
            io_uring: true,
            n_expert_used: 0,
            prefetch: 0,
            predict: true,
            predict_layers: 2,
            prefill_read_ahead: true,
            lean_open: true,
            recycle_pages: true,
            repacked_copy: true,
            repacked_copy_max_gb: 0.0,
            route_profile: ProfileMode::default().name().into(),
        }
    }
}

/// `[telemetry]`
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// Per-token CSV path (empty = none).
    pub csv: PathBuf,
    /// Route trace path (empty = none).
    pub route_trace: PathBuf,
    /// Show llama.cpp's own log.
    pub verbose: bool,
}

/// A configuration value that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {reason}")]
pub struct ConfigError {
    /// `section.field`.
    pub field: &'static str,
    /// What is wrong.
    pub reason: String,
}

fn bad(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError { field, reason: reason.into() }
}

/// Models with fewer expert bytes load whole: reading them costs little.
pub const LEAN_MIN_EXPERT_BYTES: u64 = 1 << 30;

/// Where lean copies of models are kept: the user's cache directory.
pub fn lean_dir() -> PathBuf {
    crate::moe::copies::cache_root().join("lean")
}

impl RunConfig {
    /// Reads a TOML file; unknown keys are errors.
    pub fn from_file(path: &Path) -> Result<RunConfig, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        RunConfig::from_toml(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses TOML text.
    pub fn from_toml(text: &str) -> Result<RunConfig, String> {
        toml::from_str(text).map_err(|e| e.to_string())
    }

    /// Checks every field and combination.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.serve.queue == 0 {
            return Err(bad("serve.queue", "must be at least 1"));
        }
        let grace = self.serve.shutdown_grace_s;
        if !grace.is_finite() || !(0.0..=3600.0).contains(&grace) {
            return Err(bad("serve.shutdown_grace_s", format!("must be 0 to 3600 seconds (got {grace})")));
        }
        if self.serve.body_mb == 0 {
            return Err(bad("serve.body_mb", "must be at least 1"));
        }
        let target = self.serve.step_target;
        if !(target == 0.0 || (1.5..=100.0).contains(&target)) {
            return Err(bad("serve.step_target", format!("must be 0 (no budget) or 1.5 to 100 (got {target})")));
        }
        if !(1..=64).contains(&self.serve.parallel) {
            return Err(bad("serve.parallel", format!("must be 1 to 64 (got {})", self.serve.parallel)));
        }
        let g = &self.generate;
        if g.threads > 1024 {
            return Err(bad("generate.threads", format!("{} is more than 1024", g.threads)));
        }
        if !(16..=1 << 20).contains(&g.ctx_size) {
            return Err(bad("generate.ctx_size", format!("must be between 16 and 1048576 (got {})", g.ctx_size)));
        }
        if g.n_predict > g.ctx_size {
            return Err(bad(
                "generate.n_predict",
                format!("{} is more than the context holds (ctx_size {})", g.n_predict, g.ctx_size),
            ));
        }
        if g.batch == 0 || g.batch > g.ctx_size {
            return Err(bad(
                "generate.batch",
                format!("must be between 1 and ctx_size {} (got {})", g.ctx_size, g.batch),
            ));
        }
        if g.ubatch == 0 || g.ubatch > g.batch {
            return Err(bad("generate.ubatch", format!("must be between 1 and batch {} (got {})", g.batch, g.ubatch)));
        }
        if !g.temp.is_finite() || g.temp < 0.0 {
            return Err(bad("generate.temp", format!("must be 0 (greedy) or positive (got {})", g.temp)));
        }
        if g.top_k < 0 {
            return Err(bad("generate.top_k", format!("must be 0 (off) or positive (got {})", g.top_k)));
        }
        if !(g.top_p > 0.0 && g.top_p <= 1.0) {
            return Err(bad("generate.top_p", format!("must be in (0, 1] (got {})", g.top_p)));
        }
        if !(0.0..=1.0).contains(&g.min_p) {
            return Err(bad("generate.min_p", format!("must be in [0, 1] (got {})", g.min_p)));
        }
        if !(g.typical_p > 0.0 && g.typical_p <= 1.0) {
            return Err(bad("generate.typical_p", format!("must be in (0, 1] (got {})", g.typical_p)));
        }
        if !(g.repeat_penalty.is_finite() && g.repeat_penalty > 0.0) {
            return Err(bad("generate.repeat_penalty", format!("must be positive (got {})", g.repeat_penalty)));
        }
        for (key, v) in
            [("generate.frequency_penalty", g.frequency_penalty), ("generate.presence_penalty", g.presence_penalty)]
        {
            if !(-2.0..=2.0).contains(&v) {
                return Err(bad(key, format!("must be in [-2, 2] (got {v})")));
            }
        }
        if g.repeat_last_n < -1 {
            return Err(bad(
                "generate.repeat_last_n",
                format!("must be -1 (the context), 0 (none) or more (got {})", g.repeat_last_n),
            ));
        }
        parse_logit_bias(&g.logit_bias).map_err(|e| bad("generate.logit_bias", e))?;
        if !g.grammar.as_os_str().is_empty() && !g.grammar.is_file() {
            return Err(bad("generate.grammar", format!("{} is not a file", g.grammar.display())));
        }
        if !g.json_schema.is_empty() && !g.grammar.as_os_str().is_empty() {
            return Err(bad("generate.json_schema", "give a grammar or a JSON schema, not both"));
        }
        if g.constraint()?.is_some() && self.plugins.mtp {
            return Err(bad(
                "plugins.mtp",
                "MTP drafting and a grammar do not go together (drafts are verified against unconstrained greedy \
                 choices): turn one of them off",
            ));
        }
        if g.constraint()?.is_some() && !self.plugins.draft_plugin.is_empty() {
            let which = if g.json_schema.is_empty() { "generate.grammar" } else { "generate.json_schema" };
            return Err(bad(
                which,
                "a grammar and a draft plugin do not go together (drafts are verified against unconstrained \
                 greedy choices): turn one of them off",
            ));
        }
        let m = &self.moe;
        if !(1..=4).contains(&m.predict_layers) {
            return Err(bad("moe.predict_layers", format!("must be between 1 and 4 (got {})", m.predict_layers)));
        }
        if !(1..=64).contains(&m.io_threads) {
            return Err(bad("moe.io_threads", format!("must be between 1 and 64 (got {})", m.io_threads)));
        }
        if let CacheMb::Mib(mb) = m.cache_mb {
            if !(mb.is_finite() && mb >= 0.0) {
                return Err(bad(
                    "moe.cache_mb",
                    format!("must be auto, 0 (off) or a positive number of MiB (got {mb})"),
                ));
            }
            if mb > 0.0 && m.stream == StreamMode::Off {
                return Err(bad("moe.cache_mb", "an expert cache needs streaming, and moe.stream is off"));
            }
            if mb > (1u64 << 30) as f64 {
                return Err(bad("moe.cache_mb", format!("{mb} MiB is not a plausible budget")));
            }
        }
        if let Err(e) = m.cache_policy.parse::<CachePolicy>() {
            return Err(bad("moe.cache_policy", e));
        }
        if let Err(e) = m.route_profile.parse::<ProfileMode>() {
            return Err(bad("moe.route_profile", e));
        }
        if Repack::from_name(&self.model.repack).is_none() {
            return Err(bad("model.repack", format!("`{}` is not auto, on or off", self.model.repack)));
        }
        let rpc = self.rpc_options().map_err(|e| bad("model.rpc", e))?;
        if rpc.is_none() && !self.model.rpc_layers.trim().is_empty() {
            return Err(bad("model.rpc_layers", "layers on RPC servers need servers (model.rpc / --rpc)"));
        }
        if rpc.is_some() && self.plugins.mtp {
            return Err(bad("model.rpc", "MTP drafting (plugins.mtp) runs on one machine only; turn one of them off"));
        }
        match DenseWeights::from_name(&m.dense_weights) {
            None => {
                return Err(bad("moe.dense_weights", format!("`{}` is not auto, mmap, warm or anon", m.dense_weights)));
            }
            Some(d) if d.needs_streaming() && m.stream == StreamMode::Off => {
                return Err(bad("moe.dense_weights", "warm and anon apply while streaming, and moe.stream is off"));
            }
            Some(_) => {}
        }
        if m.prefetch > 8 {
            return Err(bad("moe.prefetch", format!("reads at most 8 layers ahead (got {})", m.prefetch)));
        }
        if m.prefetch > 0 {
            let field = "moe.prefetch";
            if m.stream == StreamMode::Off {
                return Err(bad(field, "read-ahead needs streaming, and moe.stream is off"));
            }
            if m.cache_mb == CacheMb::Mib(0.0) {
                return Err(bad(field, "read-ahead fills the expert cache: it needs moe.cache_mb auto or above 0"));
            }
            if m.io_threads < 2 {
                return Err(bad(field, "read-ahead runs on spare read lanes: it needs moe.io_threads of 2 or more"));
            }
        }
        if !(m.cache_ceil_mb.is_finite() && m.cache_ceil_mb >= 0.0) {
            return Err(bad(
                "moe.cache_ceil_mb",
                format!("must be 0 (none) or a positive number of MiB (got {})", m.cache_ceil_mb),
            ));
        }
        if !(m.repacked_copy_max_gb.is_finite() && m.repacked_copy_max_gb >= 0.0) {
            return Err(bad(
                "moe.repacked_copy_max_gb",
                format!("must be 0 (half the free space) or a positive number of GiB (got {})", m.repacked_copy_max_gb),
            ));
        }
        let p = &self.plugins;
        if !(1..=16).contains(&p.draft) {
            return Err(bad("plugins.draft", format!("must be between 1 and 16 (got {})", p.draft)));
        }
        if !p.draft_plugin.is_empty() && g.temp > 0.0 {
            return Err(bad("plugins.draft_plugin", "speculative decoding needs greedy decoding (generate.temp = 0)"));
        }
        if p.mtp && g.temp > 0.0 {
            return Err(bad("plugins.mtp", "MTP drafting needs greedy decoding (generate.temp = 0)"));
        }
        if p.mtp && !p.draft_plugin.is_empty() {
            return Err(bad("plugins.mtp", "MTP drafting and a draft plugin do not go together: choose one"));
        }
        if !(0.0..=1.0).contains(&p.mtp_p_min) {
            return Err(bad("plugins.mtp_p_min", format!("must be between 0 and 1 (got {})", p.mtp_p_min)));
        }
        if MtpExperts::parse(&p.mtp_experts).is_none() {
            return Err(bad("plugins.mtp_experts", format!("`{}` is not cached or all", p.mtp_experts)));
        }
        if !p.drop_plugin.is_empty() && m.stream == StreamMode::Off {
            return Err(bad("plugins.drop_plugin", "dropping experts needs streaming, and moe.stream is off"));
        }
        if !self.telemetry.route_trace.as_os_str().is_empty() && m.stream == StreamMode::Off {
            return Err(bad(
                "telemetry.route_trace",
                "a route trace needs streaming (routing is only observed while streaming), and moe.stream is off",
            ));
        }
        if !(1..=60_000).contains(&p.call_ms) {
            return Err(bad("plugins.call_ms", format!("must be between 1 and 60000 (got {})", p.call_ms)));
        }
        if !(1..=4096).contains(&p.memory_mb) {
            return Err(bad("plugins.memory_mb", format!("must be between 1 and 4096 (got {})", p.memory_mb)));
        }
        parse_params("plugins.draft_params", &p.draft_params)?;
        parse_params("plugins.drop_params", &p.drop_params)?;
        self.chat.tool_list().map_err(|e| bad("chat.tools", e))?;
        if !["auto", "required"].contains(&self.chat.tool_choice.as_str()) {
            return Err(bad("chat.tool_choice", format!("`{}` is not auto or required", self.chat.tool_choice)));
        }
        if !["", "low", "medium", "high"].contains(&self.chat.reasoning_effort.as_str()) {
            return Err(bad(
                "chat.reasoning_effort",
                format!("`{}` is not low, medium or high", self.chat.reasoning_effort),
            ));
        }

        Ok(())
    }

    /// Compute threads after resolving 0 to the core count.
    pub fn threads(&self) -> u32 {
        match self.generate.threads {
            0 => std::thread::available_parallelism().map_or(4, |n| n.get() as u32),
            n => n,
        }
    }

    /// Whether tokens are drafted and verified in batches (a draft plugin
    /// or MTP), whose logits must equal decoding one token at a time.
    pub fn drafts(&self) -> bool {
        !self.plugins.draft_plugin.is_empty() || self.plugins.mtp
    }

    /// The first setting that needs streaming, if any: under `moe.stream =
    /// auto` it makes the run stream whatever the model's size.
    pub fn stream_needed_by(&self) -> Option<&'static str> {
        let m = &self.moe;
        if matches!(m.cache_mb, CacheMb::Mib(mb) if mb > 0.0) {
            Some("moe.cache_mb (an expert cache)")
        } else if DenseWeights::from_name(&m.dense_weights).is_some_and(DenseWeights::needs_streaming) {
            Some("moe.dense_weights")
        } else if m.prefetch > 0 {
            Some("moe.prefetch")
        } else if !self.plugins.drop_plugin.is_empty() {
            Some("plugins.drop_plugin")
        } else if !self.telemetry.route_trace.as_os_str().is_empty() {
            Some("telemetry.route_trace")
        } else {
            None
        }
    }

    /// Session options for `model`, streaming its experts when `stream`
    /// (`moe.stream` as decided for this model: [`crate::fit::choose_streaming`]).
    pub fn session_options(&self, model: &Path, stream: bool) -> SessionOptions {
        let m = &self.moe;
        SessionOptions {
            model: model.to_path_buf(),
            threads: self.threads(),
            tune: self.generate.threads == 0,
            ctx_size: self.generate.ctx_size,
            batch: self.generate.batch,
            ubatch: self.generate.ubatch,
            n_expert_used: (m.n_expert_used > 0).then_some(m.n_expert_used),
            stream: stream.then_some(StreamOptions {
                cache: self.cache_budget(),
                cache_policy: m.cache_policy.parse().unwrap_or_default(),
                dense: DenseWeights::from_name(&m.dense_weights).unwrap_or_default(),
                io_threads: m.io_threads as usize,
                o_direct: m.o_direct,
                io_uring: m.io_uring,
                read_ahead: ReadAhead {
                    layers: m.prefetch,
                    router: if m.predict { m.predict_layers } else { 0 },
                    prefill: m.predict && m.prefill_read_ahead,
                },
                lean: m.lean_open.then(|| LeanOpen {
                    dir: lean_dir(),
                    min_expert_bytes: LEAN_MIN_EXPERT_BYTES,
                    only_when_larger_than_memory: true,
                }),
                recycle_pages: m.recycle_pages,
                repacked_copy: m.repacked_copy.then(repacked_dir),
                repacked_copy_max_bytes: (m.repacked_copy_max_gb > 0.0)
                    .then_some((m.repacked_copy_max_gb * (1u64 << 30) as f64) as u64),
                route_profile: RouteProfileOpen {
                    dir: crate::moe::profile::profiles_dir(),
                    mode: m.route_profile.parse().unwrap_or_default(),
                },
            }),
            repack: Repack::from_name(&self.model.repack).unwrap_or_default(),
            mtp: self.plugins.mtp.then_some(MtpParams {
                draft_max: self.plugins.draft,
                p_min: self.plugins.mtp_p_min,
                experts: MtpExperts::parse(&self.plugins.mtp_experts).unwrap_or_default(),
            }),
            rpc: self.rpc_options().ok().flatten(),
            sequences: 1,
            batch_invariant: self.generate.batch_invariant.resolve(self.drafts()),
        }
    }

    /// The RPC servers and layer split `model.rpc` and `model.rpc_layers`
    /// ask for (`None`: no servers).
    pub fn rpc_options(&self) -> Result<Option<RpcOptions>, String> {
        RpcOptions::parse(&self.model.rpc, &self.model.rpc_layers)
    }

    /// The expert cache budget `moe.*` asks for.
    pub fn cache_budget(&self) -> CacheBudget {
        let m = &self.moe;
        let mib = |x: f64| (x * 1048576.0) as u64;
        match m.cache_mb {
            CacheMb::Auto => CacheBudget::Auto { ceil: (m.cache_ceil_mb > 0.0).then(|| mib(m.cache_ceil_mb)) },
            CacheMb::Mib(0.0) => CacheBudget::Off,
            CacheMb::Mib(x) => CacheBudget::Fixed { bytes: mib(x), force: m.force_cache },
        }
    }

    /// Sampling settings.
    pub fn sampling(&self) -> Sampling {
        let g = &self.generate;
        let last_n = if g.repeat_last_n < 0 { i32::try_from(g.ctx_size).unwrap_or(i32::MAX) } else { g.repeat_last_n };
        Sampling {
            temp: g.temp as f32,
            top_k: g.top_k,
            top_p: g.top_p as f32,
            min_p: g.min_p as f32,
            typical_p: g.typical_p as f32,
            seed: g.seed,
            penalties: crate::llama::Penalties {
                last_n,
                repeat: g.repeat_penalty as f32,
                frequency: g.frequency_penalty as f32,
                presence: g.presence_penalty as f32,
            },
            // Checked by validate(); a value that slipped past it biases nothing.
            logit_bias: parse_logit_bias(&g.logit_bias).unwrap_or_default(),
        }
    }

    /// Every setting's name, `section.key`, in file order.
    pub fn keys() -> Vec<String> {
        RunConfig::default().resolved_pairs().into_iter().map(|(k, _)| k).collect()
    }

    /// The full name of `key`, given as `section.key` or as a bare key
    /// that only one section has; an error lists the valid names.
    pub fn resolve_key(key: &str) -> Result<String, String> {
        let keys = RunConfig::keys();
        if keys.iter().any(|k| k == key) {
            return Ok(key.to_string());
        }
        let matches: Vec<&String> = keys.iter().filter(|k| k.split_once('.').is_some_and(|(_, b)| b == key)).collect();
        match matches[..] {
            [one] => Ok(one.clone()),
            [] => Err(format!("unknown setting `{key}`; settings are: {}", keys.join(", "))),
            _ => Err(format!(
                "`{key}` is ambiguous: {}",
                matches.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", ")
            )),
        }
    }

    /// A copy with `key` set from `value`, validated. `value` is TOML (`512`,
    /// `true`, `"text"`, `["a=1"]`) or bare text for a text setting; a list
    /// setting also takes `a=1,b=2`.
    pub fn with(&self, key: &str, value: &str) -> Result<RunConfig, String> {
        self.with_all(&[(key, value)])
    }

    /// This configuration with every `(key, value)` of `settings` changed
    /// at once, then validated (so settings that depend on each other, like
    /// a cache budget and streaming, can change together).
    pub fn with_all(&self, settings: &[(&str, &str)]) -> Result<RunConfig, String> {
        let mut table = toml::Value::try_from(self).map_err(|e| e.to_string())?;
        let mut last = String::new();
        for &(key, value) in settings {
            let name = RunConfig::resolve_key(key)?;
            let (section, field) = name.split_once('.').expect("keys are section.key");
            let slot = table
                .get_mut(section)
                .and_then(|s| s.get_mut(field))
                .ok_or_else(|| format!("unknown setting `{name}`"))?;
            let parsed = toml::from_str::<toml::Table>(&format!("v = {value}")).ok().and_then(|mut t| t.remove("v"));
            *slot = match (&*slot, parsed) {
                (toml::Value::Float(_), Some(toml::Value::Integer(i))) => toml::Value::Float(i as f64),
                (toml::Value::String(_), Some(v @ toml::Value::String(_))) => v,
                (toml::Value::String(_), _) => toml::Value::String(value.to_string()),
                (toml::Value::Array(_), Some(v @ toml::Value::Array(_))) => v,
                (toml::Value::Array(_), _) => toml::Value::Array(
                    value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| s.into()).collect(),
                ),
                (_, Some(v)) => v,
                // Not TOML: as text, which the setting's own parser judges.
                (_, None) => toml::Value::String(value.to_string()),
            };
            last = name;
        }
        let config: RunConfig = table.try_into().map_err(|e: toml::de::Error| format!("{last}: {}", e.message()))?;
        config.validate().map_err(|e| e.to_string())?;
        Ok(config)
    }

    /// Every field as `section.field = value`, for telemetry preambles.
    pub fn resolved_pairs(&self) -> Vec<(String, String)> {
        let value = toml::Value::try_from(self).expect("config serializes");
        let mut out = Vec::new();
        if let toml::Value::Table(sections) = value {
            for (section, fields) in sections {
                if let toml::Value::Table(fields) = fields {
                    for (k, v) in fields {
                        let v = match v {
                            toml::Value::String(s) => s,
                            other => other.to_string(),
                        };
                        out.push((format!("{section}.{k}"), v));
                    }
                }
            }
        }
        out
    }
}

/// `ID=BIAS` pairs, comma-separated (`BIAS` a number, `-inf` or `inf`),
/// as token ids and biases.
pub fn parse_logit_bias(text: &str) -> Result<Vec<(i32, f32)>, String> {
    let pair = |item: &str| -> Result<(i32, f32), String> {
        let (id, bias) = item.split_once('=').ok_or_else(|| format!("`{item}` is not ID=BIAS"))?;
        let id: i32 =
            id.trim().parse().ok().filter(|&n: &i32| n >= 0).ok_or_else(|| format!("`{id}` is not a token id"))?;
        let bias: f32 = bias
            .trim()
            .parse()
            .ok()
            .filter(|b: &f32| !b.is_nan())
            .ok_or_else(|| format!("`{bias}` is not a bias (a number, -inf or inf)"))?;
        Ok((id, bias))
    };
    text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(pair).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_logit_bias_reads_ids_and_biases() {
        assert_eq!(parse_logit_bias("300=5, 12=-inf").unwrap(), [(300, 5.0), (12, f32::NEG_INFINITY)]);
        assert_eq!(parse_logit_bias("").unwrap(), []);
        for bad in ["300", "x=1", "-3=1", "3=hot", "3=NaN"] {
            assert!(parse_logit_bias(bad).is_err(), "{bad}");
        }
        let e = RunConfig::default().with("generate.logit_bias", "7").unwrap_err();
        assert!(e.contains("generate.logit_bias"), "{e}");
        let c = RunConfig::default().with("generate.repeat_penalty", "1.3").unwrap();
        assert_eq!(c.sampling().penalties.repeat, 1.3);
        assert!(RunConfig::default().with("generate.presence_penalty", "5").is_err());
        let whole = RunConfig::default().with("generate.repeat_last_n", "-1").unwrap();
        assert_eq!(whole.sampling().penalties.last_n, 4096);
    }

    #[test]
    fn checked_in_file_is_the_defaults() {
        let text = include_str!("../bmoe.toml");
        assert_eq!(RunConfig::from_toml(text).unwrap(), RunConfig::default());
    }

    #[test]
    fn unknown_keys_are_rejected() {
        let e = RunConfig::from_toml("[moe]\ncache_gb = 3\n").unwrap_err();
        assert!(e.contains("cache_gb"), "{e}");
    }

    #[test]
    fn validate_names_the_field() {
        let mut c = RunConfig::default();
        assert!(c.validate().is_ok());
        c.moe.io_threads = 0;
        assert_eq!(c.validate().unwrap_err().field, "moe.io_threads");
        c = RunConfig::default();
        c.moe.cache_mb = CacheMb::Mib(100.0);
        assert!(c.validate().is_ok(), "moe.stream = auto takes an expert cache as a reason to stream");
        c.moe.stream = StreamMode::Off;
        assert_eq!(c.validate().unwrap_err().field, "moe.cache_mb");
        c.moe.stream = StreamMode::On;
        assert!(c.validate().is_ok());
        c.moe.cache_mb = CacheMb::Mib(-1.0);
        assert_eq!(c.validate().unwrap_err().field, "moe.cache_mb");
        c.moe.cache_mb = CacheMb::Mib(f64::INFINITY);
        assert_eq!(c.validate().unwrap_err().field, "moe.cache_mb");
        c.moe.cache_mb = CacheMb::Mib(0.25);
        c.generate.top_p = f64::NAN;
        assert_eq!(c.validate().unwrap_err().field, "generate.top_p");
        c = RunConfig::default();
        c.generate.ubatch = 1024;
        assert_eq!(c.validate().unwrap_err().field, "generate.ubatch");
        c = RunConfig::default();
        c.generate.temp = -1.0;
        assert_eq!(c.validate().unwrap_err().field, "generate.temp");
        c = RunConfig::default();
        c.generate.n_predict = 0;
        assert!(c.validate().is_ok(), "0: no budget");
        // More tokens than the context holds (a value typed after the old one: 128600).
        c.generate.n_predict = 128_600;
        let e = c.validate().unwrap_err();
        assert!(e.field == "generate.n_predict" && e.to_string().contains("more than the context holds"), "{e}");
        c = RunConfig::default();
        c.plugins.drop_plugin = "drop-cold".into();
        assert!(c.validate().is_ok(), "a drop plugin makes moe.stream = auto stream");
        c.moe.stream = StreamMode::Off;
        assert_eq!(c.validate().unwrap_err().field, "plugins.drop_plugin");
        c = RunConfig::default();
        c.plugins.draft_plugin = "ngram".into();
        c.generate.temp = 0.7;
        assert_eq!(c.validate().unwrap_err().field, "plugins.draft_plugin");
        c = RunConfig::default();
        c.plugins.draft_params = vec!["min_match".into()];
        assert_eq!(c.validate().unwrap_err().field, "plugins.draft_params");
        c = RunConfig::default();
        c.plugins.draft = 0;
        assert_eq!(c.validate().unwrap_err().field, "plugins.draft");
    }

    #[test]
    fn moe_stream_is_auto_unless_set_and_takes_every_spelling() {
        assert_eq!(RunConfig::default().moe.stream, StreamMode::Auto);
        let c = RunConfig::default();
        for (value, want) in [("true", StreamMode::On), ("on", StreamMode::On), ("false", StreamMode::Off)] {
            assert_eq!(c.with("moe.stream", value).unwrap().moe.stream, want, "{value}");
        }
        let off = c.with("moe.stream", "off").unwrap();
        assert_eq!(off.with("stream", "auto").unwrap().moe.stream, StreamMode::Auto);
        assert_eq!(RunConfig::from_toml("[moe]\nstream = true\n").unwrap().moe.stream, StreamMode::On);
        assert_eq!(RunConfig::from_toml("[moe]\nstream = \"auto\"\n").unwrap().moe.stream, StreamMode::Auto);
        assert!(RunConfig::from_toml("[moe]\nstream = \"sometimes\"\n").unwrap_err().contains("sometimes"));
        // What needs streaming makes auto stream, and is refused when streaming is off.
        assert_eq!(c.stream_needed_by(), None);
        let cached = c.with("cache_mb", "64").unwrap();
        assert_eq!(cached.stream_needed_by(), Some("moe.cache_mb (an expert cache)"));
        assert!(off.with("cache_mb", "64").unwrap_err().contains("moe.stream is off"));
        assert!(off.with("route_trace", "/tmp/t.csv").unwrap_err().contains("telemetry.route_trace"));
        assert_eq!(c.with("route_trace", "/tmp/t.csv").unwrap().stream_needed_by(), Some("telemetry.route_trace"));
    }

    #[test]
    fn settings_by_name() {
        let c = RunConfig::default();
        assert_eq!(RunConfig::resolve_key("temp").unwrap(), "generate.temp");
        assert_eq!(RunConfig::resolve_key("moe.cache_mb").unwrap(), "moe.cache_mb");
        let e = RunConfig::resolve_key("cache_gb").unwrap_err();
        assert!(e.contains("unknown setting `cache_gb`") && e.contains("moe.cache_mb"), "{e}");
        let c = c.with("moe.stream", "true").unwrap().with("cache_mb", "512").unwrap();
        assert_eq!(c.moe.cache_mb, CacheMb::Mib(512.0));
        assert_eq!(c.with("cache_mb", "auto").unwrap().moe.cache_mb, CacheMb::Auto);
        assert!(c.with("cache_mb", "lots").unwrap_err().contains("moe.cache_mb"));
        assert_eq!(c.with("temp", "0.7").unwrap().generate.temp, 0.7);
        assert_eq!(c.with("draft_plugin", "ngram").unwrap().plugins.draft_plugin, "ngram");
        let p = c.with("draft_params", "min_match=2, max_match=8").unwrap().plugins.draft_params;
        assert_eq!(p, ["min_match=2", "max_match=8"]);
        assert_eq!(c.with("model.path", "/m/x.gguf").unwrap().model.path, PathBuf::from("/m/x.gguf"));
        let off = c.with("repack", "off").unwrap();
        assert_eq!(off.session_options(Path::new("m.gguf"), false).repack, Repack::Off);
        assert_eq!(c.session_options(Path::new("m.gguf"), false).repack, Repack::Auto);
        assert!(c.with("repack", "yes").unwrap_err().contains("model.repack"));
        // Bad values are refused with the setting's name; the config is unchanged.
        assert!(c.with("io_threads", "0").unwrap_err().contains("moe.io_threads"));
        assert!(c.with("predict_layers", "5").unwrap_err().contains("moe.predict_layers"));
        assert_eq!(c.with("predict_layers", "1").unwrap().moe.predict_layers, 1);
        assert!(!c.with("recycle_pages", "false").unwrap().moe.recycle_pages);
        assert!(c.with("n_predict", "lots").unwrap_err().contains("generate.n_predict"));
        assert!(c.with("stream", "maybe").unwrap_err().contains("moe.stream"));
    }

    #[test]
    fn grammar_must_be_a_file_and_not_beside_a_draft_plugin() {
        let c = RunConfig::default();
        assert!(c.with("grammar", "/no/such.gbnf").unwrap_err().contains("generate.grammar"));
        let file = tempfile::NamedTempFile::new().unwrap();
        let path = file.path().to_str().unwrap();
        let with = c.with("grammar", path).unwrap();
        assert_eq!(with.generate.grammar, std::path::Path::new(path));
        let both = with.with("draft_plugin", "ngram").unwrap_err();
        assert!(both.contains("generate.grammar") && both.contains("draft plugin"), "{both}");
        assert!(with.with("grammar", "\"\"").unwrap().generate.grammar.as_os_str().is_empty());
    }

    #[test]
    fn the_step_target_is_off_or_above_one_and_a_half() {
        let c = RunConfig::default();
        assert_eq!(c.serve.step_target, DEFAULT_STEP_TARGET);
        assert_eq!(c.with("serve.step_target", "0").unwrap().serve.step_target, 0.0);
        assert_eq!(c.with("serve.step_target", "2.5").unwrap().serve.step_target, 2.5);
        for bad in ["1.2", "-1", "101", "nan"] {
            let e = c.with("serve.step_target", bad).unwrap_err();
            assert!(e.contains("serve.step_target"), "{bad}: {e}");
        }
    }

    #[test]
    fn resolved_pairs_cover_every_field() {
        let pairs = RunConfig::default().resolved_pairs();
        assert!(pairs.iter().any(|(k, v)| k == "moe.cache_mb" && v == "auto"));
        assert!(pairs.iter().any(|(k, v)| k == "moe.repacked_copy_max_gb" && v.parse::<f64>() == Ok(0.0)));
        assert_eq!(pairs.len(), 4 + 19 + 18 + 10 + 5 + 5 + 10);
    }

    #[test]
    fn dense_weights_auto_is_the_default_and_does_not_ask_for_streaming() {
        let mut c = RunConfig::default();
        assert_eq!(c.moe.dense_weights, "auto");
        assert_eq!(c.stream_needed_by(), None);
        c.moe.stream = StreamMode::Off;
        assert!(c.validate().is_ok(), "auto and mmap apply to a run that does not stream");
        c.moe.dense_weights = "anon".into();
        assert_eq!(c.validate().unwrap_err().field, "moe.dense_weights");
        c.moe.stream = StreamMode::Auto;
        assert_eq!(c.stream_needed_by(), Some("moe.dense_weights"));
        c.moe.dense_weights = "mmap".into();
        assert_eq!(c.stream_needed_by(), None);
        c.moe.dense_weights = "sometimes".into();
        let e = c.validate().unwrap_err();
        assert!(e.to_string().contains("`sometimes` is not auto, mmap, warm or anon"), "{e}");
    }

    #[test]
    fn batch_invariance_reads_auto_and_the_old_switches() {
        let read =
            |v: &str| toml::from_str::<GenerateConfig>(&format!("batch_invariant = {v}")).map(|g| g.batch_invariant);
        assert_eq!(read("\"auto\"").unwrap(), BatchInvariance::Auto);
        assert_eq!(read("true").unwrap(), BatchInvariance::On);
        assert_eq!(read("false").unwrap(), BatchInvariance::Off);
        let e = read("\"sometimes\"").unwrap_err().to_string();
        assert!(e.contains("`sometimes` is not `auto`, `true` (on) or `false` (off)"), "{e}");
        assert!(BatchInvariance::Auto.resolve(true) && !BatchInvariance::Auto.resolve(false));
        assert!(BatchInvariance::On.resolve(false) && !BatchInvariance::Off.resolve(true));
        // A setting typed in the chat's settings screen: a switch over auto, and auto back.
        let c = RunConfig::default().with("generate.batch_invariant", "false").unwrap();
        assert_eq!(c.generate.batch_invariant, BatchInvariance::Off);
        assert_eq!(c.with("generate.batch_invariant", "auto").unwrap().generate.batch_invariant, BatchInvariance::Auto);
    }
}
