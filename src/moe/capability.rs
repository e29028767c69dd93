//! Streaming by capability: what a model file must look like for bmoe to
//! stream it, whatever its architecture, and the MoE features it carries.
//!
//! A file streams when every expert tensor (`blk.N.ffn_{gate,up,gate_up,down}_exps.weight`)
//! has three dimensions, the last one indexing the expert, and each MoE
//! layer has a down projection plus gate and up (split or fused) or up
//! alone. The graph half of the check runs at capture
//! ([`super::MoeHook::routing_gap`]): every layer that multiplies its
//! experts must show llama.cpp's `ffn_moe_topk-<il>` node.

use std::collections::BTreeMap;
use std::fmt;

use super::recipe::{EXPERT_SUFFIXES, parse_expert_tensor};
use crate::gguf::ModelFiles;

/// How a file lays out its expert projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// Separate `ffn_gate_exps`, `ffn_up_exps`, `ffn_down_exps`.
    Split,
    /// One fused `ffn_gate_up_exps` plus `ffn_down_exps`.
    Fused,
    /// `ffn_up_exps` and `ffn_down_exps` only (an ungated activation).
    UpDown,
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Layout::Split => "split gate/up/down",
            Layout::Fused => "fused gate_up + down",
            Layout::UpDown => "up/down (no gate)",
        })
    }
}

/// Recurrent or convolutional blocks beside attention.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hybrid {
    /// Mamba state-space blocks with an `ssm_x` projection (Jamba).
    Mamba,
    /// Mamba-2 state-space blocks (`ssm_a`, `ssm_dt`, no `ssm_x` or `ssm_beta`).
    Mamba2,
    /// Gated delta-net linear attention (`ssm_beta` / `ssm_ba`).
    DeltaNet,
    /// Short convolutions (`shortconv.conv`).
    ShortConv,
}

impl fmt::Display for Hybrid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Hybrid::Mamba => "Mamba",
            Hybrid::Mamba2 => "Mamba-2",
            Hybrid::DeltaNet => "gated delta-net",
            Hybrid::ShortConv => "short conv",
        })
    }
}

/// What the file check found.
#[derive(Debug, Clone, PartialEq)]
pub struct FileFeatures {
    /// Experts per layer (the expert tensors' last dimension).
    pub n_expert: u64,
    /// Layers with expert tensors, ascending.
    pub moe_layers: Vec<u32>,
    /// The expert tensors' layout.
    pub layout: Layout,
    /// Shared experts (`*_shexp` tensors) beside the routed ones.
    pub shared_experts: bool,
    /// Layers before the first MoE layer (dense FFNs or other blocks).
    pub leading_dense: u32,
    /// MoE layers are not contiguous (e.g. every other layer).
    pub interleaved: bool,
    /// An expert-selection bias (`exp_probs_b`) reorders the top-k.
    pub selection_bias: bool,
    /// MTP / next-n prediction layers (`nextn_predict_layers`).
    pub mtp_layers: u64,
    /// Recurrent or convolutional blocks, if any.
    pub hybrid: Option<Hybrid>,
    /// Multi-head latent attention (`attn_kv_a_mqa`).
    pub mla: bool,
}

impl FileFeatures {
    /// The features as short words for `bmoe inspect`.
    pub fn describe(&self) -> Vec<String> {
        let mut out = vec![self.layout.to_string()];
        if self.shared_experts {
            out.push("shared experts".into());
        }
        if self.leading_dense > 0 {
            out.push(format!("{} leading dense layer(s)", self.leading_dense));
        }
        if self.interleaved {
            out.push("MoE on some layers only".into());
        }
        if self.selection_bias {
            out.push("expert-selection bias".into());
        }
        if self.mla {
            out.push("MLA attention".into());
        }
        if let Some(h) = self.hybrid {
            out.push(format!("{h} hybrid"));
        }
        if self.mtp_layers > 0 {
            out.push(format!("{} MTP layer(s)", self.mtp_layers));
        }
        out
    }
}

/// Checks that `files` can be streamed and names its MoE features; the
/// error names the tensor or piece that is missing or misplaced.
pub fn check_file(files: &ModelFiles) -> Result<FileFeatures, String> {
    let meta = files.meta();
    let n_expert = meta.arch_u64("expert_count").unwrap_or(0);
    // Per layer: which expert suffixes it has.
    let mut layers: BTreeMap<u32, [bool; 4]> = BTreeMap::new();
    let (mut shared, mut selection_bias, mut mla) = (false, false, false);
    let (mut mamba, mut mamba1, mut delta, mut conv) = (false, false, false, false);
    let mut nextn_tensors = false;
    for t in files.tensors() {
        let name = t.info.name.as_str();
        if let Some((layer, suffix)) = parse_expert_tensor(name) {
            let dims = &t.info.dims;
            let last = dims.last().copied().unwrap_or(0);
            if dims.len() != 3 || last != n_expert || n_expert < 2 {
                return Err(format!(
                    "{name} has shape {dims:?}, but bmoe streams expert tensors of three dimensions whose last one \
                     indexes the expert ({n_expert} experts per `expert_count`)"
                ));
            }
            layers.entry(layer).or_default()[suffix] = true;
        }
        shared |= name.contains("_shexp.");
        selection_bias |= name.contains(".exp_probs_b.");
        mla |= name.contains(".attn_kv_a_mqa.");
        delta |= name.contains(".ssm_beta.") || name.contains(".ssm_ba.");
        mamba |= name.contains(".ssm_dt.") || name.ends_with(".ssm_a");
        mamba1 |= name.contains(".ssm_x.");
        conv |= name.contains(".shortconv.conv.");
        nextn_tensors |= name.contains(".nextn.");
    }
    let Some((&first, _)) = layers.iter().next() else {
        return Err(format!(
            "no expert tensors: bmoe streams blk.N.{{{}}}.weight and this file has none",
            EXPERT_SUFFIXES.join(",")
        ));
    };
    let mut layout = None;
    for (&l, has) in &layers {
        let [gate, up, gate_up, down] = *has;
        let this = match (gate, up, gate_up) {
            _ if !down => return Err(format!("layer {l} has experts but no blk.{l}.ffn_down_exps.weight")),
            (true, true, false) => Layout::Split,
            (false, false, true) => Layout::Fused,
            (false, true, false) => Layout::UpDown,
            _ => {
                let present: Vec<&str> =
                    EXPERT_SUFFIXES.iter().zip(has).filter(|(_, h)| **h).map(|(s, _)| *s).collect();
                return Err(format!(
                    "layer {l}'s experts are {}: bmoe streams gate+up+down, gate_up+down or up+down",
                    present.join(" + ")
                ));
            }
        };
        layout.get_or_insert(this);
    }
    let moe_layers: Vec<u32> = layers.keys().copied().collect();
    let interleaved = moe_layers.windows(2).any(|w| w[1] != w[0] + 1);
    let mtp_layers = meta.arch_u64("nextn_predict_layers").unwrap_or(u64::from(nextn_tensors));
    let hybrid = if delta {
        Some(Hybrid::DeltaNet)
    } else if mamba1 {
        Some(Hybrid::Mamba)
    } else if mamba {
        Some(Hybrid::Mamba2)
    } else if conv {
        Some(Hybrid::ShortConv)
    } else {
        None
    };
    Ok(FileFeatures {
        n_expert,
        layout: layout.unwrap_or(Layout::Split),
        leading_dense: first,
        moe_layers,
        interleaved,
        shared_experts: shared,
        selection_bias,
        mtp_layers,
        hybrid,
        mla,
    })
}
