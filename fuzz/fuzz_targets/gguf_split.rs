//! Fuzz target: see `bmoe::fuzz::gguf_split`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmoe::fuzz::gguf_split(data));
