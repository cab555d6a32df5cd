//! The decoding layer, on top of the engine ([`crate::runtime`]): the decoding model read
//! from a file's metadata ([`model`]), the [`Decoder`] that feeds
//! tokens and keeps the state between runs ([`decoder`], in one of the storage forms of
//! state.rs: carried, bound to a session (resident.rs, which also writes the session's step
//! graph, `step_graph`) or a re-run prefix), the choice of the next token
//! ([`sampling`]) and the one generation loop ([`generator`]); [`step_form`] says which
//! static step a file runs and builds the fused one beside it for a measurement. The engine knows nothing of
//! this layer (`tests/suite/layers.rs` checks it); docs/architecture.md draws `generate`'s
//! path through both.
#![deny(unsafe_code)]

pub mod decoder;
pub mod generator;
pub mod model;
mod resident;
pub mod sampling;
mod state;
pub mod step_form;

pub use decoder::Decoder;
pub use generator::{Generation, Generator, Run, Sampling, Steps, StopReason};
pub use model::{check_vocabulary, DecodingFile, DecodingModel, LoadedModel, StateWrites};
pub use sampling::SamplingError;
pub use step_form::{fused_twin, StepForm};
