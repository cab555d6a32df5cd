//! The model's parameters by name ("native" layout), and where their values come from.
//!
//! Native layout (MatMul weights are stored `[in, out]`, i.e. transposed from PyTorch's
//! `Linear.weight [out, in]`, so the graph needs no runtime Transpose):
//!
//! | name | shape | meaning |
//! |---|---|---|
//! | `embed.weight` | [vocab, d] | token embedding, tied to the output projection |
//! | `stem.weight`, `stem.bias` | [d, C, p, p], [d] | patch embedding (Conv, stride p) |
//! | `blocks.{i}.norm.{weight,bias}` | [d] | LN of the block input |
//! | `blocks.{i}.proj_in.{weight,bias}` | [d, f], [f] | U |
//! | `blocks.{i}.sgu.norm.{weight,bias}` | [e] | LN of Z2 |
//! | `blocks.{i}.sgu.spatial.weight` | [2n−1] (Toeplitz) or [n, n]; [h, …] with h > 1 heads | W, `W[i,j] = w[j−i+n−1]` |
//! | `blocks.{i}.sgu.spatial.bias` | [n]; [h, n] with h > 1 heads | b, one value per token |
//! | `blocks.{i}.attn.qkv.weight` | [d, 3a] | tiny attention q, k, v (no bias) |
//! | `blocks.{i}.attn.out.{weight,bias}` | [a, e], [e] | tiny attention output |
//! | `blocks.{i}.proj_out.{weight,bias}` | [e, d], [d] | V |
//! | `norm.{weight,bias}` | [d] | final LN |
//! | `head.weight`, `head.bias` | [d, classes or vocab], [classes or vocab] | classifier / output projection (no `head.weight` when tied to the embedding) |

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Task};

/// What a parameter is, which decides its initialization.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ParamKind {
    /// LayerNorm scale γ.
    NormScale,
    /// LayerNorm shift β.
    NormShift,
    /// A projection weight with the given fan-in (Linear or Conv).
    Weight {
        /// Inputs per output unit.
        fan_in: usize,
    },
    /// A projection bias with the given fan-in.
    Bias {
        /// Inputs per output unit of the projection it belongs to.
        fan_in: usize,
    },
    /// Token embedding.
    Embedding,
    /// Spatial weight W (dense [n, n] or Toeplitz vector [2n−1]) for n tokens.
    Spatial {
        /// Number of tokens.
        n: usize,
    },
    /// Spatial bias b.
    SpatialBias,
}

/// One logical parameter of the model.
#[derive(Clone, Debug, PartialEq)]
pub struct ParamSpec {
    /// Native name, e.g. `blocks.0.sgu.spatial.weight`.
    pub name: String,
    /// Logical shape (a Toeplitz W is its [2n−1] vector).
    pub shape: Vec<usize>,
    /// What it is.
    pub kind: ParamKind,
}

impl ParamSpec {
    /// Number of values.
    pub fn len(&self) -> usize {
        self.shape.iter().product()
    }
    /// True if the parameter has no value.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Every parameter of `cfg`, in emission order.
pub fn param_specs(cfg: &GmlpConfig) -> Vec<ParamSpec> {
    let (d, f, e, n) = (cfg.d_model, cfg.d_ffn, cfg.gate_dim(), cfg.seq_len());
    let mut specs = Vec::new();
    let mut push =
        |name: String, shape: Vec<usize>, kind| specs.push(ParamSpec { name, shape, kind });
    match &cfg.task {
        Task::Tokens { vocab_size, .. } => push(
            "embed.weight".into(),
            vec![*vocab_size, d],
            ParamKind::Embedding,
        ),
        Task::Vision {
            patch_size,
            in_chans,
            ..
        } => {
            let fan_in = in_chans * patch_size * patch_size;
            push(
                "stem.weight".into(),
                vec![d, *in_chans, *patch_size, *patch_size],
                ParamKind::Weight { fan_in },
            );
            push("stem.bias".into(), vec![d], ParamKind::Bias { fan_in });
        }
    }
    for i in 0..cfg.layers {
        let b = format!("blocks.{i}");
        push(format!("{b}.norm.weight"), vec![d], ParamKind::NormScale);
        push(format!("{b}.norm.bias"), vec![d], ParamKind::NormShift);
        push(
            format!("{b}.proj_in.weight"),
            vec![d, f],
            ParamKind::Weight { fan_in: d },
        );
        push(
            format!("{b}.proj_in.bias"),
            vec![f],
            ParamKind::Bias { fan_in: d },
        );
        push(
            format!("{b}.sgu.norm.weight"),
            vec![e],
            ParamKind::NormScale,
        );
        push(format!("{b}.sgu.norm.bias"), vec![e], ParamKind::NormShift);
        let mut w_shape = if cfg.spatial.is_toeplitz() {
            vec![2 * n - 1]
        } else {
            vec![n, n]
        };
        let mut b_shape = vec![n];
        if cfg.heads > 1 {
            w_shape.insert(0, cfg.heads);
            b_shape.insert(0, cfg.heads);
        }
        push(
            format!("{b}.sgu.spatial.weight"),
            w_shape,
            ParamKind::Spatial { n },
        );
        push(
            format!("{b}.sgu.spatial.bias"),
            b_shape,
            ParamKind::SpatialBias,
        );
        if let Some(a) = cfg.attn_dim {
            push(
                format!("{b}.attn.qkv.weight"),
                vec![d, 3 * a],
                ParamKind::Weight { fan_in: d },
            );
            push(
                format!("{b}.attn.out.weight"),
                vec![a, e],
                ParamKind::Weight { fan_in: a },
            );
            push(
                format!("{b}.attn.out.bias"),
                vec![e],
                ParamKind::Bias { fan_in: a },
            );
        }
        push(
            format!("{b}.proj_out.weight"),
            vec![e, d],
            ParamKind::Weight { fan_in: e },
        );
        push(
            format!("{b}.proj_out.bias"),
            vec![d],
            ParamKind::Bias { fan_in: e },
        );
    }
    push("norm.weight".into(), vec![d], ParamKind::NormScale);
    push("norm.bias".into(), vec![d], ParamKind::NormShift);
    match &cfg.task {
        Task::Tokens {
            vocab_size,
            tied_embedding,
            ..
        } => {
            if !tied_embedding {
                push(
                    "head.weight".into(),
                    vec![d, *vocab_size],
                    ParamKind::Weight { fan_in: d },
                );
            }
            push(
                "head.bias".into(),
                vec![*vocab_size],
                ParamKind::Bias { fan_in: d },
            )
        }
        Task::Vision { num_classes, .. } => {
            push(
                "head.weight".into(),
                vec![d, *num_classes],
                ParamKind::Weight { fan_in: d },
            );
            push(
                "head.bias".into(),
                vec![*num_classes],
                ParamKind::Bias { fan_in: d },
            );
        }
    }
    specs
}

/// A provider of parameter values by [`ParamSpec`] (seeded init, or a checkpoint).
pub trait WeightSource: Send + Sync {
    /// The values of `spec`, row-major, exactly `spec.len()` of them.
    fn values(&self, spec: &ParamSpec) -> Result<Vec<f32>>;
}

/// How [`SeededInit`] draws values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InitScheme {
    /// The paper's init (§2.1): W uniform in ±1e-3/n and b = 1 so every gating unit starts
    /// as an identity gate; LayerNorms γ = 1, β = 0; projections uniform in ±1/√fan_in
    /// (PyTorch's default); embedding uniform with standard deviation 0.02.
    Paper,
    /// Every parameter away from its trivial value (W uniform in ±1/√n, b, γ, β spread
    /// around their defaults), so that a wiring mistake anywhere changes the outputs:
    /// for testing exports against a reference.
    Spread,
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

/// SplitMix64 (Steele, Lea, Flood 2014): a small, well-mixed 64-bit generator.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A stream for `seed` and a key string (FNV-1a hashed).
    pub fn keyed(seed: u64, key: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let mut s = SplitMix64(seed ^ h.rotate_left(17));
        s.next_u64();
        s
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }
    /// `len` values uniform in [lo, hi) in f32, two 24-bit draws per 64 random bits (the
    /// fast path for large weight tensors).
    pub fn uniform_f32(&mut self, len: usize, lo: f32, hi: f32) -> Vec<f32> {
        const SCALE: f32 = 1.0 / (1u32 << 24) as f32;
        let span = hi - lo;
        let mut out = vec![0f32; len];
        let mut pairs = out.chunks_exact_mut(2);
        for pair in &mut pairs {
            let x = self.next_u64();
            pair[0] = lo + span * ((x >> 40) as f32 * SCALE);
            pair[1] = lo + span * (((x >> 8) & 0xff_ffff) as f32 * SCALE);
        }
        if let [last] = pairs.into_remainder() {
            *last = lo + span * ((self.next_u64() >> 40) as f32 * SCALE);
        }
        out
    }
    /// Uniform integer in [0, bound).
    pub fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }
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

/// Checks that `values` fits `spec` and is finite; the error names the tensor.
pub fn check_values(spec: &ParamSpec, values: &[f32]) -> Result<()> {
    if values.len() != spec.len() {
        return Err(Error::BadTensor(format!(
            "{}: expected {} values for shape {:?}, got {}",
            spec.name,
            spec.len(),
            spec.shape,
            values.len()
        )));
    }
    // Branch-free scan first (it vectorizes); locate the offender only on failure.
    let all_finite = values
        .chunks(4096)
        .all(|c| c.iter().fold(true, |ok, v| ok & v.is_finite()));
    if all_finite {
        return Ok(());
    }
    if let Some(k) = values.iter().position(|v| !v.is_finite()) {
        return Err(Error::BadTensor(format!(
            "{}: value {} at flat index {k} is not finite",
            spec.name, values[k]
        )));
    }
    Ok(())
}

/// Toeplitz expansion `W[i, j] = w[j − i + n − 1]` (paper appendix C), row-major [n, n].
pub fn toeplitz_expand(w: &[f32], n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * n);
    for i in 0..n {
        // Row i reads w[n-1-i ..= 2n-2-i] in order.
        out.extend_from_slice(&w[n - 1 - i..2 * n - 1 - i]);
    }
    out
}

/// The int64 index table `idx[i][j] = j − i + n − 1` such that `Gather(w, idx)` = W.
pub fn toeplitz_index(n: usize) -> Vec<i64> {
    let n = n as i64;
    (0..n)
        .flat_map(|i| (0..n).map(move |j| j - i + n - 1))
        .collect()
}
