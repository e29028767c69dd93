//! Fuzz target: see `bmoe::fuzz::config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmoe::fuzz::config(data));
