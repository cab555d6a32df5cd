//! The integration tests, one binary (one link of tract and ONNX Runtime). Each module
//! compares the tool's numbers with something independent: the f64 reference forward
//! pass, the other runtime, outputs stored by PyTorch and the upstream libraries, the ONNX
//! checker. Tests that need the test Python environment (ONNX Runtime's library, onnx,
//! numpy: scripts/requirements-test.txt) are compiled with the `test-onnxruntime` feature
//! only, which scripts/test turns on: whole modules below, and in the other modules their
//! `with_onnxruntime` submodule. A plain `cargo test` runs everything else and passes on a
//! fresh clone.
//!
//! The external tier (a real Triton server, the consumer matrix, the pip wheel) is the
//! other binary, tests/external.

#[path = "../common/mod.rs"]
mod common;

mod cli;
#[cfg(feature = "test-onnxruntime")]
mod doc_loops;
mod docs;
mod fleet_cli;
#[cfg(feature = "test-onnxruntime")]
mod genai;
mod generation;
mod hostile;
mod import;
mod inspect;
#[cfg(feature = "test-onnxruntime")]
mod int8;
mod layers;
mod model;
mod newcomer;
#[cfg(feature = "test-onnxruntime")]
mod npz;
mod ops;
#[cfg(feature = "test-onnxruntime")]
mod pictures;
mod presets;
mod pytorch;
#[cfg(feature = "test-onnxruntime")]
mod runs;
mod spellings;
#[cfg(feature = "test-onnxruntime")]
mod static_batch;
mod static_state;
mod targets;
#[cfg(feature = "test-onnxruntime")]
mod upstream;
mod validate;
mod variants;
mod version;
mod weight_only;
