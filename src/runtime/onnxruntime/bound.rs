//! [`StaticSession`] for ONNX Runtime: static-state decoding with every buffer bound once
//! through ort's `IoBinding`. Each state tensor ([batch, n, width], float32) is bound both
//! as its `past_*` input and as its `present_*` output, so that the scatter writing a run's
//! new rows (`ScatterND`, `TensorScatter`) finds its output already holding the rest and
//! copies nothing (its kernels skip the copy when the two buffers are one); a step's
//! `input_ids` [batch, 1], `position` [batch] and `logits` [batch, 1, vocab] have buffers
//! bound once too. On the CPU execution provider these are host tensors; on CUDA they are
//! device memory, written and read through [`CudaMemory`], so that a step moves only its
//! ids and positions to the device and what is read back to the host; with CUDA graphs
//! (`RuntimeOptions::cuda_graphs`) ONNX Runtime captures a step once (graph id = the
//! batch size, after its warm-up runs) and replays it, while runs of other lengths (the
//! prompts) run uncaptured (`gpu_graph_id` −1). Greedy tokens are then picked by a second,
//! one-node session (`ArgMax`) reading the step's logits on the device, in the spirit of
//! onnxruntime-genai's device-side sampling: only [batch] ids come back.

use std::ffi::c_void;

use ndarray::{Array2, Array3, ArrayView2};
use ort::memory::{AllocationDevice, Allocator, AllocatorType, MemoryInfo, MemoryType};
use ort::session::{IoBinding, RunOptions, Session};
use ort::value::Tensor;
use ort::AsPointer;

use super::cuda_memory::CudaMemory;
use super::{cuda_session_from_memory, failed, OrtRuntime};
use crate::error::{Error, Result};
use crate::gmlp::decoding::POSITION;
use crate::gmlp::emit::{INPUT_IDS, LOGITS};
use crate::onnx::builder::GraphBuilder;
use crate::onnx::graph::{Dim, ElemType};
use crate::onnx::writer::{encode_model_to_vec, ModelInfo};
use crate::runtime::{StaticLayout, StaticSession};
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

/// The buffers of a run of T tokens and the binding that names them.
struct RunBuffers {
    ids: Tensor<i64>,
    position: Tensor<i64>,
    logits: Tensor<f32>,
    binding: IoBinding,
    /// T.
    tokens: usize,
}

/// The one-node `ArgMax` session of greedy steps on the device (captured as a CUDA graph
/// too), reading the step's logits and writing the step's `input_ids` buffer, so that the
/// next step finds its ids already there.
struct DeviceArgmax {
    session: Session,
    binding: IoBinding,
    options: RunOptions,
}

/// ONNX Runtime's static-state session (see the module documentation).
pub(crate) struct BoundStatic {
    /// The loaded model (its session runs the bindings).
    runtime: OrtRuntime,
    name: &'static str,
    memory: Memory,
    layout: StaticLayout,
    state: Vec<StateBuffer>,
    /// The single-token step's buffers (made on the first step).
    step: Option<RunBuffers>,
    /// The last run of another length (a prompt), whose logits are read after it.
    prompt: Option<RunBuffers>,
    /// Whether the last run was a step.
    last_was_step: bool,
    /// The ids the device `ArgMax` wrote into the step's `input_ids` buffer last, if
    /// nothing has written it since (a step with these ids skips its copy).
    ids_on_device: Option<Vec<i64>>,
    /// The run options of a step and of a prompt (CUDA graphs: the graph ids).
    step_options: RunOptions,
    prompt_options: RunOptions,
    graphs: bool,
    argmax: Option<DeviceArgmax>,
}

impl BoundStatic {
    /// The session of `runtime` (on CUDA for ort-cuda, with CUDA graphs when it was
    /// loaded with them) with its state buffers for `layout`, zeroed.
    pub(crate) fn new(runtime: OrtRuntime, layout: &StaticLayout) -> Result<BoundStatic> {
        let name = runtime.name;
        let graphs = runtime.cuda_graphs;
        let session = &runtime.session;
        let memory = if name == "ort-cuda" {
            let info = MemoryInfo::new(
                AllocationDevice::CUDA,
                0,
                AllocatorType::Device,
                MemoryType::Default,
            )
            .map_err(|e| failed(name, e))?;
            Memory::Cuda {
                allocator: Allocator::new(session, info).map_err(|e| failed(name, e))?,
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
        let mut step_options = RunOptions::new().map_err(|e| failed(name, e))?;
        let mut prompt_options = RunOptions::new().map_err(|e| failed(name, e))?;
        if graphs {
            // One graph per batch size (a session serves one); prompts run uncaptured.
            step_options
                .set("gpu_graph_id", layout.batch.to_string())
                .map_err(|e| failed(name, e))?;
            prompt_options
                .set("gpu_graph_id", "-1")
                .map_err(|e| failed(name, e))?;
        }
        Ok(BoundStatic {
            runtime,
            name,
            memory,
            layout: layout.clone(),
            state,
            step: None,
            prompt: None,
            last_was_step: false,
            ids_on_device: None,
            step_options,
            prompt_options,
            graphs,
            argmax: None,
        })
    }

    /// Buffers and a binding for runs of `tokens` tokens.
    fn run_buffers(&mut self, tokens: usize) -> Result<RunBuffers> {
        let (name, b, v) = (self.name, self.layout.batch, self.layout.vocab);
        let ids = self.memory.zeros::<i64>(name, &[b, tokens])?;
        let position = self.memory.zeros::<i64>(name, &[b])?;
        let mut logits = self.memory.zeros::<f32>(name, &[b, tokens, v])?;
        let mut binding = self
            .runtime
            .session
            .create_binding()
            .map_err(|e| failed(name, e))?;
        let bind = |e| failed(name, e);
        binding.bind_input(INPUT_IDS, &ids).map_err(bind)?;
        binding.bind_input(POSITION, &position).map_err(bind)?;
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
        binding.bind_output(LOGITS, &mut logits).map_err(bind)?;
        Ok(RunBuffers {
            ids,
            position,
            logits,
            binding,
            tokens,
        })
    }

    /// The buffers of the last run.
    fn last(&self) -> Result<&RunBuffers> {
        let last = if self.last_was_step {
            self.step.as_ref()
        } else {
            self.prompt.as_ref()
        };
        last.ok_or_else(|| Error::Internal("logits read before any run".into()))
    }

    /// The `ArgMax` session over the step's logits (made on first use).
    fn device_argmax(&mut self) -> Result<&mut DeviceArgmax> {
        if self.argmax.is_none() {
            let (name, b, v) = (self.name, self.layout.batch, self.layout.vocab);
            let bytes = argmax_model(b, v)?;
            let session = cuda_session_from_memory(name, &bytes, self.graphs)?;
            let step = self
                .step
                .as_mut()
                .ok_or_else(|| Error::Internal("greedy pick before any step".into()))?;
            let mut binding = session.create_binding().map_err(|e| failed(name, e))?;
            binding
                .bind_input(LOGITS, &step.logits)
                .map_err(|e| failed(name, e))?;
            binding
                .bind_output(ARGMAX_OUTPUT, &mut step.ids)
                .map_err(|e| failed(name, e))?;
            let options = RunOptions::new().map_err(|e| failed(name, e))?;
            self.argmax = Some(DeviceArgmax {
                session,
                binding,
                options,
            });
        }
        self.argmax
            .as_mut()
            .ok_or_else(|| Error::Internal("no argmax session".into()))
    }
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

/// The output of the argmax model.
const ARGMAX_OUTPUT: &str = "next_ids";

/// A one-node model: `logits` f32 [batch, 1, vocab] → `next_ids` = ArgMax over the
/// vocabulary, i64 [batch, 1] (the first largest, as the host's greedy pick).
fn argmax_model(batch: usize, vocab: usize) -> Result<Vec<u8>> {
    let mut g = GraphBuilder::new(17)?;
    let logits = g.input(
        LOGITS,
        ElemType::F32,
        vec![Dim::Fixed(batch), Dim::Fixed(1), Dim::Fixed(vocab)],
    )?;
    let ids = g.arg_max("argmax", &logits, 2)?;
    let ids = g.rename(&ids, ARGMAX_OUTPUT)?;
    let graph = g.finish("greedy", vec![ids]);
    encode_model_to_vec(
        &graph,
        &ModelInfo {
            producer_name: "gmlp-onnx".into(),
            producer_version: env!("CARGO_PKG_VERSION").into(),
            doc_string: "greedy pick on the device".into(),
            metadata: Vec::new(),
        },
    )
}

impl StaticSession for BoundStatic {
    fn name(&self) -> &str {
        self.name
    }

    fn note(&self) -> Option<String> {
        self.graphs.then(|| {
            format!(
                "state, ids, positions and logits on the device; each step of {} sequences replays one CUDA graph",
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
        let name = self.name;
        let ids_there = t == 1 && self.ids_on_device.as_ref() == Some(&ids);
        let buffers = if t == 1 {
            if self.step.is_none() {
                self.step = Some(self.run_buffers(1)?);
            }
            self.step.as_mut()
        } else {
            if self.prompt.as_ref().is_none_or(|p| p.tokens != t) {
                self.prompt = None;
                self.prompt = Some(self.run_buffers(t)?);
            }
            self.prompt.as_mut()
        }
        .ok_or_else(|| Error::Internal("run buffers missing".into()))?;
        if !ids_there {
            self.memory.write(&mut buffers.ids, &ids)?;
        }
        self.memory.write(&mut buffers.position, positions)?;
        self.memory.synchronize()?;
        let options = if t == 1 {
            &self.step_options
        } else {
            &self.prompt_options
        };
        self.ids_on_device = None;
        run_bound(name, &mut self.runtime.session, &buffers.binding, options)?;
        self.last_was_step = t == 1;
        Ok(())
    }

    fn logits(&mut self) -> Result<Array3<f32>> {
        let last = self.last()?;
        let (b, t, v) = (self.layout.batch, last.tokens, self.layout.vocab);
        let mut out = Array3::zeros((b, t, v));
        let slice = out
            .as_slice_mut()
            .ok_or_else(|| Error::Internal("logits not contiguous".into()))?;
        self.memory.read(&last.logits, 0, slice)?;
        Ok(out)
    }

    fn logits_at(&mut self, rows: &[usize]) -> Result<Array2<f32>> {
        let last = self.last()?;
        let (b, t, v) = (self.layout.batch, last.tokens, self.layout.vocab);
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
            self.memory.read(&last.logits, (k * t + r) * v, slice)?;
        }
        Ok(out)
    }

    fn greedy(&mut self) -> Result<Option<Vec<i64>>> {
        if matches!(self.memory, Memory::Host) || !self.last_was_step {
            return Ok(None);
        }
        let name = self.name;
        let argmax = self.device_argmax()?;
        run_bound(name, &mut argmax.session, &argmax.binding, &argmax.options)?;
        let mut ids = vec![0i64; self.layout.batch];
        let step = self
            .step
            .as_ref()
            .ok_or_else(|| Error::Internal("greedy pick before any step".into()))?;
        self.memory.read(&step.ids, 0, &mut ids)?;
        self.ids_on_device = Some(ids.clone());
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
