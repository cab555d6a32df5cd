//! [`BoundSession`] for ONNX Runtime: buffers allocated by the session's own allocator (host
//! memory on the CPU execution provider, device memory on CUDA), bound through ort's
//! `IoBinding`. A buffer bound both as an input and as an output is one tensor, so a node
//! that writes its output over its input (the scatter of a static state: `ScatterND`,
//! `TensorScatter`, whose kernels skip the copy when the two are one) updates it in place.
//! Every buffer is a [`Buffer`], which checks where its memory lives before each write and
//! read.
//!
//! A buffer bound as an input is read in place only where the session wants that input
//! in the buffer's memory ([`stays_bound`]): ONNX Runtime copies a bound input elsewhere
//! at bind time, and later writes would never reach that copy. The session's input
//! locations are read when it opens; an input read elsewhere is bound again before every
//! run of its binding, or refused where that cannot work ([`input_binding`]).
//!
//! With CUDA graphs on (`CudaOptions::graphs`), the session opens only where it reads every
//! input where its buffers are, and each binding of [`Replay::Captured`] runs with a
//! `gpu_graph_id` of its own (0, 1, … in the order bound): captured after its warm-up run
//! and replayed after; [`Replay::Uncaptured`] runs with −1.

use ort::session::{IoBinding, RunOptions};

use super::buffer::{input_locations, run_binding, stays_bound, Buffer, Location, Memory};
use super::{failed, OrtRuntime, Provider};
use crate::error::{Error, Result};
use crate::runtime::{
    BindingId, BoundSession, BufferId, Element, ModelSource, Replay, RuntimeOptions,
};

/// How an input of a binding reaches the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InputBinding {
    /// Bound once: the session reads it where it is.
    Once,
    /// Bound again before each run, after the host wrote it: the session reads it
    /// elsewhere (a copy made at bind time).
    EachRun,
}

/// How the input `name`, wanted by the session in `wanted`, is bound from a buffer in
/// `held`, given whether the same buffer is also an output of the binding (written in
/// place) and whether the session captures CUDA graphs; or why it cannot be.
fn input_binding(
    runtime: &str,
    name: &str,
    (wanted, held): (Location, Location),
    in_place: bool,
    graphs: bool,
) -> Result<InputBinding> {
    if stays_bound(wanted, held) {
        return Ok(InputBinding::Once);
    }
    let elsewhere = format!("the session reads {name} in {wanted:?} memory, not {held:?}");
    if in_place {
        return Err(Error::RuntimeFailed {
            runtime: runtime.into(),
            reason: format!("{elsewhere}, so its buffer cannot be written in place"),
        });
    }
    if graphs {
        return Err(Error::RuntimeFailed {
            runtime: runtime.into(),
            reason: format!("{elsewhere}, and a CUDA graph replays fixed input addresses"),
        });
    }
    Ok(InputBinding::EachRun)
}

/// One buffer, of either element type.
enum Slot {
    F32(Buffer<f32>),
    I64(Buffer<i64>),
}

/// One binding: ort's, its run options and the inputs bound again before each run.
struct Binding {
    io: IoBinding,
    options: RunOptions,
    each_run: Vec<(String, BufferId)>,
}

/// ONNX Runtime's bound session (see the module documentation).
pub(crate) struct OrtBound {
    /// The loaded model (its session runs the bindings).
    runtime: OrtRuntime,
    memory: Memory,
    graphs: bool,
    /// Where the session wants each input, by name.
    wanted: Vec<(String, Location)>,
    buffers: Vec<Option<Slot>>,
    bindings: Vec<Option<Binding>>,
    /// Whether the host wrote a buffer since the last run (device memory is synchronized
    /// before the next one).
    written: bool,
    /// The CUDA graph id of the next captured binding.
    next_graph: i64,
}

impl OrtBound {
    /// Loads `source` on `provider` (CUDA graphs where its options turn them on).
    pub(crate) fn open(
        source: ModelSource,
        provider: Provider,
        options: &RuntimeOptions,
    ) -> Result<OrtBound> {
        let runtime = OrtRuntime::load_from(source, provider, options)?;
        let name = runtime.name;
        let (memory, graphs) = match runtime.provider {
            Provider::Cuda { device, graphs } => (Memory::cuda(&runtime.session, device)?, graphs),
            Provider::Cpu => (Memory::host(), false),
        };
        let locations = input_locations(&runtime.session).map_err(|e| failed(name, e))?;
        let wanted: Vec<(String, Location)> = runtime
            .session
            .inputs()
            .iter()
            .map(|i| i.name().to_string())
            .zip(locations)
            .collect();
        if graphs {
            for (input, location) in &wanted {
                input_binding(name, input, (*location, memory.location()), false, true)?;
            }
        }
        Ok(OrtBound {
            runtime,
            memory,
            graphs,
            wanted,
            buffers: Vec::new(),
            bindings: Vec::new(),
            written: false,
            next_graph: 0,
        })
    }

    fn slot(&self, buffer: BufferId) -> Result<&Slot> {
        self.buffers
            .get(buffer.0)
            .and_then(Option::as_ref)
            .ok_or_else(|| Error::Internal(format!("no buffer {}", buffer.0)))
    }

    fn slot_mut(&mut self, buffer: BufferId) -> Result<&mut Slot> {
        self.buffers
            .get_mut(buffer.0)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Internal(format!("no buffer {}", buffer.0)))
    }

    /// Binds `buffer` as the input `name` of `io`.
    fn bind_input(&self, io: &mut IoBinding, name: &str, buffer: BufferId) -> Result<()> {
        let bound = match self.slot(buffer)? {
            Slot::F32(b) => io.bind_input(name, b.tensor()),
            Slot::I64(b) => io.bind_input(name, b.tensor()),
        };
        bound.map_err(|e| failed(self.runtime.name, e))
    }

    /// How the input `name` bound from `buffer` reaches the session.
    fn input_binding(
        &self,
        name: &str,
        buffer: BufferId,
        outputs: &[(&str, BufferId)],
    ) -> Result<InputBinding> {
        let wanted = self
            .wanted
            .iter()
            .find(|(input, _)| input == name)
            .map(|&(_, location)| location)
            .ok_or_else(|| failed(self.runtime.name, format!("the model has no input {name}")))?;
        input_binding(
            self.runtime.name,
            name,
            (wanted, self.memory.location()),
            outputs.iter().any(|&(_, b)| b == buffer),
            self.graphs,
        )
    }
}

/// Run options with the CUDA graph id `graph`, if any.
fn run_options(name: &str, graph: Option<i64>) -> Result<RunOptions> {
    let mut options = RunOptions::new().map_err(|e| failed(name, e))?;
    if let Some(id) = graph {
        options
            .set("gpu_graph_id", id.to_string())
            .map_err(|e| failed(name, e))?;
    }
    Ok(options)
}

impl BoundSession for OrtBound {
    fn name(&self) -> &str {
        self.runtime.name
    }

    fn captures(&self) -> bool {
        self.graphs
    }

    fn buffer(&mut self, element: Element, shape: &[usize]) -> Result<BufferId> {
        let slot = match element {
            Element::F32 => Slot::F32(self.memory.zeros(shape)?),
            Element::I64 => Slot::I64(self.memory.zeros(shape)?),
        };
        self.buffers.push(Some(slot));
        Ok(BufferId(self.buffers.len() - 1))
    }

    fn release(&mut self, buffer: BufferId) {
        if let Some(slot) = self.buffers.get_mut(buffer.0) {
            *slot = None;
        }
    }

    fn bind(
        &mut self,
        inputs: &[(&str, BufferId)],
        outputs: &[(&str, BufferId)],
        replay: Replay,
    ) -> Result<BindingId> {
        let name = self.runtime.name;
        let mut io = self
            .runtime
            .session
            .create_binding()
            .map_err(|e| failed(name, e))?;
        let mut each_run = Vec::new();
        for &(input, buffer) in inputs {
            if self.input_binding(input, buffer, outputs)? == InputBinding::EachRun {
                each_run.push((input.to_string(), buffer));
            }
            self.bind_input(&mut io, input, buffer)?;
        }
        for &(output, buffer) in outputs {
            let bound = match self.slot_mut(buffer)? {
                Slot::F32(b) => io.bind_output(output, b.tensor_mut()),
                Slot::I64(b) => io.bind_output(output, b.tensor_mut()),
            };
            bound.map_err(|e| failed(name, e))?;
        }
        let graph = match replay {
            _ if !self.graphs => None,
            Replay::Uncaptured => Some(-1),
            Replay::Captured => {
                self.next_graph += 1;
                Some(self.next_graph - 1)
            }
        };
        let options = run_options(name, graph)?;
        self.bindings.push(Some(Binding {
            io,
            options,
            each_run,
        }));
        Ok(BindingId(self.bindings.len() - 1))
    }

    fn unbind(&mut self, binding: BindingId) {
        if let Some(slot) = self.bindings.get_mut(binding.0) {
            *slot = None;
        }
    }

    fn run(&mut self, binding: BindingId) -> Result<()> {
        let name = self.runtime.name;
        if self.written {
            self.memory.synchronize()?;
            self.written = false;
        }
        let mut bound = self
            .bindings
            .get_mut(binding.0)
            .and_then(Option::take)
            .ok_or_else(|| Error::Internal(format!("no binding {}", binding.0)))?;
        let rebound = bound
            .each_run
            .iter()
            .try_for_each(|(input, buffer)| self.bind_input(&mut bound.io, input, *buffer));
        let ran = rebound.and_then(|()| {
            run_binding(&mut self.runtime.session, &bound.io, &bound.options)
                .map_err(|e| failed(name, e))
        });
        self.bindings[binding.0] = Some(bound);
        ran
    }

    fn write_i64(&mut self, buffer: BufferId, values: &[i64]) -> Result<()> {
        let Slot::I64(b) = self.slot_mut(buffer)? else {
            return Err(Error::Internal("int64 written to a float32 buffer".into()));
        };
        b.write(values)?;
        self.written = true;
        Ok(())
    }

    fn read_i64(&self, buffer: BufferId, offset: usize, out: &mut [i64]) -> Result<()> {
        match self.slot(buffer)? {
            Slot::I64(b) => b.read(offset, out),
            Slot::F32(_) => Err(Error::Internal("int64 read from a float32 buffer".into())),
        }
    }

    fn read_f32(&self, buffer: BufferId, offset: usize, out: &mut [f32]) -> Result<()> {
        match self.slot(buffer)? {
            Slot::F32(b) => b.read(offset, out),
            Slot::I64(_) => Err(Error::Internal("float32 read from an int64 buffer".into())),
        }
    }

    fn zero(&mut self, buffer: BufferId) -> Result<()> {
        match self.slot_mut(buffer)? {
            Slot::F32(b) => b.zero()?,
            Slot::I64(b) => b.zero()?,
        }
        self.written = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
