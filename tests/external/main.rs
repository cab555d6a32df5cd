//! The external tier: downstream stacks that scripts/test installs and caches — a real
//! Triton Inference Server (`test-triton`, scripts/triton_backend.sh), the consumer matrix
//! and the examples/web page in headless Chromium (`test-consumers`,
//! scripts/consumers_setup.sh), the pip wheel in a fresh virtual environment (`test-wheel`,
//! built by maturin in scripts/test). Each module is compiled with its feature only, so a
//! plain `cargo test` on a fresh clone builds none of them and needs none of their stacks.

#[path = "../common/mod.rs"]
mod common;

#[cfg(feature = "test-consumers")]
mod consumers;
#[cfg(feature = "test-triton")]
mod triton;
#[cfg(feature = "test-consumers")]
mod web;
#[cfg(feature = "test-wheel")]
mod wheel;
