//! The metadata and tensor list of a synthetic model: the keys every file
//! has, the architecture's own (its generator), the vocabulary.

use super::ModelSpec;
use super::build::Builder;
use super::fill::Fill;
use super::structure::Structure;
use super::vocab::{Vocab, template_markers};
use crate::gguf::{TensorSpec, Value};

/// A model ready to be written.
pub struct Planned {
    /// Metadata in write order.
    pub metadata: Vec<(String, Value)>,
    /// Tensors in write order with their fill rule.
    pub tensors: Vec<(TensorSpec, Fill)>,
}

/// Builds the full plan for `spec`.
pub fn plan(spec: &ModelSpec) -> Planned {
    let markers = spec.chat_template.as_deref().map(template_markers).unwrap_or_default();
    let vocab = Vocab::new(spec.pieces, &markers);
    let structure = Structure::new(spec, &vocab);
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
    Planned { metadata, tensors: builder.tensors }
}
