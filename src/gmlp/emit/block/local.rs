//! Local token mixing (g-mlp-gpt 0.0.15, `g_mlp_gpt.py`): a block with a window w
//! (`CausalLocalSGU`, `LocalAttention`) and / or an axial fold e (`AxiallyFold`), emitted
//! as index maps over absolute positions instead of upstream's padding and reshaping, so
//! the same nodes serve a fixed length, a variable length and a state that keeps only the
//! rows a window can still see.
//!
//! For a new row at position t and a key (state) row at position s (sub-positions
//! t' = t div e, s' = s div e; residues t mod e, s mod e):
//! ```text
//! valid(t, s) = s ≤ t  ∧  t ≡ s (mod e)  [∧ j ≥ 0 with a window]
//! global W [n, n]:      W_eff[t, s] = W[t', s'],           b_eff[t] = b[t']
//! window W [w, 2w]:     W_eff[t, s] = W[t' mod w, j],      b_eff[t] = b[t' mod w]
//!                       j = s' − (t' div w − 1)·w   (the previous block of w, then its own)
//! ```
//! and W_eff = 0 where not valid. upstream's zero padding never reaches a real output: the
//! spatial projection's zero previous block adds nothing, and a fold's or window's padded
//! tail lies after every real position. The one place padding shows is the local
//! attention: upstream's first window attends to w zero keys (zero scores, zero values)
//! that are not masked and count in the softmax's denominator; [`LocalMixing::local_attention_mask`]
//! reproduces them as one extra zero key of weight w for the rows of the first window.
//!
//! Everything is integer arithmetic on i64 tensors (`Div`, `Mul`, `Sub`, `Min`, `Max`,
//! `Abs`), so no boolean tensor or `Where` is needed.

use super::super::context::Emitter;
use super::super::MASK_VALUE;
use crate::error::{Error, Result};
use crate::gmlp::config::TokenMixing;
use crate::onnx::builder::GraphBuilder;
use crate::onnx::graph::{Dim, ElemType, Value};

/// The index maps of one local mixing over new rows [T] and key rows [S].
pub(crate) struct LocalMaps {
    /// 1 where row t may read key s, else 0: i64 [T, S].
    pub(crate) valid: Value,
    /// Index into the flattened W (per head) for every (t, s), clamped in range: i64 [T, S].
    pub(crate) weight_index: Value,
    /// Index into b (per head) for every row: i64 [T].
    pub(crate) bias_index: Value,
    /// With a window: 1 for rows in the first window block (t' < w), else 0: i64 [T, 1].
    pub(crate) first_window: Option<Value>,
}

/// A block's local token mixing: a window and / or an axial fold, as maps over the sequence.
pub(crate) struct LocalMixing;

impl LocalMixing {
    /// The index maps of `mixing` for new rows at `rows` [T] and keys at `cols` [S]
    /// (absolute positions), in the current scope.
    pub(crate) fn local_maps(
        em: &mut Emitter,
        mixing: TokenMixing,
        rows: &Value,
        cols: &Value,
    ) -> Result<LocalMaps> {
        let t_dim = rows.shape[0].clone();
        let n = em.cfg.seq_len();
        // Integer quotients by lookup (position → position div k) rather than `Div`: tract
        // reasons about `Div` of positions symbolically and overflows (tract-data 0.23.9,
        // TDim::guess_slope) on a few stacked windows; a constant table stays opaque.
        let fold_table = (mixing.fold > 1).then(|| quotient_table(n, mixing.fold));
        let fold_table = match fold_table {
            Some(t) => Some(em.g.const_i64("fold_quotient", &[n], t)?),
            None => None,
        };
        let window_table = match mixing.window {
            Some(w) => Some(em.g.const_i64("window_quotient", &[n], quotient_table(n, w))?),
            None => None,
        };
        let g = &mut em.g;
        let one = scalar(g, "one", 1)?;
        let zero = scalar(g, "zero", 0)?;
        let r = g.reshape(
            "row_positions",
            rows,
            &[-1, 1],
            vec![t_dim.clone(), Dim::Fixed(1)],
        )?;
        let causal_gap = g.sub("causal_gap", &r, cols)?;
        let valid = non_negative(g, "causal", &causal_gap, (&one, &zero))?;
        // Sub-positions t' and s' (and the residue check) of an axial fold.
        let (r_sub, s_sub, valid) = match &fold_table {
            Some(table) => fold_positions(g, table, mixing.fold, (&r, cols), valid, &one)?,
            None => (r.clone(), cols.clone(), valid),
        };
        let (weight_index, bias_index, first_window, valid) = match mixing.window {
            None => {
                let n_c = scalar(g, "width", n as i64)?;
                let row_start = g.mul("weight_row", &r_sub, &n_c)?;
                let index = g.add("weight_index", &row_start, &s_sub)?;
                let bias_index = g.reshape("bias_index", &r_sub, &[-1], vec![t_dim.clone()])?;
                (index, bias_index, None, valid)
            }
            Some(w) => {
                let table = window_table
                    .as_ref()
                    .ok_or_else(|| Error::Internal("window table missing".into()))?;
                let (index, bias_index, first, valid) = window_maps(
                    g,
                    table,
                    w as i64,
                    (&r_sub, &s_sub),
                    valid,
                    (&one, &zero),
                    &t_dim,
                )?;
                (index, bias_index, Some(first), valid)
            }
        };
        Ok(LocalMaps {
            valid,
            weight_index,
            bias_index,
            first_window,
        })
    }

    /// The additive attention mask of a local mixing, f32 [T, S] (0 where valid, the mask
    /// value elsewhere), and, with a window, the logit of upstream's zero keys as one extra
    /// key column, f32 [T, 1]: ln(w) (w zero keys of score 0) for rows of the first window,
    /// the mask value for the others.
    pub(crate) fn local_attention_mask(
        em: &mut Emitter,
        maps: &LocalMaps,
        window: Option<usize>,
    ) -> Result<(Value, Option<Value>)> {
        let g = &mut em.g;
        let valid = g.cast("valid_f32", &maps.valid, ElemType::F32)?;
        let one = g.const_f32("mask_one", &[], vec![1.0])?;
        let masked = g.sub("masked", &one, &valid)?;
        let fill = g.const_f32("mask_value", &[], vec![MASK_VALUE])?;
        let mask = g.mul("local_mask", &masked, &fill)?;
        let extra = match (&maps.first_window, window) {
            (Some(first), Some(w)) => {
                // first·ln(w) + (1 − first)·mask: no sum of ln(w) and the mask value, which
                // f32 cannot hold (the mask's ulp is far above ln(w)).
                let first = g.cast("first_window_f32", first, ElemType::F32)?;
                let others = g.sub("later_window_f32", &one, &first)?;
                let ln_w = g.const_f32("zero_keys_logit", &[], vec![(w as f32).ln()])?;
                let weighted = g.mul("zero_keys_weight", &first, &ln_w)?;
                let masked_rows = g.mul("zero_keys_masked", &others, &fill)?;
                Some(g.add("zero_keys", &weighted, &masked_rows)?)
            }
            _ => None,
        };
        Ok((mask, extra))
    }
}

/// `[t div k for t in 0..n]`: the quotient of every position by k.
fn quotient_table(n: usize, k: usize) -> Vec<i64> {
    (0..n).map(|t| (t / k) as i64).collect()
}
/// The int64 scalar constant `name` = `v`.
fn scalar(g: &mut GraphBuilder, name: &str, v: i64) -> Result<Value> {
    g.const_i64(name, &[], vec![v])
}

/// 1 where `x` ≥ 0, else 0 (`x` an integer): min(max(x + 1, 0), 1).
fn non_negative(
    g: &mut GraphBuilder,
    name: &str,
    x: &Value,
    (one, zero): (&Value, &Value),
) -> Result<Value> {
    let up = g.add(&format!("{name}_plus_one"), x, one)?;
    let floor = g.max(&format!("{name}_floor"), &up, zero)?;
    g.min(name, &floor, one)
}

/// An axial fold of `fold` rows: the sub-positions t' and s' of rows `r` [T, 1] and keys
/// `cols` [S] (by the quotient `table`), and `valid` narrowed to the pairs of one residue.
fn fold_positions(
    g: &mut GraphBuilder,
    table: &Value,
    fold: usize,
    (r, cols): (&Value, &Value),
    valid: Value,
    one: &Value,
) -> Result<(Value, Value, Value)> {
    let e = scalar(g, "fold", fold as i64)?;
    let r_sub = g.gather("row_sub", table, r, 0)?;
    let s_sub = g.gather("col_sub", table, cols, 0)?;
    let r_start = g.mul("row_sub_start", &r_sub, &e)?;
    let r_res = g.sub("row_residue", r, &r_start)?;
    let s_start = g.mul("col_sub_start", &s_sub, &e)?;
    let s_res = g.sub("col_residue", cols, &s_start)?;
    let gap = g.sub("residue_gap", &r_res, &s_res)?;
    let gap = g.abs("residue_distance", &gap)?;
    let differ = g.min("residue_differs", &gap, one)?;
    let same = g.sub("same_residue", one, &differ)?;
    let valid = g.mul("valid_fold", &valid, &same)?;
    Ok((r_sub, s_sub, valid))
}

/// A window of `w`: the weight index and bias index of rows `r_sub` and keys `s_sub` in
/// the window's 2w-wide block (by the quotient `table`), the first-window flag, and
/// `valid` narrowed to the keys inside the window.
fn window_maps(
    g: &mut GraphBuilder,
    table: &Value,
    w: i64,
    (r_sub, s_sub): (&Value, &Value),
    valid: Value,
    (one, zero): (&Value, &Value),
    t_dim: &Dim,
) -> Result<(Value, Value, Value, Value)> {
    let w_c = scalar(g, "window", w)?;
    let two_w = scalar(g, "window_width", 2 * w)?;
    let last = scalar(g, "window_last", 2 * w - 1)?;
    let block = g.gather("window_block", table, r_sub, 0)?;
    let block_start = g.mul("window_block_start", &block, &w_c)?;
    let within = g.sub("window_row", r_sub, &block_start)?;
    // j = s' − (block − 1)·w = s' − block_start + w
    let from = g.sub("window_from", &block_start, &w_c)?;
    let j = g.sub("window_column", s_sub, &from)?;
    let in_window = non_negative(g, "in_window", &j, (one, zero))?;
    let valid = g.mul("valid_window", &valid, &in_window)?;
    let j = g.max("window_column_floor", &j, zero)?;
    let j = g.min("window_column_clamped", &j, &last)?;
    let row_start = g.mul("weight_row", &within, &two_w)?;
    let index = g.add("weight_index", &row_start, &j)?;
    let bias_index = g.reshape("bias_index", &within, &[-1], vec![t_dim.clone()])?;
    let later = g.min("window_later_block", &block, one)?;
    let first = g.sub("first_window", one, &later)?;
    Ok((index, bias_index, first, valid))
}
