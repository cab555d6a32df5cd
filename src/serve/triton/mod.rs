//! Triton Inference Server model repositories: a `config.pbtxt` derived from an ONNX
//! model's declared inputs and outputs, and the standard layout
//! `REPO/NAME/config.pbtxt` + `REPO/NAME/VERSION/model.onnx` (+ `model.onnx.data`),
//! written atomically like every other output.
//!
//! The configuration targets Triton's ONNX Runtime backend (`platform:
//! "onnxruntime_onnx"`). A stateless model gets `dynamic_batching`; a with-past model
//! (inputs `past_*` each answered by an output `present_*`) gets `sequence_batching`
//! with one implicit `state` per pair, so that Triton keeps the state between the
//! requests of a sequence and a client sends only the new tokens.
//!
//! A static-state model (docs/static-state.md: `past_*` [batch, n, width], a `position`
//! input `[batch]`) is served with its weights and nodes as built: each state starts as n
//! zero rows, every sequence's state has the same size, so the `oldest` strategy batches
//! requests of different sequences at different positions (`max_batch_size` 8 by default,
//! the dynamic batcher's queue delay). Its `position` is one more implicit state, a
//! counter: the served model, emitted again from the file's configuration with Triton's
//! interface ([`Interface::Triton`](crate::gmlp::Interface::Triton), src/rebuild.rs), has
//! the output `position` + the request's token count, fed back to the next request and
//! reset to 0 by the start flag. A client sends only `input_ids`, like the growing form's.
//!
//! Two limits of Triton r24.10 shape the growing form (evidence in docs/serving.md,
//! "With-past models"): the first state of a sequence always has size 1 in each variable
//! dimension, whatever `initial_state` says (a zero-length initial state fails with "not
//! enough space: expected 16, got 0"), and a batch of sequences whose states differ in
//! length is concatenated wrongly by the ONNX Runtime backend. So the repository holds
//! a growing-state model emitted again with Triton's interface: Triton's state carries
//! one leading zero slot that the graph slices off before the model reads it and puts back
//! in front of its `present_*` output; and `max_batch_size` is 1 with the `oldest`
//! strategy, so that sequences interleave request by request without being batched. Both
//! interfaces are the emitter's, from the configuration in a file gmlp-onnx wrote; a
//! stateful file it did not write is refused.
//!
//! [`model_config`] plans the configuration (and renders it as `config.pbtxt`), [`repository`]
//! writes the entry; everything is re-exported here.

use clap::ValueEnum;

use crate::error::{Error, Result};
use crate::message::{Phrase, Setting};

pub mod client;
pub mod model_config;
pub mod pairing;
mod pbtxt;
pub mod remote;
pub mod repository;
pub mod router;
#[cfg(test)]
mod testing;

pub use model_config::{
    check_model_name, plan, triton_data_type, ImplicitState, StateKind, TritonConfig, TritonTensor,
    MAX_CANDIDATE_SEQUENCES, NEXT_POSITION, PAST_PREFIX, PRESENT_PREFIX,
};
pub use repository::{
    check_target, write_repository, write_repository_file, RepositoryPaths, RepositoryWritten,
    ADAPTER_METADATA_KEY, COUNTER_METADATA_KEY, DATA_FILE, MODEL_FILE,
};

/// Default `max_batch_size` of a generated configuration for a stateless model.
pub const DEFAULT_MAX_BATCH_SIZE: u32 = 8;
/// The only `max_batch_size` a growing-state with-past model can be served with (see the
/// module doc); static-state models default to [`DEFAULT_MAX_BATCH_SIZE`].
pub const WITH_PAST_MAX_BATCH_SIZE: u32 = 1;
/// Default `max_queue_delay_microseconds` of the dynamic batcher.
pub const DEFAULT_MAX_QUEUE_DELAY_US: u64 = 100;
/// Default `max_sequence_idle_microseconds` of a with-past model: how long a sequence may
/// go without a request before Triton frees its slot and state.
pub const DEFAULT_MAX_SEQUENCE_IDLE_US: u64 = 60_000_000;

/// Where Triton runs the model instances (`instance_group.kind`, `--triton-kind`; each
/// variant's first doc paragraph is its `--help` line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InstanceKind {
    /// KIND_CPU instances.
    Cpu,
    /// KIND_GPU instances (ONNX Runtime's CUDA execution provider).
    Gpu,
}

/// Precision of the optional TensorRT accelerator on GPU instances (`--triton-tensorrt`;
/// each variant's first doc paragraph is its `--help` line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TensorRtPrecision {
    /// TensorRT in FP16.
    ///
    /// `precision_mode: "FP16"`.
    Fp16,
    /// TensorRT in FP32.
    ///
    /// `precision_mode: "FP32"`.
    Fp32,
}

/// What the generated repository looks like.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TritonOptions {
    /// Model name: the directory under the repository and the name clients use.
    pub name: String,
    /// Version directory (a positive integer).
    pub version: u64,
    /// `max_batch_size`; 0 turns batching off and keeps the batch dimension in `dims`.
    /// `None`: [`DEFAULT_MAX_BATCH_SIZE`], or [`WITH_PAST_MAX_BATCH_SIZE`] for a
    /// growing-state with-past model.
    pub max_batch_size: Option<u32>,
    /// `instance_group.kind`.
    pub kind: InstanceKind,
    /// `instance_group.count`: model instances (each an ONNX Runtime session).
    pub instance_count: u32,
    /// TensorRT execution accelerator (GPU instances only).
    pub tensorrt: Option<TensorRtPrecision>,
    /// `max_queue_delay_microseconds`: how long the batcher waits to fill a batch.
    pub max_queue_delay_us: u64,
    /// `max_sequence_idle_microseconds` of a with-past model (`None`:
    /// [`DEFAULT_MAX_SEQUENCE_IDLE_US`]); refused for a stateless model.
    pub max_sequence_idle_us: Option<u64>,
}

impl TritonOptions {
    /// Defaults for a model called `name`: version 1, default batch size, one CPU instance.
    pub fn new(name: &str) -> Self {
        TritonOptions {
            name: name.to_string(),
            version: 1,
            max_batch_size: None,
            kind: InstanceKind::Cpu,
            instance_count: 1,
            tensorrt: None,
            max_queue_delay_us: DEFAULT_MAX_QUEUE_DELAY_US,
            max_sequence_idle_us: None,
        }
    }

    /// Checks the options on their own (name, version, counts, accelerator).
    pub fn check(&self) -> Result<()> {
        check_model_name(&self.name)?;
        if self.version == 0 {
            return Err(Error::Setting(
                Phrase::setting(Setting::TritonVersion)
                    .then(" must be >= 1 (Triton ignores a version directory named 0)"),
            ));
        }
        if self.max_sequence_idle_us == Some(0) {
            return Err(Error::Setting(
                Phrase::setting(Setting::TritonMaxSequenceIdleUs)
                    .then(" must be >= 1 (Triton reads 0 as its own default of 1 s)"),
            ));
        }
        if self.instance_count == 0 {
            return Err(Error::Setting(
                Phrase::setting(Setting::TritonInstances).then(" must be >= 1"),
            ));
        }
        if self.tensorrt.is_some() && self.kind != InstanceKind::Gpu {
            return Err(Error::Setting(
                Phrase::setting(Setting::TritonTensorrt)
                    .then(" needs ")
                    .and(Setting::TritonKind)
                    .then(" gpu (TensorRT runs on GPU instances only)"),
            ));
        }
        Ok(())
    }
}

/// A model Triton cannot serve as it is ([`Error::Unservable`]).
fn unservable(message: impl Into<String>) -> Error {
    Error::Unservable(message.into())
}
