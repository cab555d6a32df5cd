//! Fuzz target: see `safetensors_reader` in fuzz/bodies.rs (shared with the regression tests in
//! tests/suite/hostile/, which replay fuzz/corpus/safetensors_reader and the crashers kept in
//! fuzz/regressions/).
#![no_main]

#[path = "../bodies.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::safetensors_reader(data));
