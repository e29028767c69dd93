//! Which settings a live session can change between turns, which need the
//! model opened again, and what each one does (for `:help`, completion and
//! the TUI's settings popup).

/// How a setting takes effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Apply {
    /// From the next turn on, on the same session.
    Live,
    /// The model is opened again with it (the conversation is kept and
    /// prefilled again on the next turn).
    Reopen,
    /// Read by `bmoe serve` when it starts; a running session only keeps
    /// it (for `:save` and a later `bmoe serve --config`).
    ServeStart,
}

impl Apply {
    /// `live` or `reopen`.
    pub fn name(self) -> &'static str {
        match self {
            Apply::Live => "live",
            Apply::Reopen => "reopen",
            Apply::ServeStart => "serve start",
        }
    }
}

/// (setting, how it applies, what it does), for every setting in `bmoe.toml`.
pub const SETTINGS: &[(&str, Apply, &str)] = &[
    (
        "model.path",
        Apply::Reopen,
        "GGUF model file, or a hub model (OWNER/NAME[:QUANT], or a name `bmoe models` lists); empty = the demo model",
    ),
    ("model.repack", Apply::Reopen, "expert banks for the CPU's repacked kernels: auto, on, off"),
    ("model.rpc", Apply::Reopen, "RPC servers holding the last layers, HOST:PORT,... (empty = none)"),
    (
        "model.rpc_layers",
        Apply::Reopen,
        "layers on the RPC servers: a count per server, or a total (empty = by memory)",
    ),
    ("generate.n_predict", Apply::Live, "most tokens per turn"),
    ("generate.threads", Apply::Reopen, "compute threads (0 = tuned between 1 and one per core)"),
    ("generate.ctx_size", Apply::Reopen, "context length in tokens, all turns together"),
    ("generate.batch", Apply::Reopen, "most prompt tokens per decode call"),
    ("generate.ubatch", Apply::Reopen, "most tokens per graph computation"),
    (
        "generate.batch_invariant",
        Apply::Reopen,
        "batch-invariant kernels: bitwise the same logits alone or beside others (auto: for serve and drafts)",
    ),
    ("generate.temp", Apply::Live, "sampling temperature (0 = greedy)"),
    ("generate.top_k", Apply::Live, "top-k sampling stage (0 = off)"),
    ("generate.top_p", Apply::Live, "top-p sampling stage"),
    (
        "generate.min_p",
        Apply::Live,
        "min-p sampling stage: drop tokens under this fraction of the top one's probability (0 = off)",
    ),
    ("generate.typical_p", Apply::Live, "locally typical sampling's mass (1 = off)"),
    ("generate.repeat_penalty", Apply::Live, "divides the logits of tokens generated lately (1 = off; greedy too)"),
    ("generate.frequency_penalty", Apply::Live, "subtracted per time a token was generated lately (0 = off)"),
    ("generate.presence_penalty", Apply::Live, "subtracted once from a token generated lately (0 = off)"),
    ("generate.repeat_last_n", Apply::Live, "the penalties' window in generated tokens (0 = none, -1 = the context)"),
    ("generate.logit_bias", Apply::Live, "ID=BIAS pairs added to tokens' logits (-inf bans one; empty = none)"),
    ("generate.seed", Apply::Live, "sampling seed"),
    ("generate.grammar", Apply::Live, "a GBNF grammar file the output must follow (empty = none)"),
    (
        "generate.json_schema",
        Apply::Live,
        "a JSON schema the output must follow: a file, or the schema itself (empty = none)",
    ),
    ("moe.stream", Apply::Reopen, "stream routed experts from disk: auto (when the model does not fit), true or false"),
    (
        "moe.cache_mb",
        Apply::Live,
        "expert cache budget: auto or MiB (auto, turning the cache on or off, or io_uring's registered cache, reopens)",
    ),
    ("moe.cache_ceil_mb", Apply::Reopen, "upper bound of an auto cache budget, MiB (0 = none)"),
    ("moe.cache_policy", Apply::Reopen, "which cached expert goes first: decay (fewest recent uses) or lru"),
    ("moe.route_profile", Apply::Reopen, "the model's route profile: update (use and learn), read (use only) or off"),
    ("moe.force_cache", Apply::Live, "accept a fixed budget below one token's working set"),
    ("moe.dense_weights", Apply::Reopen, "how dense weights are held while streaming: auto, mmap, warm, anon"),
    ("moe.io_threads", Apply::Reopen, "parallel read lanes"),
    ("moe.o_direct", Apply::Reopen, "O_DIRECT expert reads"),
    ("moe.n_expert_used", Apply::Reopen, "experts per token (0 = the model's own; fewer is lossy)"),
    ("moe.prefetch", Apply::Reopen, "read ahead the previous token's experts of the next N layers (0 = off)"),
    ("moe.predict", Apply::Reopen, "read ahead the experts the next layer's router picks, run early (needs the cache)"),
    ("moe.predict_layers", Apply::Reopen, "how many next layers' routers run early (1-4)"),
    (
        "moe.prefill_read_ahead",
        Apply::Reopen,
        "with predict on, read ahead in prompt chunks too: the next layer's picks for every prompt token",
    ),
    (
        "moe.lean_open",
        Apply::Reopen,
        "a model larger than memory loads from a copy without its expert bytes: opening reads the dense weights only",
    ),
    (
        "moe.io_uring",
        Apply::Reopen,
        "read through io_uring into cache memory registered at open: no page pinned per read",
    ),
    (
        "moe.recycle_pages",
        Apply::Reopen,
        "move an evicted expert's pages under the next one read (no fresh page faults)",
    ),
    (
        "moe.repacked_copy",
        Apply::Reopen,
        "stream repacked experts from a copy stored repacked in the cache directory, not repacked as read",
    ),
    (
        "moe.repacked_copy_max_gb",
        Apply::Reopen,
        "most GiB a repacked copy may take on disk (0 = half the free space); over it, the copy takes the experts as read",
    ),
    (
        "plugins.draft_plugin",
        Apply::Live,
        "speculative decoding plugin (ngram, ngram-multi, suffix, a .wasm; empty = off)",
    ),
    ("plugins.draft", Apply::Live, "most tokens drafted per step"),
    ("plugins.mtp", Apply::Reopen, "draft with the model's own MTP layers (GLM-4.5+, DeepSeek-V3, ...)"),
    ("plugins.mtp_p_min", Apply::Reopen, "an MTP draft stops before a token its head gives less probability"),
    (
        "plugins.mtp_experts",
        Apply::Reopen,
        "which routed experts a streamed MTP layer drafts with: cached (reads at most one per draft token) or all",
    ),
    ("plugins.draft_params", Apply::Live, "draft plugin parameters, name=value,..."),
    ("plugins.drop_plugin", Apply::Live, "expert-drop plugin (drop-cold, a .wasm; empty = off; lossy)"),
    ("plugins.drop_params", Apply::Live, "drop plugin parameters, name=value,..."),
    ("plugins.call_ms", Apply::Live, "CPU time per plugin call, ms"),
    ("plugins.memory_mb", Apply::Live, "plugin memory limit, MiB"),
    ("chat.template", Apply::Live, "a .jinja chat template (or a bundled one's name) instead of the model's own"),
    ("chat.system", Apply::Live, "system prompt of new conversations"),
    ("chat.think", Apply::Live, "let the model reason before answering"),
    (
        "chat.reasoning_effort",
        Apply::Live,
        "how much to think, where the template takes it (gpt-oss, Hunyuan, Kimi-K3): low, medium, high",
    ),
    (
        "chat.tools",
        Apply::Live,
        "a JSON file of functions the model may call, shown by its chat template (empty = none)",
    ),
    (
        "chat.tool_choice",
        Apply::Live,
        "auto (the model decides) or required (a reply to a user message is one tool call)",
    ),
    (
        "chat.markers_in_content",
        Apply::Live,
        "read special-token markers in a message's text as tokens (off: a message's text is text)",
    ),
    ("telemetry.csv", Apply::Live, "per-token CSV file (empty = none)"),
    ("telemetry.route_trace", Apply::Live, "route trace file (empty = none; needs streaming)"),
    ("telemetry.verbose", Apply::Live, "show llama.cpp's log"),
    ("serve.host", Apply::ServeStart, "address `bmoe serve` listens on"),
    ("serve.port", Apply::ServeStart, "port `bmoe serve` listens on"),
    ("serve.api_key", Apply::ServeStart, "key `bmoe serve` clients must send; empty = none"),
    ("serve.queue", Apply::ServeStart, "requests `bmoe serve` lets wait; more get 429"),
    ("serve.parallel", Apply::ServeStart, "requests `bmoe serve` decodes together"),
    ("serve.body_mb", Apply::ServeStart, "largest request body `bmoe serve` reads, MiB"),
    (
        "serve.shutdown_grace_s",
        Apply::ServeStart,
        "seconds running requests get to finish when `bmoe serve` is stopped",
    ),
    ("serve.cors", Apply::ServeStart, "origins allowed to call `bmoe serve` from a browser, comma-separated"),
    (
        "serve.step_target",
        Apply::ServeStart,
        "a running stream's step within this many plain steps while prompts join (0 = no budget)",
    ),
];

/// How `key` (a full `section.key` name) applies.
pub fn apply_of(key: &str) -> Apply {
    SETTINGS.iter().find(|(k, _, _)| *k == key).map_or(Apply::Reopen, |(_, a, _)| *a)
}

/// What `key` does.
pub fn description(key: &str) -> &'static str {
    SETTINGS.iter().find(|(k, _, _)| *k == key).map_or("", |(_, _, d)| d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RunConfig;

    #[test]
    fn every_config_key_is_described() {
        let keys = RunConfig::keys();
        let mut described: Vec<&str> = SETTINGS.iter().map(|(k, _, _)| *k).collect();
        described.sort_unstable();
        assert_eq!(keys, described, "SETTINGS must list every bmoe.toml key once");
    }

    /// The server's settings are read when it starts, never live in a session.
    #[test]
    fn server_settings_apply_when_the_server_starts() {
        for (key, apply, _) in SETTINGS {
            assert_eq!(key.starts_with("serve."), *apply == Apply::ServeStart, "{key}");
        }
    }
}
