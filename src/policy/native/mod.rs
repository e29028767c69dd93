//! Native reference implementations of the bundled policies, written from
//! their specifications with the plainest algorithm (linear scans, no
//! indexes), so that comparing them with the Wasm plugins is a real
//! differential test.

mod drop_cold;
mod ngram;
mod ngram_multi;
mod suffix;

pub use drop_cold::DropCold;
pub use ngram::Ngram;
pub use ngram_multi::NgramMulti;
pub use suffix::Suffix;

use super::{DraftPolicy, DropPolicy};

/// The native twin of bundled plugin `name` with its default parameters.
pub fn drafter(name: &str) -> Option<Box<dyn DraftPolicy>> {
    Some(match name {
        "ngram" => Box::new(Twin::new(Ngram::default())),
        "ngram-multi" => Box::new(Twin::new(NgramMulti::default())),
        "suffix" => Box::new(Twin::new(Suffix::default())),
        _ => return None,
    })
}

/// The native twin of bundled drop plugin `name` with its default parameters.
pub fn dropper(name: &str) -> Option<Box<dyn DropPolicy>> {
    Some(match name {
        "drop-cold" => Box::new(DropCold::default()),
        _ => return None,
    })
}

/// A draft policy written as a function of the whole context.
pub trait ContextDraft: Send {
    /// Up to `max` tokens to follow `context`.
    fn draft_from(&self, context: &[i32], max: usize) -> Vec<i32>;
}

/// Keeps the context for a [`ContextDraft`], making it a [`DraftPolicy`].
#[derive(Debug, Clone, Default)]
pub struct Twin<T> {
    /// The policy and its parameters.
    pub policy: T,
    context: Vec<i32>,
}

impl<T: ContextDraft> Twin<T> {
    /// Wraps `policy` with an empty context.
    pub fn new(policy: T) -> Twin<T> {
        Twin { policy, context: Vec::new() }
    }
}

impl<T: ContextDraft> DraftPolicy for Twin<T> {
    fn reset(&mut self, context: &[i32]) -> Result<(), String> {
        self.context = context.to_vec();
        Ok(())
    }

    fn observe(&mut self, accepted: &[i32]) -> Result<(), String> {
        self.context.extend_from_slice(accepted);
        Ok(())
    }

    fn draft(&mut self, max: u32) -> Result<Vec<i32>, String> {
        Ok(self.policy.draft_from(&self.context, max as usize))
    }
}
