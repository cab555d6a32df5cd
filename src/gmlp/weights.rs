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
