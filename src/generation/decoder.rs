//! Incremental decoding of a causal token model on any runtime: a [`Decoder`] feeds new
//! tokens and keeps what the model needs between runs, as one `State` of its storage
//! forms (state.rs). A `--with-past` model gets its `present_*` outputs back as `past_*`
//! inputs; a growing-state model (position P = tokens fed so far, one P for the whole
//! batch) takes them as they are; a static-state model (fixed [batch, n, ·] state, one
//! position per sequence, docs/static-state.md) keeps its state in buffers bound once
//! where the runtime binds buffers and the file allows it (resident.rs: ONNX Runtime, on the
//! host or the CUDA device), else carries it like the growing form. A variable-length
//! model without state is re-run on the whole prefix every time (what the state avoids).
//! The decoder keeps each sequence's position. The generation loop over a decoder is
//! [`Generator`](crate::generation::Generator).
//!
//! Checked where ids enter ([`Decoder::feed`], [`Decoder::prefill`]): token ids within the
//! vocabulary, P + T ≤ n for every sequence.

use ndarray::{Array2, Array3, ArrayView2};

use crate::error::{Error, Remedy, Result};
use crate::generation::model::{check_vocabulary, DecodingModel, Engine};
use crate::generation::model::{LoadedModel, StateWrites};
use crate::generation::state::State;
use crate::gmlp::interface::SequenceMode;
use crate::runtime::{ModelFile, RuntimeKind, RuntimeOptions};
use crate::tensor::NamedTensor;

/// The loaded model a decoder runs on: its own, or one lent by the caller (shared by the
/// decoders over it, one at a time).
enum ModelHandle<'m> {
    Owned(Box<LoadedModel>),
    Lent(&'m mut LoadedModel),
    /// Given back by [`Decoder::into_model`]: only the decoder's drop sees it.
    Returned,
}

impl ModelHandle<'_> {
    fn get(&self) -> &LoadedModel {
        match self {
            ModelHandle::Owned(model) => model,
            ModelHandle::Lent(model) => model,
            ModelHandle::Returned => unreachable!("a returned model is only seen by drop"),
        }
    }

    fn get_mut(&mut self) -> &mut LoadedModel {
        match self {
            ModelHandle::Owned(model) => model,
            ModelHandle::Lent(model) => model,
            ModelHandle::Returned => unreachable!("a returned model is only seen by drop"),
        }
    }
}

/// Feeds tokens to a causal token model and keeps its state between calls.
pub struct Decoder<'m> {
    /// The loaded model: its description and the engine it runs on.
    model: ModelHandle<'m>,
    /// What this decoder keeps between runs, in its one form.
    state: State,
    batch: usize,
    /// Tokens fed so far to each sequence (the position of its next token).
    positions: Vec<usize>,
    /// Each sequence's row of its last token in the last run (T − 1, or a shorter
    /// prompt's last row).
    last_rows: Vec<usize>,
}

impl Decoder<'static> {
    /// Opens `path` in `kind` for decoding `batch` sequences at once, a static-state
    /// model's state written in place where the runtime can (on ort-cuda with CUDA graphs).
    pub fn open<'a>(
        kind: RuntimeKind,
        model: impl Into<ModelFile<'a>>,
        options: &RuntimeOptions,
        batch: usize,
    ) -> Result<Decoder<'static>> {
        Decoder::open_with(kind, model, options, batch, StateWrites::InPlace)
    }

    /// [`Decoder::open`], with [`StateWrites::Copied`] letting the runtime copy a
    /// static-state model's state every run, as a plain loop over the file does (for
    /// measuring what writing in place saves): a decoder over a [`LoadedModel`] of its own.
    /// The file is decoded here only if the caller has not ([`ModelFile`]).
    pub fn open_with<'a>(
        kind: RuntimeKind,
        file: impl Into<ModelFile<'a>>,
        options: &RuntimeOptions,
        batch: usize,
        writes: StateWrites,
    ) -> Result<Decoder<'static>> {
        // Decoded once here if the caller has not: the model's description, tract's
        // dequantized nodes and a bound state's step graph all read it.
        let model = file.into().with_decoded(|file| {
            let description = DecodingModel::of_file(file)?;
            LoadedModel::open(kind, file, description, options, writes)
        })?;
        Decoder::with_model(ModelHandle::Owned(Box::new(model)), batch)
    }

    /// A decoder of `batch` sequences owning `model` (a front end that keeps one loaded
    /// model and decoders of changing batch sizes over it: [`Decoder::into_model`] gives
    /// it back); on an error the model comes back with it.
    pub fn owning(
        mut model: Box<LoadedModel>,
        batch: usize,
    ) -> std::result::Result<Decoder<'static>, Box<(Error, Box<LoadedModel>)>> {
        let (description, engine) = model.parts();
        match State::new(engine, description, batch) {
            Ok(state) => Ok(Decoder {
                model: ModelHandle::Owned(model),
                state,
                batch,
                positions: vec![0; batch],
                last_rows: Vec::new(),
            }),
            Err(e) => Err(Box::new((e, model))),
        }
    }

    /// The loaded model this decoder owns, its state freed in it (`None` for a decoder over
    /// a lent model, which its lender keeps).
    pub fn into_model(mut self) -> Option<Box<LoadedModel>> {
        let (state, engine) = self.state_and_engine();
        state.release(engine);
        match std::mem::replace(&mut self.model, ModelHandle::Returned) {
            ModelHandle::Owned(model) => Some(model),
            ModelHandle::Lent(_) | ModelHandle::Returned => None,
        }
    }
}

impl<'m> Decoder<'m> {
    /// A decoder of `batch` sequences over `model`, lent for the decoder's life (the
    /// model's engine is loaded once and shared by the decoders over it, one at a time).
    pub fn new(model: &'m mut LoadedModel, batch: usize) -> Result<Decoder<'m>> {
        Decoder::with_model(ModelHandle::Lent(model), batch)
    }

    /// This decoder's state and the loaded model's engine it runs on, for one call.
    fn state_and_engine(&mut self) -> (&mut State, &mut Engine) {
        (&mut self.state, self.model.get_mut().parts().1)
    }

    fn with_model(mut model: ModelHandle<'m>, batch: usize) -> Result<Decoder<'m>> {
        let (description, engine) = model.get_mut().parts();
        let state = State::new(engine, description, batch)?;
        Ok(Decoder {
            model,
            state,
            batch,
            positions: vec![0; batch],
            last_rows: Vec::new(),
        })
    }

    /// Forgets every token: the next [`Decoder::feed`] is a prompt (empty or zero state).
    pub fn reset(&mut self) -> Result<()> {
        self.positions = vec![0; self.batch];
        self.last_rows.clear();
        let (state, engine) = self.state_and_engine();
        state.reset(engine)
    }

    /// Whether runs write the state in place (a static-state model in buffers bound once).
    pub fn in_place(&self) -> bool {
        self.model.get().binds_state()
    }

    /// Tokens fed so far to each sequence.
    pub fn positions(&self) -> &[usize] {
        &self.positions
    }

    /// Sequences decoded at once.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The model's description.
    pub fn model(&self) -> &DecodingModel {
        self.model.get().description()
    }

    /// The runtime's name.
    pub fn runtime_name(&self) -> &str {
        self.model.get().runtime_name()
    }

    /// What the runtime does differently from running the file as it is (e.g. tract's
    /// dequantized nodes, CUDA graphs or why they are off).
    pub fn runtime_note(&self) -> Option<String> {
        self.model.get().note(self.batch)
    }

    /// A copy of the current state (`past_*` tensors, the last run's `present_*`); empty
    /// for models without state.
    pub fn state(&mut self) -> Result<Vec<NamedTensor>> {
        let (state, engine) = self.state_and_engine();
        state.tensors(engine)
    }

    /// Checks `ids` [batch, T] against the batch, the vocabulary and the n − P positions
    /// left to each sequence.
    pub fn check(&self, ids: ArrayView2<i64>) -> Result<()> {
        let (b, t) = ids.dim();
        let n = self.model().info.max_sequence;
        if b != self.batch || t == 0 {
            return Err(Error::BatchShape(format!(
                "expected token ids of shape [{}, T ≥ 1], got [{b}, {t}]",
                self.batch
            )));
        }
        if let Some(&p) = self.positions.iter().find(|&&p| p + t > n) {
            return Err(Error::PastPositions(format!(
                "{t} tokens after the {p} already fed would pass the model's {n} positions"
            )));
        }
        check_vocabulary(ids, self.model().vocab_size, "token id")
    }

    /// Feeds `ids` [batch, T], T tokens to every sequence at its own position, and returns
    /// the logits of those T positions [batch, T, vocab].
    pub fn feed(&mut self, ids: ArrayView2<i64>) -> Result<Array3<f32>> {
        self.advance(ids)?;
        let (state, engine) = self.state_and_engine();
        state.logits(engine)
    }

    /// Feeds `ids` [batch, T] like [`Decoder::feed`], keeping the logits where the runtime
    /// put them (read them with [`Decoder::next_logits`] or [`Decoder::greedy_next`]).
    pub fn advance(&mut self, ids: ArrayView2<i64>) -> Result<()> {
        self.check(ids)?;
        self.run(ids)
    }

    /// Feeds each sequence its pick of the last run: a token of the vocabulary (picked from
    /// the model's own logits), at a position the caller has room for (the generator
    /// checks its request once, [`Generator`](crate::generation::Generator)).
    pub(crate) fn step(&mut self, picks: &[i64]) -> Result<()> {
        let ids = Array2::from_shape_vec((self.batch, 1), picks.to_vec())
            .map_err(|e| Error::Internal(e.to_string()))?;
        self.run(ids.view())
    }

    /// Runs `ids` [batch, T], checked by the caller, at each sequence's position.
    fn run(&mut self, ids: ArrayView2<i64>) -> Result<()> {
        let t = ids.ncols();
        let positions: Vec<i64> = self.positions.iter().map(|&p| p as i64).collect();
        let (state, engine) = self.state_and_engine();
        state.run(engine, ids, &positions)?;
        for p in &mut self.positions {
            *p += t;
        }
        self.last_rows = vec![t - 1; self.batch];
        Ok(())
    }

    /// Feeds one prompt to each sequence of a fresh (or reset) decoder and returns the
    /// logits of each prompt's last token [batch, vocab] ([`Decoder::prefill`], then
    /// [`Decoder::next_logits`]).
    pub fn feed_prompts(&mut self, prompts: &[Vec<i64>]) -> Result<Array2<f32>> {
        self.prefill(prompts)?;
        self.next_logits()
    }

    /// Feeds one prompt to each sequence of a fresh (or reset) decoder. Prompts of
    /// different lengths need a static-state model: they run together padded to the
    /// longest (token 0), and each sequence then continues at its own length; the padded
    /// rows are written but never read, because every later run overwrites a row before
    /// any row after it reads it. Any other model refuses them (its state has one length
    /// for the batch).
    pub fn prefill(&mut self, prompts: &[Vec<i64>]) -> Result<()> {
        if prompts.len() != self.batch {
            return Err(Error::BatchShape(format!(
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
            return Err(Error::BatchShape("a prompt is empty".into()));
        }
        if shortest != longest && self.model().info.mode != SequenceMode::Static {
            return Err(Error::NeedsRebuild {
                reason: format!(
                    "prompts of different lengths ({shortest} and {longest} tokens) need a static-state model; in a {} model every sequence of a batch is at the same position",
                    match self.model().info.mode {
                        SequenceMode::Growing => "growing-state",
                        _ => "variable-length",
                    }
                ),
                remedy: Remedy::BuildStaticState,
            });
        }
        let ids = Array2::from_shape_fn((self.batch, longest), |(b, t)| {
            prompts[b].get(t).copied().unwrap_or(0)
        });
        self.advance(ids.view())?;
        self.positions.clone_from(&lengths);
        self.last_rows = lengths.iter().map(|&len| len - 1).collect();
        Ok(())
    }

    /// The logits after each sequence's last token fed, [batch, vocab] (host copies of
    /// those rows only).
    pub fn next_logits(&mut self) -> Result<Array2<f32>> {
        if self.last_rows.len() != self.batch {
            return Err(Error::Internal("logits asked before any run".into()));
        }
        let engine = self.model.get_mut().parts().1;
        self.state.logits_at(engine, &self.last_rows)
    }

    /// The greedy next token of each sequence (the first largest logit after its last
    /// token), picked where the logits are: by the run itself in a bound state after a step
    /// (on the CUDA device for ort-cuda: only the ids come back), else on the host from the
    /// rows of [`Decoder::next_logits`].
    pub fn greedy_next(&mut self) -> Result<Vec<i64>> {
        if self.last_rows.len() != self.batch {
            return Err(Error::Internal("a pick asked before any run".into()));
        }
        let engine = self.model.get_mut().parts().1;
        self.state.greedy(engine, &self.last_rows)
    }
}

impl Drop for Decoder<'_> {
    /// Frees what this decoder holds in the shared engine (a bound state's buffers).
    fn drop(&mut self) {
        if matches!(self.model, ModelHandle::Returned) {
            return;
        }
        let (state, engine) = self.state_and_engine();
        state.release(engine);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::onnx::reader::{files_decoded, read_model};
    use crate::runtime::testing::write_tiny;

    /// The runtimes a unit test can open: tract, and ONNX Runtime on the CPU where the
    /// test environment has its library.
    fn runtimes() -> Vec<RuntimeKind> {
        let mut kinds = vec![RuntimeKind::Tract];
        if cfg!(feature = "test-onnxruntime") {
            kinds.push(RuntimeKind::OrtCpu);
        }
        kinds
    }

    #[test]
    fn a_file_the_caller_decoded_is_not_decoded_again() {
        let dir = tempfile::tempdir().unwrap();
        let options = RuntimeOptions {
            tract: crate::runtime::TractOptions {
                dequantize_nbits: true,
                ..Default::default()
            },
            ..Default::default()
        };
        for mode in [SequenceMode::Static, SequenceMode::Growing] {
            let path = write_tiny(dir.path(), mode);
            let before = files_decoded();
            // What `generate` does: one decode, then every runtime from it.
            let decoded = read_model(&path).unwrap();
            let file = ModelFile::decoded(&path, &decoded);
            for kind in runtimes() {
                let mut decoder =
                    Decoder::open_with(kind, file, &options, 1, StateWrites::InPlace).unwrap();
                assert_eq!(
                    decoder.in_place(),
                    kind.binds_buffers() && mode == SequenceMode::Static
                );
                decoder.feed(ndarray::array![[1i64, 2]].view()).unwrap();
            }
            assert_eq!(files_decoded() - before, 1, "{mode:?}");
            // The counter counts: a path alone is decoded by the decoder, once.
            Decoder::open(RuntimeKind::Tract, &path, &options, 1).unwrap();
            assert_eq!(files_decoded() - before, 2, "{mode:?}");
        }
    }
}
