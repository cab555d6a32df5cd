//! The decoding check of a `--with-past` model, growing or static state (docs/generation.md): in each runtime, prefill P
//! tokens, then K single steps, then one multi-token chunk, feeding `present_*` back as
//! `past_*`; every piece's logits and the final state are compared with one
//! whole-sequence run of the same model (past empty), and the stepwise results are
//! compared across runtimes.

use std::time::Instant;

use ndarray::{s, Array2, Array3};
use serde::Serialize;

use crate::error::{Error, Result};
use crate::rng::SplitMix64;
use crate::runtime::decoder::{Decoder, DecodingModel};
use crate::runtime::Runtime;
use crate::tensor::{NamedTensor, TensorValue};
use crate::validate::compare::{compare, pair, OutputDiff, PairReport, Tolerance};

/// Default number of single steps after the prefill.
pub const DEFAULT_STEPS: usize = 8;
/// Default length of the multi-token chunk after the steps.
pub const DEFAULT_CHUNK: usize = 4;

/// How many tokens each phase feeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct DecodingPlan {
    /// Prompt length P (first run, empty past).
    pub prefill: usize,
    /// Single-token steps K after it.
    pub steps: usize,
    /// Length of the one multi-token chunk at the end (0: none).
    pub chunk: usize,
}

impl DecodingPlan {
    /// The plan for a model of `n` positions: given values are checked (P ≥ 1,
    /// P + K + chunk ≤ n); defaults are P = n/2, K = 8 and a chunk of 4, shortened to fit
    /// (K at most half of the positions left).
    pub fn new(
        n: usize,
        prefill: Option<usize>,
        steps: Option<usize>,
        chunk: Option<usize>,
    ) -> Result<DecodingPlan> {
        let prefill = prefill.unwrap_or((n / 2).max(1));
        let left = n.saturating_sub(prefill);
        let steps = steps.unwrap_or(DEFAULT_STEPS.min(left / 2));
        let chunk = chunk.unwrap_or(DEFAULT_CHUNK.min(left.saturating_sub(steps)));
        let plan = DecodingPlan {
            prefill,
            steps,
            chunk,
        };
        if prefill == 0 || plan.tokens() > n {
            return Err(Error::InvalidArgument(format!(
                "decoding check: prefill {prefill} (at least 1) + {steps} steps + a chunk of {chunk} must fit in the model's {n} positions"
            )));
        }
        Ok(plan)
    }

    /// P + K + chunk.
    pub fn tokens(&self) -> usize {
        self.prefill + self.steps + self.chunk
    }

    /// The lengths fed, in order, each with its label.
    fn pieces(&self) -> Vec<(String, usize, usize)> {
        let mut out = vec![("prefill".to_string(), 0, self.prefill)];
        for k in 0..self.steps {
            out.push((format!("step {}", k + 1), self.prefill + k, 1));
        }
        if self.chunk > 0 {
            out.push(("chunk".to_string(), self.prefill + self.steps, self.chunk));
        }
        out
    }
}

/// What one runtime's decoding did.
#[derive(Clone, Debug, Serialize)]
pub struct DecodingRuntimeReport {
    /// Runtime name.
    pub name: String,
    /// Wall time of the prefill run, ms.
    pub prefill_ms: f64,
    /// Median wall time of a single step, ms.
    pub step_median_ms: Option<f64>,
    /// Whether the runs wrote a static-state model's state in place (ONNX Runtime's I/O
    /// binding; docs/static-state.md).
    pub state_in_place: bool,
    /// Each piece's logits (`logits[prefill]`, `logits[step 1]`, ..., `logits[chunk]`) and
    /// each final state tensor against the whole-sequence run of the same runtime.
    pub against_whole: Vec<OutputDiff>,
    /// True when every comparison agrees.
    pub pass: bool,
}

/// The `decoding` section of the validation report.
#[derive(Clone, Debug, Serialize)]
pub struct DecodingReport {
    /// Tokens fed in each phase.
    pub plan: DecodingPlan,
    /// Sequences decoded at once.
    pub batch: usize,
    /// One entry per runtime.
    pub runtimes: Vec<DecodingRuntimeReport>,
    /// Stepwise logits and final states, every pair of runtimes.
    pub pairs: Vec<PairReport>,
    /// True when every runtime agrees with its whole run and with the others.
    pub pass: bool,
}

fn f32_tensor(name: String, a: Array3<f32>) -> NamedTensor {
    NamedTensor {
        name,
        value: TensorValue::F32(a.into_dyn()),
    }
}

/// Runs the decoding check on the loaded `runtimes` of one with-past model.
pub fn check_decoding(
    runtimes: Vec<Box<dyn Runtime>>,
    model: &DecodingModel,
    plan: DecodingPlan,
    batch: usize,
    seed: u64,
    tolerance: Tolerance,
    progress: &mut dyn FnMut(&str),
) -> Result<DecodingReport> {
    let mut rng = SplitMix64::keyed(seed, "decoding");
    let tokens = plan.tokens();
    let vocab = model.vocab_size as u64;
    let ids = Array2::from_shape_fn((batch, tokens), |_| rng.below(vocab) as i64);
    let mut reports = Vec::new();
    let mut stepwise_results: Vec<(String, Vec<NamedTensor>)> = Vec::new();
    for rt in runtimes {
        let name = rt.name().to_string();
        progress(&format!("decoding {name}"));
        let mut decoder = Decoder::new(rt, model.clone(), batch);
        let state_in_place = decoder.in_place();
        let whole = decoder.feed(ids.view())?;
        let whole_state = decoder.state()?;
        decoder.reset();
        let mut against_whole = Vec::new();
        let mut all_logits = Vec::new();
        let (mut prefill_ms, mut step_ms) = (0.0, Vec::new());
        for (label, start, len) in plan.pieces() {
            let started = Instant::now();
            let logits = decoder.feed(ids.slice(s![.., start..start + len]))?;
            let ms = started.elapsed().as_secs_f64() * 1e3;
            if label == "prefill" {
                prefill_ms = ms;
            } else if len == 1 {
                step_ms.push(ms);
            }
            let output = format!("logits[{label}]");
            let expected = whole.slice(s![.., start..start + len, ..]).to_owned();
            against_whole.push(compare(
                &f32_tensor(output.clone(), expected),
                &f32_tensor(output.clone(), logits.clone()),
                tolerance,
            )?);
            all_logits.push(logits);
        }
        let final_state = decoder.state()?;
        for (state, whole) in final_state.iter().zip(&whole_state) {
            against_whole.push(compare(whole, state, tolerance)?);
        }
        step_ms.sort_by(f64::total_cmp);
        let views: Vec<_> = all_logits.iter().map(|a| a.view()).collect();
        let logits = ndarray::concatenate(ndarray::Axis(1), &views)
            .map_err(|e| Error::Internal(e.to_string()))?;
        let mut results = vec![NamedTensor {
            name: "logits[stepwise]".into(),
            value: TensorValue::F32(logits.into_dyn()),
        }];
        results.extend(final_state);
        stepwise_results.push((name.clone(), results));
        reports.push(DecodingRuntimeReport {
            name,
            prefill_ms,
            step_median_ms: (!step_ms.is_empty()).then(|| step_ms[step_ms.len() / 2]),
            state_in_place,
            pass: against_whole.iter().all(|d| d.pass),
            against_whole,
        });
    }
    let mut pairs = Vec::new();
    for i in 0..stepwise_results.len() {
        for j in i + 1..stepwise_results.len() {
            let diffs = stepwise_results[i]
                .1
                .iter()
                .zip(&stepwise_results[j].1)
                .map(|(a, b)| compare(a, b, tolerance))
                .collect::<Result<Vec<_>>>()?;
            pairs.push(pair(&stepwise_results[i].0, &stepwise_results[j].0, diffs));
        }
    }
    let pass = reports.iter().all(|r| r.pass) && pairs.iter().all(|p| p.pass);
    Ok(DecodingReport {
        plan,
        batch,
        runtimes: reports,
        pairs,
        pass,
    })
}

impl DecodingReport {
    /// Human-readable lines for the validation summary.
    pub fn render(&self) -> String {
        let p = &self.plan;
        let mut s = format!(
            "decode prefill {} + {} single steps + a chunk of {} (batch {}), present fed back as past\n",
            p.prefill, p.steps, p.chunk, self.batch
        );
        for r in &self.runtimes {
            let worst = r.against_whole.iter().fold(0f64, |m, d| m.max(d.max_rel));
            s += &format!(
                "{}  {} stepwise vs whole sequence: {} comparisons, worst max_rel {:.3e}; prefill {:.1} ms, step median {}{}\n",
                if r.pass { "agree " } else { "DIFFER" },
                r.name,
                r.against_whole.len(),
                worst,
                r.prefill_ms,
                r.step_median_ms
                    .map_or("-".to_string(), |m| format!("{m:.2} ms")),
                if r.state_in_place {
                    "; state written in place"
                } else {
                    ""
                }
            );
            for d in r.against_whole.iter().filter(|d| !d.pass) {
                s += &format!(
                    "DIFFER  {}: {} max_abs {:.3e} max_rel {:.3e} (bound {:.3e})\n",
                    r.name, d.output, d.max_abs, d.max_rel, d.bound
                );
            }
        }
        for pr in &self.pairs {
            let worst = pr.outputs.iter().fold(0f64, |m, d| m.max(d.max_rel));
            s += &format!(
                "{}  {} vs {} stepwise logits and states: worst max_rel {:.3e}\n",
                if pr.pass { "agree " } else { "DIFFER" },
                pr.reference,
                pr.other,
                worst
            );
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_default_to_half_then_eight_steps_and_fit_n() {
        let p = DecodingPlan::new(512, None, None, None).unwrap();
        assert_eq!((p.prefill, p.steps, p.chunk), (256, 8, 4));
        let small = DecodingPlan::new(12, None, None, None).unwrap();
        assert_eq!((small.prefill, small.steps, small.chunk), (6, 3, 3));
        assert!(small.tokens() <= 12);
        let p = DecodingPlan::new(32, Some(20), Some(4), None).unwrap();
        assert_eq!(p.chunk, 4);
        let err = DecodingPlan::new(32, Some(30), Some(4), None).unwrap_err();
        assert!(
            err.to_string()
                .contains("must fit in the model's 32 positions"),
            "{err}"
        );
        assert!(DecodingPlan::new(32, Some(0), None, None).is_err());
        let pieces = DecodingPlan::new(16, Some(3), Some(2), Some(5))
            .unwrap()
            .pieces();
        let labels: Vec<&str> = pieces.iter().map(|p| p.0.as_str()).collect();
        assert_eq!(labels, ["prefill", "step 1", "step 2", "chunk"]);
        assert_eq!(pieces[3].1..pieces[3].1 + pieces[3].2, 5..10);
    }
}
