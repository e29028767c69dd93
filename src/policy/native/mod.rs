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
        "ngram" => Box::new(Ngram::default()),
        "ngram-multi" => Box::new(NgramMulti::default()),
        "suffix" => Box::new(Suffix::default()),
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

/// A context that drafters append to.
#[derive(Debug, Clone, Default)]
struct History(Vec<i32>);

impl History {
    fn reset(&mut self, context: &[i32]) {
        self.0 = context.to_vec();
    }

    fn observe(&mut self, accepted: &[i32]) {
        self.0.extend_from_slice(accepted);
    }
}
