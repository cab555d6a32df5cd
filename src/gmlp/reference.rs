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

fn block(cfg: &GmlpConfig, p: &Params, i: usize, x: &Array2<f64>) -> Result<Array2<f64>> {
    let b = format!("blocks.{i}");
    let e = cfg.gate_dim();
    let h = shift_tokens(
        cfg,
        &layer_norm(
            x,
            &p.vector(&format!("{b}.norm.weight"))?,
            &p.vector(&format!("{b}.norm.bias"))?,
            f64::from(cfg.norm_eps),
        ),
    );
    let z = (h.dot(&p.matrix(&format!("{b}.proj_in.weight"))?)
        + p.vector(&format!("{b}.proj_in.bias"))?)
    .mapv(gelu);
    let z1 = z.slice(s![.., ..e]).to_owned();
    let z2 = layer_norm(
        &z.slice(s![.., e..]).to_owned(),
        &p.vector(&format!("{b}.sgu.norm.weight"))?,
        &p.vector(&format!("{b}.sgu.norm.bias"))?,
        f64::from(cfg.sgu_norm_eps),
    );
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
    let table = p.matrix("embed.weight")?;
    let head_bias = p.vector("head.bias")?;
    let head = if tied_embedding {
        table.t().to_owned()
    } else {
        p.matrix("head.weight")?
    };
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
