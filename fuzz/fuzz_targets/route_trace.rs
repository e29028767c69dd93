//! Fuzz target: see `bmoe::fuzz::route_trace`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| bmoe::fuzz::route_trace(data));
