//! The model's parameters by name ("native" layout), and where their values come from.
//!
//! Native layout (MatMul weights are stored `[in, out]`, i.e. transposed from PyTorch's
//! `Linear.weight [out, in]`, so the graph needs no runtime Transpose):
//!
//! | name | shape | meaning |
//! |---|---|---|
//! | `embed.weight` | `[vocab, d]` | token embedding, tied to the output projection |
//! | `stem.weight`, `stem.bias` | `[d, C, p, p]`, `[d]` | patch embedding (Conv, stride p) |
//! | `blocks.{i}.norm.{weight,bias}` | `[d]` | LN of the block input |
//! | `blocks.{i}.proj_in.{weight,bias}` | `[d, f]`, `[f]` | U |
//! | `blocks.{i}.sgu.norm.{weight,bias}` | `[e]` | LN of Z2 |
//! | `blocks.{i}.sgu.spatial.weight` | `[2n−1]` (Toeplitz), `[n, n]`, or `[w, 2w]` with a window w; `[h, …]` with h > 1 heads | W, `W[i,j] = w[j−i+n−1]` |
//! | `blocks.{i}.sgu.spatial.bias` | `[n]` (`[w]` with a window); `[h, …]` with h > 1 heads | b, one value per token (absent without `spatial_bias`) |
//! | `blocks.{i}.attn.qkv.weight` | `[d, 3a]` | tiny attention q, k, v (`attn.qkv.bias` `[3a]` with `attn_qkv_bias`) |
//! | `blocks.{i}.attn.out.{weight,bias}` | `[a, e]`, `[e]` | tiny attention output |
//! | `blocks.{i}.proj_out.{weight,bias}` | `[e, d]`, `[d]` | V |
//! | `blocks.{i}.fold.{weight,bias}` | `[d, 1, k]`, `[d]` | causal depthwise Conv1d after an axial fold of k (g-mlp-gpt `AxiallyFold`) |
//! | `blocks.{i}.ff.proj_in.{weight,bias}`, `blocks.{i}.ff.proj_out.{weight,bias}` | `[d, 2h]`, `[2h]`, `[h, d]`, `[d]` | GEGLU feed-forward of a reversible stack (g-mlp-gpt `FeedForward`) |
//! | `norm.{weight,bias}` | `[d]` | final LN (RMSNorm: `weight` only, as every norm) |
//! | `head.weight`, `head.bias` | `[d, classes or vocab]`, `[classes or vocab]` | classifier / output projection (no `head.weight` when tied to the embedding) |

use std::borrow::Cow;

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, StackKind, Task};
use crate::tensor::F32Sink;

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
    let d = cfg.d_model;
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
        Task::Backbone { .. } => {}
    }
    for i in 0..cfg.layers {
        block_specs(cfg, i, &mut push);
    }
    let head_dims = match &cfg.task {
        Task::Tokens { vocab_size, .. } => Some(*vocab_size),
        Task::Vision { num_classes, .. } => Some(*num_classes),
        Task::Backbone { .. } => None,
    };
    if let Some(out) = head_dims {
        norm_specs(cfg, "norm", d, &mut push);
        let tied = matches!(
            cfg.task,
            Task::Tokens {
                tied_embedding: true,
                ..
            }
        );
        if !tied {
            push(
                "head.weight".into(),
                vec![d, out],
                ParamKind::Weight { fan_in: d },
            );
        }
        push("head.bias".into(), vec![out], ParamKind::Bias { fan_in: d });
    }
    specs
}

/// The scale (and, for a norm with a shift such as LayerNorm, the shift) of the norm
/// `prefix` over `width` channels.
fn norm_specs(
    cfg: &GmlpConfig,
    prefix: &str,
    width: usize,
    push: &mut impl FnMut(String, Vec<usize>, ParamKind),
) {
    push(
        format!("{prefix}.weight"),
        vec![width],
        ParamKind::NormScale,
    );
    if cfg.block.norm.has_shift() {
        push(format!("{prefix}.bias"), vec![width], ParamKind::NormShift);
    }
}

/// A projection `{prefix}.weight [fan_in, out]` and, with `bias`, `{prefix}.bias [out]`.
fn linear_specs(
    prefix: &str,
    fan_in: usize,
    out: usize,
    bias: bool,
    push: &mut impl FnMut(String, Vec<usize>, ParamKind),
) {
    push(
        format!("{prefix}.weight"),
        vec![fan_in, out],
        ParamKind::Weight { fan_in },
    );
    if bias {
        push(
            format!("{prefix}.bias"),
            vec![out],
            ParamKind::Bias { fan_in },
        );
    }
}

/// The parameters of block `i` (see the table in the module doc).
fn block_specs(cfg: &GmlpConfig, i: usize, push: &mut impl FnMut(String, Vec<usize>, ParamKind)) {
    let (d, f, e, n) = (cfg.d_model, cfg.d_ffn, cfg.gate_dim(), cfg.seq_len());
    let b = format!("blocks.{i}");
    let mixing = cfg.block.mixing(i);
    norm_specs(cfg, &format!("{b}.norm"), d, push);
    linear_specs(&format!("{b}.proj_in"), d, f, true, push);
    norm_specs(cfg, &format!("{b}.sgu.norm"), e, push);
    let (mut w_shape, mut b_shape, rows) = match mixing.window {
        Some(w) => (vec![w, 2 * w], vec![w], w),
        None if cfg.spatial.is_toeplitz() => (vec![2 * n - 1], vec![n], n),
        None => (vec![n, n], vec![n], n),
    };
    if cfg.heads > 1 {
        w_shape.insert(0, cfg.heads);
        b_shape.insert(0, cfg.heads);
    }
    push(
        format!("{b}.sgu.spatial.weight"),
        w_shape,
        ParamKind::Spatial { n: rows },
    );
    if cfg.block.spatial_bias {
        push(
            format!("{b}.sgu.spatial.bias"),
            b_shape,
            ParamKind::SpatialBias,
        );
    }
    if let Some(a) = cfg.attn_dim {
        linear_specs(
            &format!("{b}.attn.qkv"),
            d,
            3 * a,
            cfg.block.attn_qkv_bias,
            push,
        );
        linear_specs(&format!("{b}.attn.out"), a, e, true, push);
    }
    linear_specs(&format!("{b}.proj_out"), e, d, true, push);
    if mixing.fold > 1 {
        // Depthwise Conv1d weight [d, 1, fold] (PyTorch's layout, ONNX Conv's too).
        let k = mixing.fold;
        push(
            format!("{b}.fold.weight"),
            vec![d, 1, k],
            ParamKind::Weight { fan_in: k },
        );
        push(
            format!("{b}.fold.bias"),
            vec![d],
            ParamKind::Bias { fan_in: k },
        );
    }
    if let StackKind::Reversible { ff_inner } = cfg.block.stack {
        linear_specs(&format!("{b}.ff.proj_in"), d, 2 * ff_inner, true, push);
        linear_specs(&format!("{b}.ff.proj_out"), ff_inner, d, true, push);
    }
}

/// A provider of parameter values by [`ParamSpec`] (seeded init, or a checkpoint).
pub trait WeightSource: Send + Sync {
    /// The values of `spec`, row-major, exactly `spec.len()` of them.
    fn values(&self, spec: &ParamSpec) -> Result<Vec<f32>>;

    /// Columns `[start, end)` of the 2-D `spec` (`[rows, end - start]`, row-major): this
    /// default cuts them from [`WeightSource::values`]; a checkpoint reads only the stored
    /// rows they are (one half of a PyTorch `proj_in [2f, d]`, not the whole).
    fn columns(&self, spec: &ParamSpec, start: usize, end: usize) -> Result<Vec<f32>> {
        let cols = spec.shape.get(1).copied().unwrap_or(1);
        Ok(crate::gmlp::quantize::column_range(
            self.values(spec)?,
            cols,
            start,
            end,
        ))
    }

    /// The values of `spec` handed to `sink` in order, each run checked finite before it
    /// is handed on: this default hands [`WeightSource::values`] whole (checked by
    /// [`check_values`]); a checkpoint hands its stored bytes a run at a time, transposed
    /// in strips where the graph's layout is the transpose of its own, each run checked
    /// while it is in cache.
    fn stream(&self, spec: &ParamSpec, sink: &mut F32Sink<'_>) -> Result<()> {
        stream_whole(self, spec, sink)
    }

    /// [`WeightSource::columns`] handed to `sink` in order and checked, as
    /// [`WeightSource::stream`] hands all of them.
    fn stream_columns(
        &self,
        spec: &ParamSpec,
        start: usize,
        end: usize,
        sink: &mut F32Sink<'_>,
    ) -> Result<()> {
        stream_columns_whole(self, spec, start, end, sink)
    }
}

/// `source`'s [`WeightSource::values`] of `spec`, checked by [`check_values`], handed to
/// `sink` whole: what [`WeightSource::stream`] does where a source cannot stream.
pub fn stream_whole(
    source: &(impl WeightSource + ?Sized),
    spec: &ParamSpec,
    sink: &mut F32Sink<'_>,
) -> Result<()> {
    let values = source.values(spec)?;
    check_values(spec, &values)?;
    sink(Cow::Owned(values))
}

/// `source`'s [`WeightSource::columns`] `start..end` of `spec`, checked, handed to `sink`
/// whole: what [`WeightSource::stream_columns`] does where a source cannot stream.
pub fn stream_columns_whole(
    source: &(impl WeightSource + ?Sized),
    spec: &ParamSpec,
    start: usize,
    end: usize,
    sink: &mut F32Sink<'_>,
) -> Result<()> {
    let values = source.columns(spec, start, end)?;
    check_values(&columns_spec(spec, start, end), &values)?;
    sink(Cow::Owned(values))
}

/// The spec of columns `[start, end)` of the 2-D `spec` (`[rows, end - start]`, same name).
pub fn columns_spec(spec: &ParamSpec, start: usize, end: usize) -> ParamSpec {
    ParamSpec {
        shape: vec![spec.shape.first().copied().unwrap_or(1), end - start],
        ..spec.clone()
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
    if let Some(k) = crate::tensor::first_not_finite(values) {
        return Err(Error::NotFinite(format!(
            "{}: value {} at flat index {k} is not finite",
            spec.name, values[k]
        )));
    }
    Ok(())
}
