//! Fuzz target: see `bmoe::fuzz::gguf_file`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmoe::fuzz::gguf_file(data));
