//! The one generation loop (in the spirit of onnxruntime-genai's `Generator`: feed the
//! prompts, then pick the next tokens and append them until done), used by `generate`,
//! `generate --prompts-file`, validate's decoding check and the tests: prefill, pick,
//! append, stop, over a [`Decoder`] of any runtime and state form. A sequence stops at its
//! end token (included in its tokens, as genai and Hugging Face's `generate` do) or after
//! the tokens asked for; the others of its batch go on. Each sequence has its
//! own [`Sampler`] seeded with the same seed, so that it gets the tokens it would get
//! decoded alone. Greedy picks happen where the logits are ([`Decoder::greedy_next`]: on
//! the CUDA device only the ids come back).

use std::time::Instant;

use ndarray::{Array2, ArrayView2};

use crate::error::{Error, Result};
use crate::generation::decoder::Decoder;
use crate::generation::model::check_vocabulary;
use crate::generation::sampling::{argmax, Sampler, SamplingError};

/// How the next tokens are picked.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sampling {
    /// Temperature; 0 = greedy [default: 0, or 1 with `top_k` or `top_p`].
    pub temperature: Option<f64>,
    /// Sample among the k most likely tokens.
    pub top_k: Option<usize>,
    /// Then among the fewest most likely tokens whose probabilities reach p.
    pub top_p: Option<f64>,
    /// Seed of every sequence's sampling stream.
    pub seed: u64,
}

impl Sampling {
    /// Greedy decoding.
    pub const GREEDY: Sampling = Sampling {
        temperature: None,
        top_k: None,
        top_p: None,
        seed: 0,
    };

    /// A sampler of this setting (checks it).
    pub fn sampler(&self) -> Result<Sampler, SamplingError> {
        Sampler::new(self.temperature, self.top_k, self.top_p, self.seed)
    }
}

/// Why a sequence stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// It produced the end token (the last of its tokens).
    EndToken,
    /// It produced the tokens asked for.
    MaxNewTokens,
}

/// What one generation produced, with its timings.
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// Tokens of each prompt.
    pub prompt_tokens: Vec<usize>,
    /// The new tokens of each sequence (up to and including its end token).
    pub tokens: Vec<Vec<i64>>,
    /// Why each sequence stopped.
    pub stopped: Vec<StopReason>,
    /// Time to the first new tokens: the prompts' run and the first pick, ms.
    pub prefill_ms: f64,
    /// Each later step: feeding the previous tokens and picking the next, ms.
    pub step_ms: Vec<f64>,
}

impl Generation {
    /// Total time of the steps, ms.
    pub fn steps_ms(&self) -> f64 {
        self.step_ms.iter().sum()
    }

    /// Median step, ms (none without steps).
    pub fn step_median_ms(&self) -> Option<f64> {
        let mut sorted = self.step_ms.clone();
        sorted.sort_by(f64::total_cmp);
        sorted.get(sorted.len() / 2).copied()
    }

    /// New tokens of all sequences per second of steps (none without steps).
    pub fn step_tokens_per_s(&self) -> Option<f64> {
        (!self.step_ms.is_empty())
            .then(|| (self.tokens.len() * self.step_ms.len()) as f64 / (self.steps_ms() / 1e3))
    }
}

/// What [`Generator::generate_observing`] shows the logits of every pick to.
type Observer<'a> = &'a mut dyn FnMut(ArrayView2<f32>);

/// An observer borrowed for one step (its closure may live longer than the borrow).
type StepObserver<'b, 'o> = &'b mut (dyn FnMut(ArrayView2<f32>) + 'o);

/// Generates tokens with a [`Decoder`].
pub struct Generator<'m> {
    decoder: Decoder<'m>,
    sampling: Sampling,
    end_token: Option<i64>,
}

impl<'m> Generator<'m> {
    /// A generator over `decoder` picking as `sampling` says (checked here), stopping each
    /// sequence at the model's end token if it names one.
    pub fn new(decoder: Decoder<'m>, sampling: Sampling) -> Result<Generator<'m>> {
        sampling.sampler()?;
        let end_token = decoder.model().end_token;
        Ok(Generator {
            decoder,
            sampling,
            end_token,
        })
    }

    /// Stops each sequence at `end_token` instead of the model's own (`None`: never stops
    /// early); refuses an id outside the vocabulary.
    pub fn with_end_token(mut self, end_token: Option<i64>) -> Result<Generator<'m>> {
        check_vocabulary(&end_token, self.decoder.model().vocab_size, "end token")?;
        self.end_token = end_token;
        Ok(self)
    }

    /// Picks as `sampling` says from now on (checked here).
    pub fn set_sampling(&mut self, sampling: Sampling) -> Result<()> {
        sampling.sampler()?;
        self.sampling = sampling;
        Ok(())
    }

    /// Stops each sequence at `end_token` from now on (`None`: never early), or at the
    /// model's own with [`Generator::model_end_token`]; refuses an id outside the
    /// vocabulary.
    pub fn set_end_token(&mut self, end_token: Option<i64>) -> Result<()> {
        check_vocabulary(&end_token, self.decoder.model().vocab_size, "end token")?;
        self.end_token = end_token;
        Ok(())
    }

    /// The end token the model's file names, if any.
    pub fn model_end_token(&self) -> Option<i64> {
        self.decoder.model().end_token
    }

    /// The sequences decoded at once.
    pub fn batch(&self) -> usize {
        self.decoder.batch()
    }

    /// The decoder, back from the generator (for a decoder of another batch over its model).
    pub fn into_decoder(self) -> Decoder<'m> {
        self.decoder
    }

    /// The token that ends a sequence, if any.
    pub fn end_token(&self) -> Option<i64> {
        self.end_token
    }

    /// The decoder (its runtime, model and state).
    pub fn decoder(&mut self) -> &mut Decoder<'m> {
        &mut self.decoder
    }

    /// Feeds `prompts` (one per sequence of the decoder, from a fresh state) and generates
    /// up to `new_tokens` tokens for each (fewer for a sequence that ends), calling
    /// `progress` with the steps so far.
    pub fn generate(
        &mut self,
        prompts: &[Vec<i64>],
        new_tokens: usize,
        progress: &mut dyn FnMut(usize),
    ) -> Result<Generation> {
        self.run(prompts, new_tokens, progress, None)
    }

    /// [`Generator::generate`], showing `observe` the logits [batch, vocab] every pick is
    /// made from (copied to the host: no pick happens on the device).
    pub fn generate_observing(
        &mut self,
        prompts: &[Vec<i64>],
        new_tokens: usize,
        observe: &mut dyn FnMut(ArrayView2<f32>),
    ) -> Result<Generation> {
        self.run(prompts, new_tokens, &mut |_| {}, Some(observe))
    }

    /// The loop: prefill, then pick / stop / append, one [`Generator::step`] at a time.
    fn run(
        &mut self,
        prompts: &[Vec<i64>],
        new_tokens: usize,
        progress: &mut dyn FnMut(usize),
        mut observe: Option<Observer>,
    ) -> Result<Generation> {
        let mut run = self.start(prompts, new_tokens)?;
        while run
            .step(&mut self.decoder, self.end_token, observe.as_deref_mut())?
            .is_some()
        {
            progress(run.steps);
        }
        Ok(run.finish())
    }

    /// Starts a generation: checks the request, feeds `prompts` (one per sequence of the
    /// decoder, from a fresh state) and returns the loop's state, which
    /// [`Generator::step`] advances one pick at a time (a front end that returns to its
    /// caller between steps: Python's `stream`).
    pub fn start(&mut self, prompts: &[Vec<i64>], new_tokens: usize) -> Result<Run> {
        let n = self.decoder.model().info.max_sequence;
        if let Some(longest) = prompts.iter().map(Vec::len).max() {
            if longest + new_tokens > n {
                return Err(Error::PastPositions(format!(
                    "{new_tokens} new tokens after a prompt of {longest} would pass the model's {n} positions"
                )));
            }
        }
        Run::start(&mut self.decoder, prompts, new_tokens, self.sampling)
    }

    /// One step of `run` ([`Run::step`] on this generator's decoder, stopping each
    /// sequence at its end token).
    pub fn step(&mut self, run: &mut Run) -> Result<Option<Vec<Option<i64>>>> {
        run.step(&mut self.decoder, self.end_token, None)
    }
}

/// What the one generation loop ([`Run`]) runs on: a [`Decoder`] here, or a model served
/// elsewhere (`serve::triton::remote`, one sequence a thread). It is fed each sequence's
/// tokens and gives the logits, or the greedy picks, of each one's next token.
pub trait Steps {
    /// The sequences decoded at once.
    fn batch(&self) -> usize;
    /// Feeds the prompts, one per sequence, from a fresh state.
    fn prefill(&mut self, prompts: &[Vec<i64>]) -> Result<()>;
    /// Feeds each sequence's latest pick (an ended sequence's too: the batch keeps its
    /// shape).
    fn advance(&mut self, picks: &[i64]) -> Result<()>;
    /// The logits `[batch, vocab]` of each sequence's next token; `last`: nothing is fed
    /// after this pick (a served sequence ends with this request).
    fn next_logits(&mut self, last: bool) -> Result<Array2<f32>>;
    /// Each sequence's greedy next token (an engine that picks on its device returns the
    /// ids alone); by default the argmax of [`Steps::next_logits`].
    fn greedy_next(&mut self, last: bool) -> Result<Vec<i64>> {
        let logits = self.next_logits(last)?;
        Ok(logits
            .outer_iter()
            .map(|row| argmax(&row.to_vec()) as i64)
            .collect())
    }
    /// The generation stopped before its last pick was fed, every sequence at its end
    /// token: `picks` are the final ones (a served sequence frees its slot now).
    fn end_early(&mut self, _picks: &[i64]) {}
}

impl Steps for Decoder<'_> {
    fn batch(&self) -> usize {
        Decoder::batch(self)
    }

    fn prefill(&mut self, prompts: &[Vec<i64>]) -> Result<()> {
        self.reset()?;
        Decoder::prefill(self, prompts)
    }

    fn advance(&mut self, picks: &[i64]) -> Result<()> {
        Decoder::step(self, picks)
    }

    fn next_logits(&mut self, _last: bool) -> Result<Array2<f32>> {
        Decoder::next_logits(self)
    }

    fn greedy_next(&mut self, _last: bool) -> Result<Vec<i64>> {
        Decoder::greedy_next(self)
    }
}

/// The one generation loop, between its steps: each sequence's sampler, tokens so far,
/// whether it ended, its latest pick, and the timings. [`Run::start`] feeds the prompts,
/// [`Run::step`] picks the next token of every sequence, over any [`Steps`].
pub struct Run {
    samplers: Vec<Sampler>,
    greedy: bool,
    new_tokens: usize,
    /// Picks made so far (the prefill's is the first).
    steps: usize,
    tokens: Vec<Vec<i64>>,
    stopped: Vec<Option<StopReason>>,
    /// Each sequence's latest pick: what the next step feeds.
    last: Vec<i64>,
    step_ms: Vec<f64>,
    started: Instant,
    prefill_ms: Option<f64>,
    prompt_tokens: Vec<usize>,
}

impl Run {
    /// Feeds `prompts` to `steps` (one per sequence) for up to `new_tokens` picks each, as
    /// `sampling` says (each sequence its own sampler of the same seed, so that it gets the
    /// tokens it would get decoded alone).
    pub fn start(
        steps: &mut dyn Steps,
        prompts: &[Vec<i64>],
        new_tokens: usize,
        sampling: Sampling,
    ) -> Result<Run> {
        let batch = steps.batch();
        let samplers = (0..batch)
            .map(|_| sampling.sampler())
            .collect::<Result<Vec<_>, _>>()?;
        let started = Instant::now();
        steps.prefill(prompts)?;
        Ok(Run {
            greedy: samplers.iter().all(Sampler::is_greedy),
            samplers,
            new_tokens,
            steps: 0,
            tokens: vec![Vec::with_capacity(new_tokens); batch],
            stopped: vec![None; batch],
            last: vec![0; batch],
            step_ms: Vec::with_capacity(new_tokens.saturating_sub(1)),
            started,
            prefill_ms: None,
            prompt_tokens: prompts.iter().map(Vec::len).collect(),
        })
    }

    /// One step: feeds the previous picks (after the first), picks the next token of every
    /// sequence (showing `observe` the logits it picks from, if given), and returns each
    /// one's new token (`None` for a sequence that had ended), or `None` when the
    /// generation is done: every sequence at `end_token`, or the tokens asked for made.
    pub fn step(
        &mut self,
        steps: &mut dyn Steps,
        end_token: Option<i64>,
        observe: Option<StepObserver<'_, '_>>,
    ) -> Result<Option<Vec<Option<i64>>>> {
        if self.steps == self.new_tokens || self.stopped.iter().all(Option::is_some) {
            return Ok(None);
        }
        if self.last.len() != steps.batch() {
            return Err(Error::Internal(
                "a generation stepped on steps of another batch".into(),
            ));
        }
        let step = Instant::now();
        if self.steps > 0 {
            steps.advance(&self.last)?;
        }
        let last = self.steps + 1 == self.new_tokens;
        let next = match observe {
            None if self.greedy => steps.greedy_next(last)?,
            observe => {
                let logits = steps.next_logits(last)?;
                if let Some(observe) = observe {
                    observe(logits.view());
                }
                logits
                    .outer_iter()
                    .zip(&mut self.samplers)
                    .map(|(row, sampler)| sampler.pick(&row.to_vec()) as i64)
                    .collect()
            }
        };
        let mut picks = Vec::with_capacity(next.len());
        for (b, t) in next.into_iter().enumerate() {
            self.last[b] = t;
            if self.stopped[b].is_some() {
                picks.push(None);
                continue;
            }
            self.tokens[b].push(t);
            picks.push(Some(t));
            if Some(t) == end_token {
                self.stopped[b] = Some(StopReason::EndToken);
            }
        }
        let ms = step.elapsed().as_secs_f64() * 1e3;
        match self.prefill_ms {
            None => self.prefill_ms = Some(self.started.elapsed().as_secs_f64() * 1e3),
            Some(_) => self.step_ms.push(ms),
        }
        self.steps += 1;
        if !last && self.stopped.iter().all(Option::is_some) {
            steps.end_early(&self.last);
        }
        Ok(Some(picks))
    }

    /// Picks made so far (the prefill's is the first).
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// The new tokens of each sequence so far.
    pub fn tokens(&self) -> &[Vec<i64>] {
        &self.tokens
    }

    /// What the generation produced (so far), with its timings.
    pub fn finish(self) -> Generation {
        let started = self.started;
        Generation {
            prompt_tokens: self.prompt_tokens,
            tokens: self.tokens,
            stopped: self
                .stopped
                .into_iter()
                .map(|s| s.unwrap_or(StopReason::MaxNewTokens))
                .collect(),
            prefill_ms: self
                .prefill_ms
                .unwrap_or_else(|| started.elapsed().as_secs_f64() * 1e3),
            step_ms: self.step_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use ndarray::Array2;

    use super::*;
    use crate::generation::sampling::argmax;
    use crate::gmlp::SequenceMode;
    use crate::runtime::testing::write_tiny;
    use crate::runtime::{open, RuntimeKind, RuntimeOptions};
    use crate::tensor::{NamedTensor, TensorValue};

    /// The greedy continuation computed the slow way, independently of the decoder: the
    /// variable-length model re-run on the whole prefix of each sequence, the argmax of
    /// its last position appended.
    fn rerun_greedy(path: &std::path::Path, prompt: &[i64], new: usize) -> Vec<i64> {
        let mut rt = open(RuntimeKind::Tract, path, &RuntimeOptions::default()).unwrap();
        let mut seq = prompt.to_vec();
        for _ in 0..new {
            let ids = Array2::from_shape_vec((1, seq.len()), seq.clone()).unwrap();
            let out = rt
                .run(&[NamedTensor {
                    name: "input_ids".into(),
                    value: TensorValue::I64(ids.into_dyn()),
                }])
                .unwrap();
            let TensorValue::F32(logits) = &out[0].value else {
                panic!("logits")
            };
            let last = logits.shape()[1] - 1;
            let row: Vec<f32> = logits
                .index_axis(ndarray::Axis(0), 0)
                .index_axis(ndarray::Axis(0), last)
                .iter()
                .copied()
                .collect();
            seq.push(argmax(&row) as i64);
        }
        seq[prompt.len()..].to_vec()
    }

    /// Three prompts of different lengths and each one's `new` greedy tokens from re-running
    /// its whole prefix through the variable-length model (no state to get wrong).
    fn three_prompts_rerun(dir: &std::path::Path, new: usize) -> (Vec<Vec<i64>>, Vec<Vec<i64>>) {
        let variable = write_tiny(dir, SequenceMode::Variable);
        let prompts = vec![vec![3, 17, 5], vec![40, 2, 9, 11, 1], vec![7]];
        let expected = prompts
            .iter()
            .map(|p| rerun_greedy(&variable, p, new))
            .collect();
        (prompts, expected)
    }

    #[test]
    fn greedy_generation_with_state_equals_rerunning_the_prefix() {
        let dir = tempfile::tempdir().unwrap();
        let new = 6;
        let (prompts, expected) = three_prompts_rerun(dir.path(), new);
        let distinct: std::collections::BTreeSet<i64> =
            expected.iter().flatten().copied().collect();
        assert!(
            distinct.len() >= 4,
            "a continuation that varies: {expected:?}"
        );
        for mode in [
            SequenceMode::Static,
            SequenceMode::Growing,
            SequenceMode::Variable,
        ] {
            let path = write_tiny(dir.path(), mode);
            // The static state batches prompts of different lengths; the others one at a time.
            let batches: Vec<Vec<Vec<i64>>> = match mode {
                SequenceMode::Static => vec![prompts.clone()],
                _ => prompts.iter().map(|p| vec![p.clone()]).collect(),
            };
            let mut got = Vec::new();
            for batch in batches {
                let decoder = Decoder::open(
                    RuntimeKind::Tract,
                    &path,
                    &RuntimeOptions::default(),
                    batch.len(),
                )
                .unwrap();
                let mut generator = Generator::new(decoder, Sampling::GREEDY).unwrap();
                let mut counts = Vec::new();
                let g = generator
                    .generate(&batch, new, &mut |k| counts.push(k))
                    .unwrap();
                assert_eq!(counts, (1..=new).collect::<Vec<_>>());
                assert_eq!(g.step_ms.len(), new - 1, "{mode:?}");
                assert_eq!(
                    g.prompt_tokens,
                    batch.iter().map(Vec::len).collect::<Vec<_>>()
                );
                got.extend(g.tokens);
            }
            assert_eq!(got, expected, "{mode:?}");
        }
    }

    #[test]
    fn each_sequence_stops_at_the_end_token_and_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let new = 6;
        let (prompts, expected) = three_prompts_rerun(dir.path(), new);
        // The end token: the third token of the first continuation.
        let end = expected[0][2];
        let cut = |seq: &Vec<i64>| match seq.iter().position(|&t| t == end) {
            Some(i) => (seq[..=i].to_vec(), StopReason::EndToken),
            None => (seq.clone(), StopReason::MaxNewTokens),
        };
        let path = write_tiny(dir.path(), SequenceMode::Static);
        let decoder =
            Decoder::open(RuntimeKind::Tract, &path, &RuntimeOptions::default(), 3).unwrap();
        let mut generator = Generator::new(decoder, Sampling::GREEDY)
            .unwrap()
            .with_end_token(Some(end))
            .unwrap();
        assert_eq!(generator.end_token(), Some(end));
        let g = generator.generate(&prompts, new, &mut |_| {}).unwrap();
        let want: Vec<(Vec<i64>, StopReason)> = expected.iter().map(cut).collect();
        let got: Vec<(Vec<i64>, StopReason)> = g
            .tokens
            .iter()
            .cloned()
            .zip(g.stopped.iter().copied())
            .collect();
        assert_eq!(got, want);
        assert_eq!(got[0].1, StopReason::EndToken);
        let decoder =
            Decoder::open(RuntimeKind::Tract, &path, &RuntimeOptions::default(), 1).unwrap();
        let vocab = decoder.model().vocab_size as i64;
        let refused = Generator::new(decoder, Sampling::GREEDY)
            .unwrap()
            .with_end_token(Some(vocab));
        assert!(refused.is_err());
    }

    #[test]
    fn sampling_repeats_with_its_seed_and_refuses_what_cannot_decode() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_tiny(dir.path(), SequenceMode::Static);
        let run = |seed| {
            let decoder =
                Decoder::open(RuntimeKind::Tract, &path, &RuntimeOptions::default(), 2).unwrap();
            let sampling = Sampling {
                temperature: Some(1.5),
                top_k: Some(10),
                top_p: Some(0.9),
                seed,
            };
            Generator::new(decoder, sampling)
                .unwrap()
                .generate(&[vec![1, 2], vec![1, 2]], 8, &mut |_| {})
                .unwrap()
                .tokens
        };
        let a = run(4);
        assert_eq!(a, run(4), "same seed, same tokens");
        // Each sequence has its own stream from the same seed: equal prompts, equal tokens.
        assert_eq!(a[0], a[1]);
        let decoder =
            Decoder::open(RuntimeKind::Tract, &path, &RuntimeOptions::default(), 1).unwrap();
        let mut g = Generator::new(decoder, Sampling::GREEDY).unwrap();
        let err = g.generate(&[vec![1; 8]], 5, &mut |_| {}).unwrap_err();
        assert!(matches!(err, Error::PastPositions(_)), "{err:?}");
        // The rendering of the family.
        assert_eq!(
            err.to_string(),
            "invalid argument: 5 new tokens after a prompt of 8 would pass the model's 12 positions"
        );
        let decoder =
            Decoder::open(RuntimeKind::Tract, &path, &RuntimeOptions::default(), 1).unwrap();
        let bad = Sampling {
            temperature: Some(-1.0),
            ..Sampling::GREEDY
        };
        assert!(Generator::new(decoder, bad).is_err());
    }
}
