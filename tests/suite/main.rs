//! The integration tests, one binary (one link of tract and ONNX Runtime). Each module
//! compares the tool's numbers with something independent: the f64 reference forward
//! pass, the other runtime, outputs stored by PyTorch and the upstream libraries, the ONNX
//! checker. Tests that need the test Python environment (ONNX Runtime's library, onnx,
//! numpy: scripts/requirements-test.txt) run with the `test-onnxruntime` feature, which
//! scripts/test turns on; without it they are listed as ignored, so a plain `cargo test`
//! runs everything else and passes on a fresh clone.
//!
//! The external tier (a real Triton server, the consumer matrix, the pip wheel) is the
//! other binary, tests/external.

#[path = "../common/mod.rs"]
mod common;

mod cli;
mod doc_loops;
mod docs;
mod generation;
mod hostile;
mod import;
mod inspect;
mod int8;
mod layers;
mod model;
mod newcomer;
mod npz;
mod ops;
mod pictures;
mod presets;
mod pytorch;
mod spellings;
mod static_batch;
mod static_state;
mod targets;
mod upstream;
mod validate;
mod variants;
mod weight_only;
