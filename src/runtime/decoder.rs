//! Incremental decoding of a causal token model on any [`Runtime`]: a [`Decoder`] feeds
//! new tokens and carries the state. A `--with-past` model gets its `present_*` outputs
//! back as `past_*` inputs; a growing-state model (position P = tokens fed so far, one P
//! for the whole batch) takes them as they are, a static-state model (fixed [batch, n, ·]
//! state, one position per sequence, docs/static-state.md) has them written in place
//! where the runtime and the file allow it ([`Runtime::run_in_place`]). A variable-length
//! model without state is re-run on the whole prefix every time (what the state avoids).
//!
//! Checked before any run: token ids within the vocabulary, P + T ≤ n for every sequence.

use std::path::Path;

use ndarray::{s, Array1, Array2, Array3, ArrayD, ArrayView2, Axis, IxDyn};

use crate::error::{Error, Result};
use crate::gmlp::decoding::{DecodingInfo, SequenceMode, POSITION};
use crate::gmlp::emit::{INPUT_IDS, LOGITS};
use crate::gmlp::metadata::{parse_config, CONFIG_KEY, DECODING_KEY};
use crate::gmlp::Task;
use crate::onnx::proto::ModelProto;
use crate::onnx::reader::{metadata_value, read_model, updates_in_place};
use crate::runtime::{open, CarriedState, Runtime, RuntimeKind, RuntimeOptions};
use crate::tensor::{NamedTensor, TensorValue};

/// What a model says about decoding: how it was emitted and its vocabulary.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodingModel {
    /// Mode, n and state names.
    pub info: DecodingInfo,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// A static-state model whose graph writes every `present_*` by a scatter that is the
    /// only reader of its `past_*` ([`updates_in_place`]), so the two may share a buffer.
    pub in_place: bool,
}

impl DecodingModel {
    /// Reads the decoding description from our metadata; `None` for fixed-length models
    /// and files not written by this tool.
    pub fn of(model: &ModelProto) -> Option<DecodingModel> {
        let info = metadata_value(model, DECODING_KEY).and_then(DecodingInfo::parse)?;
        let cfg = metadata_value(model, CONFIG_KEY).and_then(parse_config)?;
        let in_place = info.mode == SequenceMode::Static
            && info
                .state
                .iter()
                .all(|s| updates_in_place(model, &s.past, &s.present));
        match cfg.task {
            Task::Tokens { vocab_size, .. } => Some(DecodingModel {
                info,
                vocab_size,
                in_place,
            }),
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
    /// Tokens fed so far to each sequence (the position of its next token).
    positions: Vec<usize>,
    /// Every token fed so far, [batch, P] (variable-length models re-run it).
    history: Array2<i64>,
    /// Whether a static-state model's state may be written in place (on unless
    /// [`Decoder::set_in_place`] turned it off).
    in_place: bool,
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
            positions: vec![0; batch],
            history: Array2::zeros((batch, 0)),
            in_place: true,
        };
        d.reset();
        d
    }

    /// Forgets every token: the next [`Decoder::feed`] is a prompt (empty or zero state).
    pub fn reset(&mut self) {
        self.history = Array2::zeros((self.batch, 0));
        self.positions = vec![0; self.batch];
        let rows = match self.model.info.mode {
            SequenceMode::Static => self.model.info.max_sequence,
            _ => 0,
        };
        self.state = CarriedState::host(
            self.model
                .info
                .state
                .iter()
                .map(|s| NamedTensor {
                    name: s.past.clone(),
                    value: TensorValue::F32(ArrayD::zeros(IxDyn(&[self.batch, rows, s.width]))),
                })
                .collect(),
        );
    }

    /// Lets a static-state model's state be written in place (the default) or not (the
    /// runtime then copies it every run, as a plain loop over the file does; for
    /// measuring what writing in place saves).
    pub fn set_in_place(&mut self, allowed: bool) {
        self.in_place = allowed;
    }

    /// Whether runs write the state in place: a static-state file whose updates allow it
    /// ([`DecodingModel::in_place`]), on a runtime that does it, and not turned off.
    pub fn in_place(&self) -> bool {
        self.in_place && self.model.in_place && self.runtime.writes_in_place()
    }

    /// Tokens fed so far to the first sequence (the position of its next token).
    pub fn position(&self) -> usize {
        self.positions.first().copied().unwrap_or(0)
    }

    /// Tokens fed so far to each sequence.
    pub fn positions(&self) -> &[usize] {
        &self.positions
    }

    /// The model's description.
    pub fn model(&self) -> &DecodingModel {
        &self.model
    }

    /// The runtime's name.
    pub fn runtime_name(&self) -> &str {
        self.runtime.name()
    }

    /// What the runtime does differently from running the file as it is
    /// ([`Runtime::note`]).
    pub fn runtime_note(&self) -> Option<String> {
        self.runtime.note()
    }

    /// A copy of the current state (`past_*` tensors, the last run's `present_*`); empty
    /// for models without state.
    pub fn state(&self) -> Result<Vec<NamedTensor>> {
        self.state.to_host()
    }

    /// Checks `ids` [batch, T] against the batch, the vocabulary and the n − P positions
    /// left to each sequence.
    pub fn check(&self, ids: ArrayView2<i64>) -> Result<()> {
        let (b, t) = ids.dim();
        let n = self.model.info.max_sequence;
        if b != self.batch || t == 0 {
            return Err(Error::InvalidArgument(format!(
                "expected token ids of shape [{}, T ≥ 1], got [{b}, {t}]",
                self.batch
            )));
        }
        if let Some(&p) = self.positions.iter().find(|&&p| p + t > n) {
            return Err(Error::InvalidArgument(format!(
                "{t} tokens after the {p} already fed would pass the model's {n} positions"
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

    /// Feeds `ids` [batch, T], T tokens to every sequence at its own position, and returns
    /// the logits of those T positions [batch, T, vocab].
    pub fn feed(&mut self, ids: ArrayView2<i64>) -> Result<Array3<f32>> {
        self.check(ids)?;
        let t = ids.ncols();
        let mode = self.model.info.mode;
        if mode != SequenceMode::Static && self.positions.iter().any(|&p| p != self.position()) {
            return Err(Error::Internal(
                "sequences at different positions in a model whose state is one length".into(),
            ));
        }
        let mut history = self.history.clone();
        if mode == SequenceMode::Variable {
            history.append(Axis(1), ids).map_err(internal)?;
        }
        let fed = if mode == SequenceMode::Variable {
            history.clone()
        } else {
            ids.to_owned()
        };
        let mut inputs = vec![NamedTensor {
            name: INPUT_IDS.into(),
            value: TensorValue::I64(fed.into_dyn()),
        }];
        if mode == SequenceMode::Static {
            let position: Array1<i64> = self.positions.iter().map(|&p| p as i64).collect();
            inputs.push(NamedTensor {
                name: POSITION.into(),
                value: TensorValue::I64(position.into_dyn()),
            });
        }
        let outputs = match mode {
            SequenceMode::Static if self.in_place() => {
                self.runtime
                    .run_in_place(&inputs, &mut self.state, &self.carry)?
            }
            // The state stays in the runtime's own form (ONNX Runtime: its output values,
            // fed back without a copy).
            SequenceMode::Static | SequenceMode::WithPast => {
                self.runtime
                    .run_carrying(&inputs, &mut self.state, &self.carry)?
            }
            SequenceMode::Variable | SequenceMode::Fixed => self.runtime.run(&inputs)?,
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
        if total < t || logits.dim().0 != self.batch {
            return Err(self.missing(LOGITS));
        }
        let new_logits = if total == t {
            logits
        } else {
            logits.slice(s![.., total - t.., ..]).to_owned()
        };
        self.history = history;
        for p in &mut self.positions {
            *p += t;
        }
        Ok(new_logits)
    }

    /// Feeds one prompt to each sequence of a fresh (or reset) decoder and returns the
    /// logits of each prompt's last token [batch, vocab]. Prompts of different lengths
    /// need a static-state model: they run together padded to the longest (token 0), and
    /// each sequence then continues at its own length; the padded rows are written but
    /// never read, because every later run overwrites a row before any row after it
    /// reads it. Any other model refuses them (its state has one length for the batch).
    pub fn feed_prompts(&mut self, prompts: &[Vec<i64>]) -> Result<Array2<f32>> {
        if prompts.len() != self.batch {
            return Err(Error::InvalidArgument(format!(
                "expected {} prompts, got {}",
                self.batch,
                prompts.len()
            )));
        }
        if self.positions.iter().any(|&p| p != 0) {
            return Err(Error::Internal("prompts fed after other tokens".into()));
        }
        let lengths: Vec<usize> = prompts.iter().map(Vec::len).collect();
        let (shortest, longest) = (
            lengths.iter().copied().min().unwrap_or(0),
            lengths.iter().copied().max().unwrap_or(0),
        );
        if shortest == 0 {
            return Err(Error::InvalidArgument("a prompt is empty".into()));
        }
        if shortest != longest && self.model.info.mode != SequenceMode::Static {
            return Err(Error::InvalidArgument(format!(
                "prompts of different lengths ({shortest} and {longest} tokens) need a static-state model (build --with-past static); in a {} model every sequence of a batch is at the same position",
                match self.model.info.mode {
                    SequenceMode::WithPast => "growing-state (--with-past growing)",
                    _ => "variable-length",
                }
            )));
        }
        let ids = Array2::from_shape_fn((self.batch, longest), |(b, t)| {
            prompts[b].get(t).copied().unwrap_or(0)
        });
        let logits = self.feed(ids.view())?;
        for (p, &len) in self.positions.iter_mut().zip(&lengths) {
            *p = len;
        }
        let vocab = logits.dim().2;
        Ok(Array2::from_shape_fn((self.batch, vocab), |(b, v)| {
            logits[[b, lengths[b] - 1, v]]
        }))
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
