//! [`StaticSession`] for ONNX Runtime: static-state decoding with every buffer bound once
//! through ort's `IoBinding`. Each state tensor ([batch, n, width], float32) is bound both
//! as its `past_*` input and as its `present_*` output, so that the scatter writing a run's
//! new rows (`ScatterND`, `TensorScatter`) finds its output already holding the rest and
//! copies nothing (its kernels skip the copy when the two buffers are one). On the CPU
//! execution provider the buffers are host tensors; on CUDA they are device memory; both
//! are [`Buffer`]s, which check where their memory lives before each write and read.
//!
//! A buffer bound as an input is read in place only where the session wants that input
//! in the buffer's memory ([`stays_bound`]): ONNX Runtime copies a bound input elsewhere
//! at bind time, and later writes would never reach that copy. The session's input
//! locations are read when it opens: a state input read elsewhere cannot be written in
//! place (an error); `input_ids` or `position` read elsewhere are bound again before
//! every run (refused with CUDA graphs, which replay fixed addresses).
//!
//! The session runs the file with two more outputs (step_model.rs): the greedy tokens
//! (`ArgMax` of the logits) and `position + 1`. A single-token step has two sets of
//! `input_ids` [batch, 1] and `position` [batch] buffers used in turn: the step that reads
//! one set writes its greedy tokens and next positions into the other, so that a greedy
//! step finds its inputs already written by the run before it, and only the [batch] ids
//! come back to the host (as onnxruntime-genai samples on the device and advances its
//! positions by a kernel). A sampled token, or any other input, is written over them first.
//! With CUDA graphs (`CudaOptions::graphs`) ONNX Runtime captures each of the two
//! step bindings once (graph ids 0 and 1: a graph replays fixed addresses) after their
//! warm-up runs and replays them, while runs of other lengths (the prompts) run uncaptured
//! (`gpu_graph_id` −1). A step is then one graph replay and one copy of [batch] ids.

use ndarray::{Array2, Array3, ArrayView2};
use ort::session::{IoBinding, RunOptions};

use super::buffer::{input_locations, run_binding, stays_bound, Buffer, Location, Memory};
use super::step_model::{step_model, STEP_NEXT_IDS, STEP_NEXT_POSITION};
use super::{failed, ModelSource, OrtRuntime, Provider};
use crate::error::{Error, Result};
use crate::runtime::{ModelFile, RuntimeOptions, StaticLayout, StaticSession, StepNames};
use crate::tensor::{NamedTensor, TensorValue};

/// How a run's `input_ids` and `position` buffers reach the session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum InputBinding {
    /// Bound once: the session reads them where they are.
    Once,
    /// Bound again before each run, after they are written: the session reads them
    /// elsewhere (a copy made at bind time).
    EachRun,
}

/// How the inputs of a session of `runtime` whose inputs `names` are wanted in `wanted` (in
/// session order) are bound from buffers in `held`, given the state inputs `state`, the
/// step's other inputs `step` (ids and position) and whether CUDA graphs are on; or why
/// the session cannot run from such buffers.
fn input_binding(
    runtime: &str,
    names: &[&str],
    wanted: &[Location],
    held: Location,
    state: &[&str],
    step: &[&str],
    graphs: bool,
) -> Result<InputBinding> {
    let mut binding = InputBinding::Once;
    for (name, &want) in names.iter().zip(wanted) {
        if stays_bound(want, held) {
            continue;
        }
        let elsewhere = format!("the session reads {name} in {want:?} memory, not {held:?}");
        if state.contains(name) {
            return Err(failed(
                runtime,
                format!("{elsewhere}, so its state cannot be written in place"),
            ));
        }
        if step.contains(name) {
            if graphs {
                return Err(failed(
                    runtime,
                    format!("{elsewhere}, and a CUDA graph replays fixed input addresses"),
                ));
            }
            binding = InputBinding::EachRun;
        }
    }
    Ok(binding)
}

/// One state tensor, bound as its `past` input and its `present` output.
struct StateBuffer {
    past: String,
    present: String,
    tensor: Buffer<f32>,
}

/// The buffers of a prompt's run of T tokens and the binding that names them.
struct PromptRun {
    ids: Buffer<i64>,
    position: Buffer<i64>,
    logits: Buffer<f32>,
    binding: IoBinding,
    /// T.
    tokens: usize,
}

/// One of a step's two sets of inputs, and what they hold as far as the host knows
/// (`None`: not known, i.e. written by a run and not read back since).
struct StepInputs {
    ids: Buffer<i64>,
    position: Buffer<i64>,
    ids_held: Option<Vec<i64>>,
    positions_held: Option<Vec<i64>>,
}

/// The single-token step (see the module documentation): binding k reads `inputs[k]` and
/// writes the greedy tokens and next positions into `inputs[1 − k]`; both write `logits`.
struct Step {
    inputs: [StepInputs; 2],
    logits: Buffer<f32>,
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
    /// How `input_ids` and `position` reach the session.
    inputs: InputBinding,
}

impl BoundStatic {
    /// Loads the static-state model `model` with its step outputs (step_model.rs) on
    /// `provider` (CUDA graphs where it has them on), with its state buffers for `layout`,
    /// zeroed.
    pub(crate) fn open(
        model: ModelFile,
        provider: Provider,
        options: &RuntimeOptions,
        layout: &StaticLayout,
    ) -> Result<BoundStatic> {
        let bytes = step_model(model, layout.names)?;
        let runtime = OrtRuntime::load_from(
            ModelSource::Edited {
                path: model.path,
                bytes: &bytes,
            },
            provider,
            options,
        )?;
        drop(bytes);
        BoundStatic::new(runtime, layout)
    }

    fn new(runtime: OrtRuntime, layout: &StaticLayout) -> Result<BoundStatic> {
        let name = runtime.name;
        let (memory, graphs) = match runtime.provider {
            Provider::Cuda { device, graphs } => (Memory::cuda(&runtime.session, device)?, graphs),
            Provider::Cpu => (Memory::host(), false),
        };
        let wanted = input_locations(&runtime.session).map_err(|e| failed(name, e))?;
        let names: Vec<&str> = runtime.session.inputs().iter().map(|i| i.name()).collect();
        let state_names: Vec<&str> = layout.state.iter().map(|s| s.past.as_str()).collect();
        let inputs = input_binding(
            name,
            &names,
            &wanted,
            memory.location(),
            &state_names,
            &[layout.names.ids, layout.names.position],
            graphs,
        )?;
        let state = layout
            .state
            .iter()
            .map(|s| {
                Ok(StateBuffer {
                    past: s.past.clone(),
                    present: s.present.clone(),
                    tensor: memory.zeros(&[layout.batch, layout.positions, s.width])?,
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
            inputs,
        })
    }

    /// A binding with the state bound in place (past and present one buffer each).
    fn state_binding(&mut self) -> Result<IoBinding> {
        let name = self.name;
        let bind = |e| failed(name, e);
        let mut binding = self.runtime.session.create_binding().map_err(bind)?;
        for s in &self.state {
            binding
                .bind_input(s.past.as_str(), s.tensor.tensor())
                .map_err(bind)?;
        }
        for s in &mut self.state {
            binding
                .bind_output(s.present.as_str(), s.tensor.tensor_mut())
                .map_err(bind)?;
        }
        Ok(binding)
    }

    /// Buffers and a binding for a prompt of `tokens` tokens.
    fn prompt_run(&mut self, tokens: usize) -> Result<PromptRun> {
        let (name, b, v) = (self.name, self.layout.batch, self.layout.vocab);
        let bind = |e| failed(name, e);
        let ids = self.memory.zeros::<i64>(&[b, tokens])?;
        let position = self.memory.zeros::<i64>(&[b])?;
        let mut logits = self.memory.zeros::<f32>(&[b, tokens, v])?;
        let mut binding = self.state_binding()?;
        bind_inputs(name, self.layout.names, &mut binding, &ids, &position)?;
        binding
            .bind_output(self.layout.names.logits, logits.tensor_mut())
            .map_err(bind)?;
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
        let names = self.layout.names;
        let bind = |e| failed(name, e);
        let inputs = |memory: &Memory| -> Result<StepInputs> {
            Ok(StepInputs {
                ids: memory.zeros::<i64>(&[b, 1])?,
                position: memory.zeros::<i64>(&[b])?,
                ids_held: None,
                positions_held: None,
            })
        };
        let mut sets = [inputs(&self.memory)?, inputs(&self.memory)?];
        let mut logits = self.memory.zeros::<f32>(&[b, 1, v])?;
        let mut bindings = Vec::with_capacity(2);
        for k in 0..2 {
            let mut binding = self.state_binding()?;
            let (read, written) = match &mut sets {
                [first, second] if k == 0 => (&*first, second),
                [first, second] => (&*second, first),
            };
            bind_inputs(name, names, &mut binding, &read.ids, &read.position)?;
            binding
                .bind_output(names.logits, logits.tensor_mut())
                .map_err(bind)?;
            binding
                .bind_output(STEP_NEXT_IDS, written.ids.tensor_mut())
                .map_err(bind)?;
            binding
                .bind_output(STEP_NEXT_POSITION, written.position.tensor_mut())
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
            read.ids.write(&ids)?;
            read.ids_held = Some(ids);
            wrote = true;
        }
        if read.positions_held.as_deref() != Some(positions) {
            read.positions_held = None;
            read.position.write(positions)?;
            read.positions_held = Some(positions.to_vec());
            wrote = true;
        }
        if wrote {
            self.memory.synchronize()?;
        }
        if self.inputs == InputBinding::EachRun {
            bind_inputs(
                self.name,
                self.layout.names,
                &mut step.bindings[k],
                &read.ids,
                &read.position,
            )?;
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
        prompt.ids.write(ids)?;
        prompt.position.write(positions)?;
        self.memory.synchronize()?;
        if self.inputs == InputBinding::EachRun {
            bind_inputs(
                self.name,
                self.layout.names,
                &mut prompt.binding,
                &prompt.ids,
                &prompt.position,
            )?;
        }
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
    fn last_logits(&self) -> Result<(&Buffer<f32>, usize)> {
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

/// Binds a run's `ids` and `position` buffers as the inputs `names` gives them.
fn bind_inputs(
    name: &str,
    names: StepNames,
    binding: &mut IoBinding,
    ids: &Buffer<i64>,
    position: &Buffer<i64>,
) -> Result<()> {
    binding
        .bind_input(names.ids, ids.tensor())
        .map_err(|e| failed(name, e))?;
    binding
        .bind_input(names.position, position.tensor())
        .map_err(|e| failed(name, e))
}

/// Runs `binding` on `session` ([`run_binding`]).
fn run_bound(
    name: &str,
    session: &mut ort::session::Session,
    binding: &IoBinding,
    options: &RunOptions,
) -> Result<()> {
    run_binding(session, binding, options).map_err(|e| failed(name, e))
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
        logits.read(0, slice)?;
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
            logits.read((k * t + r) * v, slice)?;
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
        next.ids.read(0, &mut ids)?;
        next.ids_held = Some(ids.clone());
        Ok(Some(ids))
    }

    fn state(&mut self) -> Result<Vec<NamedTensor>> {
        let (b, n) = (self.layout.batch, self.layout.positions);
        self.state
            .iter()
            .zip(&self.layout.state)
            .map(|(s, tensor)| {
                let mut out = ndarray::ArrayD::<f32>::zeros(ndarray::IxDyn(&[b, n, tensor.width]));
                let slice = out
                    .as_slice_mut()
                    .ok_or_else(|| Error::Internal("state not contiguous".into()))?;
                s.tensor.read(0, slice)?;
                Ok(NamedTensor {
                    name: s.past.clone(),
                    value: TensorValue::F32(out),
                })
            })
            .collect()
    }

    fn reset(&mut self) -> Result<()> {
        for s in &mut self.state {
            s.tensor.zero()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
