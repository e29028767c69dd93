//! Model commands: `make-model`, `inspect`, `archs`, `trace-stats`.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Args;

use super::write_model_with_progress;
use crate::gguf::{GgmlType, ModelFiles};
use crate::moe::recipe::{self, EXPERT_SUFFIXES, parse_expert_tensor};
use crate::synth::{Arch, ModelSpec, Preset};
use crate::telemetry::trace;

/// `bmoe make-model`
#[derive(Args, Debug, Default)]
pub struct MakeModelArgs {
    /// Output file (with --split N: the name before -0000i-of-0000N.gguf).
    #[arg(short, long, required_unless_present = "plan")]
    pub output: Option<PathBuf>,
    /// Print the plan (tensors by group, bytes of experts, dense weights and vocabulary matrices, the
    /// file size) and write nothing.
    #[arg(long)]
    pub plan: bool,
    /// Starting shape: tiny (<5 MB, tests), demo (~220 MB), bench (Qwen3-30B-A3B layers, >5 GB), or a
    /// real model's full shape with its real vocabulary and its release's quantization mix: qwen3-30b-a3b,
    /// gpt-oss-20b, qwen3.5-35b-a3b, glm-4.5-air, lfm2-8b-a1b, deepseek-v2-lite (see --plan).
    #[arg(long, default_value = "tiny")]
    pub preset: String,
    /// Architecture, by llama.cpp's `general.architecture` name (`bmoe archs` lists those the generator makes;
    /// default qwen3moe, or the full-size preset's own).
    #[arg(long)]
    pub arch: Option<String>,
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
    /// Shared experts beside the routed ones (architectures that have them; default: the architecture's usual).
    #[arg(long)]
    pub shared_experts: Option<u32>,
    /// Leading layers with a dense FFN instead of experts (architectures that have them).
    #[arg(long)]
    pub dense_layers: Option<u32>,
    /// MTP (next-token prediction) layers after the main blocks (glm4moe, deepseek2, qwen35moe).
    #[arg(long)]
    pub mtp_layers: Option<u32>,
    /// Expert tensor type: f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1, the K-quants q2_K..q6_K, iq1_s, iq1_m,
    /// iq2_xxs, iq2_xs, iq2_s, iq3_xxs, iq3_s, iq4_xs, iq4_nl or mxfp4 (K-quants and most IQ types need widths
    /// that are multiples of 256, the others of 32).
    #[arg(long)]
    pub quant: Option<String>,
    /// A llama.cpp quantization recipe applied per tensor, as releases are made: q4_k_m, q5_k_m, q6_k, q3_k_m,
    /// iq2_xxs or mxfp4 (MXFP4_MOE: experts in MXFP4, the rest q8_0). Replaces --quant.
    #[arg(long, value_name = "RECIPE")]
    pub quant_mix: Option<String>,
    /// Vocabulary size: byte and letter tokens, the template's markers, then filler tokens up to this many
    /// (the full-size presets use their model's real size).
    #[arg(long)]
    pub vocab: Option<u32>,
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
    /// Write a chat template: a bundled family (qwen3, qwen3.5, gpt-oss, gemma-4, ...) or a .jinja file.
    /// Its markers become special tokens of the vocabulary.
    #[arg(long, value_name = "FAMILY|FILE")]
    pub chat_template: Option<String>,
}

pub fn make_model(a: MakeModelArgs) -> Result<()> {
    let spec = model_spec(&a)?;
    if a.plan {
        spec.validate().map_err(|e| anyhow!("invalid model shape: {e}"))?;
        return super::print_stdout(&plan_report(&spec));
    }
    let output = a.output.as_deref().context("give -o FILE (or --plan)")?;
    let report = write_model_with_progress(&spec, output, "writing")?;
    for p in &report.paths {
        eprintln!("wrote {}", p.display());
    }
    eprintln!(
        "{} {} layers, {} experts (top-{}), {}: {:.1} MiB in {:.2} s ({:.0} MiB/s); random weights",
        spec.arch.name(),
        spec.layers,
        spec.experts,
        spec.experts_used,
        spec.quant_mix.map_or_else(|| format!("{} experts", spec.expert_type), |m| format!("{} mix", m.name())),
        report.bytes as f64 / 1048576.0,
        report.seconds,
        report.bytes as f64 / 1048576.0 / report.seconds.max(1e-9)
    );
    Ok(())
}

/// What `make-model --plan` prints: the tensors of `spec` by group (count,
/// types, bytes), the experts against the dense weights and the file size.
pub fn plan_report(spec: &ModelSpec) -> String {
    use std::collections::BTreeMap;
    use std::fmt::Write as _;
    let planned = crate::synth::plan(spec);
    let group = |name: &str| -> &'static str {
        if parse_expert_tensor(name).is_some() {
            "routed experts"
        } else if name.starts_with("token_embd.")
            || name.starts_with("output.")
            || name.contains("nextn.embed_tokens")
            || name.contains("nextn.shared_head_head")
        {
            "vocabulary matrices"
        } else if name.contains("norm.") {
            "norms and other"
        } else if name.contains("_shexp") {
            "shared experts"
        } else if name.contains("ffn_gate_inp") || name.contains("exp_probs_b") {
            "routers"
        } else if name.contains(".ssm_") || name.contains(".shortconv.") {
            "recurrent blocks"
        } else if name.contains(".attn_") {
            "attention"
        } else if name.contains(".ffn_") {
            "dense FFNs"
        } else {
            "norms and other"
        }
    };
    // group -> (tensors, bytes, types)
    let mut groups: BTreeMap<&str, (usize, u64, BTreeMap<String, u64>)> = BTreeMap::new();
    let mut writer = crate::gguf::GgufWriter::new();
    for (k, v) in &planned.metadata {
        writer.set(k, v.clone());
    }
    for (t, _) in &planned.tensors {
        let g = groups.entry(group(&t.name)).or_default();
        g.0 += 1;
        g.1 += t.size();
        *g.2.entry(t.ty.name().to_string()).or_default() += t.size();
        writer.add_tensor(t.clone());
    }
    let total: u64 = planned.tensors.iter().map(|(t, _)| t.size()).sum();
    let params: u64 = planned.tensors.iter().map(|(t, _)| t.dims.iter().product::<u64>()).sum();
    let experts = groups.get("routed experts").map_or(0, |g| g.1);
    let mut out = String::new();
    let what = spec.quant_mix.map_or_else(|| format!("{} experts", spec.expert_type), |m| format!("{} mix", m.name()));
    let _ = writeln!(
        out,
        "{} {} layers, {} experts (top-{}), {what}: {} tensors",
        spec.arch.name(),
        spec.layers,
        spec.experts,
        spec.experts_used,
        planned.tensors.len()
    );
    let _ = writeln!(out, "{:<22} {:>7} {:>12} {:>7}  types", "group", "tensors", "MiB", "share");
    for (name, (count, bytes, types)) in &groups {
        let types: Vec<String> = types.iter().map(|(t, b)| format!("{t} {:.1}", *b as f64 / 1048576.0)).collect();
        let _ = writeln!(
            out,
            "{name:<22} {count:>7} {:>12.2} {:>6.1}%  {}",
            *bytes as f64 / 1048576.0,
            100.0 * *bytes as f64 / total.max(1) as f64,
            types.join(", ")
        );
    }
    let _ = writeln!(
        out,
        "experts {:.2} MiB, dense weights {:.2} MiB (resident while streaming), file {:.2} MiB",
        experts as f64 / 1048576.0,
        (total - experts) as f64 / 1048576.0,
        writer.file_size() as f64 / 1048576.0
    );
    let gib = |b: u64| b as f64 / f64::from(1u32 << 30);
    let _ = writeln!(
        out,
        "tensors {:.2} GiB, {:.2} B parameters, {} tokens in the vocabulary",
        gib(total),
        params as f64 / 1e9,
        planned.n_vocab
    );
    if let Some(model) = crate::synth::MODEL_PRESETS.iter().find(|m| same_shape(spec, &m.spec())) {
        let r = &model.release;
        let _ = writeln!(
            out,
            "release: {} has {:.2} GiB of tensors, {:.2} B parameters; this plan: {:+.1}% bytes, {:+.1}% parameters\n\
             (source: {})",
            r.file,
            r.gib,
            r.params_b,
            100.0 * (total as f64 / r.bytes() as f64 - 1.0),
            100.0 * (params as f64 / (r.params_b * 1e9) - 1.0),
            r.source
        );
    }
    out
}

/// Whether `a` and `b` plan the same tensors: equal but for the seed, the
/// shard count, the routing shape and the chat template (whose markers
/// take natural vocabulary rows but leave a padded vocabulary's size).
fn same_shape(a: &ModelSpec, b: &ModelSpec) -> bool {
    let b = ModelSpec {
        seed: a.seed,
        split: a.split,
        routing: a.routing,
        chat_template: a.chat_template.clone(),
        pieces: a.pieces,
        ..b.clone()
    };
    *a == b && a.vocab > 0
}

/// The model `bmoe make-model` (and a script's `make_model`) would write
/// for `a`: the preset, then every option given.
pub fn model_spec(a: &MakeModelArgs) -> Result<ModelSpec> {
    let preset = Preset::from_name(&a.preset)
        .ok_or_else(|| anyhow!("--preset {}: the presets are {}", a.preset, Preset::names()))?;
    let arch_name = a.arch.as_deref().unwrap_or("qwen3moe");
    let arch = Arch::from_name(arch_name).ok_or_else(|| {
        let known = if recipe::recipe_for(arch_name).is_some() {
            " (llama.cpp runs it, and bmoe streams its files by capability, but has no generator for it)"
        } else {
            ""
        };
        anyhow!("--arch {arch_name}{known}: the generator makes {}", Arch::names())
    })?;
    if let (Preset::Model(model), Some(_)) = (preset, &a.arch)
        && model.arch != arch
    {
        bail!("--preset {} is a {} model; leave out --arch {arch_name}", model.name, model.arch.name());
    }
    let mut spec = ModelSpec::preset(preset, arch);
    if let Some(q) = &a.quant {
        let known = crate::synth::EXPERT_TYPES.iter().any(|t| t.eq_ignore_ascii_case(q));
        spec.expert_type = GgmlType::from_name(q).filter(|_| known).ok_or_else(|| {
            anyhow!("--quant {q}: the generator writes {} experts", crate::synth::EXPERT_TYPES.join(", "))
        })?;
        if spec.quant_mix.take().is_some() {
            // A full-size preset's mix gives way: experts of one type, the dense weights in f16.
            spec.dense_type = GgmlType::F16;
        }
    }
    if let Some(m) = &a.quant_mix {
        if a.quant.is_some() {
            bail!("give --quant (one type for the experts) or --quant-mix (a recipe for every tensor), not both");
        }
        let names: Vec<&str> = crate::synth::QuantMix::ALL.iter().map(|(_, n)| *n).collect();
        spec.quant_mix = Some(
            crate::synth::QuantMix::from_name(m)
                .ok_or_else(|| anyhow!("--quant-mix {m}: the recipes are {}", names.join(", ")))?,
        );
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
    set(&mut spec.shared_experts, a.shared_experts);
    set(&mut spec.dense_layers, a.dense_layers);
    set(&mut spec.mtp_layers, a.mtp_layers);
    set(&mut spec.vocab, a.vocab);
    spec.derive();
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
    if let Some(t) = &a.chat_template {
        let source = match crate::chat::named_template(t) {
            Some(s) => s.to_string(),
            None if std::path::Path::new(t).is_file() => {
                std::fs::read_to_string(t).with_context(|| format!("reading {t}"))?
            }
            None => {
                let names: Vec<&str> = crate::chat::NAMED_TEMPLATES.iter().map(|(n, _)| *n).collect();
                bail!("--chat-template {t}: not a file nor a bundled family ({})", names.join(", "));
            }
        };
        crate::chat::ChatTemplate::new(t, &source).map_err(|e| anyhow!(e))?;
        spec.chat_template = Some(source);
    }
    Ok(spec)
}

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / 1048576.0)
}

pub fn inspect(file: &Path) -> Result<()> {
    let files = ModelFiles::open(file)?;
    super::print_stdout(&inspect_report(&files, file))
}

/// What `bmoe inspect` prints about an opened model: its shape, expert and
/// dense bytes, and whether bmoe can stream it. The metadata is untrusted:
/// any values, however absurd, give a report (the fuzz targets check this).
pub fn inspect_report(files: &ModelFiles, file: &Path) -> String {
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
    // MTP (next-n) layers count in block_count but never run in the main graph.
    let mtp = meta.arch_u64("nextn_predict_layers").unwrap_or(0);
    let trunk = n_layer.map(|n| n.saturating_sub(mtp));
    let layers_line = match (n_layer, mtp) {
        (Some(n), m) if m > 0 && m <= n => format!("{n} ({} + {m} MTP)", n - m),
        (n, _) => n.map_or("?".into(), |v| v.to_string()),
    };
    let _ = writeln!(out, "layers:        {layers_line}");
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
                e.2 &= t.file_offset.is_multiple_of(4096) && slice.is_multiple_of(4096);
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
    if let Some(line) = vocabulary_line(files) {
        let _ = writeln!(out, "vocabulary:    {line}");
    }
    if let Some((first, (slice, projs, _))) = layers.iter().next() {
        let uniform = layers.values().all(|(s, _, _)| s == slice);
        let _ = writeln!(
            out,
            "expert slice:  {} per expert per layer{} ({})",
            mib(*slice),
            if uniform { String::new() } else { format!(" in layer {first}; varies by layer") },
            projs.join(", ")
        );
        let in_trunk = |l: &u32| trunk.is_none_or(|t| u64::from(*l) < t);
        let trunk_moe = layers.keys().filter(|l| in_trunk(l)).count();
        let mtp_note =
            if trunk_moe < layers.len() { " (an MTP layer's experts are not read while decoding)" } else { "" };
        let _ = writeln!(out, "moe layers:    {trunk_moe} of {}{mtp_note}", trunk.unwrap_or(0));
        if let Some(k) = k {
            let per_token: u64 =
                layers.iter().filter(|(l, _)| in_trunk(l)).map(|(_, (s, _, _))| s * k.min(n_expert)).sum();
            let _ = writeln!(out, "token demand:  {} read per token with no cache", mib(per_token));
        }
        let aligned = layers.values().all(|(_, _, a)| *a);
        let _ = writeln!(out, "page-aligned:  {}", if aligned { "yes" } else { "no (O_DIRECT reads aligned windows)" });
        let banks = files.tensors().filter(|t| crate::moe::repack::is_bank(&t.info.name, &t.info.dims)).count();
        let repackable = crate::moe::repack::repackable_banks(files).len();
        let _ = writeln!(
            out,
            "repacked:      {repackable} of {banks} expert banks have this CPU's faster repacked kernels{}",
            if repackable > 0 { " (--repack)" } else { "" }
        );
    }
    let checked = crate::moe::capability::check_file(files);
    if let Ok(features) = &checked {
        let _ = writeln!(out, "moe features:  {}", features.describe().join(", "));
    }
    let verdict = match (recipe::refusal(arch), checked) {
        (Some(why), _) => format!("no: {why}"),
        (None, Err(e)) => format!("no: {e}"),
        (None, Ok(_)) => match recipe::recipe_for(arch) {
            Some(r) if r.gated() => "yes (covered by byte-identity gates)".to_string(),
            Some(_) => "yes (by capability; no byte-identity gate covers this architecture yet)".to_string(),
            None => "yes (by capability; an architecture bmoe's registry does not list)".to_string(),
        },
    };
    let _ = writeln!(out, "streamable:    {verdict}");
    out
}

/// What the vocabulary matrices cost: the embedding is gathered a row per
/// token (mapped, only the rows used become resident), the output head is
/// read whole every token (or is the embedding, when tied).
fn vocabulary_line(files: &ModelFiles) -> Option<String> {
    let find = |name: &str| files.tensors().find(|t| t.info.name == name);
    let embd = find("token_embd.weight")?;
    let rows = embd.info.dims.get(1).copied().unwrap_or(0);
    let embd_size = format!("{} {}", mib(embd.info.size), embd.info.ty);
    Some(match find("output.weight") {
        Some(o) => format!(
            "{rows} tokens: token_embd {embd_size} (read a row per token), output {} {} (read whole every token)",
            mib(o.info.size),
            o.info.ty
        ),
        None => format!("{rows} tokens: token_embd {embd_size}, tied: also the output head (read whole every token)"),
    })
}

/// `bmoe archs`: every MoE architecture the pinned llama.cpp runs, with its
/// models, features, gate and chat templates.
pub fn archs() -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let gated = recipe::RECIPES.iter().filter(|r| r.gated()).count();
    let _ = writeln!(
        out,
        "{} MoE architectures in the pinned llama.cpp; {gated} gated (a synthetic model of each streams bit-identical \
         to resident in `cargo test`).",
        recipe::RECIPES.len()
    );
    let _ = writeln!(out, "{:<16} {:<6} {:<12} {:<62} models", "arch", "gated", "template", "moe features");
    let mut rows: Vec<&recipe::Recipe> = recipe::RECIPES.iter().collect();
    rows.sort_by_key(|r| (!r.gated(), r.support != recipe::Support::Capable, r.arch));
    for r in &rows {
        let templates = recipe::chat_templates(r.arch);
        let template = if templates.is_empty() { "-".to_string() } else { templates.join(",") };
        let gate = match r.support {
            recipe::Support::Refused(_) => "NO",
            recipe::Support::Capable if r.gated() => "yes",
            recipe::Support::Capable => "-",
        };
        let features = if r.features.is_empty() { "routed experts only" } else { r.features };
        let _ = writeln!(out, "{:<16} {:<6} {:<12} {:<62} {}", r.arch, gate, template, features, r.models);
    }
    let _ =
        writeln!(out, "\ngated yes: generated and gated; -: streams by capability with a notice; NO: cannot stream:");
    for r in rows.iter().filter(|r| matches!(r.support, recipe::Support::Refused(_))) {
        if let recipe::Support::Refused(why) = r.support {
            let _ = writeln!(out, "  {}: {why}", r.arch);
        }
    }
    let _ = writeln!(
        out,
        "\nStreaming by capability: every blk.<il>.ffn_{{gate,up,gate_up,down}}_exps.weight has three dimensions,"
    );
    let _ = writeln!(
        out,
        "the last indexing the expert; each MoE layer has down plus gate+up, gate_up or up alone; and every"
    );
    let _ =
        writeln!(out, "layer that multiplies its experts shows llama.cpp's ffn_moe_topk-<il> node. Everything else");
    let _ = writeln!(
        out,
        "(attention, norms, routers, shared experts, recurrent blocks, .scale/.bias companions) stays resident."
    );
    let _ = writeln!(out, "`bmoe make-model --arch NAME` writes a synthetic model of a gated architecture.");
    out
}

pub fn trace_stats(files: &[PathBuf], tokens: usize) -> Result<()> {
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
