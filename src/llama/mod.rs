//! The only module that touches llama.cpp (through `llama-cpp-sys-2`) or raw
//! memory. Everything here wraps an FFI call or a pointer in a small safe
//! type; every `unsafe` block says which contract makes it sound.

mod context;
mod log;
pub mod memory;
mod model;
pub mod quant;
mod sampler;
mod tensor;

use std::sync::Once;

use llama_cpp_sys_2 as sys;

pub use context::{Context, ContextParams, DecodeError, EvalHook, Logits, NoHook};
pub use log::{last_errors, set_verbose};
pub use model::{Model, ModelLoadError};
pub use sampler::{Sampler, Sampling, argmax};
pub use tensor::{RowScorer, Tensor, TensorBinding, TensorHandle};

static INIT: Once = Once::new();

/// Initializes the llama.cpp backend and routes its log through bmoe's.
/// Safe to call many times.
pub fn init() {
    INIT.call_once(|| {
        log::install();
        // SAFETY: called once per process before any other llama.cpp call.
        unsafe { sys::llama_backend_init() };
    });
}

/// (elements per block, bytes per block) of a ggml type, from the linked ggml.
pub fn ggml_type_geometry(type_id: u32) -> (u64, u64) {
    // SAFETY: pure table lookups; ids come from our own table of valid types.
    unsafe { (sys::ggml_blck_size(type_id) as u64, sys::ggml_type_size(type_id) as u64) }
}
