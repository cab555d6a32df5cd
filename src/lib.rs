//! gmlp-onnx: compiles gMLP and aMLP networks ("Pay Attention to MLPs", Liu et al. 2021)
//! into ONNX and checks the result in two independent runtimes.
//!
//! Data path, one way: [`gmlp::GmlpConfig`] (from a preset or a [`checkpoint`]) →
//! [`gmlp::build_graph`] through [`onnx::builder::GraphBuilder`] → [`onnx::writer`] →
//! [`runtime`] (tract, ONNX Runtime) → [`generation`] (decoding) or [`validate`].
//!
//! The modules form a graph without a circle; each line names a module and the modules it
//! uses (`tests/suite/layers.rs` checks it on the sources, both ways: no use outside it,
//! no edge the sources lack). Modules that use none of each other's are siblings:
//! [`checkpoint`], [`inspect`], [`rebuild`] and [`runtime`] over [`gmlp`] (the engine's
//! own code uses none of it; its unit tests build their models with it); [`serve`] and
//! [`validate`] over [`generation`]; [`pipeline`] (the build both front ends run) on top.
//!
//! ```text
//! message:
//! rng:
//! spelling:
//! error: message
//! tensor: error
//! fs: error
//! archive: error
//! npz: archive, error, fs, tensor
//! plot: error, fs
//! onnx: error, fs, rng, tensor
//! gmlp: error, message, onnx, rng, spelling, tensor
//! checkpoint: archive, error, fs, gmlp, message, npz, tensor
//! inspect: error, gmlp, message, onnx, plot
//! rebuild: error, gmlp, onnx
//! runtime: error, gmlp, onnx, spelling, tensor
//! generation: error, gmlp, onnx, rebuild, rng, runtime, tensor
//! serve: error, fs, generation, gmlp, message, onnx, rebuild, rng, runtime, tensor
//! validate: error, generation, gmlp, message, npz, onnx, plot, rng, runtime, tensor
//! pipeline: checkpoint, error, gmlp, inspect, message, onnx, runtime, serve
//! ```
#![warn(missing_docs)]
// `unsafe` only where a module or item says why it allows it: ONNX Runtime's buffer
// module (raw tensor memory, the CUDA runtime's copies) and the read-only map of a
// checkpoint file, and the writeback hint of an output file (fs.rs).
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

pub mod rebuild;

pub mod runtime;

pub mod generation;

pub mod serve;

pub mod validate;

pub mod pipeline;

pub use error::{ArrayFileError, CheckpointError, Error, Remedy, Result};
