//! An independent forward pass in f64 with ndarray, written from the paper's equations
//! (not from the emitted graph), to check what the runtimes compute.
//!
//! It reads the *logical* parameters (a Toeplitz W is its [2n−1] vector) and builds
//! `W[i, j] = w[j − i + n − 1]` itself; causality is applied here as the paper states it
//! (W[i, j] = 0 and attention masked for j > i), not by reading masked weights.

use ndarray::{s, Array1, Array2, Array3, ArrayD, ArrayView2, ArrayView4, Axis, IxDyn};

use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, Task};
use crate::gmlp::weights::{param_specs, ParamSpec, WeightSource};

struct Params<'a> {
    specs: Vec<ParamSpec>,
    source: &'a dyn WeightSource,
}

impl Params<'_> {
    fn get(&self, name: &str) -> Result<ArrayD<f64>> {
        let spec = self
            .specs
            .iter()
            .find(|s| s.name == name)
            .ok_or_else(|| Error::InvalidConfig(format!("no parameter named {name}")))?;
        let values = self.source.values(spec)?;
        ArrayD::from_shape_vec(IxDyn(&spec.shape), values)
            .map(|a| a.mapv(f64::from))
            .map_err(|e| Error::BadTensor(format!("{name}: {e}")))
    }
    fn matrix(&self, name: &str) -> Result<Array2<f64>> {
        self.get(name)?
            .into_dimensionality()
            .map_err(|e| Error::BadTensor(format!("{name}: {e}")))
    }
    fn vector(&self, name: &str) -> Result<Array1<f64>> {
        self.get(name)?
            .into_dimensionality()
            .map_err(|e| Error::BadTensor(format!("{name}: {e}")))
    }
}

/// LayerNorm over the last axis with biased variance, as PyTorch and ONNX define it.
fn layer_norm(x: &Array2<f64>, gamma: &Array1<f64>, beta: &Array1<f64>, eps: f64) -> Array2<f64> {
    let mut out = x.clone();
    for mut row in out.rows_mut() {
        let mean = row.mean().unwrap_or(0.0);
        let var = row.mapv(|v| (v - mean) * (v - mean)).mean().unwrap_or(0.0);
        let inv = 1.0 / (var + eps).sqrt();
        row.mapv_inplace(|v| (v - mean) * inv);
        row *= gamma;
        row += beta;
    }
    out
}

/// Exact GELU, x·Φ(x) = 0.5·x·(1 + erf(x/√2)).
fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

fn softmax_rows(x: &mut Array2<f64>) {
    for mut row in x.rows_mut() {
        let max = row.fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        row.mapv_inplace(|v| (v - max).exp());
        let sum = row.sum();
        row /= sum;
    }
}

/// The spatial matrices W [n, n] of one layer, one per head, from its logical parameter.
fn spatial_matrices(cfg: &GmlpConfig, w: ArrayD<f64>) -> Vec<Array2<f64>> {
    let n = cfg.seq_len();
    let per_head = if cfg.spatial.is_toeplitz() {
        2 * n - 1
    } else {
        n * n
    };
    let flat = w.into_raw_vec_and_offset().0;
    flat.chunks(per_head)
        .map(|w| {
            let mut full = if cfg.spatial.is_toeplitz() {
                Array2::from_shape_fn((n, n), |(i, j)| w[j + n - 1 - i])
            } else {
                Array2::from_shape_vec((n, n), w.to_vec()).expect("dense W is n x n")
            };
            if cfg.causal {
                full.indexed_iter_mut()
                    .filter(|((i, j), _)| j > i)
                    .for_each(|(_, v)| *v = 0.0);
            }
            full
        })
        .collect()
}

/// Token shift: channel chunk k moves by `amounts[k]` tokens, out[i] = h[i − a], zero fill.
fn shift_tokens(cfg: &GmlpConfig, h: &Array2<f64>) -> Array2<f64> {
    let amounts = cfg.shift_amounts();
    let mut out = h.clone();
    if amounts.is_empty() {
        return out;
    }
    let (n, chunk) = (h.nrows(), cfg.d_model / amounts.len());
    for (k, &a) in amounts.iter().enumerate() {
        for c in k * chunk..(k + 1) * chunk {
            for i in 0..n {
                let src = i as i64 - a;
                out[[i, c]] = if (0..n as i64).contains(&src) {
                    h[[src as usize, c]]
                } else {
                    0.0
                };
            }
        }
    }
    out
}

/// The block's input LayerNorm, `LN(x)` (paper eq. 1).
fn block_norm(cfg: &GmlpConfig, p: &Params, b: &str, x: &Array2<f64>) -> Result<Array2<f64>> {
    Ok(layer_norm(
        x,
        &p.vector(&format!("{b}.norm.weight"))?,
        &p.vector(&format!("{b}.norm.bias"))?,
        f64::from(cfg.norm_eps),
    ))
}

/// The per-token half of a block on its normalized input `h`: `z = GELU(h·U + b_U)`, then
/// `z1 = z[:, :e]` and `u = LN_sgu(z[:, e:])` (paper eq. 1–3; u is what the spatial
/// projection mixes and what a with-past graph keeps as state).
fn gate_halves(
    cfg: &GmlpConfig,
    p: &Params,
    b: &str,
    h: &Array2<f64>,
) -> Result<(Array2<f64>, Array2<f64>)> {
    let e = cfg.gate_dim();
    let z = (h.dot(&p.matrix(&format!("{b}.proj_in.weight"))?)
        + p.vector(&format!("{b}.proj_in.bias"))?)
    .mapv(gelu);
    let z1 = z.slice(s![.., ..e]).to_owned();
    let u = layer_norm(
        &z.slice(s![.., e..]).to_owned(),
        &p.vector(&format!("{b}.sgu.norm.weight"))?,
        &p.vector(&format!("{b}.sgu.norm.bias"))?,
        f64::from(cfg.sgu_norm_eps),
    );
    Ok((z1, u))
}

fn block(cfg: &GmlpConfig, p: &Params, i: usize, x: &Array2<f64>) -> Result<Array2<f64>> {
    let b = format!("blocks.{i}");
    let e = cfg.gate_dim();
    let h = shift_tokens(cfg, &block_norm(cfg, p, &b, x)?);
    let (z1, z2) = gate_halves(cfg, p, &b, &h)?;
    let ws = spatial_matrices(cfg, p.get(&format!("{b}.sgu.spatial.weight"))?);
    let biases = p
        .get(&format!("{b}.sgu.spatial.bias"))?
        .into_raw_vec_and_offset()
        .0;
    let c = e / cfg.heads;
    let mut gate = Array2::<f64>::zeros(z2.dim());
    for (k, w) in ws.iter().enumerate() {
        let bias = Array1::from(biases[k * cfg.seq_len()..(k + 1) * cfg.seq_len()].to_vec());
        let mixed = w.dot(&z2.slice(s![.., k * c..(k + 1) * c])) + bias.insert_axis(Axis(1));
        gate.slice_mut(s![.., k * c..(k + 1) * c]).assign(&mixed);
    }
    if let Some(a) = cfg.attn_dim {
        let qkv = h.dot(&p.matrix(&format!("{b}.attn.qkv.weight"))?);
        let (q, k, v) = (
            qkv.slice(s![.., ..a]),
            qkv.slice(s![.., a..2 * a]),
            qkv.slice(s![.., 2 * a..]),
        );
        let mut scores = q.dot(&k.t()) / (a as f64).sqrt();
        if cfg.causal {
            scores
                .indexed_iter_mut()
                .filter(|((i, j), _)| j > i)
                .for_each(|(_, s)| *s = f64::NEG_INFINITY);
        }
        softmax_rows(&mut scores);
        let attn = scores
            .dot(&v)
            .dot(&p.matrix(&format!("{b}.attn.out.weight"))?)
            + p.vector(&format!("{b}.attn.out.bias"))?;
        gate += &attn;
    }
    let y = (z1 * gate).dot(&p.matrix(&format!("{b}.proj_out.weight"))?)
        + p.vector(&format!("{b}.proj_out.bias"))?;
    Ok(x + &y)
}

fn trunk(cfg: &GmlpConfig, p: &Params, mut x: Array2<f64>) -> Result<Array2<f64>> {
    for i in 0..cfg.layers {
        x = block(cfg, p, i, &x)?;
    }
    Ok(layer_norm(
        &x,
        &p.vector("norm.weight")?,
        &p.vector("norm.bias")?,
        f64::from(cfg.norm_eps),
    ))
}

/// The embedding table [vocab, d] and the output head (weight [d, vocab] — the table
/// transposed when tied, `head.weight` otherwise — and bias [vocab]).
fn token_ends(p: &Params, tied_embedding: bool) -> Result<(Array2<f64>, Array2<f64>, Array1<f64>)> {
    let table = p.matrix("embed.weight")?;
    let head = if tied_embedding {
        table.t().to_owned()
    } else {
        p.matrix("head.weight")?
    };
    Ok((table, head, p.vector("head.bias")?))
}

/// Logits [batch, n, vocab] of a token model for `ids` [batch, n].
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
        return Err(Error::InvalidArgument(
            "forward_tokens needs a token model".into(),
        ));
    };
    if ids.ncols() != seq_len {
        return Err(Error::BadTensor(format!(
            "input_ids: expected {seq_len} tokens, got {}",
            ids.ncols()
        )));
    }
    let p = Params {
        specs: param_specs(cfg),
        source,
    };
    let (table, head, head_bias) = token_ends(&p, tied_embedding)?;
    let mut out = Array3::<f32>::zeros((ids.nrows(), seq_len, vocab_size));
    for (b, row) in ids.rows().into_iter().enumerate() {
        let mut x = Array2::<f64>::zeros((seq_len, cfg.d_model));
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
        return Err(Error::InvalidArgument(
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

/// The state of one block after the tokens fed so far: u_s = LN_sgu(z2_s), for aMLP k_s
/// and v_s, and with token shift the normalized inputs h_s = LN(x_s), one row per position
/// (the reference keeps every row; a with-past graph keeps only the last s of h).
struct BlockCache {
    u: Array2<f64>,
    k: Array2<f64>,
    v: Array2<f64>,
    h: Array2<f64>,
}

/// One block on the new rows `x` (positions P..P+T−1, P = rows already in `cache`),
/// reading the earlier positions only through `cache` (SPEC §6).
fn block_step(
    cfg: &GmlpConfig,
    p: &Params,
    i: usize,
    ws: &[Array2<f64>],
    x: &Array2<f64>,
    cache: &mut BlockCache,
) -> Result<Array2<f64>> {
    let b = format!("blocks.{i}");
    let e = cfg.gate_dim();
    let start = cache.u.nrows();
    let mut h = block_norm(cfg, p, &b, x)?;
    if cfg.shift_tokens > 0 {
        // Causal shifts read only earlier rows: shift the whole history, keep the new rows.
        cache
            .h
            .append(Axis(0), h.view())
            .map_err(|e| Error::Internal(e.to_string()))?;
        h = shift_tokens(cfg, &cache.h)
            .slice(s![start.., ..])
            .to_owned();
    }
    let (z1, u_new) = gate_halves(cfg, p, &b, &h)?;
    cache
        .u
        .append(Axis(0), u_new.view())
        .map_err(|e| Error::Internal(e.to_string()))?;
    let biases = p
        .get(&format!("{b}.sgu.spatial.bias"))?
        .into_raw_vec_and_offset()
        .0;
    let (n, c, t_new) = (cfg.seq_len(), e / cfg.heads, x.nrows());
    let mut gate = Array2::<f64>::zeros((t_new, e));
    for (head, w) in ws.iter().enumerate() {
        for t in 0..t_new {
            let pos = start + t;
            for ch in head * c..(head + 1) * c {
                let mixed: f64 = (0..=pos).map(|s| w[[pos, s]] * cache.u[[s, ch]]).sum();
                gate[[t, ch]] = mixed + biases[head * n + pos];
            }
        }
    }
    if let Some(a) = cfg.attn_dim {
        let qkv = h.dot(&p.matrix(&format!("{b}.attn.qkv.weight"))?);
        let append = |dst: &mut Array2<f64>, from: usize| {
            dst.append(Axis(0), qkv.slice(s![.., from..from + a]))
                .map_err(|e| Error::Internal(e.to_string()))
        };
        append(&mut cache.k, a)?;
        append(&mut cache.v, 2 * a)?;
        let mut context = Array2::<f64>::zeros((t_new, a));
        for t in 0..t_new {
            let pos = start + t;
            let q = qkv.slice(s![t, ..a]);
            let mut scores: Vec<f64> = (0..=pos)
                .map(|s| q.dot(&cache.k.row(s)) / (a as f64).sqrt())
                .collect();
            let max = scores.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
            scores.iter_mut().for_each(|v| *v = (*v - max).exp());
            let sum: f64 = scores.iter().sum();
            for (s, w) in scores.iter().enumerate() {
                context.row_mut(t).scaled_add(w / sum, &cache.v.row(s));
            }
        }
        gate += &(context.dot(&p.matrix(&format!("{b}.attn.out.weight"))?)
            + p.vector(&format!("{b}.attn.out.bias"))?);
    }
    let y = (z1 * gate).dot(&p.matrix(&format!("{b}.proj_out.weight"))?)
        + p.vector(&format!("{b}.proj_out.bias"))?;
    Ok(x + &y)
}

/// Logits [batch, P, vocab] of a causal token model computed incrementally, as a
/// `--with-past` graph runs: the tokens of `ids` [batch, P] are fed in chunks of the
/// given lengths (summing to P ≤ n), each chunk seeing the earlier ones only through the
/// per-block state (u, k and v for aMLP, the normalized inputs with token shift). Equal
/// to [`forward_tokens`] on the first P positions for causal models.
pub fn forward_tokens_stepwise(
    cfg: &GmlpConfig,
    source: &dyn WeightSource,
    ids: ArrayView2<i64>,
    chunks: &[usize],
) -> Result<Array3<f32>> {
    let Task::Tokens {
        vocab_size,
        seq_len,
        tied_embedding,
    } = cfg.task
    else {
        return Err(Error::InvalidArgument(
            "forward_tokens_stepwise needs a token model".into(),
        ));
    };
    if !cfg.causal {
        return Err(Error::InvalidArgument(
            "stepwise decoding needs a causal model".into(),
        ));
    }
    let total = ids.ncols();
    if chunks.iter().sum::<usize>() != total || total > seq_len || chunks.contains(&0) {
        return Err(Error::InvalidArgument(format!(
            "chunks {chunks:?} must be non-empty and cover the {total} tokens (at most {seq_len})"
        )));
    }
    let p = Params {
        specs: param_specs(cfg),
        source,
    };
    let (table, head, head_bias) = token_ends(&p, tied_embedding)?;
    let spatial: Vec<Vec<Array2<f64>>> = (0..cfg.layers)
        .map(|i| {
            Ok(spatial_matrices(
                cfg,
                p.get(&format!("blocks.{i}.sgu.spatial.weight"))?,
            ))
        })
        .collect::<Result<_>>()?;
    let (e, a) = (cfg.gate_dim(), cfg.attn_dim.unwrap_or(0));
    let mut out = Array3::<f32>::zeros((ids.nrows(), total, vocab_size));
    for (b, row) in ids.rows().into_iter().enumerate() {
        let mut caches: Vec<BlockCache> = (0..cfg.layers)
            .map(|_| BlockCache {
                u: Array2::zeros((0, e)),
                k: Array2::zeros((0, a)),
                v: Array2::zeros((0, a)),
                h: Array2::zeros((0, cfg.d_model)),
            })
            .collect();
        let mut start = 0;
        for &len in chunks {
            let mut x = Array2::<f64>::zeros((len, cfg.d_model));
            for t in 0..len {
                let id = row[start + t];
                if id < 0 || id as usize >= vocab_size {
                    return Err(Error::BadTensor(format!(
                        "input_ids: token {id} outside 0..{vocab_size}"
                    )));
                }
                x.row_mut(t).assign(&table.row(id as usize));
            }
            for (i, cache) in caches.iter_mut().enumerate() {
                x = block_step(cfg, &p, i, &spatial[i], &x, cache)?;
            }
            let h = layer_norm(
                &x,
                &p.vector("norm.weight")?,
                &p.vector("norm.bias")?,
                f64::from(cfg.norm_eps),
            );
            let logits = h.dot(&head) + &head_bias;
            out.slice_mut(s![b, start..start + len, ..])
                .assign(&logits.mapv(|v| v as f32));
            start += len;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gmlp::config::{Precision, SpatialForm};
    use crate::gmlp::init::{InitScheme, SeededInit};

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
