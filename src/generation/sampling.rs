//! Choosing the next token from a row of logits: greedy (argmax), or sampling from the
//! softmax at a temperature, optionally restricted to the k most likely tokens and then to
//! the smallest set of most likely tokens whose probability reaches p (nucleus sampling,
//! Holtzman et al. 2020; the order of onnxruntime-genai's top-k-then-top-p search), drawn
//! from a seeded SplitMix64 stream so that a run can be repeated (and compared across
//! runtimes).

use crate::rng::SplitMix64;

/// What is wrong with a sampling setting (a command names its own flag for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SamplingError {
    /// A temperature below 0, or not finite.
    #[error("the temperature must be a finite number >= 0")]
    Temperature,
    /// A top-k of 0.
    #[error("top-k must be at least 1")]
    TopK,
    /// A top-p outside (0, 1].
    #[error("top-p must be a probability in (0, 1]")]
    TopP,
}

impl From<SamplingError> for crate::error::Error {
    fn from(e: SamplingError) -> Self {
        crate::error::Error::OutOfRange(e.to_string())
    }
}

/// Picks tokens from logits.
pub struct Sampler {
    temperature: f64,
    top_k: Option<usize>,
    top_p: Option<f64>,
    rng: SplitMix64,
}

impl Sampler {
    /// Greedy when `temperature` is 0 (and no `top_k` or `top_p`); otherwise samples at
    /// `temperature` (> 0, default 1 when only `top_k` or `top_p` is given) among the
    /// `top_k` most likely tokens, and among those the fewest most likely whose
    /// probabilities add up to `top_p` (0 < p ≤ 1).
    pub fn new(
        temperature: Option<f64>,
        top_k: Option<usize>,
        top_p: Option<f64>,
        seed: u64,
    ) -> Result<Sampler, SamplingError> {
        let temperature = temperature.unwrap_or(if top_k.is_some() || top_p.is_some() {
            1.0
        } else {
            0.0
        });
        if !(temperature.is_finite() && temperature >= 0.0) {
            return Err(SamplingError::Temperature);
        }
        if top_k == Some(0) {
            return Err(SamplingError::TopK);
        }
        if top_p.is_some_and(|p| !(p > 0.0 && p <= 1.0)) {
            return Err(SamplingError::TopP);
        }
        Ok(Sampler {
            temperature,
            top_k,
            top_p,
            rng: SplitMix64::keyed(seed, "sampling"),
        })
    }

    /// True when every pick is the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0 || self.top_k == Some(1)
    }

    /// The next token for one row of `logits` (NaN logits are never picked).
    pub fn pick(&mut self, logits: &[f32]) -> usize {
        if self.is_greedy() {
            return argmax(logits);
        }
        let mut order: Vec<usize> = (0..logits.len()).filter(|&i| !logits[i].is_nan()).collect();
        // Most likely first; ties keep the lower id first (a stable order).
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if order.is_empty() {
            return 0;
        }
        let kept = &order[..self.top_k.unwrap_or(order.len()).min(order.len())];
        let max = f64::from(logits[kept[0]]);
        let mut weights: Vec<f64> = kept
            .iter()
            .map(|&i| ((f64::from(logits[i]) - max) / self.temperature).exp())
            .collect();
        let mut total: f64 = weights.iter().sum();
        if let Some(p) = self.top_p {
            // The fewest most likely tokens whose probability reaches p (at least one).
            let mut sum = 0.0;
            let keep = weights
                .iter()
                .position(|w| {
                    sum += w;
                    sum >= p * total
                })
                .map_or(weights.len(), |k| k + 1);
            weights.truncate(keep);
            total = weights.iter().sum();
        }
        let kept = &kept[..weights.len()];
        let mut draw = self.rng.next_f64() * total;
        for (&id, w) in kept.iter().zip(&weights) {
            if draw < *w {
                return id;
            }
            draw -= w;
        }
        kept[kept.len() - 1]
    }
}

/// The greedy pick: the index of the largest of `logits` (by `total_cmp`), the lowest
/// index among equals, NaNs never picked (0 when every one is NaN). One pass, the order
/// [`Sampler::pick`]'s sort would give first.
pub fn argmax(logits: &[f32]) -> usize {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in logits.iter().enumerate() {
        if v.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| v.total_cmp(&b) == std::cmp::Ordering::Greater) {
            best = Some((i, v));
        }
    }
    best.map_or(0, |(i, _)| i)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_takes_the_argmax_and_sampling_repeats_with_the_seed() {
        let logits = [0.1f32, 2.0, -1.0, 2.0, 1.5];
        let mut greedy = Sampler::new(None, None, None, 0).unwrap();
        assert!(greedy.is_greedy());
        assert_eq!(greedy.pick(&logits), 1, "first of the tied maxima");
        assert_eq!(
            Sampler::new(Some(0.7), Some(1), None, 3)
                .unwrap()
                .pick(&logits),
            1
        );
        let draw = |seed| {
            let mut s = Sampler::new(Some(1.0), Some(3), None, seed).unwrap();
            (0..200).map(|_| s.pick(&logits)).collect::<Vec<_>>()
        };
        let a = draw(5);
        assert_eq!(a, draw(5), "same seed, same tokens");
        assert!(a.iter().all(|t| [1, 3, 4].contains(t)), "only the top 3");
        for t in [1, 3, 4] {
            assert!(a.contains(&t), "token {t} never drawn");
        }
        // Frequencies follow the softmax: p(4) = e^-0.5 / (2 + e^-0.5) ≈ 0.23.
        let fours = a.iter().filter(|&&t| t == 4).count() as f64 / a.len() as f64;
        assert!((fours - 0.233).abs() < 0.08, "{fours}");
        let refused = |t, k, p| Sampler::new(t, k, p, 0).err();
        assert_eq!(
            refused(Some(-1.0), None, None),
            Some(SamplingError::Temperature)
        );
        assert_eq!(
            refused(Some(f64::NAN), None, None),
            Some(SamplingError::Temperature)
        );
        assert_eq!(refused(None, Some(0), None), Some(SamplingError::TopK));
        for p in [0.0, -0.5, 1.5, f64::NAN] {
            assert!(Sampler::new(None, None, Some(p), 0).is_err(), "top_p {p}");
        }
        let mut s = Sampler::new(None, None, None, 0).unwrap();
        assert_eq!(s.pick(&[f32::NAN, 1.0]), 1);
    }

    #[test]
    fn top_p_keeps_the_fewest_most_likely_tokens_reaching_p() {
        // Probabilities at temperature 1: softmax(ln 0.5, ln 0.3, ln 0.15, ln 0.05).
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.15f32.ln(), 0.05f32.ln()];
        let draw = |p: f64, seed| {
            let mut s = Sampler::new(None, None, Some(p), seed).unwrap();
            assert!(!s.is_greedy());
            (0..400).map(|_| s.pick(&logits)).collect::<Vec<_>>()
        };
        // p = 0.75: 0.5 + 0.3 reaches it, so tokens 0 and 1 only, in ratio 5:3.
        let a = draw(0.75, 1);
        assert!(a.iter().all(|&t| t < 2), "only the nucleus");
        let zeros = a.iter().filter(|&&t| t == 0).count() as f64 / a.len() as f64;
        assert!((zeros - 0.625).abs() < 0.08, "{zeros}");
        // p = 0.4 is reached by the first token alone.
        assert!(draw(0.4, 2).iter().all(|&t| t == 0));
        // p = 1 keeps every token, each drawn sometimes.
        let all = draw(1.0, 3);
        for t in 0..4 {
            assert!(all.contains(&t), "token {t} never drawn");
        }
        // top-k first, then top-p within it: k = 3, p = 0.9 of (0.5, 0.3, 0.15)/0.95.
        let mut s = Sampler::new(None, Some(3), Some(0.9), 4).unwrap();
        let picks: Vec<usize> = (0..400).map(|_| s.pick(&logits)).collect();
        assert!(picks.iter().all(|&t| t < 3) && picks.contains(&2));
    }
}
