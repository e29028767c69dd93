//! One byte-identity gate per generated architecture: the tiny synthetic
//! model of each architecture llama.cpp runs, streamed with the cache off,
//! with an evicting cache and with read-ahead on, gives the resident run's
//! tokens and every step's logits bit for bit. Three architectures also run
//! a three-turn session and one is a split file.

mod common;

use bmoe::engine::{Phase, Session, StreamOptions};
use bmoe::moe::predict::ReadAhead;
use bmoe::synth::{self, Arch};
use common::*;

const N: u32 = 24;

/// What one architecture's gate covers besides the three stream settings.
#[derive(Clone, Copy, Default)]
struct Extras {
    /// Also a three-turn session.
    turns: bool,
    /// Written as two shards.
    split: bool,
    /// The first streamed layer is not predicted from the token's
    /// embedding: the graph has no `attn_norm-0` over the embeddings
    /// (`lfm2moe` names its norms otherwise and starts with dense conv
    /// layers), or the router takes the raw layer input (no prediction).
    first_unpredicted: bool,
}

fn arch_gate(arch: Arch, extras: Extras) {
    let dir = tempdir();
    let m = write_tiny(dir.path(), &format!("{}.gguf", arch.name()), arch, |s| {
        if extras.split {
            s.split = 2;
        }
    });
    let name = arch.name();
    let (reference, _) = run(options(&m, None), N);
    for (step, logits) in reference.logits.iter().enumerate() {
        assert!(logits.iter().all(|x| x.is_finite()), "{name}: resident logits at step {step} are not finite");
    }
    let distinct: std::collections::BTreeSet<_> = reference.tokens.iter().collect();
    assert!(distinct.len() > 4, "{name}: the synthetic model repeats itself: {:?}", reference.tokens);

    // A cache of a sixth of the bank evicts every few layers.
    let bank = {
        let _serial = llama_lock();
        let s = Session::open(options(&m, stream0(1, true))).unwrap_or_else(|e| panic!("{name}: open: {e}"));
        assert!(s.info().streamed_layers > 0, "{name}: no layer streamed");
        s.info().bank_bytes
    };
    let evicting = cached(bank / 6, 2);
    let read_ahead = cached(bank / 3, 3)
        .map(|s| StreamOptions { read_ahead: ReadAhead { layers: 1, router: 2, prefill: true }, ..s });
    for (what, stream) in
        [("cache off", stream0(2, true)), ("evicting cache", evicting.clone()), ("read-ahead", read_ahead)]
    {
        let (streamed, reports) = run(options(&m, stream), N);
        let what = format!("{name}, {what}");
        assert_identical(&reference, &streamed, &what);
        let decode: Vec<_> = reports.iter().filter(|r| r.phase == Phase::Decode).collect();
        let read: u64 = decode.iter().map(|r| r.trace.bytes_read).sum();
        assert!(read > 0, "{what}: no expert bytes were read while decoding");
        if what.ends_with("evicting cache") {
            let evictions: u64 = decode.iter().map(|r| r.trace.evictions).sum();
            assert!(evictions > 0, "{what}: the cache never evicted");
        }
        if what.ends_with("read-ahead") {
            let prefetched: u64 = decode.iter().map(|r| r.trace.prefetched).sum();
            assert!(prefetched > 0, "{what}: nothing was read ahead");
            // The first streamed layer is predicted from the token's embedding every step.
            let first = decode.iter().flat_map(|r| &r.trace.rows).map(|r| r.layer).min();
            let scores = decode.iter().flat_map(|r| &r.trace.predictions);
            let predicted = scores.filter(|p| Some(p.layer) == first).count();
            let expected = if extras.first_unpredicted { 0 } else { decode.len() };
            assert_eq!(predicted, expected, "{what}: steps predicting the first streamed layer");
        }
    }
    if extras.turns {
        let turns = [PROMPT, " and then", " finally, the end."];
        let (reference, _) = run_turns(options(&m, None), &turns, 12);
        let (streamed, _) = run_turns(options(&m, evicting), &turns, 12);
        for (i, (a, b)) in reference.iter().zip(&streamed).enumerate() {
            assert_identical(a, b, &format!("{name}, turn {i}, evicting cache"));
        }
    }
}

macro_rules! gates {
    ($($test:ident: $arch:ident $(, $extra:ident)*;)*) => {
        $(
            #[test]
            fn $test() {
                arch_gate(Arch::$arch, Extras { $($extra: true,)* ..Extras::default() });
            }
        )*

        /// Every architecture the generator makes has its gate here.
        #[test]
        fn every_generated_architecture_is_gated() {
            let gated = [$(Arch::$arch),*];
            for arch in Arch::ALL {
                assert!(gated.contains(arch), "{} has a generator but no gate in tests/arch_gates.rs", arch.name());
            }
        }
    };
}

gates! {
    gate_qwen3moe: Qwen3Moe;
    gate_gemma4: Gemma4;
    gate_gpt_oss: GptOss;
    gate_qwen2moe: Qwen2Moe, turns;
    gate_llama_mixtral: Llama;
    gate_olmoe: Olmoe;
    gate_llama4: Llama4;
    gate_ernie4_5_moe: Ernie45Moe;
    gate_hunyuan_moe: HunyuanMoe;
    gate_glm4moe: Glm4Moe, turns;
    gate_dots1: Dots1;
    gate_minimax_m2: MinimaxM2;
    gate_deepseek2: Deepseek2, split;
    gate_qwen3next: Qwen3Next, turns;
    gate_qwen35moe: Qwen35Moe;
    gate_lfm2moe: Lfm2Moe, first_unpredicted;
    gate_granitehybrid: GraniteHybrid;
    gate_nemotron_h_moe: NemotronHMoe;
    gate_smallthinker: SmallThinker, first_unpredicted;
    gate_bailingmoe2: BailingMoe2;
}

/// Writes the tiny qwen3moe plan after `edit` changed it.
fn write_edited(dir: &std::path::Path, name: &str, edit: impl FnOnce(&mut synth::Planned)) -> std::path::PathBuf {
    let spec = synth::ModelSpec::preset(synth::Preset::Tiny, Arch::Qwen3Moe);
    let mut planned = synth::plan(&spec);
    edit(&mut planned);
    let path = dir.join(name);
    synth::write_plan(&planned, &spec, &path, &mut |_, _| std::ops::ControlFlow::Continue(())).expect("write");
    path
}

fn open_error(model: &std::path::Path) -> String {
    let _serial = llama_lock();
    match Session::open(options(model, stream0(1, true))) {
        Ok(_) => panic!("{}: streaming opened", model.display()),
        Err(e) => e.to_string(),
    }
}

/// A file whose experts are not indexed on their last dimension is refused
/// at open, naming the tensor; so is a layer without a down projection.
#[test]
fn files_failing_the_capability_check_are_refused_with_the_reason() {
    let dir = tempdir();
    let moved = write_edited(dir.path(), "moved.gguf", |p| {
        let (t, _) = p.tensors.iter_mut().find(|(t, _)| t.name == "blk.1.ffn_up_exps.weight").unwrap();
        t.dims.rotate_right(1); // [n_expert, d, ff]: the expert first
    });
    let e = open_error(&moved);
    assert!(e.contains("blk.1.ffn_up_exps.weight") && e.contains("last one indexes the expert"), "{e}");
    let files = bmoe::gguf::ModelFiles::open(&moved).unwrap();
    let report = bmoe::moe::inspect::inspect_report(&files, &moved);
    assert!(report.contains("streamable:    no: blk.1.ffn_up_exps.weight"), "{report}");

    let no_down =
        write_edited(dir.path(), "no-down.gguf", |p| p.tensors.retain(|(t, _)| t.name != "blk.2.ffn_down_exps.weight"));
    let e = open_error(&no_down);
    assert!(e.contains("layer 2 has experts but no blk.2.ffn_down_exps.weight"), "{e}");
}

/// An architecture bmoe has no generator for, whose file passes the check,
/// streams with one notice, bit-identical to resident (qwen3vlmoe: the
/// qwen3moe tensors with multi-section rope).
#[test]
fn an_ungated_capable_architecture_streams_with_one_notice() {
    let dir = tempdir();
    let m = write_edited(dir.path(), "vl.gguf", |p| {
        for (k, v) in &mut p.metadata {
            if let Some(rest) = k.strip_prefix("qwen3moe.") {
                *k = format!("qwen3vlmoe.{rest}");
            } else if k == "general.architecture" {
                *v = bmoe::gguf::Value::String("qwen3vlmoe".into());
            }
        }
        let sections = [4, 2, 2, 0].map(bmoe::gguf::Value::I32).to_vec();
        p.metadata.push((
            "qwen3vlmoe.rope.dimension_sections".into(),
            bmoe::gguf::Value::Array(bmoe::gguf::ValueType::I32, sections),
        ));
    });
    let notices = {
        let _serial = llama_lock();
        Session::open(options(&m, stream0(1, true))).unwrap_or_else(|e| panic!("open: {e}")).info().notices.clone()
    };
    let about: Vec<_> = notices.iter().filter(|n| n.contains("streams by capability")).collect();
    assert_eq!(about.len(), 1, "{notices:?}");
    assert!(about[0].starts_with("qwen3vlmoe"), "{}", about[0]);
    let (reference, _) = run(options(&m, None), N);
    let (streamed, _) = run(options(&m, cached(200 << 10, 2)), N);
    assert_identical(&reference, &streamed, "qwen3vlmoe, evicting cache");
}

/// Every architecture takes the shape flags (a second shape: 6 layers,
/// width 128, 16 experts, top-4, q8_0 experts) and streams bit-identical
/// from a lean open (a copy of the file without its experts), which drops
/// the MTP layers' experts with the others.
#[test]
fn every_architecture_takes_the_shape_flags_and_a_lean_open() {
    use bmoe::engine::LeanOpen;
    let dir = tempdir();
    let lean =
        Some(LeanOpen { dir: dir.path().join("lean"), min_expert_bytes: 0, only_when_larger_than_memory: false });
    for &arch in Arch::ALL {
        let m = write_tiny(dir.path(), &format!("{}-wide.gguf", arch.name()), arch, |s| {
            (s.layers, s.embd, s.experts, s.experts_used, s.expert_ff, s.seed) = (6, 128, 16, 4, 96, 7);
            s.expert_type = bmoe::gguf::GgmlType::Q8_0;
            s.derive();
        });
        let (reference, _) = run(options(&m, None), 16);
        let stream = cached(1 << 20, 2).map(|s| StreamOptions { lean: lean.clone(), ..s });
        let (streamed, reports) = run(options(&m, stream), 16);
        assert_identical(&reference, &streamed, &format!("{}, 6 layers x 16 experts, lean open", arch.name()));
        assert!(reports.iter().map(|r| r.trace.bytes_read).sum::<u64>() > 0, "{}", arch.name());
    }
    let copies = std::fs::read_dir(dir.path().join("lean")).map(|d| d.count()).unwrap_or(0);
    assert_eq!(copies, Arch::ALL.len(), "one lean copy per architecture");
}
