//! Fixed-size state written in place (`--with-past static`; docs/static-state.md). Every
//! state tensor is `past_*` [batch, n, width] in and `present_*` [batch, n, width] out,
//! and a `position` input [batch] gives each sequence's P. The T new tokens of sequence b
//! sit at rows P_b..P_b+T−1; a run writes only those rows into each state (`ScatterND` at
//! indices (b, P_b + t), or opset 24's `TensorScatter` at write index P_b) and then reads
//! the whole state: the spatial projection's row of W at P_b + t (a `Gather`, constant
//! shapes, no `Slice` or `Concat`) is zero past the diagonal, and the attention is masked
//! by position, so rows after a sequence's last token never count. The rows are checked
//! once: a position outside 0..n fails at a `Gather` instead of reading or writing out of
//! bounds.

use std::collections::HashMap;

use super::context::Emitter;
use super::MASK_VALUE;
use crate::error::{Error, Result};
use crate::gmlp::decoding::{
    first_local_block, mode_state, static_local_mixing_refused, SequenceMode, POSITION, SEQUENCE,
};
use crate::onnx::graph::{Dim, ElemType, Value};
use crate::onnx::ops::TENSOR_SCATTER_OPSET;

/// The inputs of a static-state graph, declared before the embedding.
pub(crate) struct StaticInputs {
    /// The `position` input, i64 [batch].
    position: Value,
    /// The `past_*` inputs [batch, n, width], by name.
    past: HashMap<String, Value>,
}

/// The static state of a graph (the `Static` variant of sequence.rs's `Sequence`): the checked rows of
/// the new tokens, the `past_*` inputs and the `present_*` outputs made so far. Made only
/// for a model whose every block mixes tokens globally ([`Emitter::start_static`]).
pub(crate) struct StaticState {
    /// The rows of the new tokens and the index tensors derived from them.
    pub(crate) rows: StaticRows,
    past: HashMap<String, Value>,
    present: Vec<(String, Value)>,
}

impl StaticState {
    /// The `present_*` outputs in the order they were made.
    pub(crate) fn into_present(self) -> Vec<(String, Value)> {
        self.present
    }
}

/// The per-sequence positions of a static-state graph, computed once and shared by the
/// blocks (the derived index tensors are made on first use).
pub(crate) struct StaticRows {
    /// The checked positions P_b + t of the new tokens, i64 [batch, sequence]: a run
    /// whose rows leave 0..n fails at the `Gather`s that check them.
    pub(crate) rows: Value,
    /// The same as [batch, sequence, 1].
    rows3: Value,
    /// Each sequence's checked P (the first row), i64 [batch].
    start: Value,
    /// The positions 0..n−1, i64 [n] (the state's rows).
    table: Value,
    /// The index b of each new token's sequence, i64 [batch, sequence].
    batch_index: Value,
    /// `ScatterND` indices (b, P_b + t), i64 [batch, sequence, 2].
    scatter_indices: Option<Value>,
    /// The additive causal mask over the state's rows, f32 [batch, sequence, n].
    mask: Option<Value>,
    /// Toeplitz index rows `s − (P_b + t) + n − 1`, i64 [batch, sequence, n].
    toeplitz_index: Option<Value>,
}

impl Emitter {
    /// The `position` input [batch] and the `past_*` inputs [batch, n, width].
    pub(crate) fn declare_static_inputs(&mut self, batch: &Dim) -> Result<StaticInputs> {
        let position = self.g.input(POSITION, ElemType::I64, vec![batch.clone()])?;
        let n = self.cfg.seq_len();
        let mut past = HashMap::new();
        for state in mode_state(&self.cfg, SequenceMode::Static) {
            let shape = vec![batch.clone(), Dim::Fixed(n), Dim::Fixed(state.width)];
            let v = self.g.input(&state.past, ElemType::F32, shape)?;
            past.insert(state.past.clone(), v);
        }
        Ok(StaticInputs { position, past })
    }

    /// The checked rows P_b + t of the new tokens `ids` [batch, sequence], in the
    /// `positions` scope: each row is looked up in the table 0..n−1 at the row and at the
    /// row − n, so that a row ≥ n (the first lookup) or < 0 (the second: below −n) fails
    /// where ONNX's `Gather` would otherwise wrap a negative index. Refuses a model with
    /// local token mixing (a window's rows do not fit the fixed state).
    pub(crate) fn start_static(
        &mut self,
        inputs: StaticInputs,
        ids: &Value,
    ) -> Result<StaticState> {
        if let Some(i) = first_local_block(&self.cfg) {
            return Err(static_local_mixing_refused(i));
        }
        let n = self.cfg.seq_len();
        let position = inputs.position;
        let batch = ids.shape[0].clone();
        let seq = Dim::Symbol(SEQUENCE.into());
        let rows = self.g.scoped("positions", |g| {
            let zero = g.const_i64("zero", &[], vec![0])?;
            let one = g.const_i64("one", &[], vec![1])?;
            // A 1 for every new token, i64 [batch, sequence], from the ids' values: the
            // indices below are running sums of it, so no node reads a shape and every
            // node can run on a GPU (a step can be captured as a CUDA graph).
            let ids_zero = g.mul("token_zero", ids, &zero)?;
            let ones = g.add("token_one", &ids_zero, &one)?;
            let offsets = g.cum_sum("offsets", &ones, &one, true)?;
            let start_col = g.reshape(
                "position_column",
                &position,
                &[-1, 1],
                vec![batch.clone(), 1.into()],
            )?;
            let raw = g.add("rows_unchecked", &start_col, &offsets)?;
            let table = g.const_i64("table", &[n], (0..n as i64).collect())?;
            let n_c = g.const_i64("n", &[], vec![n as i64])?;
            let below = g.sub("rows_minus_n", &raw, &n_c)?;
            let upper = g.gather("check_below_n", &table, &raw, 0)?;
            let lower = g.gather("check_not_negative", &table, &below, 0)?;
            let rows = g.max("rows", &upper, &lower)?;
            let rows3 = g.reshape(
                "rows_column",
                &rows,
                &[0, 0, 1],
                vec![batch.clone(), seq.clone(), 1.into()],
            )?;
            let start = g.gather("start", &rows, &zero, 1)?;
            let batch_index = g.cum_sum("batch_index", &ones, &zero, true)?;
            Ok(StaticRows {
                rows,
                rows3,
                start,
                table,
                batch_index,
                scatter_indices: None,
                mask: None,
                toeplitz_index: None,
            })
        })?;
        Ok(StaticState {
            rows,
            past: inputs.past,
            present: Vec::new(),
        })
    }

    /// The `ScatterND` indices (b, P_b + t), i64 [batch, sequence, 2], shared.
    fn static_scatter_indices(&mut self, r: &mut StaticRows) -> Result<Value> {
        if let Some(v) = &r.scatter_indices {
            return Ok(v.clone());
        }
        let v = self.g.scoped("shared", |g| {
            let zero = g.const_i64("scatter_zero", &[], vec![0])?;
            let zeros = g.mul("scatter_zeros", &r.rows, &zero)?;
            let b = g.add("scatter_batch", &zeros, &r.batch_index)?;
            let b3 = g.reshape(
                "scatter_batch_column",
                &b,
                &[0, 0, 1],
                r.rows3.shape.clone(),
            )?;
            g.concat("scatter_indices", &[&b3, &r.rows3], 2)
        })?;
        r.scatter_indices = Some(v.clone());
        Ok(v)
    }

    /// Writes `new` [batch, sequence, width] into the state of `kind` of block `i` at the
    /// new rows; the result is the `present_*` output and is returned (cast to `new`'s
    /// type) for the computation, which reads all n rows.
    pub(crate) fn update_static_state(
        &mut self,
        state: &mut StaticState,
        i: usize,
        kind: &str,
        new: &Value,
    ) -> Result<Value> {
        let tensor = mode_state(&self.cfg, SequenceMode::Static)
            .into_iter()
            .find(|s| s.block == i && s.kind() == kind)
            .ok_or_else(|| Error::Internal(format!("block {i} has no {kind} state")))?;
        let past = state
            .past
            .get(&tensor.past)
            .cloned()
            .ok_or_else(|| Error::Internal(format!("no graph input {}", tensor.past)))?;
        let update = self.cast_to(&format!("{kind}_update_to_f32"), new, ElemType::F32)?;
        let local = format!("{kind}_update");
        let present = if self.g.opset() >= TENSOR_SCATTER_OPSET {
            let start = state.rows.start.clone();
            self.g.tensor_scatter(&local, &past, &update, &start, 1)?
        } else {
            let indices = self.static_scatter_indices(&mut state.rows)?;
            self.g.scatter_nd(&local, &past, &indices, &update)?
        };
        state
            .present
            .push((tensor.present.clone(), present.clone()));
        self.cast_to(&format!("{kind}_state_cast"), &present, new.elem)
    }

    /// The additive causal mask over the state's rows, f32 [batch, sequence, n]: 0 for rows
    /// s ≤ P_b + t, [`MASK_VALUE`] after (shared by the blocks).
    pub(crate) fn static_mask(&mut self, state: &mut StaticState) -> Result<Value> {
        let r = &mut state.rows;
        if let Some(v) = &r.mask {
            return Ok(v.clone());
        }
        let v = self.g.scoped("shared", |g| {
            let zero = g.const_i64("mask_zero", &[], vec![0])?;
            let one = g.const_i64("mask_one", &[], vec![1])?;
            // 1 where s > P_b + t: min(max(s − row, 0), 1).
            let after = g.sub("mask_after", &r.table, &r.rows3)?;
            let after = g.max("mask_after_floor", &after, &zero)?;
            let after = g.min("mask_after_clamped", &after, &one)?;
            let after = g.cast("mask_after_f32", &after, ElemType::F32)?;
            let fill = g.const_f32("mask_value", &[], vec![MASK_VALUE])?;
            g.mul("static_causal_mask", &after, &fill)
        })?;
        r.mask = Some(v.clone());
        Ok(v)
    }

    /// The Toeplitz gather form's index rows `s − (P_b + t) + n − 1`, i64
    /// [batch, sequence, n], always within 0..2n−1 (shared by the blocks).
    pub(crate) fn static_toeplitz_index(&mut self, state: &mut StaticState) -> Result<Value> {
        let r = &mut state.rows;
        if let Some(v) = &r.toeplitz_index {
            return Ok(v.clone());
        }
        let n = self.cfg.seq_len();
        let v = self.g.scoped("shared", |g| {
            let offset = g.sub("toeplitz_offset", &r.table, &r.rows3)?;
            let diagonal = g.const_i64("toeplitz_diagonal", &[], vec![n as i64 - 1])?;
            g.add("toeplitz_index", &offset, &diagonal)
        })?;
        r.toeplitz_index = Some(v.clone());
        Ok(v)
    }

    /// Rows P_b + t − `back` of `all` [batch, n, width] (the whole state of each sequence),
    /// zero where that row is before 0: [batch, sequence, width]. One `Gather` on the
    /// state seen as [batch·n, width] at b·n + max(row − back, 0).
    pub(crate) fn static_rows_back(
        &mut self,
        state: &StaticState,
        local: &str,
        all: &Value,
        back: usize,
    ) -> Result<Value> {
        let n = self.cfg.seq_len();
        let r = &state.rows;
        let (rows, rows3, batch_index) = (&r.rows, &r.rows3, &r.batch_index);
        let width = all.shape[2].clone();
        let g = &mut self.g;
        let back_c = g.const_i64(&format!("{local}_back"), &[], vec![back as i64])?;
        let zero = g.const_i64(&format!("{local}_zero"), &[], vec![0])?;
        let one = g.const_i64(&format!("{local}_one"), &[], vec![1])?;
        let n_c = g.const_i64(&format!("{local}_n"), &[], vec![n as i64])?;
        let source = g.sub(&format!("{local}_source"), rows, &back_c)?;
        let clamped = g.max(&format!("{local}_source_floor"), &source, &zero)?;
        let base = g.mul(&format!("{local}_sequence_start"), batch_index, &n_c)?;
        let flat_index = g.add(&format!("{local}_flat_index"), &base, &clamped)?;
        let flat = g.reshape(
            &format!("{local}_flat_state"),
            all,
            &[-1, width_i64(&width)?],
            vec![Dim::Symbol("batch * n".into()), width.clone()],
        )?;
        let picked = g.gather(&format!("{local}_rows"), &flat, &flat_index, 0)?;
        // 1 where row − back ≥ 0: min(max(row − back + 1, 0), 1).
        let back3 = g.sub(&format!("{local}_source_column"), rows3, &back_c)?;
        let up = g.add(&format!("{local}_valid_plus_one"), &back3, &one)?;
        let up = g.max(&format!("{local}_valid_floor"), &up, &zero)?;
        let valid = g.min(&format!("{local}_valid"), &up, &one)?;
        let valid = g.cast(&format!("{local}_valid_float"), &valid, all.elem)?;
        g.mul(local, &picked, &valid)
    }
}

fn width_i64(width: &Dim) -> Result<i64> {
    match width {
        Dim::Fixed(w) => Ok(*w as i64),
        Dim::Symbol(s) => Err(Error::Internal(format!("state width {s} is not fixed"))),
    }
}
