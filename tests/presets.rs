//! Full-size presets plan files the size of the real releases, and the
//! features they bring (a real vocabulary with filler tokens, DeepSeek's
//! lite attention, tied embeddings, hybrid layouts and widths that are not
//! derived from the heads) stream bit-identical to resident on tiny models.

mod common;

use bmoe::engine::Phase;
use bmoe::gguf::ModelFiles;
use bmoe::synth::{self, Arch, MODEL_PRESETS, ModelSpec, QuantMix};
use common::*;

const N: u32 = 16;

/// Each preset plans within 3% of its release file's tensor bytes and 1% of
/// its parameter count (the figures llama.cpp reports for that file), with
/// the model's real vocabulary.
#[test]
fn presets_plan_the_size_of_their_release_files() {
    for preset in MODEL_PRESETS {
        let spec = preset.spec();
        spec.validate().unwrap_or_else(|e| panic!("{}: {e}", preset.name));
        let planned = synth::plan(&spec);
        let bytes: u64 = planned.tensors.iter().map(|(t, _)| t.size()).sum();
        let params: u64 = planned.tensors.iter().map(|(t, _)| t.dims.iter().product::<u64>()).sum();
        let r = &preset.release;
        let bytes_off = bytes as f64 / r.bytes() as f64 - 1.0;
        let params_off = params as f64 / (r.params_b * 1e9) - 1.0;
        assert!(
            bytes_off.abs() < 0.03,
            "{}: planned {bytes} bytes, {:+.2}% off {}",
            preset.name,
            100.0 * bytes_off,
            r.file
        );
        assert!(
            params_off.abs() < 0.01,
            "{}: planned {params} parameters, {:+.2}% off",
            preset.name,
            100.0 * params_off
        );
        assert_eq!(planned.n_vocab as u32, spec.vocab, "{}", preset.name);
        let embd = planned.tensors.iter().find(|(t, _)| t.name == "token_embd.weight").unwrap();
        assert_eq!(embd.0.dims[1], u64::from(spec.vocab), "{}", preset.name);
    }
}

/// The Qwen3-30B-A3B preset plans the release's Q4_K_M file layer by layer:
/// each layer's expert slice and dense bytes equal those the reference
/// engine recorded from `Qwen3-30B-A3B-Q4_K_M.gguf` (the route trace's
/// `# layer=` lines), so every tensor's type under the mix is the release's.
#[test]
fn qwen3_30b_a3b_matches_the_release_layer_by_layer() {
    let trace = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/assets/route-traces/qwen.route.csv"))
        .expect("the qwen route trace");
    let field = |line: &str, key: &str| -> u64 {
        let value = line.split_whitespace().find_map(|w| w.strip_prefix(key)).unwrap();
        value.parse().unwrap()
    };
    let real: Vec<(u64, u64)> = trace
        .lines()
        .filter(|l| l.starts_with("# layer="))
        .map(|l| (field(l, "expert_bytes="), field(l, "dense_bytes=")))
        .collect();
    let preset = bmoe::synth::ModelPreset::from_name("qwen3-30b-a3b").unwrap();
    let spec = preset.spec();
    let planned = synth::plan(&spec);
    assert_eq!(real.len(), spec.layers as usize);
    for (l, (expert_slice, dense)) in real.iter().enumerate() {
        let prefix = format!("blk.{l}.");
        let layer: Vec<_> = planned.tensors.iter().filter(|(t, _)| t.name.starts_with(&prefix)).collect();
        let experts: u64 = layer.iter().filter(|(t, _)| t.name.contains("_exps.")).map(|(t, _)| t.size()).sum();
        let other: u64 = layer.iter().filter(|(t, _)| !t.name.contains("_exps.")).map(|(t, _)| t.size()).sum();
        assert_eq!(experts / u64::from(spec.experts), *expert_slice, "layer {l}: expert slice");
        assert_eq!(other, *dense, "layer {l}: dense bytes");
    }
}

/// Writes the tiny model of `arch` edited by `edit`, then gates it: finite
/// resident logits, streamed bitwise equal with the cache off and with an
/// evicting cache. Returns the file.
fn gate(arch: Arch, what: &str, edit: impl FnOnce(&mut ModelSpec)) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", arch, edit);
    let (reference, _) = run(options(&m, None), N);
    for (step, logits) in reference.logits.iter().enumerate() {
        assert!(logits.iter().all(|x| x.is_finite()), "{what}: resident logits at step {step} are not finite");
    }
    let files = ModelFiles::open(&m).unwrap();
    let layer = files.tensors().find(|t| t.info.name.ends_with("ffn_down_exps.weight")).unwrap();
    let slice = layer.info.size / 8;
    for (how, stream) in [("cache off", stream0(2, true)), ("evicting cache", cached(slice * 3 * 3, 2))] {
        let (streamed, reports) = run(options(&m, stream), N);
        assert_identical(&reference, &streamed, &format!("{what}, {how}"));
        let decode: Vec<_> = reports.iter().filter(|r| r.phase == Phase::Decode).collect();
        assert!(decode.iter().map(|r| r.trace.bytes_read).sum::<u64>() > 0, "{what}, {how}: nothing read");
    }
    (dir, m)
}

/// A real-size vocabulary (Qwen3's 151,936 tokens: the natural ones, then
/// fillers) under the Q4_K_M mix streams bit-identical; the fillers are
/// never generated, and the prompt tokenizes as with the natural vocabulary.
#[test]
fn a_real_vocabulary_streams_bit_identical() {
    let (_dir, m) = gate(Arch::Qwen3Moe, "qwen3moe, 151936 tokens, q4_k_m", |s| {
        (s.embd, s.expert_ff) = (256, 256);
        s.derive();
        s.vocab = 151_936;
        s.quant_mix = Some(QuantMix::Q4KM);
    });
    let files = ModelFiles::open(&m).unwrap();
    let output = files.tensors().find(|t| t.info.name == "output.weight").unwrap();
    assert_eq!(output.info.dims, [256, 151_936]);
    // Mapped, the embedding costs the rows a context can touch: the budget's
    // dense weights leave out all but 4096 of its 151,936 rows.
    let embd = files.tensors().find(|t| t.info.name == "token_embd.weight").unwrap().info.size;
    let dense = files.total_bytes()
        - files.tensors().filter(|t| t.info.name.contains("_exps.")).map(|t| t.info.size).sum::<u64>();
    let held = {
        let _serial = llama_lock();
        let s = bmoe::engine::Session::open(options(&m, stream0(1, true))).unwrap();
        s.info().holdings.expect("streaming holdings")
    };
    assert!(held.dense < dense - embd + embd / 30, "dense {} of {dense}, embedding {embd}", held.dense);
    let natural = synth::plan(&ModelSpec::preset(synth::Preset::Tiny, Arch::Qwen3Moe)).n_vocab as u32;
    let (generation, _) = run(options(&m, None), N);
    assert!(generation.tokens.iter().all(|&t| (t as u32) < natural), "a filler was generated: {:?}", generation.tokens);
}

/// DeepSeek-V2-Lite's attention (27 layers: queries straight from the
/// embedding, no q latent) with a KV latent wider than the derived one.
#[test]
fn deepseek_lite_attention_streams_bit_identical() {
    let (_dir, m) = gate(Arch::Deepseek2, "deepseek2 lite", |s| {
        s.layers = 27;
        s.mtp_layers = 0;
        s.widths.kv_lora = Some(64);
    });
    let files = ModelFiles::open(&m).unwrap();
    assert!(files.tensors().any(|t| t.info.name == "blk.0.attn_q.weight"), "the lite form has attn_q");
    assert!(!files.tensors().any(|t| t.info.name.contains("attn_q_a")), "the lite form has no q latent");
    let kv = files.tensors().find(|t| t.info.name == "blk.0.attn_kv_a_norm.weight").unwrap();
    assert_eq!(kv.info.dims, [64]);
}

/// LFM2-8B-A1B's layout: attention on listed layers only, and tied
/// embeddings (no `output.weight`), which inspect and the cache budget
/// count as the output head.
#[test]
fn listed_attention_layers_and_tied_embeddings_stream_bit_identical() {
    let (_dir, m) = gate(Arch::Lfm2Moe, "lfm2moe, attention on layers 2 and 5, tied", |s| {
        s.layers = 6;
        s.widths.attention_layers = Some(1 << 2 | 1 << 5);
        s.tied_embeddings = true;
        s.fit_tied_head();
        // More rows than the context has positions: only a tied head keeps them all counted.
        s.vocab = 20_000;
    });
    let files = ModelFiles::open(&m).unwrap();
    assert!(!files.tensors().any(|t| t.info.name == "output.weight"), "tied: no output head");
    let report = bmoe::moe::inspect::inspect_report(&files, &m);
    assert!(report.contains("tied: also the output head"), "{report}");
    // Tied, the embedding is read whole every token and counts whole in the budget.
    let embd = files.tensors().find(|t| t.info.name == "token_embd.weight").unwrap().info.size;
    let held = {
        let _serial = llama_lock();
        let s = bmoe::engine::Session::open(options(&m, stream0(1, true))).unwrap();
        s.info().holdings.expect("streaming holdings")
    };
    assert!(held.dense >= embd, "dense {} below the tied embedding's {embd}", held.dense);
    let attends: Vec<u32> =
        (0..6).filter(|l| files.tensors().any(|t| t.info.name == format!("blk.{l}.attn_q.weight"))).collect();
    assert_eq!(attends, [2, 5]);
}

/// Qwen3.5's delta-net widths as released (key heads, value heads and head
/// width set apart from the attention heads).
#[test]
fn delta_net_widths_apart_from_the_heads_stream_bit_identical() {
    let (_dir, m) = gate(Arch::Qwen35Moe, "qwen35moe, delta-net (8, 4, 8)", |s| {
        s.widths.delta_net = Some((8, 4, 8));
    });
    let files = ModelFiles::open(&m).unwrap();
    let qkv = files.tensors().find(|t| t.info.name == "blk.0.attn_qkv.weight").unwrap();
    // Two key widths (8 x 4 each) and the value width (8 x 8).
    assert_eq!(qkv.info.dims[1], 2 * 8 * 4 + 8 * 8);
}

/// Tied embeddings are refused for an architecture whose loader needs its
/// own output head; a vocabulary past the fillers' names is refused.
#[test]
fn impossible_preset_features_are_refused() {
    let mut spec = ModelSpec::preset(synth::Preset::Tiny, Arch::Glm4Moe);
    spec.tied_embeddings = true;
    assert!(spec.validate().unwrap_err().contains("own output head"));
    let mut spec = ModelSpec::preset(synth::Preset::Tiny, Arch::Qwen3Moe);
    spec.vocab = 500_000;
    assert!(spec.validate().unwrap_err().contains("vocabulary must be at most"));
}
