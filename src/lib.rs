//! bmoe: run Mixture-of-Experts models larger than RAM by streaming only the
//! routed experts' weights from disk into llama.cpp, losslessly.

#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod bench;
pub mod chat;
pub mod cli;
pub mod config;
pub mod engine;
pub mod eval;
pub mod fit;
#[doc(hidden)]
pub mod fuzz;
pub mod gguf;
pub mod host;
pub mod hub;
pub mod interrupt;
#[allow(unsafe_code)]
pub mod llama;
pub mod moe;
pub mod mtp_head;
pub mod notes;
pub mod policy;
pub mod progress;
pub mod replay;
pub mod schema;
pub mod script;
pub mod serve;
pub mod synth;
pub mod telemetry;
pub mod text;
pub mod ui;
pub mod units;
