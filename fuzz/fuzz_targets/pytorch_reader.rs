//! Fuzz target: see `pytorch_reader` in fuzz/bodies.rs (shared with the regression tests in
//! tests/suite/hostile/, which replay fuzz/corpus/pytorch_reader and fuzz/regressions/pytorch_reader).
#![no_main]

#[path = "../bodies.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::pytorch_reader(data));
