//! The fused spelling's static-state rows (`--target onnxruntime`; docs/static-state.md,
//! "The onnxruntime step"): the positions in i64 arithmetic (a file for ONNX Runtime alone,
//! CPU or CUDA, whose CUDA provider has the i64 kernels; the WebGPU provider's lack of them
//! is why the standard spelling computes in f32), checked as there: a row outside 0..n
//! fails at a `Gather`. The spatial biases of all blocks are read at once (a stacked table,
//! one `Gather`, one `Split`) and the attention's mask is additive (−10⁹ after each
//! sequence's row P_b + t) over all n rows, in `Attention`'s layout.
//!
//! **Unwritten rows are not guarded here.** The state is read as it is: the rows after each
//! sequence's last one count with a weight of 0 (the causal W, the mask), which hides any
//! finite value there but not a NaN (0 × NaN = NaN). The file therefore declares in its
//! metadata that its state buffers must start zeroed ([`StateStart::Zeroed`]), which every
//! loop the project ships guarantees (our decoder allocates and resets them as zeros,
//! Triton's `initial_state` is `zero_data`; genai, which leaves them unfilled on some
//! devices, refuses such a file). That saves the standard spelling's copy of every state
//! every step (its cost grows with the state, not with the rows a step writes).
//!
//! [`StateStart::Zeroed`]: crate::gmlp::interface::StateStart::Zeroed

use super::super::context::Emitter;
use super::super::MASK_VALUE;
use crate::error::Result;
use crate::gmlp::emit::static_state::StaticStatePart;
use crate::onnx::graph::{Dim, Value};

/// The checked rows of a fused step's new tokens and what the blocks derive from them.
pub(super) struct IntRows {
    /// P_b + t, i64 [batch, sequence], checked within 0..n.
    pub(super) rows: Value,
    /// P_b, i64 [batch]: `TensorScatter`'s write indices (the first checked row).
    pub(super) start: Value,
    /// `s − (P_b + t) + n − 1`, i64 [batch, sequence, n] (the Toeplitz vector's index, and
    /// the mask's), made on first use.
    toeplitz_index: Option<Value>,
    /// The additive mask f32 [batch, 1, sequence, n] of the attention, made on first use.
    mask: Option<Value>,
    /// `b_i[P_b + t]` of each block i, f32 [batch, sequence, 1] (one gating head), where
    /// they were gathered together.
    pub(super) spatial_biases: Option<Vec<Value>>,
}

impl StaticStatePart {
    /// The checked rows P_b + t of the new tokens `ids` (in the `positions` scope): the
    /// offsets t are an exclusive running sum of ones made from the ids' values (no
    /// `Shape`, so every node can run on the GPU), and each row is looked up in the table
    /// 0..n−1 at the row and at the row − n, which fails for a row ≥ n or < 0. Then every
    /// block's spatial bias at those rows (in the `shared` scope).
    pub(super) fn int_rows(em: &mut Emitter, position: &Value, ids: &Value) -> Result<IntRows> {
        let n = em.cfg.seq_len();
        let batch = ids.shape[0].clone();
        let (rows, start) = em.g.scoped("positions", |g| {
            let zero = g.const_i64("zero", &[], vec![0])?;
            let one = g.const_i64("one", &[], vec![1])?;
            let axis1 = g.const_i64("axis_tokens", &[], vec![1])?;
            let ids_zero = g.mul("token_zero", ids, &zero)?;
            let ones = g.add("token_one", &ids_zero, &one)?;
            let offsets = g.cum_sum("offsets", &ones, &axis1, true)?;
            let column = g.reshape(
                "position_column",
                position,
                &[-1, 1],
                vec![batch.clone(), 1.into()],
            )?;
            let raw = g.add("rows_unchecked", &column, &offsets)?;
            let table = g.const_i64("table", &[n], (0..n as i64).collect())?;
            let n_c = g.const_i64("n", &[], vec![n as i64])?;
            let below = g.sub("rows_minus_n", &raw, &n_c)?;
            let upper = g.gather("check_below_n", &table, &raw, 0)?;
            let lower = g.gather("check_not_negative", &table, &below, 0)?;
            let rows = g.max("rows", &upper, &lower)?;
            let first = g.const_i64("start_token", &[], vec![0])?;
            let start = g.gather("start", &rows, &first, 1)?;
            Ok((rows, start))
        })?;
        let spatial_biases = em.scoped("shared", |s| {
            StaticStatePart::stacked_spatial_biases(s, &rows)
        })?;
        Ok(IntRows {
            rows,
            start,
            toeplitz_index: None,
            mask: None,
            spatial_biases,
        })
    }

    /// Every block's spatial bias at the new rows `rows`, read together: the L vectors b_i
    /// [n] side by side in one table [n, L], one `Gather` of its rows and one `Split` into
    /// the blocks' [batch, sequence, 1] columns (two nodes where one `Gather` per block would
    /// be L). `None` with several gating heads or without the bias.
    fn stacked_spatial_biases(em: &mut Emitter, rows: &Value) -> Result<Option<Vec<Value>>> {
        let layers = em.cfg.layers;
        if em.cfg.heads > 1 || !em.cfg.block.spatial_bias || layers < 2 {
            return Ok(None);
        }
        let n = em.cfg.seq_len();
        let params: Vec<String> = (0..layers)
            .map(|i| format!("blocks.{i}.sgu.spatial.bias"))
            .collect();
        let elem = em.cfg.dtype.elem();
        let table = em.joined_param(
            "sgu.spatial.bias.stacked",
            &params,
            &[n, layers],
            elem,
            move |v| Ok((0..n).flat_map(|r| v.iter().map(move |b| b[r])).collect()),
        )?;
        let picked = em.g.gather("spatial_bias_rows", &table, rows, 0)?;
        let columns =
            em.g.split("spatial_bias_blocks", &picked, -1, &vec![1; layers])?;
        Ok(Some(columns))
    }

    /// `s − (P_b + t) + n − 1`, i64 [batch, sequence, n] (shared).
    pub(super) fn int_toeplitz_index(em: &mut Emitter, r: &mut IntRows) -> Result<Value> {
        if let Some(v) = &r.toeplitz_index {
            return Ok(v.clone());
        }
        let n = em.cfg.seq_len();
        let v = em.g.scoped("positions", |g| {
            let mut shape = r.rows.shape.clone();
            shape.push(1.into());
            let rows3 = g.reshape("rows_column", &r.rows, &[0, 0, 1], shape)?;
            let diagonal = g.const_i64(
                "toeplitz_diagonal",
                &[n],
                (0..n as i64).map(|s| s + n as i64 - 1).collect(),
            )?;
            g.sub("toeplitz_index", &diagonal, &rows3)
        })?;
        r.toeplitz_index = Some(v.clone());
        Ok(v)
    }

    /// The attention's additive mask f32 [batch, 1, sequence, n]: 0 for rows s ≤ P_b + t,
    /// [`MASK_VALUE`] after, looked up at the Toeplitz index (≤ n − 1 exactly where s ≤
    /// P_b + t) in a table of 2n − 1 entries (shared).
    pub(super) fn int_mask(em: &mut Emitter, r: &mut IntRows) -> Result<Value> {
        if let Some(v) = &r.mask {
            return Ok(v.clone());
        }
        let n = em.cfg.seq_len();
        let index = StaticStatePart::int_toeplitz_index(em, r)?;
        let v = em.g.scoped("positions", |g| {
            let values = (0..2 * n - 1)
                .map(|k| if k < n { 0.0 } else { MASK_VALUE })
                .collect();
            let table = g.const_f32("mask_table", &[2 * n - 1], values)?;
            let rows = g.gather("mask_rows", &table, &index, 0)?;
            let (b, t) = (index.shape[0].clone(), index.shape[1].clone());
            g.reshape(
                "attention_mask",
                &rows,
                &[0, 1, -1, n as i64],
                vec![b, 1.into(), t, Dim::Fixed(n)],
            )
        })?;
        r.mask = Some(v.clone());
        Ok(v)
    }
}
