//! Incremental decoding of a causal token model on any [`Runtime`]: a [`Decoder`] feeds
//! new tokens and carries the state. A `--with-past` model gets its `present_*` outputs
//! back as `past_*` inputs (position P = tokens fed so far); a variable-length model
//! without state is re-run on the whole prefix every time (what the state avoids).
//!
//! Checked before any run: token ids within the vocabulary, P + T ≤ n.

use std::path::Path;

use ndarray::{s, Array2, Array3, ArrayD, ArrayView2, Axis, IxDyn};

use crate::error::{Error, Result};
use crate::gmlp::decoding::{DecodingInfo, SequenceMode};
use crate::gmlp::emit::{INPUT_IDS, LOGITS};
use crate::gmlp::metadata::{parse_config, CONFIG_KEY, DECODING_KEY};
use crate::gmlp::Task;
use crate::onnx::proto::ModelProto;
use crate::onnx::reader::{metadata_value, read_model};
use crate::runtime::{open, CarriedState, Runtime, RuntimeKind, RuntimeOptions};
use crate::tensor::{NamedTensor, TensorValue};

/// What a model says about decoding: how it was emitted and its vocabulary.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodingModel {
    /// Mode, n and state names.
    pub info: DecodingInfo,
    /// Vocabulary size.
    pub vocab_size: usize,
}

impl DecodingModel {
    /// Reads the decoding description from our metadata; `None` for fixed-length models
    /// and files not written by this tool.
    pub fn of(model: &ModelProto) -> Option<DecodingModel> {
        let info = metadata_value(model, DECODING_KEY).and_then(DecodingInfo::parse)?;
        let cfg = metadata_value(model, CONFIG_KEY).and_then(parse_config)?;
        match cfg.task {
            Task::Tokens { vocab_size, .. } => Some(DecodingModel { info, vocab_size }),
            Task::Vision { .. } | Task::Backbone { .. } => None,
        }
    }

    /// Reads `path` and requires a causal token model that can decode (variable length
    /// or with past), naming the fix otherwise.
    pub fn read(path: &Path) -> Result<DecodingModel> {
        let model = read_model(path)?;
        DecodingModel::of(&model).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "{} is not a causal token model built by gmlp-onnx with a variable length or --with-past (rebuild it with `build --causal --with-past`)",
                path.display()
            ))
        })
    }
}

/// Feeds tokens to a causal token model and keeps its state between calls.
pub struct Decoder {
    runtime: Box<dyn Runtime>,
    model: DecodingModel,
    batch: usize,
    /// `past_*` values to feed next (with-past models), in the runtime's own form.
    state: CarriedState,
    /// (present, past) name pairs of the state.
    carry: Vec<(String, String)>,
    /// Every token fed so far, [batch, P] (re-run for models without state).
    history: Array2<i64>,
}

impl Decoder {
    /// Opens `path` in `kind` for decoding `batch` sequences at once.
    pub fn open(
        kind: RuntimeKind,
        path: &Path,
        options: &RuntimeOptions,
        batch: usize,
    ) -> Result<Decoder> {
        let model = DecodingModel::read(path)?;
        let runtime = open(kind, path, options)?;
        Ok(Decoder::new(runtime, model, batch))
    }

    /// A decoder over an already loaded runtime.
    pub fn new(runtime: Box<dyn Runtime>, model: DecodingModel, batch: usize) -> Decoder {
        let carry = model
            .info
            .state
            .iter()
            .map(|s| (s.present.clone(), s.past.clone()))
            .collect();
        let mut d = Decoder {
            runtime,
            model,
            batch,
            state: CarriedState::default(),
            carry,
            history: Array2::zeros((batch, 0)),
        };
        d.reset();
        d
    }

    /// Forgets every token: the next [`Decoder::feed`] is a prompt (empty past).
    pub fn reset(&mut self) {
        self.history = Array2::zeros((self.batch, 0));
        self.state = CarriedState::host(
            self.model
                .info
                .state
                .iter()
                .map(|s| NamedTensor {
                    name: s.past.clone(),
                    value: TensorValue::F32(ArrayD::zeros(IxDyn(&[self.batch, 0, s.width]))),
                })
                .collect(),
        );
    }

    /// Tokens fed so far (the position of the next token).
    pub fn position(&self) -> usize {
        self.history.ncols()
    }

    /// The model's description.
    pub fn model(&self) -> &DecodingModel {
        &self.model
    }

    /// The runtime's name.
    pub fn runtime_name(&self) -> &str {
        self.runtime.name()
    }

    /// A copy of the current state (`past_*` tensors, the last run's `present_*`); empty
    /// for models without state.
    pub fn state(&self) -> Result<Vec<NamedTensor>> {
        self.state.to_host()
    }

    /// Checks `ids` [batch, T] against the batch, the vocabulary and the n − P positions left.
    pub fn check(&self, ids: ArrayView2<i64>) -> Result<()> {
        let (b, t) = ids.dim();
        let n = self.model.info.max_sequence;
        if b != self.batch || t == 0 {
            return Err(Error::InvalidArgument(format!(
                "expected token ids of shape [{}, T ≥ 1], got [{b}, {t}]",
                self.batch
            )));
        }
        if self.position() + t > n {
            return Err(Error::InvalidArgument(format!(
                "{} tokens after the {} already fed would pass the model's {n} positions",
                t,
                self.position()
            )));
        }
        let vocab = self.model.vocab_size;
        if let Some(bad) = ids.iter().find(|&&id| id < 0 || id as usize >= vocab) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary 0..{vocab}"
            )));
        }
        Ok(())
    }

    /// Feeds `ids` [batch, T] and returns the logits of those T positions [batch, T, vocab].
    pub fn feed(&mut self, ids: ArrayView2<i64>) -> Result<Array3<f32>> {
        self.check(ids)?;
        let t = ids.ncols();
        let mut history = self.history.clone();
        history.append(Axis(1), ids).map_err(internal)?;
        let with_past = self.model.info.mode == SequenceMode::WithPast;
        let fed = if with_past {
            ids.to_owned()
        } else {
            history.clone()
        };
        let inputs = [NamedTensor {
            name: INPUT_IDS.into(),
            value: TensorValue::I64(fed.into_dyn()),
        }];
        let outputs = if with_past {
            // The state stays in the runtime's own form (ONNX Runtime: its output values,
            // fed back without a copy).
            self.runtime
                .run_carrying(&inputs, &mut self.state, &self.carry)?
        } else {
            self.runtime.run(&inputs)?
        };
        let logits = outputs
            .into_iter()
            .find(|o| o.name == LOGITS)
            .ok_or_else(|| self.missing(LOGITS))?;
        let TensorValue::F32(logits) = logits.value else {
            return Err(self.missing(LOGITS));
        };
        let logits: Array3<f32> = logits.into_dimensionality().map_err(internal)?;
        let total = logits.dim().1;
        if total < t {
            return Err(self.missing(LOGITS));
        }
        let new_logits = if total == t {
            logits
        } else {
            logits.slice(s![.., total - t.., ..]).to_owned()
        };
        self.history = history;
        Ok(new_logits)
    }

    fn missing(&self, output: &str) -> Error {
        Error::RuntimeFailed {
            runtime: self.runtime.name().to_string(),
            reason: format!("the model returned no usable output {output}"),
        }
    }
}

fn internal(e: impl std::fmt::Display) -> Error {
    Error::Internal(e.to_string())
}
