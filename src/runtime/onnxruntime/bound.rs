//! [`StaticSession`] for ONNX Runtime: static-state decoding with every buffer bound once
//! through ort's `IoBinding`. Each state tensor ([batch, n, width], float32) is bound both
//! as its `past_*` input and as its `present_*` output, so that the scatter writing a run's
//! new rows (`ScatterND`, `TensorScatter`) finds its output already holding the rest and
//! copies nothing (its kernels skip the copy when the two buffers are one). On the CPU
//! execution provider the buffers are host tensors; on CUDA they are device memory,
//! written and read through [`CudaMemory`].
//!
//! The session runs the file with two more outputs (step_model.rs): the greedy tokens
//! (`ArgMax` of the logits) and `position + 1`. A single-token step has two sets of
//! `input_ids` [batch, 1] and `position` [batch] buffers used in turn: the step that reads
//! one set writes its greedy tokens and next positions into the other, so that a greedy
//! step finds its inputs already written by the run before it, and only the [batch] ids
//! come back to the host (as onnxruntime-genai samples on the device and advances its
//! positions by a kernel). A sampled token, or any other input, is written over them first.
//! With CUDA graphs (`RuntimeOptions::cuda_graphs`) ONNX Runtime captures each of the two
//! step bindings once (graph ids 0 and 1: a graph replays fixed addresses) after their
//! warm-up runs and replays them, while runs of other lengths (the prompts) run uncaptured
//! (`gpu_graph_id` −1). A step is then one graph replay and one copy of [batch] ids.

use std::ffi::c_void;

use std::path::Path;

use ndarray::{Array2, Array3, ArrayView2};
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, RunOptions, Session};
use ort::value::Tensor;
use ort::AsPointer;

use super::cuda_memory::CudaMemory;
use super::step_model::{step_model, NEXT_INPUT_IDS, NEXT_POSITION};
use super::{failed, ModelSource, OrtRuntime};
use crate::error::{Error, Result};
use crate::gmlp::decoding::POSITION;
use crate::gmlp::emit::{INPUT_IDS, LOGITS};
use crate::runtime::{RuntimeOptions, StaticLayout, StaticSession};
use crate::tensor::{NamedTensor, TensorValue};

/// Where the bound buffers live.
enum Memory {
    /// Host memory (the CPU execution provider).
    Host,
    /// CUDA device memory from the session's allocator, copied through `cuda`.
    Cuda {
        allocator: Allocator,
        cuda: CudaMemory,
    },
}

impl Memory {
    /// A zeroed tensor of `shape` in this memory.
    fn zeros<T: ort::value::PrimitiveTensorElementType + std::fmt::Debug>(
        &self,
        name: &str,
        shape: &[usize],
    ) -> Result<Tensor<T>> {
        let host;
        let allocator = match self {
            Memory::Host => {
                host = Allocator::default();
                &host
            }
            Memory::Cuda { allocator, .. } => allocator,
        };
        let mut t = Tensor::<T>::new(allocator, shape.to_vec()).map_err(|e| failed(name, e))?;
        self.zero(&mut t)?;
        Ok(t)
    }

    /// Sets every element of `t` to zero.
    fn zero<T: ort::value::PrimitiveTensorElementType + std::fmt::Debug>(
        &self,
        t: &mut Tensor<T>,
    ) -> Result<()> {
        let bytes = t.shape().iter().product::<i64>() as usize * std::mem::size_of::<T>();
        let ptr = t.data_ptr_mut();
        match self {
            // SAFETY: the tensor's buffer holds `bytes` bytes.
            Memory::Host => unsafe { std::ptr::write_bytes(ptr.cast::<u8>(), 0, bytes) },
            // SAFETY: a device allocation of `bytes` bytes.
            Memory::Cuda { cuda, .. } => unsafe { cuda.zero(ptr, bytes)? },
        }
        Ok(())
    }

    /// Waits until the writes issued so far have landed (device memory).
    fn synchronize(&self) -> Result<()> {
        match self {
            Memory::Host => Ok(()),
            Memory::Cuda { cuda, .. } => cuda.synchronize(),
        }
    }

    /// Writes `values` over the start of `t` (which holds at least as many); on the
    /// device they have landed after [`Memory::synchronize`].
    fn write<T: ort::value::PrimitiveTensorElementType + std::fmt::Debug + Copy>(
        &self,
        t: &mut Tensor<T>,
        values: &[T],
    ) -> Result<()> {
        let len = t.shape().iter().product::<i64>() as usize;
        if values.len() > len {
            return Err(Error::Internal(format!(
                "{} values for a buffer of {len}",
                values.len()
            )));
        }
        let ptr = t.data_ptr_mut();
        let bytes = std::mem::size_of_val(values);
        match self {
            // SAFETY: checked above that the buffer holds the values.
            Memory::Host => unsafe {
                std::ptr::copy_nonoverlapping(values.as_ptr(), ptr.cast::<T>(), values.len())
            },
            // SAFETY: as above, on the device.
            Memory::Cuda { cuda, .. } => unsafe {
                cuda.to_device(ptr, values.as_ptr().cast::<c_void>(), bytes)?
            },
        }
        Ok(())
    }

    /// Reads `out.len()` elements of `t` from element `offset` on.
    fn read<T: ort::value::PrimitiveTensorElementType + std::fmt::Debug + Copy>(
        &self,
        t: &Tensor<T>,
        offset: usize,
        out: &mut [T],
    ) -> Result<()> {
        let len = t.shape().iter().product::<i64>() as usize;
        if offset + out.len() > len {
            return Err(Error::Internal(format!(
                "elements {offset}..{} of a buffer of {len}",
                offset + out.len()
            )));
        }
        // SAFETY: checked above that the range lies in the buffer.
        let src = unsafe { t.data_ptr().cast::<T>().add(offset) };
        match self {
            // SAFETY: as above.
            Memory::Host => unsafe {
                std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), out.len())
            },
            // SAFETY: as above, from the device.
            Memory::Cuda { cuda, .. } => unsafe {
                cuda.to_host(
                    out.as_mut_ptr().cast::<c_void>(),
                    src.cast::<c_void>(),
                    std::mem::size_of_val(out),
                )?
            },
        }
        Ok(())
    }
}

/// One state tensor, bound as its `past` input and its `present` output.
struct StateBuffer {
    past: String,
    present: String,
    tensor: Tensor<f32>,
}

/// The buffers of a prompt's run of T tokens and the binding that names them.
struct PromptRun {
    ids: Tensor<i64>,
    position: Tensor<i64>,
    logits: Tensor<f32>,
    binding: IoBinding,
    /// T.
    tokens: usize,
}

/// One of a step's two sets of inputs, and what they hold as far as the host knows
/// (`None`: not known, i.e. written by a run and not read back since).
struct StepInputs {
    ids: Tensor<i64>,
    position: Tensor<i64>,
    ids_held: Option<Vec<i64>>,
    positions_held: Option<Vec<i64>>,
}

/// The single-token step (see the module documentation): binding k reads `inputs[k]` and
/// writes the greedy tokens and next positions into `inputs[1 − k]`; both write `logits`.
struct Step {
    inputs: [StepInputs; 2],
    logits: Tensor<f32>,
    bindings: [IoBinding; 2],
    /// Each binding's run options (with CUDA graphs: its graph id).
    options: [RunOptions; 2],
    /// The set of inputs the next step reads (0 or 1).
    turn: usize,
}

/// Which run was last, whose logits are read.
#[derive(Clone, Copy, PartialEq, Eq)]
enum LastRun {
    Nothing,
    Step,
    Prompt,
}

/// ONNX Runtime's static-state session (see the module documentation).
pub(crate) struct BoundStatic {
    /// The loaded step model (its session runs the bindings).
    runtime: OrtRuntime,
    name: &'static str,
    memory: Memory,
    layout: StaticLayout,
    state: Vec<StateBuffer>,
    /// The single-token step's buffers (made on the first step).
    step: Option<Step>,
    /// The last run of another length (a prompt).
    prompt: Option<PromptRun>,
    last: LastRun,
    /// The run options of a prompt (CUDA graphs: uncaptured).
    prompt_options: RunOptions,
    graphs: bool,
}

impl BoundStatic {
    /// Loads the static-state model `path` with its step outputs (step_model.rs) on the
    /// CPU execution provider or on CUDA (with CUDA graphs when `options` ask for them),
    /// with its state buffers for `layout`, zeroed.
    pub(crate) fn open(
        path: &Path,
        cuda: bool,
        options: &RuntimeOptions,
        layout: &StaticLayout,
    ) -> Result<BoundStatic> {
        let bytes = step_model(path)?;
        let runtime = OrtRuntime::load_from(
            ModelSource::Edited {
                path,
                bytes: &bytes,
            },
            cuda,
            options,
        )?;
        drop(bytes);
        BoundStatic::new(runtime, layout)
    }

    fn new(runtime: OrtRuntime, layout: &StaticLayout) -> Result<BoundStatic> {
        let name = runtime.name;
        let graphs = runtime.cuda_graphs;
        let memory = if runtime.cuda {
            let info = MemoryInfo::new(
                AllocationDevice::CUDA,
                0,
                AllocatorType::Device,
                MemoryType::Default,
            )
            .map_err(|e| failed(name, e))?;
            Memory::Cuda {
                allocator: Allocator::new(&runtime.session, info).map_err(|e| failed(name, e))?,
                cuda: CudaMemory::load()?,
            }
        } else {
            Memory::Host
        };
        let state = layout
            .state
            .iter()
            .map(|(past, present, width)| {
                Ok(StateBuffer {
                    past: past.clone(),
                    present: present.clone(),
                    tensor: memory.zeros(name, &[layout.batch, layout.positions, *width])?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let prompt_options = run_options(name, graphs.then_some(-1))?;
        Ok(BoundStatic {
            runtime,
            name,
            memory,
            layout: layout.clone(),
            state,
            step: None,
            prompt: None,
            last: LastRun::Nothing,
            prompt_options,
            graphs,
        })
    }

    /// A binding with the state bound in place (past and present one buffer each).
    fn state_binding(&mut self) -> Result<IoBinding> {
        let name = self.name;
        let bind = |e| failed(name, e);
        let mut binding = self.runtime.session.create_binding().map_err(bind)?;
        for s in &self.state {
            binding
                .bind_input(s.past.as_str(), &s.tensor)
                .map_err(bind)?;
        }
        for s in &mut self.state {
            binding
                .bind_output(s.present.as_str(), &mut s.tensor)
                .map_err(bind)?;
        }
        Ok(binding)
    }

    /// Buffers and a binding for a prompt of `tokens` tokens.
    fn prompt_run(&mut self, tokens: usize) -> Result<PromptRun> {
        let (name, b, v) = (self.name, self.layout.batch, self.layout.vocab);
        let bind = |e| failed(name, e);
        let ids = self.memory.zeros::<i64>(name, &[b, tokens])?;
        let position = self.memory.zeros::<i64>(name, &[b])?;
        let mut logits = self.memory.zeros::<f32>(name, &[b, tokens, v])?;
        let mut binding = self.state_binding()?;
        binding.bind_input(INPUT_IDS, &ids).map_err(bind)?;
        binding.bind_input(POSITION, &position).map_err(bind)?;
        binding.bind_output(LOGITS, &mut logits).map_err(bind)?;
        Ok(PromptRun {
            ids,
            position,
            logits,
            binding,
            tokens,
        })
    }

    /// The step's two sets of inputs, its logits and its two bindings.
    fn step_buffers(&mut self) -> Result<Step> {
        let (name, b, v) = (self.name, self.layout.batch, self.layout.vocab);
        let bind = |e| failed(name, e);
        let inputs = |memory: &Memory| -> Result<StepInputs> {
            Ok(StepInputs {
                ids: memory.zeros::<i64>(name, &[b, 1])?,
                position: memory.zeros::<i64>(name, &[b])?,
                ids_held: None,
                positions_held: None,
            })
        };
        let mut sets = [inputs(&self.memory)?, inputs(&self.memory)?];
        let mut logits = self.memory.zeros::<f32>(name, &[b, 1, v])?;
        let mut bindings = Vec::with_capacity(2);
        for k in 0..2 {
            let mut binding = self.state_binding()?;
            let (read, written) = match &mut sets {
                [first, second] if k == 0 => (&*first, second),
                [first, second] => (&*second, first),
            };
            binding.bind_input(INPUT_IDS, &read.ids).map_err(bind)?;
            binding.bind_input(POSITION, &read.position).map_err(bind)?;
            binding.bind_output(LOGITS, &mut logits).map_err(bind)?;
            binding
                .bind_output(NEXT_INPUT_IDS, &mut written.ids)
                .map_err(bind)?;
            binding
                .bind_output(NEXT_POSITION, &mut written.position)
                .map_err(bind)?;
            bindings.push(binding);
        }
        let [first, second]: [IoBinding; 2] = bindings
            .try_into()
            .map_err(|_| Error::Internal("two step bindings".into()))?;
        let graph = |k: i64| run_options(name, self.graphs.then_some(k));
        Ok(Step {
            inputs: sets,
            logits,
            bindings: [first, second],
            options: [graph(0)?, graph(1)?],
            turn: 0,
        })
    }

    /// A single-token step of `ids` [batch] at `positions`: what its inputs do not already
    /// hold is written, then its binding runs.
    fn run_step(&mut self, ids: Vec<i64>, positions: &[i64]) -> Result<()> {
        if self.step.is_none() {
            self.step = Some(self.step_buffers()?);
        }
        let step = self
            .step
            .as_mut()
            .ok_or_else(|| Error::Internal("step buffers missing".into()))?;
        let k = step.turn;
        let [first, second] = &mut step.inputs;
        let (read, written) = if k == 0 {
            (first, second)
        } else {
            (second, first)
        };
        let mut wrote = false;
        if read.ids_held.as_ref() != Some(&ids) {
            read.ids_held = None;
            self.memory.write(&mut read.ids, &ids)?;
            read.ids_held = Some(ids);
            wrote = true;
        }
        if read.positions_held.as_deref() != Some(positions) {
            read.positions_held = None;
            self.memory.write(&mut read.position, positions)?;
            read.positions_held = Some(positions.to_vec());
            wrote = true;
        }
        if wrote {
            self.memory.synchronize()?;
        }
        written.ids_held = None;
        written.positions_held = None;
        self.last = LastRun::Nothing;
        run_bound(
            self.name,
            &mut self.runtime.session,
            &step.bindings[k],
            &step.options[k],
        )?;
        written.positions_held = Some(positions.iter().map(|p| p + 1).collect());
        step.turn = 1 - k;
        self.last = LastRun::Step;
        Ok(())
    }

    /// A prompt's run of `ids` [batch, T] at `positions`.
    fn run_prompt(&mut self, ids: &[i64], tokens: usize, positions: &[i64]) -> Result<()> {
        if self.prompt.as_ref().is_none_or(|p| p.tokens != tokens) {
            self.prompt = None;
            self.prompt = Some(self.prompt_run(tokens)?);
        }
        let prompt = self
            .prompt
            .as_mut()
            .ok_or_else(|| Error::Internal("prompt buffers missing".into()))?;
        self.memory.write(&mut prompt.ids, ids)?;
        self.memory.write(&mut prompt.position, positions)?;
        self.memory.synchronize()?;
        self.last = LastRun::Nothing;
        run_bound(
            self.name,
            &mut self.runtime.session,
            &prompt.binding,
            &self.prompt_options,
        )?;
        self.last = LastRun::Prompt;
        Ok(())
    }

    /// The logits buffer of the last run and its T.
    fn last_logits(&self) -> Result<(&Tensor<f32>, usize)> {
        match (self.last, &self.step, &self.prompt) {
            (LastRun::Step, Some(step), _) => Ok((&step.logits, 1)),
            (LastRun::Prompt, _, Some(prompt)) => Ok((&prompt.logits, prompt.tokens)),
            _ => Err(Error::Internal("logits read before any run".into())),
        }
    }
}

/// Run options with the CUDA graph id `graph` (−1: run uncaptured), if any.
fn run_options(name: &str, graph: Option<i64>) -> Result<RunOptions> {
    let mut options = RunOptions::new().map_err(|e| failed(name, e))?;
    if let Some(id) = graph {
        options
            .set("gpu_graph_id", id.to_string())
            .map_err(|e| failed(name, e))?;
    }
    Ok(options)
}

/// Runs `binding` on `session`. ort's `run_binding` also asks ONNX Runtime for every bound
/// output back and wraps each in a new value, every run; the buffers are ours already, so
/// this calls `RunWithBinding` alone.
fn run_bound(
    name: &str,
    session: &mut Session,
    binding: &IoBinding,
    options: &RunOptions,
) -> Result<()> {
    // SAFETY: the three pointers are live objects owned by the arguments for the whole
    // call; `&mut Session` keeps the (not thread-safe) run exclusive.
    let status = unsafe {
        (ort::api().RunWithBinding)(session.ptr().cast_mut(), options.ptr(), binding.ptr())
    };
    // SAFETY: a status returned by the call above, owned here.
    unsafe { ort::Error::result_from_status(status) }.map_err(|e| failed(name, e))
}

impl StaticSession for BoundStatic {
    fn name(&self) -> &str {
        self.name
    }

    fn note(&self) -> Option<String> {
        self.graphs.then(|| {
            format!(
                "state, ids, positions and logits on the device; each step of {} sequences replays a CUDA graph that also picks the greedy tokens",
                self.layout.batch
            )
        })
    }

    fn run(&mut self, ids: ArrayView2<i64>, positions: &[i64]) -> Result<()> {
        let (b, t) = ids.dim();
        if b != self.layout.batch || positions.len() != b {
            return Err(Error::Internal(format!(
                "a run of {b} sequences ({} positions) in a session of {}",
                positions.len(),
                self.layout.batch
            )));
        }
        let ids: Vec<i64> = ids.iter().copied().collect();
        if t == 1 {
            self.run_step(ids, positions)
        } else {
            self.run_prompt(&ids, t, positions)
        }
    }

    fn logits(&mut self) -> Result<Array3<f32>> {
        let (logits, t) = self.last_logits()?;
        let (b, v) = (self.layout.batch, self.layout.vocab);
        let mut out = Array3::zeros((b, t, v));
        let slice = out
            .as_slice_mut()
            .ok_or_else(|| Error::Internal("logits not contiguous".into()))?;
        self.memory.read(logits, 0, slice)?;
        Ok(out)
    }

    fn logits_at(&mut self, rows: &[usize]) -> Result<Array2<f32>> {
        let (logits, t) = self.last_logits()?;
        let (b, v) = (self.layout.batch, self.layout.vocab);
        if rows.len() != b || rows.iter().any(|&r| r >= t) {
            return Err(Error::Internal(format!(
                "rows {rows:?} of a run of {t} tokens"
            )));
        }
        let mut out = Array2::zeros((b, v));
        for (k, (mut row, &r)) in out.outer_iter_mut().zip(rows).enumerate() {
            let slice = row
                .as_slice_mut()
                .ok_or_else(|| Error::Internal("logits not contiguous".into()))?;
            self.memory.read(logits, (k * t + r) * v, slice)?;
        }
        Ok(out)
    }

    fn greedy(&mut self) -> Result<Option<Vec<i64>>> {
        let (LastRun::Step, Some(step)) = (self.last, self.step.as_mut()) else {
            return Ok(None);
        };
        let next = &mut step.inputs[step.turn];
        if let Some(ids) = &next.ids_held {
            return Ok(Some(ids.clone()));
        }
        let mut ids = vec![0i64; self.layout.batch];
        self.memory.read(&next.ids, 0, &mut ids)?;
        next.ids_held = Some(ids.clone());
        Ok(Some(ids))
    }

    fn state(&mut self) -> Result<Vec<NamedTensor>> {
        let (b, n) = (self.layout.batch, self.layout.positions);
        self.state
            .iter()
            .zip(&self.layout.state)
            .map(|(s, (_, _, width))| {
                let mut out = ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&[b, n, *width]));
                let slice = out
                    .as_slice_mut()
                    .ok_or_else(|| Error::Internal("state not contiguous".into()))?;
                self.memory.read(&s.tensor, 0, slice)?;
                Ok(NamedTensor {
                    name: s.past.clone(),
                    value: TensorValue::F32(out),
                })
            })
            .collect()
    }

    fn reset(&mut self) -> Result<()> {
        for s in &mut self.state {
            self.memory.zero(&mut s.tensor)?;
        }
        Ok(())
    }
}
