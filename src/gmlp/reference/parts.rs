//! The parts of a block in f64, written from the paper's equations and from the upstream
//! sources of each variant (not from the emitted graph): norms, GELU forms, the spatial
//! projection (global, or g-mlp-gpt's `CausalLocalSGU` computed block by block with
//! upstream's padding), the tiny attention (global, or `LocalAttention` block by block,
//! zero-padded previous window included), the gate activation, the axial fold
//! (`AxiallyFold`: real sub-sequences, then the causal depthwise convolution), and the
//! GEGLU feed-forward of a reversible stack.

use ndarray::{s, Array1, Array2, ArrayD, Axis};

use super::params::Params;
use crate::error::Result;
use crate::gmlp::config::{GateAct, GeluForm, GmlpConfig, NormKind};

/// LayerNorm over the last axis with biased variance, as PyTorch and ONNX define it.
pub(super) fn layer_norm(
    x: &Array2<f64>,
    gamma: &Array1<f64>,
    beta: &Array1<f64>,
    eps: f64,
) -> Array2<f64> {
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

/// RMSNorm over the last axis, `x / √(mean(x²) + ε) · γ` (tinygrad's `nn.RMSNorm`).
fn rms_norm(x: &Array2<f64>, gamma: &Array1<f64>, eps: f64) -> Array2<f64> {
    let mut out = x.clone();
    for mut row in out.rows_mut() {
        let ms = row.mapv(|v| v * v).mean().unwrap_or(0.0);
        let inv = 1.0 / (ms + eps).sqrt();
        row.mapv_inplace(|v| v * inv);
        row *= gamma;
    }
    out
}

/// The configured norm with the parameters `{prefix}.weight` (and `.bias` for LayerNorm).
pub(super) fn norm(
    cfg: &GmlpConfig,
    p: &Params,
    prefix: &str,
    x: &Array2<f64>,
    eps: f32,
) -> Result<Array2<f64>> {
    let gamma = p.vector(&format!("{prefix}.weight"))?;
    Ok(match cfg.block.norm {
        NormKind::LayerNorm => layer_norm(
            x,
            &gamma,
            &p.vector(&format!("{prefix}.bias"))?,
            f64::from(eps),
        ),
        NormKind::RmsNorm => rms_norm(x, &gamma, f64::from(eps)),
    })
}

/// Exact GELU, x·Φ(x) = 0.5·x·(1 + erf(x/√2)).
pub(super) fn gelu(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// GELU's tanh approximation (tinygrad's `Tensor.gelu`).
fn gelu_tanh(x: f64) -> f64 {
    let c = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh())
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// The gate activation (g-mlp-pytorch's and g-mlp-gpt's `act`).
fn gate_act(act: GateAct, x: f64) -> f64 {
    match act {
        GateAct::Identity => x,
        GateAct::Tanh => x.tanh(),
        GateAct::Sigmoid => sigmoid(x),
        GateAct::Relu => x.max(0.0),
        GateAct::Gelu => gelu(x),
        GateAct::Silu => x * sigmoid(x),
    }
}

/// Softmax of every row (masked entries hold −∞).
pub(super) fn softmax_rows(x: &mut Array2<f64>) {
    for mut row in x.rows_mut() {
        let max = row.fold(f64::NEG_INFINITY, |m, &v| m.max(v));
        row.mapv_inplace(|v| (v - max).exp());
        let sum = row.sum();
        row /= sum;
    }
}

/// The global spatial matrices W [n, n] of one layer, one per head, from its logical
/// parameter; a Toeplitz vector w gives `W[i, j] = w[j − i + n − 1]`; causal models have
/// W[i, j] = 0 for j > i.
pub(super) fn spatial_matrices(cfg: &GmlpConfig, w: ArrayD<f64>) -> Vec<Array2<f64>> {
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

/// The spatial biases of block `b`, one vector per head (zeros without a spatial bias).
fn spatial_biases(cfg: &GmlpConfig, p: &Params, b: &str, rows: usize) -> Result<Vec<Vec<f64>>> {
    if !cfg.block.spatial_bias {
        return Ok(vec![vec![0.0; rows]; cfg.heads]);
    }
    let flat = p
        .get(&format!("{b}.sgu.spatial.bias"))?
        .into_raw_vec_and_offset()
        .0;
    Ok(flat.chunks(rows).map(<[f64]>::to_vec).collect())
}

/// Token shift: channel chunk k moves by `amounts[k]` tokens, out[i] = h[i − a], zero fill.
pub(super) fn shift_tokens(cfg: &GmlpConfig, h: &Array2<f64>) -> Array2<f64> {
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

/// The per-token half of a block on its normalized input `h`: `z = GELU(h·U + b_U)`, then
/// `z1 = z[:, :e]` and `u = LN_sgu(z[:, e:])` (paper eq. 1–3; u is what the spatial
/// projection mixes and what a with-past graph keeps as state).
pub(super) fn gate_halves(
    cfg: &GmlpConfig,
    p: &Params,
    b: &str,
    h: &Array2<f64>,
) -> Result<(Array2<f64>, Array2<f64>)> {
    let e = cfg.gate_dim();
    let act: fn(f64) -> f64 = match cfg.block.gelu {
        GeluForm::Erf => gelu,
        GeluForm::Tanh => gelu_tanh,
    };
    let z = (h.dot(&p.matrix(&format!("{b}.proj_in.weight"))?)
        + p.vector(&format!("{b}.proj_in.bias"))?)
    .mapv(act);
    let z1 = z.slice(s![.., ..e]).to_owned();
    let u = norm(
        cfg,
        p,
        &format!("{b}.sgu.norm"),
        &z.slice(s![.., e..]).to_owned(),
        cfg.sgu_norm_eps,
    )?;
    Ok((z1, u))
}

/// `W · u + b` per head for the m rows of `u` (m ≤ n): the global W's first m rows and
/// columns, or, with a window, upstream's `CausalLocalSGU` block by block.
fn spatial(cfg: &GmlpConfig, p: &Params, i: usize, u: &Array2<f64>) -> Result<Array2<f64>> {
    let b = format!("blocks.{i}");
    let (m, e) = u.dim();
    let c = e / cfg.heads;
    let mut gate = Array2::<f64>::zeros((m, e));
    match cfg.block.mixing(i).window {
        None => {
            let ws = spatial_matrices(cfg, p.get(&format!("{b}.sgu.spatial.weight"))?);
            let biases = spatial_biases(cfg, p, &b, cfg.seq_len())?;
            for (k, w) in ws.iter().enumerate() {
                let bias = Array1::from(biases[k][..m].to_vec());
                let mixed = w
                    .slice(s![..m, ..m])
                    .dot(&u.slice(s![.., k * c..(k + 1) * c]))
                    + bias.insert_axis(Axis(1));
                gate.slice_mut(s![.., k * c..(k + 1) * c]).assign(&mixed);
            }
        }
        Some(w) => {
            // Pad to a multiple of w; block q mixes [block q − 1 (zeros for q = 0) ‖ block q]
            // with W_h [w, 2w] masked to j ≤ i + w, plus b_h [w].
            let flat = p
                .get(&format!("{b}.sgu.spatial.weight"))?
                .into_raw_vec_and_offset()
                .0;
            let biases = spatial_biases(cfg, p, &b, w)?;
            let padded_rows = m.div_ceil(w) * w;
            let mut padded = Array2::<f64>::zeros((padded_rows, e));
            padded.slice_mut(s![..m, ..]).assign(u);
            for (k, wk) in flat.chunks(w * 2 * w).enumerate() {
                for q in 0..padded_rows / w {
                    for row in 0..w {
                        let t = q * w + row;
                        if t >= m {
                            break;
                        }
                        for col in 0..=row + w {
                            let Some(src) = (q * w + col).checked_sub(w) else {
                                continue;
                            };
                            let weight = wk[row * 2 * w + col];
                            for ch in k * c..(k + 1) * c {
                                gate[[t, ch]] += weight * padded[[src, ch]];
                            }
                        }
                        for ch in k * c..(k + 1) * c {
                            gate[[t, ch]] += biases[k][row];
                        }
                    }
                }
            }
        }
    }
    Ok(gate)
}

/// aMLP's tiny attention of block `i` on its normalized input `h` [m, d]: global (masked
/// above the diagonal when causal), or upstream's `LocalAttention` with window w (x padded
/// to a multiple of w, block q attending to [keys of block q − 1, zeros for q = 0 ‖ its
/// own keys] with j ≤ i + w, and — as g-mlp-gpt 0.0.15's code does, building both from k
/// in `map(lambda t: torch.cat((k[:, :-1], k[:, 1:]), dim = 2), (k, v))` — the keys
/// also as values).
fn attention(
    cfg: &GmlpConfig,
    p: &Params,
    i: usize,
    h: &Array2<f64>,
    a: usize,
) -> Result<Array2<f64>> {
    let b = format!("blocks.{i}");
    let m = h.nrows();
    let scale = (a as f64).sqrt();
    let project = |x: &Array2<f64>| -> Result<Array2<f64>> {
        let mut qkv = x.dot(&p.matrix(&format!("{b}.attn.qkv.weight"))?);
        if cfg.block.attn_qkv_bias {
            qkv += &p.vector(&format!("{b}.attn.qkv.bias"))?;
        }
        Ok(qkv)
    };
    let context = match cfg.block.mixing(i).window {
        None => {
            let qkv = project(h)?;
            let (q, k, v) = (
                qkv.slice(s![.., ..a]),
                qkv.slice(s![.., a..2 * a]),
                qkv.slice(s![.., 2 * a..]),
            );
            let mut scores = q.dot(&k.t()) / scale;
            if cfg.causal {
                scores
                    .indexed_iter_mut()
                    .filter(|((i, j), _)| j > i)
                    .for_each(|(_, s)| *s = f64::NEG_INFINITY);
            }
            softmax_rows(&mut scores);
            scores.dot(&v)
        }
        Some(w) => {
            let padded_rows = m.div_ceil(w) * w;
            let mut x = Array2::<f64>::zeros((padded_rows, h.ncols()));
            x.slice_mut(s![..m, ..]).assign(h);
            let qkv = project(&x)?;
            let mut context = Array2::<f64>::zeros((padded_rows, a));
            for q_block in 0..padded_rows / w {
                let own = q_block * w..(q_block + 1) * w;
                let mut keys = Array2::<f64>::zeros((2 * w, a));
                if q_block > 0 {
                    let prev = (q_block - 1) * w..q_block * w;
                    keys.slice_mut(s![..w, ..])
                        .assign(&qkv.slice(s![prev, a..2 * a]));
                }
                keys.slice_mut(s![w.., ..])
                    .assign(&qkv.slice(s![own.clone(), a..2 * a]));
                let values = &keys;
                let q = qkv.slice(s![own.clone(), ..a]);
                let mut scores = q.dot(&keys.t()) / scale;
                scores
                    .indexed_iter_mut()
                    .filter(|((row, col), _)| *col > row + w)
                    .for_each(|(_, s)| *s = f64::NEG_INFINITY);
                softmax_rows(&mut scores);
                context.slice_mut(s![own, ..]).assign(&scores.dot(values));
            }
            context.slice(s![..m, ..]).to_owned()
        }
    };
    Ok(context.dot(&p.matrix(&format!("{b}.attn.out.weight"))?)
        + p.vector(&format!("{b}.attn.out.bias"))?)
}

/// Everything of block `i` after its input norm, on the m rows of `h` (a whole sequence or
/// one fold's sub-sequence): `(z1 ⊙ act(W·LN(z2) + b + attn(h)))·V + b_V`.
fn mix(cfg: &GmlpConfig, p: &Params, i: usize, h: &Array2<f64>) -> Result<Array2<f64>> {
    let b = format!("blocks.{i}");
    let (z1, u) = gate_halves(cfg, p, &b, h)?;
    let mut gate = spatial(cfg, p, i, &u)?;
    if let Some(a) = cfg.attn_dim {
        gate += &attention(cfg, p, i, h, a)?;
    }
    let act = cfg.block.gate_act;
    let gate = gate.mapv(|v| gate_act(act, v));
    Ok((z1 * gate).dot(&p.matrix(&format!("{b}.proj_out.weight"))?)
        + p.vector(&format!("{b}.proj_out.bias"))?)
}

/// The branch f_i(x) of block `i` (its residual is the stack's): input norm, token shift,
/// and the mixing, through upstream's `AxiallyFold` when the block folds (pad to a
/// multiple of e, the e interleaved sub-sequences each through the block, unfold, causal
/// depthwise Conv1d of kernel e, first m rows).
pub(super) fn block(
    cfg: &GmlpConfig,
    p: &Params,
    i: usize,
    x: &Array2<f64>,
) -> Result<Array2<f64>> {
    let b = format!("blocks.{i}");
    let h = shift_tokens(cfg, &norm(cfg, p, &format!("{b}.norm"), x, cfg.norm_eps)?);
    let e = cfg.block.mixing(i).fold;
    if e <= 1 {
        return mix(cfg, p, i, &h);
    }
    let (m, d) = h.dim();
    let padded_rows = m.div_ceil(e) * e;
    let mut padded = Array2::<f64>::zeros((padded_rows, d));
    padded.slice_mut(s![..m, ..]).assign(&h);
    let mut y = Array2::<f64>::zeros((padded_rows, d));
    for r in 0..e {
        let sub = padded.slice(s![r..;e, ..]).to_owned();
        let out = mix(cfg, p, i, &sub)?;
        y.slice_mut(s![r..;e, ..]).assign(&out);
    }
    let kernel = p
        .get(&format!("{b}.fold.weight"))?
        .into_raw_vec_and_offset()
        .0;
    let bias = p.vector(&format!("{b}.fold.bias"))?;
    let mut out = Array2::<f64>::zeros((m, d));
    for t in 0..m {
        for c in 0..d {
            let mut acc = bias[c];
            for k in 0..e {
                // Input row t − (e − 1) + k of the left-padded sequence.
                if let Some(src) = (t + k).checked_sub(e - 1) {
                    acc += kernel[c * e + k] * y[[src, c]];
                }
            }
            out[[t, c]] = acc;
        }
    }
    Ok(out)
}

/// The GEGLU feed-forward g_i of a reversible stack (g-mlp-gpt's `FeedForward`):
/// `(a ⊙ GELU(g))·W2 + b2` with `[a, g] = x·W1 + b1`.
pub(super) fn feed_forward(
    p: &Params,
    i: usize,
    x: &Array2<f64>,
    inner: usize,
) -> Result<Array2<f64>> {
    let b = format!("blocks.{i}.ff");
    let hidden = x.dot(&p.matrix(&format!("{b}.proj_in.weight"))?)
        + p.vector(&format!("{b}.proj_in.bias"))?;
    let gated = &hidden.slice(s![.., ..inner]) * &hidden.slice(s![.., inner..]).mapv(gelu);
    Ok(gated.dot(&p.matrix(&format!("{b}.proj_out.weight"))?)
        + p.vector(&format!("{b}.proj_out.bias"))?)
}
