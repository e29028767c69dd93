//! The only module that touches llama.cpp (through `llama-cpp-sys-2`) or raw
//! memory. Everything here wraps an FFI call or a pointer in a small safe
//! type; every `unsafe` block says which contract makes it sound.

mod constraint;
mod context;
pub mod cpu_layouts;
pub mod invariant_sgemm;
pub mod kernels;
mod log;
pub use log::take_kv_cache_bytes;
pub mod memory;
mod model;
mod mtp;
pub mod quant;
mod repack;
pub mod rpc;
mod sampler;
mod tensor;
pub mod uring;

use std::sync::Once;

use llama_cpp_sys_2 as sys;

pub use constraint::{Constraint, SchemaGuide, TokenTable};
pub use context::{Context, ContextParams, DecodeError, EvalHook, Logits, NoHook, SeqPart, batch_index_of_last};
pub use log::{last_errors, set_verbose};
pub use model::{Model, ModelLoadError};
pub use mtp::{MtpExperts, MtpParams};
pub use repack::Repacker;
pub use rpc::RemoteLayers;
pub use sampler::{Penalties, Sampler, Sampling, argmax};
pub use tensor::{RowScorer, Tensor, TensorBinding, TensorHandle};

static INIT: Once = Once::new();

/// Initializes the llama.cpp backend and routes its log through bmoe's.
/// Safe to call many times.
pub fn init() {
    INIT.call_once(|| {
        log::install();
        // SAFETY: installs a plain function pointer, before any other call.
        unsafe { sys::ggml_set_abort_callback(Some(on_ggml_abort)) };
        // SAFETY: called once per process before any other llama.cpp call.
        unsafe { sys::llama_backend_init() };
        // Registered before any graph computes (the CPU backend reads its
        // list of extra buffer types on every node).
        let _ = invariant_sgemm::buffer_type();
    });
}

/// Says why llama.cpp is about to end the process (ggml then calls
/// `abort`, which nothing can stop): its own message, and for the RPC
/// backend, which aborts on a broken connection, what that means.
unsafe extern "C" fn on_ggml_abort(message: *const std::ffi::c_char) {
    let text = if message.is_null() {
        String::new()
    } else {
        // SAFETY: ggml passes its NUL-terminated message buffer.
        unsafe { std::ffi::CStr::from_ptr(message) }.to_string_lossy().into_owned()
    };
    let rpc = text.contains("RPC") || text.contains("rpc");
    let _ = std::panic::catch_unwind(|| {
        eprintln!("bmoe: llama.cpp stopped the process: {text}");
        if rpc {
            eprintln!("bmoe: {}", rpc::abort_note());
        }
    });
}

/// The CPU features the linked llama.cpp was built to use, as it reports
/// them (`AVX2 = 1 | FMA = 1 | ...`): only those it uses.
pub fn cpu_features() -> String {
    init();
    // SAFETY: returns a pointer to a static, NUL-terminated buffer llama.cpp
    // owns; it is copied out before any other call.
    let text = unsafe { std::ffi::CStr::from_ptr(sys::llama_print_system_info()) };
    let text = text.to_string_lossy();
    let used: Vec<&str> =
        text.split('|').map(|f| f.trim().trim_start_matches("CPU : ")).filter_map(|f| f.strip_suffix(" = 1")).collect();
    used.join(" ")
}

/// (elements per block, bytes per block) of a ggml type, from the linked ggml.
pub fn ggml_type_geometry(type_id: u32) -> (u64, u64) {
    // SAFETY: pure table lookups; ids come from our own table of valid types.
    unsafe { (sys::ggml_blck_size(type_id) as u64, sys::ggml_type_size(type_id) as u64) }
}
