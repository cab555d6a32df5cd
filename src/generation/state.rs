//! What one decoder keeps between runs, apart from the loaded model it runs on
//! ([`LoadedModel`](crate::generation::LoadedModel)), as one [`State`] of its storage forms:
//! [`Carried`], the `past_*` values carried from run to run ([`Runtime::run_carrying`]:
//! ONNX Runtime's own values, on the host or the CUDA device, or tract's own values);
//! [`BoundState`], a static state in buffers bound once to the model's session and written
//! in place (resident.rs); [`Prefix`], no state: every token fed so far re-run (a
//! variable-length model). Each form runs on its engine ([`Engine::runs`],
//! [`Engine::session`]). A new form is a variant here, its file, and its choice in
//! [`State::new`].

use ndarray::{s, Array1, Array2, Array3, ArrayD, ArrayView2, Axis, IxDyn};

use crate::error::{Error, Result};
use crate::generation::model::DecodingModel;
use crate::generation::model::Engine;
use crate::generation::resident::BoundState;
use crate::generation::sampling::argmax;
use crate::gmlp::emit::{INPUT_IDS, LOGITS};
use crate::gmlp::interface::{DecodingInfo, SequenceMode, POSITION};
use crate::runtime::{CarriedState, Carry, Runtime};
use crate::tensor::{NamedTensor, TensorValue};

/// What one decoder keeps between runs, in one of its storage forms.
pub(crate) enum State {
    /// Carried from run to run.
    Carried(Carried),
    /// Bound once to the model's session, written in place.
    Bound(BoundState),
    /// None: the prefix re-run.
    Prefix(Prefix),
}

impl State {
    /// The empty state of `model` for `batch` sequences on `engine`: bound where the engine
    /// is a session of bound buffers, else carried, or a prefix without state.
    pub(crate) fn new(engine: &mut Engine, model: &DecodingModel, batch: usize) -> Result<State> {
        Ok(match (engine, model.info.mode) {
            (Engine::Bound { session, .. }, _) => State::Bound(BoundState::new(
                session.as_mut(),
                (&model.info, model.vocab_size),
                batch,
            )?),
            (Engine::Runs(_), SequenceMode::Variable) => State::Prefix(Prefix::new(batch)),
            (
                Engine::Runs(_),
                SequenceMode::Static | SequenceMode::Growing | SequenceMode::Fixed,
            ) => State::Carried(Carried::new(&model.info, batch)),
        })
    }

    /// Forgets every token: zeros for a static state, no rows for a growing one.
    pub(crate) fn reset(&mut self, engine: &mut Engine) -> Result<()> {
        match self {
            State::Carried(c) => c.reset(),
            State::Bound(b) => b.reset(engine.session()?)?,
            State::Prefix(p) => p.reset(),
        }
        Ok(())
    }

    /// Runs `ids` [batch, T] at each sequence's `positions` \[batch\] (checked by the
    /// decoder), keeping the logits of the T new positions.
    pub(crate) fn run(
        &mut self,
        engine: &mut Engine,
        ids: ArrayView2<i64>,
        positions: &[i64],
    ) -> Result<()> {
        match self {
            State::Carried(c) => c.run(engine.runs()?, ids, positions),
            State::Bound(b) => b.run(engine.session()?, ids, positions),
            State::Prefix(p) => p.run(engine.runs()?, ids),
        }
    }

    /// The last run's logits [batch, T, vocab].
    pub(crate) fn logits(&mut self, engine: &mut Engine) -> Result<Array3<f32>> {
        match self {
            State::Carried(Carried { last, .. }) | State::Prefix(Prefix { last, .. }) => last.all(),
            State::Bound(b) => b.logits(engine.session()?),
        }
    }

    /// The last run's logits at row `rows[b]` of each sequence b, [batch, vocab].
    pub(crate) fn logits_at(&mut self, engine: &mut Engine, rows: &[usize]) -> Result<Array2<f32>> {
        match self {
            State::Carried(Carried { last, .. }) | State::Prefix(Prefix { last, .. }) => {
                last.at(rows)
            }
            State::Bound(b) => b.logits_at(engine.session()?, rows),
        }
    }

    /// The greedy next token of each sequence after row `rows[b]` of the last run, picked
    /// where the logits are (a bound state's step picks them on its device).
    pub(crate) fn greedy(&mut self, engine: &mut Engine, rows: &[usize]) -> Result<Vec<i64>> {
        if let State::Bound(b) = self {
            return b.greedy(engine.session()?, rows);
        }
        let logits = self.logits_at(engine, rows)?;
        Ok(logits
            .outer_iter()
            .map(|row| argmax(&row.to_vec()) as i64)
            .collect())
    }

    /// A host copy of the state (`past_*` tensors); empty without state.
    pub(crate) fn tensors(&mut self, engine: &mut Engine) -> Result<Vec<NamedTensor>> {
        match self {
            State::Carried(c) => c.state.to_host(),
            State::Bound(b) => b.tensors(engine.session()?),
            State::Prefix(_) => Ok(Vec::new()),
        }
    }

    /// Frees what the state holds in the engine (a bound state's buffers).
    pub(crate) fn release(&mut self, engine: &mut Engine) {
        if let (State::Bound(b), Ok(session)) = (self, engine.session()) {
            b.release(session);
        }
    }
}

/// A step's inputs besides the state: the ids, and each sequence's position for a
/// static-state model.
fn step_inputs(info: &DecodingInfo, ids: ArrayView2<i64>, positions: &[i64]) -> Vec<NamedTensor> {
    let mut inputs = vec![NamedTensor {
        name: INPUT_IDS.into(),
        value: TensorValue::I64(ids.to_owned().into_dyn()),
    }];
    if info.mode == SequenceMode::Static {
        inputs.push(NamedTensor {
            name: POSITION.into(),
            value: TensorValue::I64(Array1::from(positions.to_vec()).into_dyn()),
        });
    }
    inputs
}

/// The state of no token: every `past_*` of `batch` sequences with no rows (growing) or n
/// rows of zeros (static).
fn empty_past(info: &DecodingInfo, batch: usize) -> Vec<NamedTensor> {
    let rows = match info.mode {
        SequenceMode::Static => info.max_sequence,
        _ => 0,
    };
    info.state
        .iter()
        .map(|s| NamedTensor {
            name: s.past.clone(),
            value: TensorValue::F32(ArrayD::zeros(IxDyn(&[batch, rows, s.width]))),
        })
        .collect()
}

/// A with-past model's state carried from run to run ([`Runtime::run_carrying`]): each
/// run's `present_*` outputs become the next run's `past_*` inputs, kept by the engine (a
/// growing state gains the run's rows; a static state is copied whole by the graph's
/// scatter).
pub(crate) struct Carried {
    info: DecodingInfo,
    batch: usize,
    /// Each state tensor's output and the input it is fed back as.
    carry: Vec<Carry>,
    /// `past_*` values to feed next.
    state: CarriedState,
    last: LastLogits,
}

impl Carried {
    /// An empty state of the model `info` describes, for `batch` sequences.
    fn new(info: &DecodingInfo, batch: usize) -> Carried {
        Carried {
            state: CarriedState::host(empty_past(info, batch)),
            carry: info
                .state
                .iter()
                .map(|s| Carry {
                    input: s.past.clone(),
                    output: s.present.clone(),
                })
                .collect(),
            info: info.clone(),
            batch,
            last: LastLogits::default(),
        }
    }

    fn reset(&mut self) {
        self.state = CarriedState::host(empty_past(&self.info, self.batch));
        self.last.clear();
    }

    fn run(
        &mut self,
        runtime: &mut dyn Runtime,
        ids: ArrayView2<i64>,
        positions: &[i64],
    ) -> Result<()> {
        let inputs = step_inputs(&self.info, ids, positions);
        let outputs = runtime.run_carrying(&inputs, &mut self.state, &self.carry)?;
        self.last
            .keep(outputs, self.batch, ids.ncols(), runtime.name())
    }
}

/// No state: a variable-length model re-run on every token fed so far.
pub(crate) struct Prefix {
    batch: usize,
    /// Every token fed so far, [batch, P].
    history: Array2<i64>,
    last: LastLogits,
}

impl Prefix {
    /// No tokens yet, for `batch` sequences.
    fn new(batch: usize) -> Prefix {
        Prefix {
            batch,
            history: Array2::zeros((batch, 0)),
            last: LastLogits::default(),
        }
    }

    fn reset(&mut self) {
        self.history = Array2::zeros((self.batch, 0));
        self.last.clear();
    }

    fn run(&mut self, runtime: &mut dyn Runtime, ids: ArrayView2<i64>) -> Result<()> {
        let mut all = self.history.clone();
        all.append(Axis(1), ids)
            .map_err(|e| Error::Internal(e.to_string()))?;
        let outputs = runtime.run(&[NamedTensor {
            name: INPUT_IDS.into(),
            value: TensorValue::I64(all.clone().into_dyn()),
        }])?;
        self.last
            .keep(outputs, self.batch, ids.ncols(), runtime.name())?;
        self.history = all;
        Ok(())
    }
}

/// The logits of the last run's new tokens [batch, T, vocab], kept on the host by the forms
/// whose runs return them (all but [`BoundState`], whose session keeps its own).
#[derive(Default)]
struct LastLogits(Option<Array3<f32>>);

impl LastLogits {
    /// Keeps the logits of the last `t` positions of a run's `outputs` [batch, ≥ t, vocab].
    fn keep(
        &mut self,
        outputs: Vec<NamedTensor>,
        batch: usize,
        t: usize,
        runtime: &str,
    ) -> Result<()> {
        self.0 = Some(new_logits(outputs, batch, t).ok_or_else(|| missing_logits(runtime))?);
        Ok(())
    }

    /// Forgets them (a new generation).
    fn clear(&mut self) {
        self.0 = None;
    }

    /// All of them, [batch, T, vocab].
    fn all(&self) -> Result<Array3<f32>> {
        self.0.clone().ok_or_else(no_run)
    }

    /// Row `rows[b]` of each sequence b, [batch, vocab].
    fn at(&self, rows: &[usize]) -> Result<Array2<f32>> {
        Ok(rows_of(self.0.as_ref().ok_or_else(no_run)?, rows))
    }
}

/// Row `rows[b]` of each sequence b of `logits` [batch, T, vocab], [batch, vocab].
fn rows_of(logits: &Array3<f32>, rows: &[usize]) -> Array2<f32> {
    let vocab = logits.dim().2;
    Array2::from_shape_fn((rows.len(), vocab), |(b, v)| logits[[b, rows[b], v]])
}

/// The logits of the last `t` positions of a run's `outputs`, [batch, t, vocab].
fn new_logits(outputs: Vec<NamedTensor>, batch: usize, t: usize) -> Option<Array3<f32>> {
    let logits = outputs.into_iter().find(|o| o.name == LOGITS)?;
    let TensorValue::F32(logits) = logits.value else {
        return None;
    };
    let logits: Array3<f32> = logits.into_dimensionality().ok()?;
    let total = logits.dim().1;
    if total < t || logits.dim().0 != batch {
        return None;
    }
    Some(if total == t {
        logits
    } else {
        logits.slice(s![.., total - t.., ..]).to_owned()
    })
}

/// Logits asked before any run.
fn no_run() -> Error {
    Error::Internal("logits read before any run".into())
}

fn missing_logits(runtime: &str) -> Error {
    Error::RuntimeFailed {
        runtime: runtime.to_string(),
        reason: format!("the model returned no usable output {LOGITS}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generation::model::DecodingModel;
    use crate::runtime::testing::write_tiny;
    use crate::runtime::{open, RuntimeKind, RuntimeOptions};

    /// A carried state on tract (its own values) grows by the rows of each run, and a run the
    /// runtime refuses leaves it as it was (what `Runtime::run_carrying` promises).
    #[test]
    fn a_carried_state_grows_by_each_run_and_survives_a_failed_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_tiny(dir.path(), SequenceMode::Growing);
        let model = DecodingModel::read(&path).unwrap();
        let runtime = open(RuntimeKind::Tract, &path, &RuntimeOptions::default()).unwrap();
        let mut engine = Engine::Runs(runtime);
        let mut state = State::new(&mut engine, &model, 1).unwrap();
        assert!(matches!(state, State::Carried(_)));
        let rows = |state: &mut State, engine: &mut Engine| -> Vec<usize> {
            state
                .tensors(engine)
                .unwrap()
                .iter()
                .map(|t| t.value.shape()[1])
                .collect()
        };
        let e = &mut engine;
        assert!(rows(&mut state, e).iter().all(|&r| r == 0));
        state
            .run(e, ndarray::array![[1i64, 2, 3]].view(), &[0])
            .unwrap();
        assert_eq!(state.logits(e).unwrap().dim(), (1, 3, model.vocab_size));
        let after_prompt = state.tensors(e).unwrap();
        assert!(rows(&mut state, e).iter().all(|&r| r == 3));
        // Two sequences where the state holds one: tract refuses the run.
        assert!(state
            .run(e, ndarray::array![[4i64], [5]].view(), &[3, 3])
            .is_err());
        assert_eq!(state.tensors(e).unwrap(), after_prompt);
        state.run(e, ndarray::array![[4i64]].view(), &[3]).unwrap();
        assert!(rows(&mut state, e).iter().all(|&r| r == 4));
        state.reset(e).unwrap();
        assert!(rows(&mut state, e).iter().all(|&r| r == 0));
    }

    /// A static state on tract moves into each run (its rows are written in place), so a
    /// run that fails inside the graph (a position past the model's rows, caught by its
    /// checked `Gather`) spends it: the next run is refused, naming the spent state, and a
    /// reset starts again.
    #[test]
    fn a_static_state_spent_by_a_failed_tract_run_is_refused_until_reset() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_tiny(dir.path(), SequenceMode::Static);
        let model = DecodingModel::read(&path).unwrap();
        let n = model.info.max_sequence as i64;
        let runtime = open(RuntimeKind::Tract, &path, &RuntimeOptions::default()).unwrap();
        let mut engine = Engine::Runs(runtime);
        let e = &mut engine;
        let mut state = State::new(e, &model, 1).unwrap();
        state
            .run(e, ndarray::array![[1i64, 2]].view(), &[0])
            .unwrap();
        state.run(e, ndarray::array![[3i64]].view(), &[2]).unwrap();
        assert!(state
            .run(e, ndarray::array![[4i64]].view(), &[n + 5])
            .is_err());
        let again = state
            .run(e, ndarray::array![[4i64]].view(), &[3])
            .unwrap_err();
        assert!(
            matches!(&again, Error::RuntimeFailed { reason, .. } if reason.contains("spent")),
            "{again:?}"
        );
        state.reset(e).unwrap();
        state
            .run(e, ndarray::array![[1i64, 2]].view(), &[0])
            .unwrap();
        assert_eq!(state.logits(e).unwrap().dim(), (1, 2, model.vocab_size));
    }
}
