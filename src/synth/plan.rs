//! The metadata and tensor list of a synthetic model: the keys every file
//! has, the architecture's own (its generator), the vocabulary.

use super::ModelSpec;
use super::build::Builder;
use super::fill::Fill;
use super::mix::{MixModel, apply};
use super::structure::Structure;
use super::vocab::{Vocab, template_markers};
use crate::gguf::{TensorSpec, Value};

/// A model ready to be written.
pub struct Planned {
    /// Metadata in write order.
    pub metadata: Vec<(String, Value)>,
    /// Tensors in write order with their fill rule.
    pub tensors: Vec<(TensorSpec, Fill)>,
    /// Tokens in the vocabulary.
    pub n_vocab: usize,
}

/// Builds the full plan for `spec`.
pub fn plan(spec: &ModelSpec) -> Planned {
    let markers = spec.chat_template.as_deref().map(template_markers).unwrap_or_default();
    let vocab = Vocab::new(spec.pieces, &markers, spec.vocab);
    let structure = Structure::new(spec, &vocab);
    let n_vocab = vocab.len();
    let arch = spec.arch.name();
    let mut metadata = vec![
        ("general.architecture".to_string(), Value::String(arch.into())),
        ("general.name".to_string(), Value::String(format!("bmoe synthetic {arch} (random weights)"))),
        ("general.alignment".to_string(), Value::U32(32)),
    ];
    let mut builder = Builder::new(spec, vocab.len() as u64, &structure);
    (spec.arch.generator().build)(&mut builder);
    metadata.append(&mut builder.metadata);
    metadata.extend(vocab.metadata().into_iter().map(|(k, v)| (k.to_string(), v)));
    if let Some(template) = &spec.chat_template {
        metadata.push(("tokenizer.chat_template".to_string(), Value::String(template.clone())));
    }
    let mut tensors = builder.tensors;
    if let Some(quant_mix) = spec.quant_mix {
        let model = MixModel {
            n_layer: spec.layers + spec.mtp_layers,
            n_expert: spec.experts,
            n_gqa: spec.heads / spec.kv_heads.max(1),
        };
        let mut specs: Vec<TensorSpec> = tensors.iter().map(|(t, _)| t.clone()).collect();
        apply(quant_mix, model, &mut specs);
        for ((t, _), mixed) in tensors.iter_mut().zip(specs) {
            t.ty = mixed.ty;
        }
    }
    Planned { metadata, tensors, n_vocab }
}
