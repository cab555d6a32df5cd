//! The external tier: downstream stacks that scripts/test installs and caches — a real
//! Triton Inference Server (`test-triton`, scripts/triton_backend.sh), the consumer matrix
//! and the examples/web page in headless Chromium (`test-consumers`,
//! scripts/consumers_setup.sh), the pip wheel in a fresh virtual environment (`test-wheel`,
//! built by maturin in scripts/test). Each test runs with its feature and is listed as
//! ignored without it.

#[path = "../common/mod.rs"]
mod common;

mod consumers;
mod triton;
mod web;
mod wheel;
