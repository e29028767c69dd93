//! What `bmoe inspect` says about a model file: its shape, expert and dense
//! bytes, how many bytes a token reads with no cache, and whether bmoe can
//! stream it.

use std::path::Path;

use super::recipe::{self, EXPERT_SUFFIXES, parse_expert_tensor};
use crate::gguf::ModelFiles;

fn mib(b: u64) -> String {
    format!("{:.2} MiB", b as f64 / 1048576.0)
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
    // The header may hold anything: the name is printed short and escaped.
    let _ = writeln!(out, "architecture:  {}", crate::text::excerpt(arch, 64));
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
        let mtp_note = if trunk_moe < layers.len() {
            " (an MTP layer's experts are read only when drafting with --mtp)"
        } else {
            ""
        };
        let _ = writeln!(out, "moe layers:    {trunk_moe} of {}{mtp_note}", trunk.unwrap_or(0));
        if let Some(k) = k {
            let per_token: u64 =
                layers.iter().filter(|(l, _)| in_trunk(l)).map(|(_, (s, _, _))| s * k.min(n_expert)).sum();
            let _ = writeln!(out, "token demand:  {} read per token with no cache", mib(per_token));
        }
        let aligned = layers.values().all(|(_, _, a)| *a);
        let _ = writeln!(out, "page-aligned:  {}", if aligned { "yes" } else { "no (O_DIRECT reads aligned windows)" });
        let banks = files.tensors().filter(|t| crate::moe::repack::is_bank(&t.info.name, &t.info.dims)).count();
        let repackable = crate::moe::repack::repackable_banks(files);
        let _ = writeln!(
            out,
            "repacked:      {} of {banks} expert banks have this CPU's faster repacked kernels{}",
            repackable.len(),
            repacked_layouts_of(files, &repackable)
        );
    }
    let _ = writeln!(out, "chat template: {}", chat_template_line(files));
    let checked = crate::moe::capability::check_file(files);
    if let Ok(features) = &checked {
        let _ = writeln!(out, "moe features:  {}", features.describe().join(", "));
    }
    // The header and tensor types as llama.cpp needs them to load the file.
    let loadable = crate::gguf::check_model(files, &crate::gguf::RunShape::default());
    let _ = writeln!(
        out,
        "load check:    {}",
        match &loadable {
            Ok(()) => "ok (header and tensor types as llama.cpp needs them)".to_string(),
            Err(e) => format!("FAILED: {e}"),
        }
    );
    let verdict = match verdict(arch, &loadable, &checked) {
        Ok(how) => format!("yes ({how})"),
        Err(why) => format!("no: {why}"),
    };
    let _ = writeln!(out, "streamable:    {verdict}");
    out
}

/// Whether bmoe can stream `files` (what `inspect` says under
/// "streamable"): how it is covered, or why not.
pub fn stream_verdict(files: &ModelFiles) -> Result<&'static str, String> {
    let arch = files.meta().architecture().unwrap_or("(none)");
    let loadable = crate::gguf::check_model(files, &crate::gguf::RunShape::default());
    verdict(arch, &loadable, &crate::moe::capability::check_file(files))
}

/// The verdict from the checks' results.
fn verdict<F>(arch: &str, loadable: &Result<(), String>, checked: &Result<F, String>) -> Result<&'static str, String> {
    match (recipe::refusal(arch), loadable, checked) {
        (Some(why), _, _) => Err(why.to_string()),
        (None, Err(e), _) => Err(format!("llama.cpp cannot load this file: {e}")),
        (None, Ok(()), Err(e)) => Err(e.clone()),
        (None, Ok(()), Ok(_)) => Ok(match recipe::recipe_for(arch) {
            Some(r) if r.gated() => "covered by byte-identity gates",
            Some(_) => "by capability; no byte-identity gate covers this architecture yet",
            None => "by capability; an architecture bmoe's registry does not list",
        }),
    }
}

/// The type holding most of the expert bytes (the model's quantization as
/// far as streaming goes), or of all tensor bytes in a dense model.
pub fn main_type(files: &ModelFiles) -> String {
    let mut by_type: std::collections::BTreeMap<String, u64> = Default::default();
    let experts = files.tensors().any(|t| parse_expert_tensor(&t.info.name).is_some());
    for t in files.tensors().filter(|t| !experts || parse_expert_tensor(&t.info.name).is_some()) {
        *by_type.entry(t.info.ty.to_string()).or_default() += t.info.size;
    }
    by_type.into_iter().max_by_key(|(_, bytes)| *bytes).map(|(ty, _)| ty).unwrap_or_else(|| "?".into())
}

/// Which chat template the file carries (a bundled one's name, or its first
/// line), how it marks reasoning and how thinking is turned off.
fn chat_template_line(files: &ModelFiles) -> String {
    use crate::chat::{ChatFormat, NAMED_TEMPLATES};
    let Some(source) = files.meta().get_str("tokenizer.chat_template") else {
        return "none in the file (chat falls back to plain turns; --chat-template FILE|NAME sets one)".into();
    };
    let which = match NAMED_TEMPLATES.iter().find(|(_, bundled)| bundled.trim() == source.trim()) {
        Some((name, _)) => format!("the bundled {name}"),
        None => {
            let first = source.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default();
            let shown: String = first.chars().take(48).collect();
            let more = if shown.len() < first.len() { "..." } else { "" };
            format!("{} bytes, first line {shown:?}{more}", source.len())
        }
    };
    match ChatFormat::new("the model's", Some(source), "", "") {
        Ok(format) => {
            let switches = match format.think_switches() {
                [] => String::new(),
                names => format!(" ({})", names.join(", ")),
            };
            format!(
                "{which}; reasoning {}, thinking control: {}{switches}",
                format.family().name(),
                format.think_control().name()
            )
        }
        Err(e) => format!("{which}; it does not compile: {}", e.to_string().lines().next().unwrap_or_default()),
    }
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

/// `" (q4_0 as 4x4; --repack)"` for the repackable banks' types and the
/// layouts this CPU's llama.cpp gives them; empty when no bank repacks.
fn repacked_layouts_of(files: &ModelFiles, repackable: &[String]) -> String {
    if repackable.is_empty() {
        return String::new();
    }
    let mut layouts: Vec<String> = files
        .tensors()
        .filter(|t| repackable.contains(&t.info.name))
        .map(|t| match crate::llama::cpu_layouts::layout_of_type(t.info.ty) {
            Some(layout) => format!("{} as {layout}", t.info.ty),
            None => t.info.ty.to_string(),
        })
        .collect();
    layouts.sort();
    layouts.dedup();
    format!(" ({}; --repack)", layouts.join(", "))
}
