//! Variable length and state (causal token models; docs/generation.md): the new positions
//! P..P+T−1 (P = `past_sequence`, 0 without state; T = `sequence`) read rows P..P+T−1
//! and columns 0..P+T−1 of W and b[P..P+T−1], gathered by a computed row index (which also
//! makes a run past n fail instead of wrapping around); the Toeplitz gather form builds
//! only those rows of its index table, `idx[t][s] = s − (P + t) + n − 1`. A with-past
//! graph takes each block's state as `past_*` inputs and returns `present_*` = past
//! followed by the new positions.

use super::context::{Emitter, Positions};
use crate::error::{Error, Result};
use crate::gmlp::decoding::{block_state, SequenceMode, StateTensor, TOTAL_SEQUENCE};
use crate::onnx::graph::{Dim, ElemType, Value};

impl Emitter {
    /// The `past_*` inputs of every block, `[batch, past_sequence, width]` (a window state
    /// `[batch, past_shift_sequence, width]` or `[batch, past_window_K, width]`).
    pub(crate) fn declare_past_inputs(&mut self, batch: &Dim) -> Result<()> {
        for i in 0..self.cfg.layers {
            for state in block_state(&self.cfg, i) {
                let rows = Dim::Symbol(state.past_rows_symbol());
                let shape = vec![batch.clone(), rows, Dim::Fixed(state.width)];
                let v = self.g.input(&state.past, ElemType::F32, shape)?;
                self.past.insert(state.past.clone(), v);
            }
        }
        Ok(())
    }

    /// The shared row positions P..P+T−1 of the new tokens `ids` [batch, sequence]
    /// (P from the length of the first state that grows, in a with-past graph; 0
    /// otherwise), in the `positions` scope.
    pub(crate) fn compute_positions(&mut self, ids: &Value, seq: &Dim) -> Result<()> {
        let growing = (0..self.cfg.layers)
            .flat_map(|i| block_state(&self.cfg, i))
            .find(|s| s.window.is_none());
        let first_past = growing.and_then(|s| self.past.get(&s.past).cloned());
        let positions = self.g.scoped("positions", |g| {
            let zero = g.const_i64("zero", &[], vec![0])?;
            let one = g.const_i64("one", &[], vec![1])?;
            let ids_len = g.shape_of("sequence_shape", ids, 1, 2)?;
            let new = g.gather("sequence", &ids_len, &zero, 0)?;
            let (start, total_dim) = match &first_past {
                Some(past) => {
                    let past_len = g.shape_of("past_shape", past, 1, 2)?;
                    let start = g.gather("past_sequence", &past_len, &zero, 0)?;
                    (start, Dim::Symbol(TOTAL_SEQUENCE.into()))
                }
                None => (zero.clone(), seq.clone()),
            };
            let total_scalar = g.add("total", &start, &new)?;
            let rows = g.range("rows", &start, &total_scalar, &one, seq.clone())?;
            let total = g.reshape("total_1d", &total_scalar, &[1], vec![Dim::Fixed(1)])?;
            Ok(Positions {
                rows,
                total,
                total_dim,
                toeplitz_index: None,
                mask: None,
                total_scalar,
            })
        })?;
        self.positions = Some(positions);
        Ok(())
    }

    /// The shared positions (an error if asked before the embedding made them).
    pub(crate) fn positions(&self) -> Result<&Positions> {
        self.positions
            .as_ref()
            .ok_or_else(|| Error::Internal("positions used before the embedding".into()))
    }

    /// Columns 0..P+T−1 of `x` (last axis) for rows already gathered.
    pub(crate) fn first_columns(&mut self, local: &str, x: &Value) -> Result<Value> {
        let pos = self.positions()?;
        let (total, total_dim) = (pos.total.clone(), pos.total_dim.clone());
        let zero = self.g.const_i64(&format!("{local}_start"), &[1], vec![0])?;
        let last = x
            .shape
            .len()
            .checked_sub(1)
            .ok_or_else(|| Error::Internal(format!("{local}: columns of a scalar")))?;
        let mut shape = x.shape.clone();
        shape[last] = total_dim;
        // A non-negative axis: candle-onnx 0.11 misreads Slice's negative axes.
        self.g
            .slice_dynamic(local, x, &zero, &total, &[last as i64], shape)
    }

    /// Rows P..P+T−1 of `x` along `axis` (fails at run time past n).
    pub(crate) fn rows_of(&mut self, local: &str, x: &Value, axis: usize) -> Result<Value> {
        let rows = self.positions()?.rows.clone();
        self.g.gather(local, x, &rows, axis)
    }

    /// The shared index rows `idx[t][s] = s − (P + t) + n − 1` of the Toeplitz gather form.
    pub(crate) fn toeplitz_index_rows(&mut self) -> Result<Value> {
        if let Some(v) = &self.positions()?.toeplitz_index {
            return Ok(v.clone());
        }
        let n = self.cfg.seq_len();
        let pos = self.positions()?;
        let (rows, total_scalar, total_dim) = (
            pos.rows.clone(),
            pos.total_scalar.clone(),
            pos.total_dim.clone(),
        );
        let seq = rows.shape[0].clone();
        let v = self.g.scoped("shared", |g| {
            let zero = g.const_i64("toeplitz_zero", &[], vec![0])?;
            let one = g.const_i64("toeplitz_one", &[], vec![1])?;
            let cols = g.range("toeplitz_columns", &zero, &total_scalar, &one, total_dim)?;
            let rows_col = g.reshape("toeplitz_rows", &rows, &[-1, 1], vec![seq, Dim::Fixed(1)])?;
            let offset = g.sub("toeplitz_offset", &cols, &rows_col)?;
            let diagonal = g.const_i64("toeplitz_diagonal", &[], vec![n as i64 - 1])?;
            g.add("toeplitz_index", &offset, &diagonal)
        })?;
        if let Some(pos) = self.positions.as_mut() {
            pos.toeplitz_index = Some(v.clone());
        }
        Ok(v)
    }

    /// The causal mask for the new rows: [sequence, total], shared by the blocks.
    pub(crate) fn mask_rows(&mut self) -> Result<Value> {
        if let Some(v) = &self.positions()?.mask {
            return Ok(v.clone());
        }
        let full = self.causal_mask()?;
        self.g.push_scope("shared");
        let rows = self.rows_of("causal_mask_rows", &full, 0);
        let v = rows.and_then(|r| self.first_columns("causal_mask_columns", &r));
        self.g.pop_scope();
        let v = v?;
        if let Some(pos) = self.positions.as_mut() {
            pos.mask = Some(v.clone());
        }
        Ok(v)
    }

    /// The graph input `past` (cast to `elem`).
    pub(crate) fn past_input(&mut self, past: &str, local: &str, elem: ElemType) -> Result<Value> {
        let value = self
            .past
            .get(past)
            .cloned()
            .ok_or_else(|| Error::Internal(format!("no graph input {past}")))?;
        self.cast_to(local, &value, elem)
    }

    /// Records `value` (cast to f32) as the graph output `present` (a with-past state).
    pub(crate) fn push_present(
        &mut self,
        present: String,
        local: &str,
        value: &Value,
    ) -> Result<()> {
        let value = self.cast_to(local, value, ElemType::F32)?;
        self.present.push((present, value));
        Ok(())
    }

    /// `past` (a graph input) followed by `new` along the tokens; the result is also the
    /// `present_*` output `kind`.
    pub(crate) fn with_past(&mut self, past: &str, kind: &str, new: &Value) -> Result<Value> {
        let past_value = self.past_input(past, &format!("past_{kind}_cast"), new.elem)?;
        let total_dim = self.positions()?.total_dim.clone();
        let all =
            self.g
                .concat_symbolic(&format!("{kind}_concat"), &[&past_value, new], 1, total_dim)?;
        let present = past.replacen("past_", "present_", 1);
        self.push_present(present, &format!("present_{kind}_to_f32"), &all)?;
        Ok(all)
    }

    /// The window state of `state` (K = its window rows): `past` followed by `new`,
    /// returned for the computation, and its last min(L + T, K) rows as the `present_*`
    /// output.
    pub(crate) fn with_past_window(&mut self, state: &StateTensor, new: &Value) -> Result<Value> {
        let kind = state.kind().to_string();
        let window = state
            .window
            .ok_or_else(|| Error::Internal(format!("{} is not a window state", state.past)))?;
        let past = self.past_input(&state.past, &format!("past_{kind}_cast"), new.elem)?;
        let full = self.g.concat_symbolic(
            &format!("{kind}_concat"),
            &[&past, new],
            1,
            Dim::Symbol(format!("{} + {}", state.past_rows_symbol(), new.shape[1])),
        )?;
        let len = self.g.shape_of(&format!("{kind}_rows"), &full, 1, 2)?;
        let keep = self
            .g
            .const_i64(&format!("{kind}_window"), &[1], vec![window as i64])?;
        let zero = self
            .g
            .const_i64(&format!("{kind}_window_zero"), &[1], vec![0])?;
        let over = self.g.sub(&format!("{kind}_window_over"), &len, &keep)?;
        let start = self.g.max(&format!("{kind}_window_start"), &over, &zero)?;
        let mut shape = full.shape.clone();
        shape[1] = Dim::Symbol(state.present_rows_symbol());
        let present = self.g.slice_dynamic(
            &format!("{kind}_window_rows"),
            &full,
            &start,
            &len,
            &[1],
            shape,
        )?;
        self.push_present(
            state.present.clone(),
            &format!("present_{kind}_to_f32"),
            &present,
        )?;
        Ok(full)
    }

    /// The block state of `kind` for block `i` (growing or window) joined with `new`.
    pub(crate) fn with_block_state(&mut self, i: usize, kind: &str, new: &Value) -> Result<Value> {
        let state = block_state(&self.cfg, i)
            .into_iter()
            .find(|s| s.kind() == kind)
            .ok_or_else(|| Error::Internal(format!("block {i} has no {kind} state")))?;
        match state.window {
            None => self.with_past(&state.past, kind, new),
            Some(_) => self.with_past_window(&state, new),
        }
    }

    /// Absolute positions of the new rows, i64 [T]: 0..n−1 in a fixed graph, P..P+T−1
    /// otherwise.
    pub(crate) fn row_positions(&mut self) -> Result<Value> {
        match self.mode {
            SequenceMode::Fixed => self.fixed_positions(),
            _ => Ok(self.positions()?.rows.clone()),
        }
    }

    /// Absolute positions of the rows of `keys`, which end at the last new row: i64 [S]
    /// (P + T − S ..= P + T − 1).
    pub(crate) fn key_positions(&mut self, keys: &Value) -> Result<Value> {
        match self.mode {
            SequenceMode::Fixed => self.fixed_positions(),
            SequenceMode::Variable => Ok(self.positions()?.rows.clone()),
            SequenceMode::WithPast => {
                let total = self.positions()?.total_scalar.clone();
                let zero = self.g.const_i64("key_positions_zero", &[], vec![0])?;
                let one = self.g.const_i64("key_positions_one", &[], vec![1])?;
                let len = self.g.shape_of("key_positions_shape", keys, 1, 2)?;
                let len = self.g.gather("key_positions_count", &len, &zero, 0)?;
                let start = self.g.sub("key_positions_start", &total, &len)?;
                self.g
                    .range("key_positions", &start, &total, &one, keys.shape[1].clone())
            }
            // Local mixing is refused for static state (SequenceMode::check).
            SequenceMode::Static => Err(Error::Internal(
                "key positions of local mixing in a static-state graph".into(),
            )),
        }
    }

    /// The constant positions 0..n−1 of a fixed graph, shared by the blocks.
    fn fixed_positions(&mut self) -> Result<Value> {
        if let Some(v) = &self.fixed_positions {
            return Ok(v.clone());
        }
        let n = self.cfg.seq_len();
        let v = self.g.scoped("shared", |g| {
            g.const_i64("positions", &[n], (0..n as i64).collect())
        })?;
        self.fixed_positions = Some(v.clone());
        Ok(v)
    }
}
