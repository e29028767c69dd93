//! One byte-identity gate per expert type a release ships: the K-quants, IQ
//! types and MXFP4 written by ggml's own quantizer, bf16, and the types the
//! generator encodes itself; on split (qwen3moe) and fused (gemma4) expert
//! layouts, and MXFP4 on gpt-oss as its releases ship it. Resident logits
//! must be finite (valid blocks), and streaming with the cache off and with
//! an evicting cache must give them bit for bit.

mod common;

use bmoe::engine::Phase;
use bmoe::gguf::GgmlType;
use bmoe::synth::Arch;
use common::*;

const N: u32 = 16;

fn type_gate(arch: Arch, ty: &str) {
    let ty = GgmlType::from_name(ty).unwrap();
    let what = format!("{} {ty} experts", arch.name());
    gate_with(
        arch,
        &what,
        |s| s.expert_type = ty,
        |files| {
            let expert = files.tensors().find(|t| t.info.name == "blk.1.ffn_down_exps.weight").unwrap();
            assert_eq!(expert.info.ty, ty, "{what}");
        },
    );
}

fn mix_gate(arch: Arch, mix: &str) {
    let what = format!("{} {mix} mix", arch.name());
    gate_with(
        arch,
        &what,
        |s| s.quant_mix = bmoe::synth::QuantMix::from_name(mix),
        |files| {
            let types: std::collections::BTreeSet<String> =
                files.tensors().map(|t| t.info.ty.name().to_string()).collect();
            assert!(types.len() >= 3, "{what}: a mix has several types, the file has {types:?}");
        },
    );
}

/// Writes the tiny model of `arch` with `edit` applied (and widths of 256:
/// whole blocks of every K-quant and IQ type), checks the file, then gates
/// it: finite resident logits, streamed bitwise equal with the cache off
/// and with an evicting cache.
fn gate_with(
    arch: Arch,
    what: &str,
    edit: impl FnOnce(&mut bmoe::synth::ModelSpec),
    check: impl FnOnce(&bmoe::gguf::ModelFiles),
) {
    let dir = tempdir();
    let m = write_tiny(dir.path(), "m.gguf", arch, |s| {
        (s.embd, s.expert_ff) = (256, 256);
        s.derive();
        edit(s);
    });
    let files = bmoe::gguf::ModelFiles::open(&m).unwrap();
    check(&files);
    let expert = files.tensors().find(|t| t.info.name == "blk.1.ffn_down_exps.weight").unwrap();
    let (reference, _) = run(options(&m, None), N);
    for (step, logits) in reference.logits.iter().enumerate() {
        assert!(logits.iter().all(|x| x.is_finite()), "{what}: resident logits at step {step} are not finite");
    }
    // A cache of about three experts' slices evicts on every layer.
    let slice = expert.info.size / 8 * 3;
    for (how, stream) in [("cache off", stream0(2, true)), ("evicting cache", cached(slice * 3, 2))] {
        let (streamed, reports) = run(options(&m, stream), N);
        assert_identical(&reference, &streamed, &format!("{what}, {how}"));
        let decode: Vec<_> = reports.iter().filter(|r| r.phase == Phase::Decode).collect();
        assert!(decode.iter().map(|r| r.trace.bytes_read).sum::<u64>() > 0, "{what}, {how}: nothing read");
        if how == "evicting cache" {
            assert!(decode.iter().map(|r| r.trace.evictions).sum::<u64>() > 0, "{what}: the cache never evicted");
        }
    }
}

macro_rules! type_gates {
    ($($test:ident: $ty:literal;)*) => {
        $(
            #[test]
            fn $test() {
                type_gate(Arch::Qwen3Moe, $ty);
                type_gate(Arch::Gemma4, $ty);
            }
        )*

        /// Every expert type the generator writes has its gate here.
        #[test]
        fn every_expert_type_is_gated() {
            let gated = [$($ty),*];
            for ty in bmoe::synth::EXPERT_TYPES {
                assert!(gated.contains(ty), "expert type {ty} has no gate in tests/quant_gates.rs");
            }
        }
    };
}

type_gates! {
    gate_f32: "f32";
    gate_f16: "f16";
    gate_bf16: "bf16";
    gate_q8_0: "q8_0";
    gate_q4_0: "q4_0";
    gate_q4_1: "q4_1";
    gate_q5_0: "q5_0";
    gate_q5_1: "q5_1";
    gate_q2_k: "q2_K";
    gate_q3_k: "q3_K";
    gate_q4_k: "q4_K";
    gate_q5_k: "q5_K";
    gate_q6_k: "q6_K";
    gate_iq1_s: "iq1_s";
    gate_iq1_m: "iq1_m";
    gate_iq2_xxs: "iq2_xxs";
    gate_iq2_xs: "iq2_xs";
    gate_iq2_s: "iq2_s";
    gate_iq3_xxs: "iq3_xxs";
    gate_iq3_s: "iq3_s";
    gate_iq4_xs: "iq4_xs";
    gate_iq4_nl: "iq4_nl";
    gate_mxfp4: "mxfp4";
}

/// gpt-oss ships its experts in MXFP4, beside per-expert biases.
#[test]
fn gate_gpt_oss_mxfp4() {
    type_gate(Arch::GptOss, "mxfp4");
}

/// Widths that are not whole K-quant blocks (GLM-4.5-Air's and
/// DeepSeek-V2-Lite's experts are 1408 wide) fall back as llama-quantize
/// does: under Q4_K_M their down projections become q5_0 (for q4_K) and
/// q8_0 (for q6_K), as in those releases.
#[test]
fn gate_mix_fallbacks() {
    let what = "glm4moe q4_k_m mix, experts 352 wide";
    gate_with(
        Arch::Glm4Moe,
        what,
        |s| {
            s.expert_ff = 352;
            s.quant_mix = Some(bmoe::synth::QuantMix::Q4KM);
        },
        |files| {
            let types: std::collections::BTreeSet<String> = files
                .tensors()
                .filter(|t| t.info.name.ends_with("ffn_down_exps.weight"))
                .map(|t| t.info.ty.name().to_string())
                .collect();
            assert_eq!(types, ["q5_0", "q8_0"].map(String::from).into(), "{what}");
        },
    );
}

/// Each llama.cpp recipe, applied per tensor as releases are made, on
/// qwen3moe; MXFP4_MOE also on gpt-oss (its releases) and Q4_K_M on
/// deepseek2 (MLA tensors whose rows fall back to 32-blocks).
#[test]
fn gate_quant_mixes() {
    for (_, mix) in bmoe::synth::QuantMix::ALL {
        mix_gate(Arch::Qwen3Moe, mix);
    }
    mix_gate(Arch::GptOss, "mxfp4");
    mix_gate(Arch::Deepseek2, "q4_k_m");
}
