//! Where a [`Decoder`](crate::generation::Decoder)'s model runs and what it keeps between
//! runs, apart from the decoder (as onnxruntime-genai keeps its `KV_Cache` apart from the
//! session): one [`State`] implementation per form of the state. The `past_*` values fed
//! back every run, as [`HostArrays`] (tract) or as [`EngineValues`], the engine's own
//! output values ([`CarriedState`]: ONNX Runtime's, fed back without a copy); [`Bound`]: a
//! static state in buffers bound once to the session and written in place
//! ([`StaticSession`]); [`Prefix`]: no state, every token fed so far re-run (a
//! variable-length model). The decoder holds one of them and never asks which.

use ndarray::{s, Array1, Array2, Array3, ArrayD, ArrayView2, Axis, IxDyn};

use crate::error::{Error, Result};
use crate::gmlp::decoding::StateTensor;
use crate::gmlp::decoding::{DecodingInfo, SequenceMode, POSITION};
use crate::gmlp::emit::{INPUT_IDS, LOGITS};
use crate::runtime::{missing_output, CarriedState, Runtime, StaticSession};
use crate::tensor::{NamedTensor, TensorValue};

/// A model's runs and the state they keep, in one form.
pub trait State {
    /// The runtime's name.
    fn runtime_name(&self) -> &str;
    /// What the runtime does differently from running the file as it is
    /// ([`Runtime::note`], [`StaticSession::note`]).
    fn note(&self) -> Option<String>;
    /// Whether runs write the state in place.
    fn in_place(&self) -> bool;
    /// Forgets every token: zeros for a static state, no rows for a growing one.
    fn reset(&mut self) -> Result<()>;
    /// Runs `ids` [batch, T] at each sequence's `positions` \[batch\] (checked by the
    /// decoder), keeping the logits of the T new positions.
    fn run(&mut self, ids: ArrayView2<i64>, positions: &[i64]) -> Result<()>;
    /// The last run's logits [batch, T, vocab].
    fn logits(&mut self) -> Result<Array3<f32>>;
    /// The last run's logits at row `rows[b]` of each sequence b, [batch, vocab].
    fn logits_at(&mut self, rows: &[usize]) -> Result<Array2<f32>>;
    /// The greedy next ids picked by the run itself where the logits are; `None` where
    /// the caller picks from [`State::logits_at`].
    fn greedy(&mut self) -> Result<Option<Vec<i64>>>;
    /// A host copy of the state (`past_*` tensors); empty without state.
    fn tensors(&mut self) -> Result<Vec<NamedTensor>>;
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

/// A with-past model's state carried from run to run as host arrays (tract: a runtime
/// without values of its own): each run's `present_*` outputs become the next run's
/// `past_*` inputs (a growing state gains the run's rows; a static state is copied whole
/// by the graph's scatter).
pub struct HostArrays {
    runtime: Box<dyn Runtime>,
    info: DecodingInfo,
    batch: usize,
    /// `past_*` values to feed next, in model order.
    past: Vec<NamedTensor>,
    last: LastLogits,
}

impl HostArrays {
    /// An empty state of the model `info` describes, for `batch` sequences on `runtime`.
    pub fn new(runtime: Box<dyn Runtime>, info: DecodingInfo, batch: usize) -> HostArrays {
        HostArrays {
            past: empty_past(&info, batch),
            runtime,
            info,
            batch,
            last: LastLogits::default(),
        }
    }
}

impl State for HostArrays {
    fn runtime_name(&self) -> &str {
        self.runtime.name()
    }

    fn note(&self) -> Option<String> {
        self.runtime.note()
    }

    fn in_place(&self) -> bool {
        false
    }

    fn reset(&mut self) -> Result<()> {
        self.past = empty_past(&self.info, self.batch);
        self.last.clear();
        Ok(())
    }

    fn run(&mut self, ids: ArrayView2<i64>, positions: &[i64]) -> Result<()> {
        let mut feed = step_inputs(&self.info, ids, positions);
        let given = feed.len();
        feed.append(&mut self.past);
        let name = self.runtime.name().to_string();
        let rest = match self
            .runtime
            .run(&feed)
            .and_then(|outputs| split_carried(&name, outputs, &self.info.state))
        {
            Ok((past, rest)) => {
                self.past = past;
                rest
            }
            Err(e) => {
                // The state is unchanged: the values fed go back.
                self.past = feed.split_off(given);
                return Err(e);
            }
        };
        self.last.keep(rest, self.batch, ids.ncols(), &name)?;
        Ok(())
    }

    fn logits(&mut self) -> Result<Array3<f32>> {
        self.last.all(self.runtime.name())
    }

    fn logits_at(&mut self, rows: &[usize]) -> Result<Array2<f32>> {
        self.last.at(rows, self.runtime.name())
    }

    fn greedy(&mut self) -> Result<Option<Vec<i64>>> {
        Ok(None)
    }

    fn tensors(&mut self) -> Result<Vec<NamedTensor>> {
        Ok(self.past.clone())
    }
}

/// Splits a run's `outputs` into the carried ones (renamed present → past, in `carry`
/// order) and the rest (in their order).
fn split_carried(
    runtime: &str,
    outputs: Vec<NamedTensor>,
    carry: &[StateTensor],
) -> Result<(Vec<NamedTensor>, Vec<NamedTensor>)> {
    let mut rest = outputs;
    let mut kept = Vec::with_capacity(carry.len());
    for s in carry {
        let k = rest
            .iter()
            .position(|o| o.name == s.present)
            .ok_or_else(|| missing_output(runtime, &s.present))?;
        kept.push(NamedTensor {
            name: s.past.clone(),
            value: rest.remove(k).value,
        });
    }
    Ok((kept, rest))
}

/// A with-past model's state carried from run to run in the engine's own values
/// ([`Runtime::run_carrying`]: ONNX Runtime's output values, on the host or the CUDA
/// device, fed back without a copy).
pub struct EngineValues {
    runtime: Box<dyn Runtime>,
    info: DecodingInfo,
    batch: usize,
    /// `past_*` values to feed next.
    state: CarriedState,
    last: LastLogits,
}

impl EngineValues {
    /// An empty state of the model `info` describes, for `batch` sequences on `runtime`
    /// (one that [carries its own values](Runtime::carries_own_values)).
    pub fn new(runtime: Box<dyn Runtime>, info: DecodingInfo, batch: usize) -> EngineValues {
        EngineValues {
            state: CarriedState::host(empty_past(&info, batch)),
            runtime,
            info,
            batch,
            last: LastLogits::default(),
        }
    }
}

impl State for EngineValues {
    fn runtime_name(&self) -> &str {
        self.runtime.name()
    }

    fn note(&self) -> Option<String> {
        self.runtime.note()
    }

    fn in_place(&self) -> bool {
        false
    }

    fn reset(&mut self) -> Result<()> {
        self.state = CarriedState::host(empty_past(&self.info, self.batch));
        self.last.clear();
        Ok(())
    }

    fn run(&mut self, ids: ArrayView2<i64>, positions: &[i64]) -> Result<()> {
        let inputs = step_inputs(&self.info, ids, positions);
        let outputs = self
            .runtime
            .run_carrying(&inputs, &mut self.state, &self.info.state)?;
        self.last
            .keep(outputs, self.batch, ids.ncols(), self.runtime.name())?;
        Ok(())
    }

    fn logits(&mut self) -> Result<Array3<f32>> {
        self.last.all(self.runtime.name())
    }

    fn logits_at(&mut self, rows: &[usize]) -> Result<Array2<f32>> {
        self.last.at(rows, self.runtime.name())
    }

    fn greedy(&mut self) -> Result<Option<Vec<i64>>> {
        Ok(None)
    }

    fn tensors(&mut self) -> Result<Vec<NamedTensor>> {
        self.state.to_host()
    }
}

/// A static state in buffers bound once to an engine's session, written in place.
pub struct Bound(pub Box<dyn StaticSession>);

impl State for Bound {
    fn runtime_name(&self) -> &str {
        self.0.name()
    }

    fn note(&self) -> Option<String> {
        self.0.note()
    }

    fn in_place(&self) -> bool {
        true
    }

    fn reset(&mut self) -> Result<()> {
        self.0.reset()
    }

    fn run(&mut self, ids: ArrayView2<i64>, positions: &[i64]) -> Result<()> {
        self.0.run(ids, positions)
    }

    fn logits(&mut self) -> Result<Array3<f32>> {
        self.0.logits()
    }

    fn logits_at(&mut self, rows: &[usize]) -> Result<Array2<f32>> {
        self.0.logits_at(rows)
    }

    fn greedy(&mut self) -> Result<Option<Vec<i64>>> {
        self.0.greedy()
    }

    fn tensors(&mut self) -> Result<Vec<NamedTensor>> {
        self.0.state()
    }
}

/// No state: a variable-length model re-run on every token fed so far.
pub struct Prefix {
    runtime: Box<dyn Runtime>,
    batch: usize,
    /// Every token fed so far, [batch, P].
    history: Array2<i64>,
    last: LastLogits,
}

impl Prefix {
    /// No tokens yet, for `batch` sequences on `runtime`.
    pub fn new(runtime: Box<dyn Runtime>, batch: usize) -> Prefix {
        Prefix {
            runtime,
            batch,
            history: Array2::zeros((batch, 0)),
            last: LastLogits::default(),
        }
    }
}

impl State for Prefix {
    fn runtime_name(&self) -> &str {
        self.runtime.name()
    }

    fn note(&self) -> Option<String> {
        self.runtime.note()
    }

    fn in_place(&self) -> bool {
        false
    }

    fn reset(&mut self) -> Result<()> {
        self.history = Array2::zeros((self.batch, 0));
        self.last.clear();
        Ok(())
    }

    fn run(&mut self, ids: ArrayView2<i64>, _positions: &[i64]) -> Result<()> {
        let mut all = self.history.clone();
        all.append(Axis(1), ids)
            .map_err(|e| Error::Internal(e.to_string()))?;
        let outputs = self.runtime.run(&[NamedTensor {
            name: INPUT_IDS.into(),
            value: TensorValue::I64(all.clone().into_dyn()),
        }])?;
        self.last
            .keep(outputs, self.batch, ids.ncols(), self.runtime.name())?;
        self.history = all;
        Ok(())
    }

    fn logits(&mut self) -> Result<Array3<f32>> {
        self.last.all(self.runtime.name())
    }

    fn logits_at(&mut self, rows: &[usize]) -> Result<Array2<f32>> {
        self.last.at(rows, self.runtime.name())
    }

    fn greedy(&mut self) -> Result<Option<Vec<i64>>> {
        Ok(None)
    }

    fn tensors(&mut self) -> Result<Vec<NamedTensor>> {
        Ok(Vec::new())
    }
}

/// The logits of the last run's new tokens [batch, T, vocab], kept on the host by the forms
/// whose runs return them (all but [`Bound`], whose session keeps its own).
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
    fn all(&self, runtime: &str) -> Result<Array3<f32>> {
        self.0.clone().ok_or_else(|| missing_logits(runtime))
    }

    /// Row `rows[b]` of each sequence b, [batch, vocab].
    fn at(&self, rows: &[usize], runtime: &str) -> Result<Array2<f32>> {
        let last = self.0.as_ref().ok_or_else(|| missing_logits(runtime))?;
        Ok(rows_of(last, rows))
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

    /// Host arrays grow by the rows of each run, and a run the runtime refuses leaves them
    /// as they were (what `Runtime::run_carrying` promises of the engine's own values).
    #[test]
    fn host_arrays_grow_by_each_run_and_survive_a_failed_one() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_tiny(dir.path(), SequenceMode::Growing);
        let model = DecodingModel::read(&path).unwrap();
        let runtime = open(RuntimeKind::Tract, &path, &RuntimeOptions::default()).unwrap();
        assert!(!runtime.carries_own_values());
        let mut state = HostArrays::new(runtime, model.info.clone(), 1);
        let rows = |state: &mut HostArrays| -> Vec<usize> {
            state
                .tensors()
                .unwrap()
                .iter()
                .map(|t| t.value.shape()[1])
                .collect()
        };
        assert!(rows(&mut state).iter().all(|&r| r == 0));
        state
            .run(ndarray::array![[1i64, 2, 3]].view(), &[0])
            .unwrap();
        assert_eq!(state.logits().unwrap().dim(), (1, 3, model.vocab_size));
        let after_prompt = state.tensors().unwrap();
        assert!(rows(&mut state).iter().all(|&r| r == 3));
        // Two sequences where the state holds one: tract refuses the run.
        assert!(state
            .run(ndarray::array![[4i64], [5]].view(), &[3, 3])
            .is_err());
        assert_eq!(state.tensors().unwrap(), after_prompt);
        state.run(ndarray::array![[4i64]].view(), &[3]).unwrap();
        assert!(rows(&mut state).iter().all(|&r| r == 4));
        state.reset().unwrap();
        assert!(rows(&mut state).iter().all(|&r| r == 0));
    }
}
