//! gmlp-onnx: compiles gMLP and aMLP networks ("Pay Attention to MLPs", Liu et al. 2021)
//! into ONNX and checks the result in two independent runtimes.
//!
//! Data path, one way: [`gmlp::GmlpConfig`] (from a preset or a [`checkpoint`]) →
//! [`gmlp::build_graph`] through [`onnx::builder::GraphBuilder`] → [`onnx::writer`] →
//! [`runtime`] (tract, ONNX Runtime) → [`generation`] (decoding) or [`validate`].
//!
//! Layers, each importing only from the ones before it: [`message`] → [`error`] → [`tensor`], [`rng`],
//! [`fs`], [`archive`], [`spelling`] → [`npz`], [`plot`] → [`onnx`] → [`gmlp`] → [`checkpoint`] → [`inspect`] →
//! [`runtime`] → [`generation`] → [`serve`] → [`validate`] → [`pipeline`] (the build both front ends run).
//! `tests/suite/layers.rs` checks this order on the sources.
#![warn(missing_docs)]
// `unsafe` only where a module or item says why it allows it: ONNX Runtime's buffer
// module (raw tensor memory, the CUDA runtime's copies) and the read-only map of a
// checkpoint file.
#![deny(unsafe_code)]

pub mod message;

pub mod archive;
pub mod error;
pub mod fs;
pub mod rng;
pub mod spelling;
pub mod tensor;

pub mod npz;
pub mod plot;

pub mod onnx;

pub mod gmlp;

pub mod checkpoint;

pub mod inspect;

pub mod runtime;

pub mod generation;

pub mod serve;

pub mod validate;

pub mod pipeline;

pub use error::{ArrayFileError, CheckpointError, Error, Remedy, Result};
