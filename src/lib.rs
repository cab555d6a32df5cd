//! gmlp-onnx: compiles gMLP and aMLP networks ("Pay Attention to MLPs", Liu et al. 2021)
//! into ONNX and checks the result in two independent runtimes.
//!
//! Data path: [`gmlp::GmlpConfig`] → [`gmlp::build_graph`] (through [`graph::GraphBuilder`])
//! → [`model_io::write_model`] → [`runtime`] → [`compare`] / [`validate`].
#![warn(missing_docs)]

pub mod checkpoint;
pub mod compare;
pub mod error;
pub mod export;
pub mod gmlp;
pub mod graph;
pub mod inspect;
pub mod model_io;
pub mod npz;
pub mod onnx;
pub mod runtime;
pub mod triton;
pub mod validate;

pub use error::{Error, Result};
