//! The engine layer: runtimes that execute an ONNX file, tract (CPU) and ONNX Runtime
//! through `ort` (CPU or CUDA execution provider). [`open`] gives a [`Runtime`], the trait
//! every engine implements (runs, runs into owned arrays, runs carrying a state);
//! [`open_static`] a [`StaticSession`] where the engine binds a static state (ONNX
//! Runtime); [`discovery`] says where ONNX Runtime's library comes from, and
//! [`RuntimeOptions`] holds each engine's settings. It knows no model's tensor names (a
//! caller passes them, as [`StaticLayout`]) and nothing of the decoding layer above it
//! (src/generation/, which `tests/suite/layers.rs` keeps out of here).
//!
//! No `unsafe` here but in ONNX Runtime's buffer module (onnxruntime/buffer.rs), which
//! checks each raw access's preconditions.
#![deny(unsafe_code)]

use std::path::Path;

use clap::ValueEnum;
use ndarray::{Array2, Array3, ArrayView2};

use crate::error::{Error, Result};
use crate::gmlp::decoding::StateTensor;
use crate::onnx::proto::ModelProto;
use crate::onnx::reader::read_model;
use crate::spelling::spelling;
use crate::tensor::{NamedTensor, TensorValue};

pub mod discovery;
pub mod onnxruntime;
#[cfg(test)]
pub(crate) mod testing;
pub mod tract;

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

    /// Whether the runtime keeps a static-state model's state in buffers bound to its
    /// session ([`StaticSession`]); otherwise the state is carried
    /// ([`Runtime::run_carrying`]).
    pub fn binds_static_state(self) -> bool {
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
    /// run goes through buffers bound on the device ([`StaticSession`]); the session then
    /// refuses a graph with any node outside the CUDA execution provider.
    pub graphs: bool,
}

/// Number of graph nodes that ran on each execution provider, by provider name.
pub type Placement = std::collections::BTreeMap<String, usize>;

/// A loaded model that can be run repeatedly.
pub trait Runtime {
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
    /// Whether the runtime keeps a carried state in values of its own
    /// ([`Runtime::run_carrying`]: ONNX Runtime's output values, fed back without a copy);
    /// otherwise a caller carries the state as host arrays through [`Runtime::run`].
    fn carries_own_values(&self) -> bool {
        false
    }
    /// One run of a model with state, where [`Runtime::carries_own_values`]: `inputs` plus
    /// the values held in `state`, matched by name. Each output named as the `present` of
    /// a tensor in `carry` is not returned: it becomes `state`'s value under its `past`
    /// name, in the runtime's own form, fed by the next call. On error `state` is
    /// unchanged. This default refuses (a runtime without values of its own).
    fn run_carrying(
        &mut self,
        _inputs: &[NamedTensor],
        _state: &mut CarriedState,
        _carry: &[StateTensor],
    ) -> Result<Vec<NamedTensor>> {
        Err(Error::Internal(format!(
            "{} keeps no values of its own to carry a state in",
            self.name()
        )))
    }
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

/// What a static-state session needs to know of the model.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StaticLayout {
    /// Sequences decoded at once.
    pub batch: usize,
    /// Positions n: every state tensor is [batch, n, width].
    pub positions: usize,
    /// Vocabulary size (the last axis of `logits`).
    pub vocab: usize,
    /// Every state tensor (its past input, present output and width), in model order.
    pub state: Vec<StateTensor>,
    /// The names of a run's other inputs and its output, which the model's decoding
    /// description gives (the engine knows no model's names).
    pub names: StepNames,
}

/// The names of a static-state run's inputs and output besides its state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepNames {
    /// The token ids, [batch, T], int64.
    pub ids: &'static str,
    /// Each sequence's position, \[batch\], int64.
    pub position: &'static str,
    /// The logits, [batch, T, vocab], float32.
    pub logits: &'static str,
}

/// [`open_static`]'s answer.
pub enum Bound {
    /// The runtime as a static-state session.
    Static(Box<dyn StaticSession>),
    /// The runtime, which has no static-state session.
    Unbound(Box<dyn Runtime>),
}

/// A static-state model (docs/static-state.md) whose state lives in buffers bound once to
/// the session, both as each `past_*` input and as its `present_*` output, so that a run
/// writes only its new rows and copies nothing; a step's ids, positions and logits have
/// buffers of their own, bound once too (ONNX Runtime's I/O binding, on the host or the
/// CUDA device, where a step may be captured as a CUDA graph and replayed).
pub trait StaticSession {
    /// Runtime name for reports.
    fn name(&self) -> &str;
    /// What the session does beyond running the file as it is (e.g. CUDA graphs), for
    /// reports; `None` when nothing.
    fn note(&self) -> Option<String>;
    /// Runs `ids` [batch, T] at each sequence's `positions` \[batch\] (checked by the
    /// caller: within the vocabulary, P + T ≤ n), writing the T new rows of every state
    /// tensor in place and keeping the logits where the runtime put them. If a run fails,
    /// rows after the sequences' positions may have been written; no run reads a row
    /// before writing it, so the state stays valid for the positions fed so far.
    fn run(&mut self, ids: ArrayView2<i64>, positions: &[i64]) -> Result<()>;
    /// The last run's logits [batch, T, vocab], copied to the host.
    fn logits(&mut self) -> Result<Array3<f32>>;
    /// The last run's logits at row `rows[b]` of each sequence b, [batch, vocab] (one
    /// copy of those rows only).
    fn logits_at(&mut self, rows: &[usize]) -> Result<Array2<f32>>;
    /// The argmax of the last run's logits at its last row, per sequence, computed by the
    /// run itself where the logits are (an `ArgMax` in the session's graph, on the CUDA
    /// device for ort-cuda, so that only \[batch\] ids come back); `None` when the last run
    /// was not a single step (the caller then picks from [`StaticSession::logits_at`]).
    fn greedy(&mut self) -> Result<Option<Vec<i64>>>;
    /// A host copy of every state tensor, by `past_*` name, in model order.
    fn state(&mut self) -> Result<Vec<NamedTensor>>;
    /// Sets the state to zeros (a new set of sequences).
    fn reset(&mut self) -> Result<()>;
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
}

impl StateValue {
    /// A host copy of the value.
    fn to_host(&self) -> Result<TensorValue> {
        match self {
            StateValue::Host(t) => Ok(t.clone()),
            StateValue::Ort(v) => v.to_host(),
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

/// Loads the static-state model `model` (whose graph writes each `present_*` output by a
/// scatter that is its `past_*` input's only reader; the caller checks this) in the
/// runtime `kind` as a [`StaticSession`] laid out as `layout` where the runtime has one
/// (ONNX Runtime), else as it is (tract: its caller then carries the state as host
/// arrays). The one road to a static-state session.
pub fn open_static<'a>(
    kind: RuntimeKind,
    model: impl Into<ModelFile<'a>>,
    options: &RuntimeOptions,
    layout: &StaticLayout,
) -> Result<Bound> {
    let model = model.into();
    if !kind.binds_static_state() {
        return Ok(Bound::Unbound(open(kind, model, options)?));
    }
    Ok(Bound::Static(onnxruntime::open_static(
        model,
        provider(kind, options)?,
        options,
        layout,
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
        RuntimeKind::Tract => Ok(Box::new(tract::TractRuntime::load_file(
            model,
            options.tract.dequantize_nbits,
        )?)),
        RuntimeKind::OrtCpu | RuntimeKind::OrtCuda => Ok(Box::new(onnxruntime::OrtRuntime::load(
            model.path,
            provider(kind, options)?,
            options,
        )?)),
    }
}
