//! The engine layer: runtimes that execute an ONNX file, tract (CPU) and ONNX Runtime
//! through `ort` (CPU or CUDA execution provider). [`open`] gives a [`Runtime`], the trait
//! every engine implements (runs, runs into owned arrays, runs carrying values from one run
//! to the next); [`open_bound`] a [`BoundSession`] where the engine binds buffers to a
//! session (ONNX Runtime): named buffers bound once as inputs and outputs, runs (replayed as
//! CUDA graphs where asked) and reads of a buffer. [`discovery`] says where ONNX Runtime's
//! library comes from, and [`RuntimeOptions`] holds each engine's settings. It knows no
//! model (a caller names every tensor) and nothing of the decoding layer above it
//! (src/generation/, which `tests/suite/layers.rs` keeps out of here).
//!
//! No `unsafe` here but in ONNX Runtime's buffer module (onnxruntime/buffer.rs), which
//! checks each raw access's preconditions.
#![deny(unsafe_code)]

use std::path::Path;

use clap::ValueEnum;

use crate::error::{Error, Result};
use crate::onnx::proto::ModelProto;
use crate::onnx::reader::read_model;
use crate::spelling::spelling;
use crate::tensor::{NamedTensor, TensorValue};

mod binding;
pub mod discovery;
pub mod onnxruntime;
#[cfg(test)]
pub(crate) mod testing;
pub mod tract;

pub use binding::{BindingId, BoundSession, BufferId, Element, Replay};

/// Which runtime to use (`--runtimes`, `--runtime`, `--compare`; each variant's first doc
/// paragraph is its `--help` line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, ValueEnum)]
pub enum RuntimeKind {
    /// tract, pure Rust, CPU.
    Tract,
    /// ONNX Runtime, CPU execution provider.
    #[value(alias = "ort")]
    OrtCpu,
    /// ONNX Runtime, CUDA execution provider (no silent CPU fallback).
    OrtCuda,
}

impl RuntimeKind {
    /// The name used on the command line and in reports.
    pub fn name(self) -> String {
        spelling(&self)
    }

    /// Whether the runtime binds buffers to a session ([`open_bound`]: ONNX Runtime);
    /// otherwise every run takes and returns values ([`Runtime::run`],
    /// [`Runtime::run_carrying`]).
    pub fn binds_buffers(self) -> bool {
        match self {
            RuntimeKind::Tract => false,
            RuntimeKind::OrtCpu | RuntimeKind::OrtCuda => true,
        }
    }
}

/// How runtimes open a file, one group per engine: a command that runs several runtimes
/// (`validate --runtimes tract,ort-cpu,ort-cuda`) gives each the group it reads.
#[derive(Clone, Debug, Default)]
pub struct RuntimeOptions {
    /// tract's settings.
    pub tract: TractOptions,
    /// ONNX Runtime's settings, on either execution provider.
    pub ort: OrtOptions,
    /// The CUDA execution provider's settings (ort-cuda).
    pub cuda: CudaOptions,
}

/// tract's settings.
#[derive(Clone, Debug, Default)]
pub struct TractOptions {
    /// Run `MatMulNBits` nodes tract cannot read (8-bit codes) as `MatMul`s on the weights
    /// dequantized from the file ([`crate::onnx::dequantize`]), saying so in
    /// [`Runtime::note`]; off: such a file fails to load.
    pub dequantize_nbits: bool,
    /// Threads of tract's matrix products (tract-linalg's pool); 0 or 1: the calling
    /// thread alone. Each output tile is computed as on one thread, so the results are
    /// the same whatever the count.
    pub threads: usize,
}

/// ONNX Runtime's settings, on either execution provider.
#[derive(Clone, Debug, Default)]
pub struct OrtOptions {
    /// Path of `libonnxruntime.so`; otherwise found as [`onnxruntime::find_library`] says.
    pub library: Option<std::path::PathBuf>,
    /// Intra-op threads (0 = its default).
    pub threads: usize,
    /// Enable profiling with this file prefix, so that [`Runtime::placement`] can report
    /// where each node ran.
    pub profile_prefix: Option<std::path::PathBuf>,
}

/// The CUDA execution provider's settings.
#[derive(Clone, Debug, Default)]
pub struct CudaOptions {
    /// The CUDA device to run on (`--device`; 0, the first, by default).
    pub device: i32,
    /// Allow TF32 math (off by default for parity).
    pub tf32: bool,
    /// Refuse a session whose graph cannot be placed entirely on the CUDA execution
    /// provider (ONNX Runtime's `session.disable_cpu_ep_fallback`).
    pub no_cpu_fallback: bool,
    /// Enable ONNX Runtime's CUDA graphs (`enable_cuda_graph`), for a session whose every
    /// run goes through buffers bound on the device ([`BoundSession`]); the session then
    /// refuses a graph with any node outside the CUDA execution provider.
    pub graphs: bool,
}

/// Number of graph nodes that ran on each execution provider, by provider name.
pub type Placement = std::collections::BTreeMap<String, usize>;

/// A loaded model that can be run repeatedly.
pub trait Runtime: Send {
    /// Runtime name for reports (`tract`, `ort-cpu`, `ort-cuda`).
    fn name(&self) -> &str;
    /// Runs the model; inputs are matched by name, outputs come back in graph order.
    fn run(&mut self, inputs: &[NamedTensor]) -> Result<Vec<NamedTensor>>;
    /// [`Runtime::run`] into `outputs`, which hold the run's outputs in graph order after
    /// it. Arrays already there with an output's name, element type and shape (those of an
    /// earlier run with inputs of the same shapes) are written over instead of allocated:
    /// ONNX Runtime on the CPU binds them as its outputs, so the run writes its results
    /// straight into them; tract and ONNX Runtime on CUDA copy into them. Repeated runs of
    /// one shape thus allocate nothing and copy no more than the runtime must. This
    /// default replaces them with [`Runtime::run`]'s. On error `outputs` may hold partly
    /// written values.
    fn run_into(&mut self, inputs: &[NamedTensor], outputs: &mut Vec<NamedTensor>) -> Result<()> {
        *outputs = self.run(inputs)?;
        Ok(())
    }
    /// `inputs` made ready to run repeatedly on the runtime's device with no transfer to or
    /// from the host: copied to the device once, the outputs bound to device memory and
    /// left there (`validate --bench`'s device-resident latency). `None` for a runtime
    /// whose outputs are host memory anyway (tract, ONNX Runtime's CPU provider).
    fn on_device<'a>(
        &'a mut self,
        _inputs: &[NamedTensor],
    ) -> Result<Option<Box<dyn DeviceRun + 'a>>> {
        Ok(None)
    }
    /// Ends profiling and returns how many nodes ran on each execution provider during
    /// the runs so far; `None` when the runtime has no such notion or profiling is off.
    /// Later runs are not profiled.
    fn placement(&mut self) -> Result<Option<Placement>> {
        Ok(None)
    }
    /// What the runtime did differently from running the file as it is (e.g. tract's
    /// dequantized 8-bit `MatMulNBits`), for reports; `None` when nothing.
    fn note(&self) -> Option<String> {
        None
    }
    /// One run carrying values to the next: `inputs` plus the values held in `state`,
    /// matched by name. Each output named as the `output` of a pair in `carry` is not
    /// returned: it becomes `state`'s value under the pair's `input` name, fed by the next
    /// call; the other outputs come back in graph order. On error `state` is unchanged,
    /// but for tract's values after a run that got past its input shapes: tract writes a
    /// static state's rows into the tensor it was given, so such a run spends its state
    /// ([`StateValue::Spent`]) and the next one is refused.
    /// ONNX Runtime and tract keep the carried values as their own (on the device for
    /// ort-cuda: no copy between runs); this default carries them as host arrays through
    /// [`Runtime::run`].
    fn run_carrying(
        &mut self,
        inputs: &[NamedTensor],
        state: &mut CarriedState,
        carry: &[Carry],
    ) -> Result<Vec<NamedTensor>> {
        let name = self.name().to_string();
        carry_on_host(&name, inputs, state, carry, |feed| self.run(feed))
    }
}

/// [`Runtime::run_carrying`] through host arrays: the held values move into the run's
/// inputs (ONNX Runtime's own values copied to the host first) and come back on error.
fn carry_on_host(
    runtime: &str,
    inputs: &[NamedTensor],
    state: &mut CarriedState,
    carry: &[Carry],
    run: impl FnOnce(&[NamedTensor]) -> Result<Vec<NamedTensor>>,
) -> Result<Vec<NamedTensor>> {
    for (_, value) in &mut state.values {
        if !matches!(value, StateValue::Host(_)) {
            *value = StateValue::Host(value.to_host()?);
        }
    }
    let mut feed = inputs.to_vec();
    let given = feed.len();
    feed.extend(std::mem::take(&mut state.values).into_iter().filter_map(
        |(name, value)| match value {
            StateValue::Host(value) => Some(NamedTensor { name, value }),
            StateValue::Ort(_) | StateValue::Tract(_) | StateValue::Spent => None,
        },
    ));
    let split = run(&feed).and_then(|outputs| split_carried(runtime, outputs, carry));
    match split {
        Ok((kept, rest)) => {
            if !carry.is_empty() {
                state.values = kept;
            }
            Ok(rest)
        }
        Err(e) => {
            // The state is unchanged: the values fed go back.
            state.values = feed
                .split_off(given)
                .into_iter()
                .map(|t| (t.name, StateValue::Host(t.value)))
                .collect();
            Err(e)
        }
    }
}

/// Splits a run's `outputs` into the carried ones (as host values under their input
/// names, in `carry` order) and the rest (in their order).
fn split_carried(
    runtime: &str,
    outputs: Vec<NamedTensor>,
    carry: &[Carry],
) -> Result<(StateValues, Vec<NamedTensor>)> {
    let mut rest = outputs;
    let mut kept = Vec::with_capacity(carry.len());
    for pair in carry {
        let k = rest
            .iter()
            .position(|o| o.name == pair.output)
            .ok_or_else(|| missing_output(runtime, &pair.output))?;
        kept.push((pair.input.clone(), StateValue::Host(rest.remove(k).value)));
    }
    Ok((kept, rest))
}

/// One value a run carries to the next ([`Runtime::run_carrying`]): the output `output`,
/// fed back as the input `input`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Carry {
    /// The input the value is fed as.
    pub input: String,
    /// The output it comes from.
    pub output: String,
}

/// What a session is made from.
#[derive(Clone, Copy)]
pub enum ModelSource<'a> {
    /// The file as it is.
    File(&'a Path),
    /// `bytes`, an edited copy of the file `path` (its external data, if any, is still
    /// read from beside `path`).
    Edited {
        /// The file edited.
        path: &'a Path,
        /// The edited model, encoded.
        bytes: &'a [u8],
    },
}

/// An ONNX file as runtimes open it: its path, and the model the tool decoded from it if
/// it has (then no runtime decodes the file again: a command decodes each file once).
#[derive(Clone, Copy)]
pub struct ModelFile<'a> {
    /// The file (external data files are beside it).
    pub path: &'a Path,
    /// The decoded model, when the caller has it.
    pub decoded: Option<&'a ModelProto>,
}

impl<'a> ModelFile<'a> {
    /// `path` with its decoded model.
    pub fn decoded(path: &'a Path, model: &'a ModelProto) -> ModelFile<'a> {
        ModelFile {
            path,
            decoded: Some(model),
        }
    }

    /// `f` of this file with its decoded model: the caller's, or the file decoded now (once,
    /// for everything `f` does with it).
    pub fn with_decoded<T>(self, f: impl FnOnce(ModelFile) -> Result<T>) -> Result<T> {
        match self.decoded {
            Some(_) => f(self),
            None => {
                let model = read_model(self.path)?;
                f(ModelFile::decoded(self.path, &model))
            }
        }
    }

    /// The decoded model: the caller's, or the file decoded now.
    pub fn model(&self) -> Result<std::borrow::Cow<'a, ModelProto>> {
        Ok(match self.decoded {
            Some(model) => std::borrow::Cow::Borrowed(model),
            None => std::borrow::Cow::Owned(read_model(self.path)?),
        })
    }
}

impl<'a, P: AsRef<Path> + ?Sized> From<&'a P> for ModelFile<'a> {
    /// A file not decoded yet.
    fn from(path: &'a P) -> ModelFile<'a> {
        ModelFile {
            path: path.as_ref(),
            decoded: None,
        }
    }
}

/// Runs of fixed inputs kept on a runtime's device ([`Runtime::on_device`]).
pub trait DeviceRun {
    /// One run, its outputs left in device memory; returns when the device has finished it.
    fn run(&mut self) -> Result<()>;
}

/// One value a [`CarriedState`] holds.
pub enum StateValue {
    /// A host array (the empty state of a prompt).
    Host(TensorValue),
    /// An ONNX Runtime output value, fed back to the session that made it as it is.
    Ort(onnxruntime::OrtValue),
    /// A tract output value, fed back to the plan that made it as it is.
    Tract(tract::TractValue),
    /// A tract value moved into a run that then failed (a run writes a static state's rows
    /// into the tensor it was given): nothing left to feed.
    Spent,
}

impl StateValue {
    /// A host copy of the value.
    fn to_host(&self) -> Result<TensorValue> {
        match self {
            StateValue::Host(t) => Ok(t.clone()),
            StateValue::Ort(v) => v.to_host(),
            StateValue::Tract(v) => v.to_host(),
            StateValue::Spent => Err(Error::RuntimeFailed {
                runtime: "tract".into(),
                reason: "a state spent by a run that failed".into(),
            }),
        }
    }
}

/// (input name, value) pairs of a [`CarriedState`].
pub type StateValues = Vec<(String, StateValue)>;

/// The `past_*` values a decoding run feeds next, by input name, in the form the
/// runtime produced them (see [`Runtime::run_carrying`]).
#[derive(Default)]
pub struct CarriedState {
    /// (input name, value) in model order.
    pub values: StateValues,
}

impl CarriedState {
    /// A state of host arrays (e.g. the empty `[batch, 0, width]` past of a prompt).
    pub fn host(tensors: Vec<NamedTensor>) -> CarriedState {
        CarriedState {
            values: tensors
                .into_iter()
                .map(|t| (t.name, StateValue::Host(t.value)))
                .collect(),
        }
    }

    /// Copies every value to the host (for comparisons and reports).
    pub fn to_host(&self) -> Result<Vec<NamedTensor>> {
        self.values
            .iter()
            .map(|(name, v)| {
                Ok(NamedTensor {
                    name: name.clone(),
                    value: v.to_host()?,
                })
            })
            .collect()
    }
}

/// The error for a model that did not return a state output it declares, on `runtime`.
pub fn missing_output(runtime: &str, name: &str) -> Error {
    Error::RuntimeFailed {
        runtime: runtime.into(),
        reason: format!("the model returned no output {name}"),
    }
}

/// Loads `source` in the runtime `kind` as a [`BoundSession`], where the runtime binds
/// buffers ([`RuntimeKind::binds_buffers`]: ONNX Runtime); tract refuses.
pub fn open_bound(
    kind: RuntimeKind,
    source: ModelSource,
    options: &RuntimeOptions,
) -> Result<Box<dyn BoundSession>> {
    Ok(Box::new(onnxruntime::OrtBound::open(
        source,
        provider(kind, options)?,
        options,
    )?))
}

/// ONNX Runtime's provider for `kind`, which is one of its runtimes.
fn provider(kind: RuntimeKind, options: &RuntimeOptions) -> Result<onnxruntime::Provider> {
    onnxruntime::Provider::of(kind, options)
        .ok_or_else(|| Error::Internal(format!("{} is not ONNX Runtime", kind.name())))
}

/// Loads `model` in the runtime `kind`.
pub fn open<'a>(
    kind: RuntimeKind,
    model: impl Into<ModelFile<'a>>,
    options: &RuntimeOptions,
) -> Result<Box<dyn Runtime>> {
    let model = model.into();
    match kind {
        RuntimeKind::Tract => Ok(Box::new(tract::TractRuntime::load_file_with(
            model,
            &options.tract,
        )?)),
        RuntimeKind::OrtCpu | RuntimeKind::OrtCuda => Ok(Box::new(onnxruntime::OrtRuntime::load(
            model.path,
            provider(kind, options)?,
            options,
        )?)),
    }
}
