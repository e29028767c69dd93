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
    let dir = tempdir();
    let ty = GgmlType::from_name(ty).unwrap();
    // Widths of 256: whole blocks of every K-quant and IQ type.
    let m = write_tiny(dir.path(), "m.gguf", arch, |s| {
        (s.embd, s.expert_ff, s.expert_type) = (256, 256, ty);
        s.derive();
    });
    let what = format!("{} {ty} experts", arch.name());
    let files = bmoe::gguf::ModelFiles::open(&m).unwrap();
    let expert = files.tensors().find(|t| t.info.name == "blk.1.ffn_down_exps.weight").unwrap();
    assert_eq!(expert.info.ty, ty, "{what}");
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
    gate_q2_k: "q2_K";
    gate_q3_k: "q3_K";
    gate_q4_k: "q4_K";
    gate_q5_k: "q5_K";
    gate_q6_k: "q6_K";
    gate_iq2_xxs: "iq2_xxs";
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
