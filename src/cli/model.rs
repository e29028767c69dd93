//! Model commands: `make-model`, `inspect`, `archs`, `trace-stats`.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};
use clap::Args;

use crate::gguf::ModelFiles;
use crate::moe::recipe::{self, parse_expert_tensor};
use crate::progress::write_model_with_progress;
use crate::synth::{ModelOptions, ModelSpec, model_spec};
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
    /// The model's shape, types, routing and chat template.
    #[command(flatten)]
    pub model: ModelOptions,
}

pub fn make_model(a: MakeModelArgs) -> Result<()> {
    let spec = model_spec(&a.model)?;
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
    if let Some(share) = a.model.mtp_agreement()? {
        eprint!("mtp head: learning each token's successor from greedy runs... ");
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get() as u32);
        let head = crate::mtp_head::write_agreeing_head(&report.paths[0], share, spec.seed, threads)
            .map_err(|e| anyhow!("--mtp-head: {e}"))?;
        eprintln!(
            "{} tokens generated, {} with a successor, {} of them kept (the rest given a wrong one)",
            head.tokens_seen, head.with_successor, head.agreeing
        );
    }
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

pub fn inspect(file: &Path) -> Result<()> {
    let files = ModelFiles::open(file)?;
    super::print_stdout(&crate::moe::inspect::inspect_report(&files, file))
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
    let mut rows: Vec<&recipe::Recipe> = recipe::RECIPES.iter().collect();
    rows.sort_by_key(|r| (!r.gated(), r.support != recipe::Support::Capable, r.arch));
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            let templates = recipe::chat_templates(r.arch);
            let template = if templates.is_empty() { "-".to_string() } else { templates.join(",") };
            let gate = match r.support {
                recipe::Support::Refused(_) => "NO",
                recipe::Support::Capable if r.gated() => "yes",
                recipe::Support::Capable => "-",
            };
            let features = if r.features.is_empty() { "routed experts only" } else { r.features };
            [r.arch.to_string(), gate.to_string(), template, features.to_string(), r.models.to_string()]
        })
        .collect();
    let header = ["arch", "gated", "template", "moe features", "models"].map(str::to_string);
    // Each column as wide as its widest cell, so no name breaks the table.
    let widths: Vec<usize> =
        (0..4).map(|c| cells.iter().chain([&header]).map(|row| row[c].chars().count()).max().unwrap_or(0)).collect();
    for row in [&header].into_iter().chain(&cells) {
        let _ = writeln!(
            out,
            "{:<w0$} {:<w1$} {:<w2$} {:<w3$} {}",
            row[0],
            row[1],
            row[2],
            row[3],
            row[4],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2],
            w3 = widths[3]
        );
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
