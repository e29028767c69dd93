//! Telemetry: per-token CSV, route traces (writing and analysing), memory
//! readings and the end-of-run summary. All consume engine events.

pub mod csv;
pub mod digest;
pub mod mem;
pub mod summary;
pub mod trace;

/// The engine version string written into every telemetry file.
pub fn engine_version() -> String {
    format!("bmoe {} (llama-cpp-sys-2 0.1.161, ggml {})", env!("CARGO_PKG_VERSION"), env!("BMOE_GGML_VERSION"))
}
