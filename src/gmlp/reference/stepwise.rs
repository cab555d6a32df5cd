//! The incremental form of a causal model (docs/generation.md): the tokens fed in chunks,
//! each chunk seeing the earlier ones only through the per-block state, as a `--with-past`
//! graph runs. Written for the paper's block (global mixing; token shift included).

use ndarray::{s, Array2, Array3, ArrayView2, Axis};

use super::params::{token_ends, Params};
use super::parts::{gate_halves, norm, shift_tokens, spatial_matrices};
use crate::error::{Error, Result};
use crate::gmlp::config::{GmlpConfig, StackKind, Task};
use crate::gmlp::weights::{param_specs, WeightSource};

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
/// reading the earlier positions only through `cache`.
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
    let mut h = norm(cfg, p, &format!("{b}.norm"), x, cfg.norm_eps)?;
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
/// to [`forward_tokens`](super::forward_tokens) on the first P positions for causal models.
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
        return Err(Error::Unsupported(
            "forward_tokens_stepwise needs a token model".into(),
        ));
    };
    if !cfg.causal {
        return Err(Error::Unsupported(
            "stepwise decoding needs a causal model".into(),
        ));
    }
    if cfg.block.has_local_mixing() || cfg.block.stack != StackKind::Sequential {
        return Err(Error::Unsupported(
            "the stepwise reference covers the paper's block (no windows, folds or reversible stacks)"
                .into(),
        ));
    }
    let total = ids.ncols();
    if chunks.iter().sum::<usize>() != total || total > seq_len || chunks.contains(&0) {
        return Err(Error::Unsupported(format!(
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
            let h = norm(cfg, &p, "norm", &x, cfg.norm_eps)?;
            let logits = h.dot(&head) + &head_bias;
            out.slice_mut(s![b, start..start + len, ..])
                .assign(&logits.mapv(|v| v as f32));
            start += len;
        }
    }
    Ok(out)
}
