//! Fuzz target: see `onnx_reader` in fuzz/bodies.rs (shared with the regression tests in
//! tests/suite/hostile/, which replay fuzz/corpus/onnx_reader and fuzz/regressions/onnx_reader).
#![no_main]

#[path = "../bodies.rs"]
mod bodies;

libfuzzer_sys::fuzz_target!(|data: &[u8]| bodies::onnx_reader(data));
