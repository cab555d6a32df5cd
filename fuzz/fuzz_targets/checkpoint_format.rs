//! Fuzz target: see `checkpoint_format` in fuzz/bodies.rs (shared with the regression tests in
//! tests/suite/hostile/, which replay fuzz/corpus/checkpoint_format and the crashers kept in
//! fuzz/regressions/).
#![no_main]

#[path = "../bodies.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::checkpoint_format(data));
