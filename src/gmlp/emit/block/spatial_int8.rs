//! The spatial mixing of an int8 model (`--dtype int8`): W is quantized at build time
//! and the mixing runs as a dynamically quantized integer MatMul, in the fixed form and for
//! the new rows of a variable-length or with-past graph.

use super::super::context::Emitter;
use super::super::sequence::Positions;
use crate::error::Result;
use crate::gmlp::config::SpatialForm;
use crate::gmlp::emit::block::SpatialProjection;
use crate::gmlp::quantize::{column_scales, quantize_columns, transpose};
use crate::gmlp::toeplitz::{mask_upper, toeplitz_expand};
use crate::onnx::graph::{ElemType, Value};

impl SpatialProjection {
    /// The spatial mixing `W · u` of an int8 model, for `u` of shape `[…, n, c]` (heads
    /// first when there are several) and W of any stored form: computed transposed,
    /// `(uᵀ · Wᵀ)ᵀ`, so that the constant int8 matrix is MatMulInteger's second operand
    /// (ONNX Runtime has no fast kernel with a constant int8 first operand; measured in
    /// BENCHMARKS.md). Wᵀ is materialized `[n, n]` per head (Toeplitz forms expanded,
    /// causal mask applied) and quantized per column of Wᵀ, i.e. per output token.
    pub(crate) fn matmul_int8(
        em: &mut Emitter,
        local: &str,
        weight: &str,
        u: &Value,
    ) -> Result<Value> {
        let (q, scales) = SpatialProjection::int8_weights(em, weight)?;
        SpatialProjection::int8_transposed(em, local, u, &q, &scales)
    }

    /// [`Self::matmul_int8`] for the new positions P..P+T−1 (`pos`) of a
    /// variable-length or growing-state graph, `u` holding positions 0..P+T−1: Wᵀ's columns P..P+T−1 and
    /// their scales are gathered, and its rows cut to 0..P+T−1 (never n×n per step).
    pub(crate) fn matmul_int8_rows(
        em: &mut Emitter,
        local: &str,
        weight: &str,
        u: &Value,
        pos: &Positions,
    ) -> Result<Value> {
        let (q, scales) = SpatialProjection::int8_weights(em, weight)?;
        let last = q.shape.len() - 1;
        let rows = pos.rows.clone();
        let (total, total_dim) = (pos.total.clone(), pos.total_dim.clone());
        let q_cols =
            em.g.gather(&format!("{local}_weight_columns"), &q, &rows, last)?;
        let zero =
            em.g.const_i64(&format!("{local}_weight_rows_start"), &[1], vec![0])?;
        let mut shape = q_cols.shape.clone();
        shape[last - 1] = total_dim;
        let q_rows = em.g.slice_dynamic(
            &format!("{local}_weight_rows"),
            &q_cols,
            &zero,
            &total,
            &[last as i64 - 1],
            shape,
        )?;
        let scales =
            em.g.gather(&format!("{local}_scale_columns"), &scales, &rows, last)?;
        SpatialProjection::int8_transposed(em, local, u, &q_rows, &scales)
    }

    /// The int8 Wᵀ `[heads?, n, n]` and its per-column scales `[heads?, 1, n]`.
    fn int8_weights(em: &mut Emitter, weight: &str) -> Result<(Value, Value)> {
        em.require_int8_opset()?;
        let n = em.cfg.seq_len();
        let (causal, dense) = (em.cfg.causal, em.cfg.spatial == SpatialForm::Dense);
        // W per head as dense [n, n], masked, transposed.
        let transposed = move |v: Vec<f32>| -> Vec<f32> {
            let per_head = if dense { n * n } else { 2 * n - 1 };
            v.chunks(per_head)
                .flat_map(|h| {
                    let mut w = if dense {
                        h.to_vec()
                    } else {
                        toeplitz_expand(h, n)
                    };
                    if causal {
                        mask_upper(&mut w, n);
                    }
                    transpose(&w, n, n)
                })
                .collect()
        };
        let heads = em.cfg.heads;
        let mut q_dims = vec![n, n];
        let mut s_dims = vec![1, n];
        if heads > 1 {
            q_dims.insert(0, heads);
            s_dims.insert(0, heads);
        }
        let scales = em.derived_param(
            &format!("{weight}.transposed.scale"),
            weight,
            &s_dims,
            ElemType::F32,
            move |v| {
                transposed(v)
                    .chunks(n * n)
                    .flat_map(|t| column_scales(t, n))
                    .collect()
            },
        )?;
        let q = em.derived_param(
            &format!("{weight}.transposed.int8"),
            weight,
            &q_dims,
            ElemType::I8,
            move |v| {
                transposed(v)
                    .chunks(n * n)
                    .flat_map(|t| quantize_columns(t.to_vec(), &column_scales(t, n)))
                    .collect()
            },
        )?;
        Ok((q, scales))
    }

    /// `(uᵀ · q)ᵀ` rescaled: the spatial mixing with the int8 Wᵀ as the second operand.
    fn int8_transposed(
        em: &mut Emitter,
        local: &str,
        u: &Value,
        q: &Value,
        scales: &Value,
    ) -> Result<Value> {
        let rank = u.shape.len();
        let mut perm: Vec<usize> = (0..rank).collect();
        perm.swap(rank - 2, rank - 1);
        // Quantize first (per tensor, so it commutes with the transpose), then transpose the
        // u8 tensor: a quarter of the bytes an f32 transpose moves.
        let (uq, u_scale, u_zero) =
            em.g.dynamic_quantize_linear(&format!("{local}_quantize"), u)?;
        let uq_t =
            em.g.transpose(&format!("{local}_transpose_in"), &uq, &perm)?;
        let mixed_t = em.quantized_matmul(local, &uq_t, &u_scale, &u_zero, q, scales)?;
        em.g.transpose(&format!("{local}_transpose_out"), &mixed_t, &perm)
    }
}
