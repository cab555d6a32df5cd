//! Fuzz target: see `pytorch_reader` in fuzz/bodies.rs (shared with the regression tests in
//! tests/suite/hostile/, which replay fuzz/corpus/pytorch_reader and the crashers kept in
//! fuzz/regressions/).
#![no_main]

#[path = "../bodies.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::pytorch_reader(data));
