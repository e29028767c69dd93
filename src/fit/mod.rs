//! `bmoe fit`: whether a model runs on this machine, resident or streamed,
//! and how fast, estimated from its GGUF header and measured speeds of this
//! machine's memory, disk and compute (docs/models.md, "What fits").

mod choice;
mod estimate;
pub mod probe;
mod shape;

pub use choice::{StreamChoice, choose_streaming};
pub use estimate::{Estimate, Machine, Mode, estimate, hit_rates};
pub use shape::ModelShape;
