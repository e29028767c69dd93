//! The builder an architecture's generator writes its metadata and tensors
//! through: named shorthands for the fills every generator uses, so an
//! architecture file reads as the list of what its llama.cpp loader expects.

use super::ModelSpec;
use super::fill::Fill;
use super::structure::Structure;
use crate::gguf::{GgmlType, TensorSpec, Value, ValueType};

/// Collects one model's architecture metadata and tensors.
pub struct Builder<'a> {
    /// The shape being built.
    pub spec: &'a ModelSpec,
    /// Tokens in the vocabulary.
    pub n_vocab: u64,
    structure: &'a Structure,
    /// `<arch>.` keys and other metadata, in write order.
    pub(super) metadata: Vec<(String, Value)>,
    /// Tensors in write order with their fill rule.
    pub(super) tensors: Vec<(TensorSpec, Fill)>,
    /// The first layer a router was written for.
    first_moe: Option<u32>,
}

/// `blk.<l>.<what>.weight`.
pub fn blk(l: u32, what: &str) -> String {
    format!("blk.{l}.{what}.weight")
}

/// `blk.<l>.<what>.bias`.
pub fn blk_bias(l: u32, what: &str) -> String {
    format!("blk.{l}.{what}.bias")
}

impl<'a> Builder<'a> {
    pub(super) fn new(spec: &'a ModelSpec, n_vocab: u64, structure: &'a Structure) -> Builder<'a> {
        Builder { spec, n_vocab, structure, metadata: Vec::new(), tensors: Vec::new(), first_moe: None }
    }

    /// The `general.architecture` name.
    pub fn arch(&self) -> &'static str {
        self.spec.arch.name()
    }

    /// Embedding width.
    pub fn d(&self) -> u64 {
        u64::from(self.spec.embd)
    }

    /// Sets `<arch>.<key>`, replacing an earlier value of the same key in
    /// place (an architecture file may override a common key).
    pub fn key(&mut self, key: &str, value: Value) {
        let full = format!("{}.{key}", self.arch());
        match self.metadata.iter_mut().find(|(k, _)| *k == full) {
            Some(entry) => entry.1 = value,
            None => self.metadata.push((full, value)),
        }
    }

    /// Sets `<arch>.<key>` to a u32.
    pub fn key_u32(&mut self, key: &str, value: u32) {
        self.key(key, Value::U32(value));
    }

    /// Sets `<arch>.<key>` to an f32.
    pub fn key_f32(&mut self, key: &str, value: f32) {
        self.key(key, Value::F32(value));
    }

    /// Sets `<arch>.<key>` to a bool.
    pub fn key_bool(&mut self, key: &str, value: bool) {
        self.key(key, Value::Bool(value));
    }

    /// Sets `<arch>.<key>` to one u32 per layer.
    pub fn key_per_layer(&mut self, key: &str, value: impl Fn(u32) -> u32) {
        let values = (0..self.spec.layers).map(|l| Value::U32(value(l))).collect();
        self.key(key, Value::Array(ValueType::U32, values));
    }

    /// Adds a tensor.
    pub fn tensor(&mut self, name: impl Into<String>, dims: &[u64], ty: GgmlType, fill: Fill) {
        self.tensors.push((TensorSpec::new(name, dims, ty), fill));
    }

    /// A norm weight of `width` ones (f32).
    pub fn norm(&mut self, name: impl Into<String>, width: u64) {
        self.tensor(name, &[width], GgmlType::F32, Fill::Const(1.0));
    }

    /// An f32 vector of one constant value.
    pub fn constant(&mut self, name: impl Into<String>, dims: &[u64], value: f32) {
        self.tensor(name, dims, GgmlType::F32, Fill::Const(value));
    }

    /// A zero bias (f32).
    pub fn zeros(&mut self, name: impl Into<String>, dims: &[u64]) {
        self.constant(name, dims, 0.0);
    }

    /// An input projection `fan_in -> fan_out` in the dense type, scaled to
    /// keep its output near unit size.
    pub fn matrix(&mut self, name: impl Into<String>, fan_in: u64, fan_out: u64) {
        let ty = self.spec.dense_type;
        self.tensor(name, &[fan_in, fan_out], ty, proj(fan_in, 1.0));
    }

    /// A projection back into the residual stream, scaled down by the
    /// routing shape's `mix` so the stream keeps its token structure.
    pub fn out_matrix(&mut self, name: impl Into<String>, fan_in: u64, fan_out: u64) {
        let ty = self.spec.dense_type;
        let mix = self.spec.routing.mix;
        self.tensor(name, &[fan_in, fan_out], ty, proj(fan_in, mix));
    }

    /// A gated dense FFN `ffn_{gate,up,down}<suffix>` of hidden width
    /// `width` at layer `l` (`suffix` empty for a layer's own FFN, `_shexp`
    /// for a shared expert): random, except a tied model's first layer,
    /// which holds its successor lookup (see [`super::tied`]).
    pub fn dense_ffn(&mut self, l: u32, suffix: &str, width: u64) {
        let d = self.d();
        let [gate, up, down] = ["ffn_gate", "ffn_up", "ffn_down"].map(|n| blk(l, &format!("{n}{suffix}")));
        match self.structure.tied.as_ref().filter(|_| l == 0 && suffix.is_empty()) {
            Some(tied) if width == u64::from(self.spec.dense_ff) => {
                let (ty, gate_fill, up_fill, down_fill) =
                    (self.spec.dense_type, tied.gate.clone(), tied.up.clone(), tied.down.clone());
                self.tensor(gate, &[d, width], ty, gate_fill);
                self.tensor(up, &[d, width], ty, up_fill);
                self.tensor(down, &[width, d], ty, down_fill);
            }
            _ => {
                self.matrix(gate, d, width);
                self.matrix(up, d, width);
                self.out_matrix(down, width, d);
            }
        }
    }

    /// Layer `l`'s router `[d, n_expert]` with the structured fill.
    pub fn router(&mut self, name: impl Into<String>, l: u32) {
        let first = *self.first_moe.get_or_insert(l);
        let values = self.structure.router(self.spec, l, first);
        let ty = if self.spec.dense_type == GgmlType::F16 { GgmlType::F16 } else { GgmlType::F32 };
        let dims = [self.d(), u64::from(self.spec.experts)];
        self.tensor(name, &dims, ty, Fill::Values(values));
    }

    /// An expert bank `[fan_in, fan_out, n_expert]` in the expert type;
    /// `scale` sizes its output (1 for inputs, `mix`-scaled for outputs).
    pub fn experts(&mut self, name: impl Into<String>, fan_in: u64, fan_out: u64, scale: f32) {
        let ty = self.spec.expert_type;
        let dims = [fan_in, fan_out, u64::from(self.spec.experts)];
        self.tensor(name, &dims, ty, proj(fan_in, scale));
    }

    /// An expert bank's down projection `[fan_in, d, n_expert]` in the
    /// expert type: random rows for the residual stream's expert band
    /// ([`super::expert_band`]), zero rows for the rest. `scale` sizes its
    /// output as [`Builder::experts`]'s does (the band's rows are larger so
    /// that the output's total size is the same), times the architecture's
    /// `expert_gain`.
    pub fn expert_outputs(&mut self, name: impl Into<String>, fan_in: u64, scale: f32) {
        let (ty, d) = (self.spec.expert_type, self.spec.embd as usize);
        let band = super::expert_band(d);
        let dims = [fan_in, d as u64, u64::from(self.spec.experts)];
        let gain = self.spec.arch.generator().expert_gain;
        let std = gain * scale / (fan_in as f32).sqrt() * (d as f32 / band as f32).sqrt();
        self.tensor(name, &dims, ty, Fill::Band { std, live: band, period: d });
    }

    /// `token_embd`, `output_norm` and `output` with the structured fills.
    pub fn embeddings(&mut self) {
        self.embeddings_with_norm("output_norm.weight");
    }

    /// [`Builder::embeddings`] with the final norm named `norm` (LFM2 calls
    /// it `token_embd_norm`).
    pub fn embeddings_with_norm(&mut self, norm: &str) {
        let (d, ty) = (self.d(), self.spec.dense_type);
        self.tensor("token_embd.weight", &[d, self.n_vocab], ty, self.structure.embedding.clone());
        match &self.structure.tied {
            Some(tied) => self.tensor(norm, &[d], GgmlType::F32, tied.final_norm.clone()),
            None => self.norm(norm, d),
        }
        if !self.spec.tied_embeddings {
            self.tensor("output.weight", &[d, self.n_vocab], ty, self.structure.output.clone());
        }
    }
}

/// Uniform random values with standard deviation `scale / sqrt(fan_in)`.
fn proj(fan_in: u64, scale: f32) -> Fill {
    Fill::Random { std: scale / (fan_in as f32).sqrt() }
}
