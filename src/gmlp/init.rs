//! Seeded initialization: deterministic parameters for builds without trained weights, the
//! paper's scheme (§2.1) or one that moves every parameter away from its trivial value.

use clap::ValueEnum;

use crate::error::Result;
use crate::gmlp::weights::{ParamKind, ParamSpec, WeightSource};
use crate::rng::SplitMix64;
use crate::spelling::spelling;

/// How [`SeededInit`] draws values (`--init`; each variant's first doc paragraph is its
/// `--help` line).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum InitScheme {
    /// The paper's init: W near zero, b = 1 (identity gating at start).
    ///
    /// §2.1: W uniform in ±1e-3/n and b = 1 so every gating unit starts as an identity
    /// gate; LayerNorms γ = 1, β = 0; projections uniform in ±1/√fan_in (PyTorch's
    /// default); embedding uniform with standard deviation 0.02.
    Paper,
    /// Every parameter away from its trivial value (for testing exports).
    ///
    /// W uniform in ±1/√n, b, γ, β spread around their defaults, so that a wiring mistake
    /// anywhere changes the outputs: for testing exports against a reference.
    Spread,
}

impl InitScheme {
    /// The command-line spelling, also in a seeded model's description.
    pub fn name(self) -> String {
        spelling(&self)
    }
}

/// Deterministic pseudo-random parameters: each tensor is drawn from its own stream,
/// keyed by the seed and the parameter's name, so values do not depend on emission order
/// or on the spatial form (a Toeplitz vector is the same whether emitted as a Gather or
/// expanded).
#[derive(Clone, Debug)]
pub struct SeededInit {
    /// Seed of every stream.
    pub seed: u64,
    /// Distribution family.
    pub scheme: InitScheme,
}

impl WeightSource for SeededInit {
    fn values(&self, spec: &ParamSpec) -> Result<Vec<f32>> {
        let mut rng = SplitMix64::keyed(self.seed, &spec.name);
        let len = spec.len();
        let spread = self.scheme == InitScheme::Spread;
        let mut uniform = |lo: f64, hi: f64| rng.uniform_f32(len, lo as f32, hi as f32);
        let values = match spec.kind {
            ParamKind::NormScale if spread => uniform(0.5, 1.5),
            ParamKind::NormScale => vec![1.0; len],
            ParamKind::NormShift if spread => uniform(-0.5, 0.5),
            ParamKind::NormShift => vec![0.0; len],
            ParamKind::Weight { fan_in } | ParamKind::Bias { fan_in } => {
                let bound = 1.0 / (fan_in.max(1) as f64).sqrt();
                uniform(-bound, bound)
            }
            ParamKind::Embedding => {
                // Uniform with standard deviation 0.02 (1 for spread): bound = std·√3.
                let bound = if spread { 1.0 } else { 0.02 } * 3f64.sqrt();
                uniform(-bound, bound)
            }
            ParamKind::Spatial { n } => {
                let bound = if spread {
                    1.0 / (n as f64).sqrt()
                } else {
                    1e-3 / n as f64
                };
                uniform(-bound, bound)
            }
            ParamKind::SpatialBias if spread => uniform(0.5, 1.5),
            ParamKind::SpatialBias => vec![1.0; len],
        };
        Ok(values)
    }
}
