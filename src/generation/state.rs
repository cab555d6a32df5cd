//! Where a [`Decoder`](crate::generation::Decoder)'s model runs and what it keeps between
//! runs, apart from the decoder (as onnxruntime-genai keeps its `KV_Cache` apart from the
//! session): one [`State`] implementation per form of the state. [`Carried`]: the
//! `past_*` values fed back every run, in the engine's own form ([`CarriedState`]: host
//! arrays on tract, ONNX Runtime's output values on ONNX Runtime); [`Bound`]: a
//! static state in buffers bound once to the session and written in place
//! ([`StaticSession`]); [`Prefix`]: no state, every token fed so far re-run (a
//! variable-length model). The decoder holds one of them and never asks which.

use ndarray::{s, Array1, Array2, Array3, ArrayD, ArrayView2, Axis, IxDyn};

use crate::error::{Error, Result};
use crate::gmlp::decoding::{DecodingInfo, SequenceMode, POSITION};
use crate::gmlp::emit::{INPUT_IDS, LOGITS};
use crate::runtime::{CarriedState, Runtime, StaticSession};
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
    /// Runs `ids` [batch, T] at each sequence's `positions` [batch] (checked by the
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

/// The state of a with-past model carried from run to run: each run's `present_*`
/// outputs fed back as the next run's `past_*` inputs (a growing state gains the run's
/// rows; a static state is copied whole by the graph's scatter), in the form the engine
/// made them ([`Runtime::run_carrying`]).
pub struct Carried {
    runtime: Box<dyn Runtime>,
    info: DecodingInfo,
    batch: usize,
    /// `past_*` values to feed next.
    state: CarriedState,
    /// The logits of the last run's new tokens [batch, T, vocab].
    last: Option<Array3<f32>>,
}

impl Carried {
    /// An empty state (no rows, or zeros for a static one) of the model `info` describes,
    /// for `batch` sequences on `runtime`.
    pub fn new(runtime: Box<dyn Runtime>, info: DecodingInfo, batch: usize) -> Carried {
        let mut carried = Carried {
            runtime,
            info,
            batch,
            state: CarriedState::default(),
            last: None,
        };
        carried.empty();
        carried
    }

    fn empty(&mut self) {
        let rows = match self.info.mode {
            SequenceMode::Static => self.info.max_sequence,
            _ => 0,
        };
        let batch = self.batch;
        self.last = None;
        self.state = CarriedState::host(
            self.info
                .state
                .iter()
                .map(|s| NamedTensor {
                    name: s.past.clone(),
                    value: TensorValue::F32(ArrayD::zeros(IxDyn(&[batch, rows, s.width]))),
                })
                .collect(),
        );
    }
}

impl State for Carried {
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
        self.empty();
        Ok(())
    }

    fn run(&mut self, ids: ArrayView2<i64>, positions: &[i64]) -> Result<()> {
        let mut inputs = vec![NamedTensor {
            name: INPUT_IDS.into(),
            value: TensorValue::I64(ids.to_owned().into_dyn()),
        }];
        if self.info.mode == SequenceMode::Static {
            inputs.push(NamedTensor {
                name: POSITION.into(),
                value: TensorValue::I64(Array1::from(positions.to_vec()).into_dyn()),
            });
        }
        // The state stays in the runtime's own form (ONNX Runtime: its output values, fed
        // back without a copy).
        let outputs = self
            .runtime
            .run_carrying(&inputs, &mut self.state, &self.info.state)?;
        self.last = Some(
            new_logits(outputs, self.batch, ids.ncols())
                .ok_or_else(|| missing_logits(self.runtime.name()))?,
        );
        Ok(())
    }

    fn logits(&mut self) -> Result<Array3<f32>> {
        self.last
            .clone()
            .ok_or_else(|| missing_logits(self.runtime.name()))
    }

    fn logits_at(&mut self, rows: &[usize]) -> Result<Array2<f32>> {
        let last = self
            .last
            .as_ref()
            .ok_or_else(|| missing_logits(self.runtime.name()))?;
        Ok(rows_of(last, rows))
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
    /// The logits of the last run's new tokens [batch, T, vocab].
    last: Option<Array3<f32>>,
}

impl Prefix {
    /// No tokens yet, for `batch` sequences on `runtime`.
    pub fn new(runtime: Box<dyn Runtime>, batch: usize) -> Prefix {
        Prefix {
            runtime,
            batch,
            history: Array2::zeros((batch, 0)),
            last: None,
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
        self.last = None;
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
        self.last = Some(
            new_logits(outputs, self.batch, ids.ncols())
                .ok_or_else(|| missing_logits(self.runtime.name()))?,
        );
        self.history = all;
        Ok(())
    }

    fn logits(&mut self) -> Result<Array3<f32>> {
        self.last
            .clone()
            .ok_or_else(|| missing_logits(self.runtime.name()))
    }

    fn logits_at(&mut self, rows: &[usize]) -> Result<Array2<f32>> {
        let last = self
            .last
            .as_ref()
            .ok_or_else(|| missing_logits(self.runtime.name()))?;
        Ok(rows_of(last, rows))
    }

    fn greedy(&mut self) -> Result<Option<Vec<i64>>> {
        Ok(None)
    }

    fn tensors(&mut self) -> Result<Vec<NamedTensor>> {
        Ok(Vec::new())
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
