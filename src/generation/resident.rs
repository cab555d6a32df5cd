//! A static state bound to an engine's session ([`BoundSession`]: ONNX Runtime's I/O
//! binding, on the host or the CUDA device): every state tensor ([batch, n, width],
//! float32) is one buffer bound both as its `past_*` input and as its `present_*` output,
//! so that the scatter writing a run's new rows finds its output already holding the rest
//! and copies nothing; a run's ids, positions and logits have buffers of their own, bound
//! once too.
//!
//! The session runs the file emitted again with two more outputs ([`step_graph`]:
//! [`Interface::BoundStep`], src/rebuild.rs), so that a step's run
//! leaves the next step's inputs where they are read, with no work on the host in between
//! (the way onnxruntime-genai picks tokens on the device and advances its positions by a
//! kernel rather than from the host): the greedy tokens `next_input_ids` = `ArgMax(logits)`
//! over the vocabulary, [batch, T] (every row's first largest logit, as the host's pick),
//! and `next_position` = `position + 1`, [batch]. The file itself is not changed: the
//! graph emitted again is loaded from memory. A single-token step has two sets of
//! `input_ids` [batch, 1] and `position` [batch] buffers used in turn: the step that reads
//! one set writes its greedy tokens and next positions into the other, so that a greedy
//! step finds its inputs already written by the run before it, and only the [batch] ids
//! come back to the host (as onnxruntime-genai samples on the device and advances its
//! positions by a kernel). A sampled token, or any other input, is written over them first.
//! The two step bindings are CUDA graphs where the session captures them
//! ([`Replay::Captured`]; a graph replays fixed addresses), while runs of other lengths
//! (the prompts) run uncaptured. A step is then one graph replay and one copy of [batch]
//! ids. The session is the loaded model's ([`LoadedModel`](crate::generation::LoadedModel)),
//! lent to each run: the buffers here are one decoder's, released when it is dropped.

use ndarray::{Array2, Array3, ArrayD, ArrayView2, IxDyn};

use crate::error::{Error, Result};
use crate::generation::sampling::argmax;
use crate::gmlp::emit::{INPUT_IDS, LOGITS};
use crate::gmlp::interface::{
    DecodingInfo, Interface, StateTensor, NEXT_INPUT_IDS, NEXT_POSITION, POSITION,
};
use crate::rebuild::rebuild;
use crate::runtime::{BindingId, BoundSession, BufferId, Element, ModelFile, Replay};
use crate::tensor::{NamedTensor, TensorValue};

/// The buffers of a prompt's run of T tokens and the binding that names them.
struct PromptRun {
    ids: BufferId,
    position: BufferId,
    logits: BufferId,
    binding: BindingId,
    /// T.
    tokens: usize,
}

/// One of a step's two sets of inputs, and what they hold as far as the host knows
/// (`None`: not known, i.e. written by a run and not read back since).
struct StepInputs {
    ids: BufferId,
    position: BufferId,
    ids_held: Option<Vec<i64>>,
    positions_held: Option<Vec<i64>>,
}

/// The single-token step (see the module documentation): binding k reads `inputs[k]` and
/// writes the greedy tokens and next positions into `inputs[1 − k]`; both write `logits`.
struct Step {
    inputs: [StepInputs; 2],
    logits: BufferId,
    bindings: [BindingId; 2],
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

/// A static state in buffers bound once to an engine's session, written in place (see the
/// module documentation).
pub(crate) struct BoundState {
    batch: usize,
    vocab: usize,
    /// n: every state tensor is [batch, n, width].
    positions: usize,
    /// Every state tensor and its buffer.
    state: Vec<(StateTensor, BufferId)>,
    step: Step,
    /// The last run of another length (a prompt).
    prompt: Option<PromptRun>,
    last: LastRun,
}

impl BoundState {
    /// The state buffers of the model `info` describes (its vocabulary `vocab`) for `batch`
    /// sequences, zeroed, and the step's, bound in `session` (which runs the file with its
    /// step graph's outputs).
    pub(crate) fn new(
        session: &mut dyn BoundSession,
        (info, vocab): (&DecodingInfo, usize),
        batch: usize,
    ) -> Result<BoundState> {
        let n = info.max_sequence;
        let state = info
            .state
            .iter()
            .map(|s| {
                Ok((
                    s.clone(),
                    session.buffer(Element::F32, &[batch, n, s.width])?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let step = step_buffers(session, &state, batch, vocab)?;
        Ok(BoundState {
            batch,
            vocab,
            positions: n,
            state,
            step,
            prompt: None,
            last: LastRun::Nothing,
        })
    }

    /// Frees every buffer and binding of this state in `session`.
    pub(crate) fn release(&mut self, session: &mut dyn BoundSession) {
        self.release_prompt(session);
        for binding in self.step.bindings {
            session.unbind(binding);
        }
        let step_buffers = self
            .step
            .inputs
            .iter()
            .flat_map(|set| [set.ids, set.position])
            .chain([self.step.logits]);
        for buffer in step_buffers.chain(self.state.iter().map(|&(_, b)| b)) {
            session.release(buffer);
        }
    }

    /// Frees the prompt's buffers and binding, if any.
    fn release_prompt(&mut self, session: &mut dyn BoundSession) {
        if let Some(prompt) = self.prompt.take() {
            session.unbind(prompt.binding);
            for buffer in [prompt.ids, prompt.position, prompt.logits] {
                session.release(buffer);
            }
        }
    }

    /// Runs `ids` [batch, T] at each sequence's `positions` \[batch\] (checked by the
    /// decoder: within the vocabulary, P + T ≤ n), writing the T new rows of every state
    /// tensor in place and keeping the logits where the runtime put them. If a run fails,
    /// rows after the sequences' positions may have been written; no run reads a row
    /// before writing it, so the state stays valid for the positions fed so far.
    pub(crate) fn run(
        &mut self,
        session: &mut dyn BoundSession,
        ids: ArrayView2<i64>,
        positions: &[i64],
    ) -> Result<()> {
        let t = ids.ncols();
        let ids: Vec<i64> = ids.iter().copied().collect();
        self.last = LastRun::Nothing;
        if t == 1 {
            self.run_step(session, ids, positions)?;
            self.last = LastRun::Step;
        } else {
            self.run_prompt(session, &ids, t, positions)?;
            self.last = LastRun::Prompt;
        }
        Ok(())
    }

    /// A single-token step of `ids` [batch] at `positions`: what its inputs do not already
    /// hold is written, then its binding runs.
    fn run_step(
        &mut self,
        session: &mut dyn BoundSession,
        ids: Vec<i64>,
        positions: &[i64],
    ) -> Result<()> {
        let step = &mut self.step;
        let k = step.turn;
        let [first, second] = &mut step.inputs;
        let (read, written) = if k == 0 {
            (first, second)
        } else {
            (second, first)
        };
        if read.ids_held.as_ref() != Some(&ids) {
            read.ids_held = None;
            session.write_i64(read.ids, &ids)?;
            read.ids_held = Some(ids);
        }
        if read.positions_held.as_deref() != Some(positions) {
            read.positions_held = None;
            session.write_i64(read.position, positions)?;
            read.positions_held = Some(positions.to_vec());
        }
        written.ids_held = None;
        written.positions_held = None;
        session.run(step.bindings[k])?;
        written.positions_held = Some(positions.iter().map(|p| p + 1).collect());
        step.turn = 1 - k;
        Ok(())
    }

    /// A prompt's run of `ids` [batch, T] at `positions`.
    fn run_prompt(
        &mut self,
        session: &mut dyn BoundSession,
        ids: &[i64],
        tokens: usize,
        positions: &[i64],
    ) -> Result<()> {
        if self.prompt.as_ref().is_some_and(|p| p.tokens != tokens) {
            self.release_prompt(session);
        }
        let prompt = match self.prompt.take() {
            Some(prompt) => prompt,
            None => self.prompt_run(session, tokens)?,
        };
        let ran = session
            .write_i64(prompt.ids, ids)
            .and_then(|()| session.write_i64(prompt.position, positions))
            .and_then(|()| session.run(prompt.binding));
        self.prompt = Some(prompt);
        ran
    }

    /// Buffers and a binding for a prompt of `tokens` tokens.
    fn prompt_run(&self, session: &mut dyn BoundSession, tokens: usize) -> Result<PromptRun> {
        let (b, v) = (self.batch, self.vocab);
        let ids = session.buffer(Element::I64, &[b, tokens])?;
        let position = session.buffer(Element::I64, &[b])?;
        let logits = session.buffer(Element::F32, &[b, tokens, v])?;
        let (mut inputs, mut outputs) = state_bindings(&self.state);
        inputs.extend([(INPUT_IDS, ids), (POSITION, position)]);
        outputs.push((LOGITS, logits));
        let binding = session.bind(&inputs, &outputs, Replay::Uncaptured)?;
        Ok(PromptRun {
            ids,
            position,
            logits,
            binding,
            tokens,
        })
    }

    /// The logits buffer of the last run and its T.
    fn last_logits(&self) -> Result<(BufferId, usize)> {
        match (self.last, &self.prompt) {
            (LastRun::Step, _) => Ok((self.step.logits, 1)),
            (LastRun::Prompt, Some(prompt)) => Ok((prompt.logits, prompt.tokens)),
            _ => Err(Error::Internal("logits read before any run".into())),
        }
    }

    /// The last run's logits [batch, T, vocab], copied to the host.
    pub(crate) fn logits(&self, session: &dyn BoundSession) -> Result<Array3<f32>> {
        let (logits, t) = self.last_logits()?;
        let mut out = Array3::zeros((self.batch, t, self.vocab));
        let slice = out
            .as_slice_mut()
            .ok_or_else(|| Error::Internal("logits not contiguous".into()))?;
        session.read_f32(logits, 0, slice)?;
        Ok(out)
    }

    /// The last run's logits at row `rows[b]` of each sequence b, [batch, vocab] (one
    /// copy of those rows only).
    pub(crate) fn logits_at(
        &self,
        session: &dyn BoundSession,
        rows: &[usize],
    ) -> Result<Array2<f32>> {
        let (logits, t) = self.last_logits()?;
        let v = self.vocab;
        if rows.len() != self.batch || rows.iter().any(|&r| r >= t) {
            return Err(Error::Internal(format!(
                "rows {rows:?} of a run of {t} tokens"
            )));
        }
        let mut out = Array2::zeros((self.batch, v));
        for (k, (mut row, &r)) in out.outer_iter_mut().zip(rows).enumerate() {
            let slice = row
                .as_slice_mut()
                .ok_or_else(|| Error::Internal("logits not contiguous".into()))?;
            session.read_f32(logits, (k * t + r) * v, slice)?;
        }
        Ok(out)
    }

    /// The greedy next token of each sequence after row `rows[b]`: after a step, the ids
    /// its run picked (on the CUDA device for ort-cuda: only they come back); after a
    /// prompt, picked on the host from those rows.
    pub(crate) fn greedy(
        &mut self,
        session: &dyn BoundSession,
        rows: &[usize],
    ) -> Result<Vec<i64>> {
        if self.last != LastRun::Step {
            let logits = self.logits_at(session, rows)?;
            return Ok(logits
                .outer_iter()
                .map(|row| argmax(&row.to_vec()) as i64)
                .collect());
        }
        let next = &mut self.step.inputs[self.step.turn];
        if let Some(ids) = &next.ids_held {
            return Ok(ids.clone());
        }
        let mut ids = vec![0i64; self.batch];
        session.read_i64(next.ids, 0, &mut ids)?;
        next.ids_held = Some(ids.clone());
        Ok(ids)
    }

    /// A host copy of every state tensor, by `past_*` name, in model order.
    pub(crate) fn tensors(&self, session: &dyn BoundSession) -> Result<Vec<NamedTensor>> {
        let (b, n) = (self.batch, self.positions);
        self.state
            .iter()
            .map(|(tensor, buffer)| {
                let mut out = ArrayD::<f32>::zeros(IxDyn(&[b, n, tensor.width]));
                let slice = out
                    .as_slice_mut()
                    .ok_or_else(|| Error::Internal("state not contiguous".into()))?;
                session.read_f32(*buffer, 0, slice)?;
                Ok(NamedTensor {
                    name: tensor.past.clone(),
                    value: TensorValue::F32(out),
                })
            })
            .collect()
    }

    /// Sets the state to zeros (a new set of sequences).
    pub(crate) fn reset(&mut self, session: &mut dyn BoundSession) -> Result<()> {
        for &(_, buffer) in &self.state {
            session.zero(buffer)?;
        }
        self.last = LastRun::Nothing;
        Ok(())
    }
}

/// The state bound in place: every buffer as its `past_*` input and its `present_*` output.
type Names<'a> = Vec<(&'a str, BufferId)>;

/// The (inputs, outputs) that bind `state` in place.
fn state_bindings(state: &[(StateTensor, BufferId)]) -> (Names<'_>, Names<'_>) {
    (
        state.iter().map(|(s, b)| (s.past.as_str(), *b)).collect(),
        state
            .iter()
            .map(|(s, b)| (s.present.as_str(), *b))
            .collect(),
    )
}

/// The step's two sets of inputs, its logits and its two bindings (two CUDA graphs where
/// the session captures them).
fn step_buffers(
    session: &mut dyn BoundSession,
    state: &[(StateTensor, BufferId)],
    batch: usize,
    vocab: usize,
) -> Result<Step> {
    let inputs = |session: &mut dyn BoundSession| -> Result<StepInputs> {
        Ok(StepInputs {
            ids: session.buffer(Element::I64, &[batch, 1])?,
            position: session.buffer(Element::I64, &[batch])?,
            ids_held: None,
            positions_held: None,
        })
    };
    let sets = [inputs(session)?, inputs(session)?];
    let logits = session.buffer(Element::F32, &[batch, 1, vocab])?;
    let mut bind = |k: usize| {
        let (read, written) = (&sets[k], &sets[1 - k]);
        let (mut ins, mut outs) = state_bindings(state);
        ins.extend([(INPUT_IDS, read.ids), (POSITION, read.position)]);
        outs.extend([
            (LOGITS, logits),
            (NEXT_INPUT_IDS, written.ids),
            (NEXT_POSITION, written.position),
        ]);
        session.bind(&ins, &outs, Replay::Captured)
    };
    let bindings = [bind(0)?, bind(1)?];
    Ok(Step {
        inputs: sets,
        logits,
        bindings,
        turn: 0,
    })
}

/// The static-state model `file` emitted again with the bound step's outputs
/// ([`Interface::BoundStep`]: [`NEXT_INPUT_IDS`] and [`NEXT_POSITION`] after the file's
/// own), its weights the file's, encoded (decoding the file only if the caller has not).
/// The file is not changed.
pub(crate) fn step_graph(file: ModelFile) -> Result<Vec<u8>> {
    let model = file.model()?;
    rebuild(&model, file.path, Interface::BoundStep, &[])
}

#[cfg(test)]
mod tests;
