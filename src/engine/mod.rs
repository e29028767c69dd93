//! The session: open a model once (load, capture, rebind), then generate
//! many times with the KV cache and the expert cache kept warm.

mod contention;
mod events;
mod remote;
mod session;
mod threads;

pub use crate::moe::budget::CacheBudget;
pub use crate::moe::dense::DenseWeights;
pub use crate::moe::repack::Repack;
pub use events::{Event, Phase, StepReport};
pub use remote::RpcOptions;
pub use session::{
    AbortHandle, EngineError, GenerateRequest, Generation, LeanOpen, OpenReport, Prompt, RouteProfileOpen, Scored,
    Session, SessionOptions, StreamOptions, Utf8Stream,
};
pub use threads::{Setting, StepTuner};
