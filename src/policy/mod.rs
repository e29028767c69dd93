//! Draft and drop policies: the traits the engine calls, the guards that
//! validate every answer and disable a misbehaving policy, the native
//! reference implementations, and the WebAssembly plugin host.
//!
//! A policy sees only plain data: token ids, expert ids, router weights and
//! residency bits. Bundled policies exist twice: as a Wasm plugin (the one
//! the engine loads) and as a native twin in `native/`, written
//! independently from the specification, used as a differential test.

mod guard;
pub mod native;
pub mod scaffold;
pub mod wasm;

pub use guard::{Drafter, Dropper};

/// One drop decision request: one token at one MoE layer.
#[derive(Debug, Clone, Copy)]
pub struct DropCall<'a> {
    /// Layer index.
    pub layer: u32,
    /// Routed experts in router-slot order (slot 0 has the largest weight).
    pub experts: &'a [u32],
    /// Their applied router weights.
    pub weights: &'a [f32],
    /// Whether each expert's bytes are resident.
    pub resident: &'a [bool],
    /// Routed slots per token.
    pub k: u32,
}

/// A speculative-decoding draft policy. Errors are faults (a trap, a
/// deadline, a memory limit); the guard disables the policy on the first one.
pub trait DraftPolicy: Send {
    /// Starts over with every token of the conversation so far.
    fn reset(&mut self, context: &[i32]) -> Result<(), String>;
    /// Appends accepted tokens.
    fn observe(&mut self, accepted: &[i32]) -> Result<(), String>;
    /// Proposes up to `max` next tokens.
    fn draft(&mut self, max: u32) -> Result<Vec<i32>, String>;
}

/// An expert-drop policy.
pub trait DropPolicy: Send {
    /// Experts to drop for one token at one layer (usually none).
    fn decide(&mut self, call: &DropCall<'_>) -> Result<Vec<u32>, String>;
}

/// The two kinds of policy plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginKind {
    /// Exports `drafter-policy`.
    Drafter,
    /// Exports `dropper-policy`.
    Dropper,
}

impl PluginKind {
    /// `drafter` or `dropper`.
    pub fn name(self) -> &'static str {
        match self {
            PluginKind::Drafter => "drafter",
            PluginKind::Dropper => "dropper",
        }
    }
}
