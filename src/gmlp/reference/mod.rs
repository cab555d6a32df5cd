//! An independent forward pass in f64 with ndarray, written from the paper's equations
//! and the upstream implementations' sources (not from the emitted graph), to check what
//! the runtimes compute: the block's parts in `parts`, the stack and the model ends
//! here, and the incremental (stepwise) form of a causal model in `stepwise`.
//!
//! It reads the *logical* parameters (a Toeplitz W is its [2n−1] vector) and builds
//! `W[i, j] = w[j − i + n − 1]` itself; causality is applied here as the paper states it
//! (W[i, j] = 0 and attention masked for j > i), not by reading masked weights.
//!
//! Only tests call it, and it stays library code without a feature gate: the linker keeps
//! only what the binary reaches, so none of it is in `gmlp-onnx` (`nm` on a release build
//! finds no `gmlp::reference` symbol, nor any of its messages), while a gate would need the
//! package as its own dev-dependency and make `cargo build` and `cargo test` compile two
//! variants of the library.

mod params;
mod parts;
mod stepwise;

use ndarray::{Array2, Array3, ArrayView2, ArrayView3, ArrayView4, Axis};

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, StackKind, Task};
use crate::gmlp::weights::{param_specs, WeightSource};
use params::{token_ends, Params};
use parts::{block, feed_forward, norm};
pub use stepwise::forward_tokens_stepwise;

/// The stack of blocks on the embedded input `x` (sequential `x ← x + f_i(x)`, or
/// g-mlp-gpt's reversible stack), then the final norm (none for a backbone).
fn trunk(cfg: &GmlpConfig, p: &Params, x: Array2<f64>) -> Result<Array2<f64>> {
    let x = match cfg.block.stack {
        StackKind::Sequential => {
            let mut x = x;
            for i in 0..cfg.layers {
                x = &x + &block(cfg, p, i, &x)?;
            }
            x
        }
        StackKind::Reversible { ff_inner } => {
            let (mut x1, mut x2) = (x.clone(), x);
            for i in 0..cfg.layers {
                let y1 = &x1 + &block(cfg, p, i, &x2)?;
                let y2 = &x2 + &feed_forward(p, i, &y1, ff_inner)?;
                (x1, x2) = (y1, y2);
            }
            x1 + x2
        }
    };
    match cfg.task {
        Task::Backbone { .. } => Ok(x),
        _ => norm(cfg, p, "norm", &x, cfg.norm_eps),
    }
}

/// Logits [batch, T, vocab] of a token model for `ids` [batch, T]: T = n, or any
/// 1 ≤ T ≤ n for a causal model (its first T positions).
pub fn forward_tokens(
    cfg: &GmlpConfig,
    source: &dyn WeightSource,
    ids: ArrayView2<i64>,
) -> Result<Array3<f32>> {
    let Task::Tokens {
        vocab_size,
        seq_len,
        tied_embedding,
    } = cfg.task
    else {
        return Err(Error::Unsupported(
            "forward_tokens needs a token model".into(),
        ));
    };
    let len = ids.ncols();
    if !(len == seq_len || cfg.causal && (1..seq_len).contains(&len)) {
        return Err(Error::BadTensor(format!(
            "input_ids: expected {seq_len} tokens, got {len}"
        )));
    }
    let p = Params {
        specs: param_specs(cfg),
        source,
    };
    let (table, head, head_bias) = token_ends(&p, tied_embedding)?;
    let mut out = Array3::<f32>::zeros((ids.nrows(), len, vocab_size));
    for (b, row) in ids.rows().into_iter().enumerate() {
        let mut x = Array2::<f64>::zeros((len, cfg.d_model));
        for (t, &id) in row.iter().enumerate() {
            if id < 0 || id as usize >= vocab_size {
                return Err(Error::BadTensor(format!(
                    "input_ids: token {id} outside 0..{vocab_size}"
                )));
            }
            x.row_mut(t).assign(&table.row(id as usize));
        }
        let h = trunk(cfg, &p, x)?;
        let logits = h.dot(&head) + &head_bias;
        out.index_axis_mut(Axis(0), b)
            .assign(&logits.mapv(|v| v as f32));
    }
    Ok(out)
}

/// `last_hidden_state` [batch, n, d] of a backbone for `embeds` [batch, n, d].
pub fn forward_backbone(
    cfg: &GmlpConfig,
    source: &dyn WeightSource,
    embeds: ArrayView3<f32>,
) -> Result<Array3<f32>> {
    let Task::Backbone { seq_len } = cfg.task else {
        return Err(Error::Unsupported(
            "forward_backbone needs a backbone".into(),
        ));
    };
    let (batch, n, d) = embeds.dim();
    if (n, d) != (seq_len, cfg.d_model) {
        return Err(Error::BadTensor(format!(
            "inputs_embeds: expected [*, {seq_len}, {}], got [*, {n}, {d}]",
            cfg.d_model
        )));
    }
    let p = Params {
        specs: param_specs(cfg),
        source,
    };
    let mut out = Array3::<f32>::zeros((batch, n, d));
    for (b, x) in embeds.outer_iter().enumerate() {
        let h = trunk(cfg, &p, x.mapv(f64::from))?;
        out.index_axis_mut(Axis(0), b).assign(&h.mapv(|v| v as f32));
    }
    Ok(out)
}

/// Logits [batch, classes] of a vision model for `pixels` [batch, C, H, W].
pub fn forward_vision(
    cfg: &GmlpConfig,
    source: &dyn WeightSource,
    pixels: ArrayView4<f32>,
) -> Result<Array2<f32>> {
    let Task::Vision {
        image_size,
        patch_size,
        in_chans,
        num_classes,
    } = cfg.task
    else {
        return Err(Error::Unsupported(
            "forward_vision needs a vision model".into(),
        ));
    };
    let (_, c, hh, ww) = pixels.dim();
    if (c, hh, ww) != (in_chans, image_size, image_size) {
        return Err(Error::BadTensor(format!(
            "pixel_values: expected [*, {in_chans}, {image_size}, {image_size}], got [*, {c}, {hh}, {ww}]"
        )));
    }
    let p = Params {
        specs: param_specs(cfg),
        source,
    };
    let side = image_size / patch_size;
    let patch_len = in_chans * patch_size * patch_size;
    let stem = p
        .get("stem.weight")?
        .into_shape_with_order((cfg.d_model, patch_len))
        .map_err(|e| Error::BadTensor(format!("stem.weight: {e}")))?;
    let stem_bias = p.vector("stem.bias")?;
    let head = p.matrix("head.weight")?;
    let head_bias = p.vector("head.bias")?;
    let mut out = Array2::<f32>::zeros((pixels.dim().0, num_classes));
    for (b, img) in pixels.outer_iter().enumerate() {
        // Patches in row-major order, each flattened as (c, ky, kx) like the Conv weight.
        let patches = Array2::from_shape_fn((side * side, patch_len), |(t, k)| {
            let (py, px) = (t / side, t % side);
            let (ch, rest) = (k / (patch_size * patch_size), k % (patch_size * patch_size));
            let (ky, kx) = (rest / patch_size, rest % patch_size);
            f64::from(img[[ch, py * patch_size + ky, px * patch_size + kx]])
        });
        let x = patches.dot(&stem.t()) + &stem_bias;
        let h = trunk(cfg, &p, x)?;
        let pooled = h.mean_axis(Axis(0)).expect("n > 0");
        let logits = pooled.dot(&head) + &head_bias;
        out.row_mut(b).assign(&logits.mapv(|v| v as f32));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gmlp::config::{Precision, SpatialForm};
    use crate::gmlp::init::{InitScheme, SeededInit};
    use ndarray::s;

    fn causal_tokens(attn: Option<usize>, heads: usize, spatial: SpatialForm) -> GmlpConfig {
        GmlpConfig {
            task: Task::Tokens {
                vocab_size: 11,
                seq_len: 9,
                tied_embedding: false,
            },
            layers: 2,
            d_model: 8,
            d_ffn: 16,
            attn_dim: attn,
            causal: true,
            heads,
            shift_tokens: 0,
            spatial,
            norm_eps: 1e-5,
            sgu_norm_eps: 1e-5,
            dtype: Precision::F32,
            block: Default::default(),
        }
    }

    #[test]
    fn stepwise_equals_the_whole_sequence_at_every_position() {
        let source = SeededInit {
            seed: 3,
            scheme: InitScheme::Spread,
        };
        let ids = Array2::from_shape_fn((2, 9), |(b, t)| ((b * 5 + t * 7) % 11) as i64);
        let mut shifted = causal_tokens(Some(4), 1, SpatialForm::Dense);
        shifted.shift_tokens = 2;
        for cfg in [
            causal_tokens(None, 1, SpatialForm::ToeplitzGather),
            causal_tokens(Some(4), 1, SpatialForm::Dense),
            causal_tokens(Some(4), 2, SpatialForm::ToeplitzExpand),
            shifted,
        ] {
            let whole = forward_tokens(&cfg, &source, ids.view()).unwrap();
            for chunks in [&[9][..], &[4, 1, 1, 3], &[1; 9]] {
                let stepwise = forward_tokens_stepwise(&cfg, &source, ids.view(), chunks).unwrap();
                let diff = (&stepwise - &whole)
                    .mapv(f32::abs)
                    .fold(0f32, |m, &v| m.max(v));
                assert!(diff < 1e-5, "{chunks:?}: {diff}");
            }
            let prefix =
                forward_tokens_stepwise(&cfg, &source, ids.slice(s![.., ..5]), &[2, 3]).unwrap();
            let diff = (&prefix - &whole.slice(s![.., ..5, ..]))
                .mapv(f32::abs)
                .fold(0f32, |m, &v| m.max(v));
            assert!(diff < 1e-5, "prefix: {diff}");
        }
        let cfg = causal_tokens(None, 1, SpatialForm::Dense);
        assert!(forward_tokens_stepwise(&cfg, &source, ids.view(), &[4, 4]).is_err());
        let mut bidirectional = cfg.clone();
        bidirectional.causal = false;
        assert!(forward_tokens_stepwise(&bidirectional, &source, ids.view(), &[9]).is_err());
    }
}
