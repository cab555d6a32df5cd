//! The sequence axis as the blocks see it: one [`Sequence`] per graph, whose variant holds
//! exactly what its mode has (as candle's `forward(x, index_pos, &mut cache)` passes the
//! position and the cache, and onnxruntime-genai keeps a `KeyValueCache`): nothing for a
//! fixed length, the positions of a variable length, the positions and the growing state
//! of `--with-past growing`, the per-sequence rows and the fixed-size state of the static
//! form ([`super::static_state`]). Each part matches it once; a part cannot see the data
//! of another mode, and nothing exists before the embedding made it.
//!
//! Variable length and growing state (causal token models; docs/generation.md): the new
//! positions P..P+T−1 (P = `past_sequence`, 0 without state; T = `sequence`) read rows
//! P..P+T−1 and columns 0..P+T−1 of W and b[P..P+T−1], gathered by a computed row index
//! (which also makes a run past n fail instead of wrapping around); the Toeplitz gather
//! form builds only those rows of its index table, `idx[t][s] = s − (P + t) + n − 1`. A
//! growing-state graph takes each block's state as `past_*` inputs and returns
//! `present_*` = past followed by the new positions.

use std::collections::HashMap;

use super::context::Emitter;
use super::static_state::{StaticInputs, StaticState};
use super::MASK_VALUE;
use crate::error::{Error, Result};
use crate::gmlp::config::GmlpConfig;
use crate::gmlp::emit::static_state::StaticStatePart;
use crate::gmlp::interface::{
    block_state, first_local_block, static_local_mixing_refused, Interface, SequenceMode,
    StateTensor, TOTAL_SEQUENCE,
};
use crate::onnx::builder::GraphBuilder;
use crate::onnx::graph::{Dim, ElemType, Value};

/// How the blocks see the sequence axis, with the data of that mode only.
pub(crate) enum Sequence {
    /// The whole sequence of n tokens at positions 0..n−1.
    Fixed(FixedPositions),
    /// T ≤ n tokens at positions 0..T−1, no state.
    Variable(Positions),
    /// T new tokens at P..P+T−1 after the P in a state that grows with every token
    /// (`--with-past growing`).
    Growing(Positions, GrowingState),
    /// T new tokens per sequence at its own P_b, written into fixed-size state
    /// (`--with-past`, `--with-past static`).
    Static(Box<StaticState>),
}

/// The forms local token mixing (a window or an axial fold) supports: every one but the
/// static state, whose fixed rows cannot hold a window ([`Sequence::local`]).
pub(crate) enum LocalSequence<'a> {
    /// [`Sequence::Fixed`].
    Fixed(&'a mut FixedPositions),
    /// [`Sequence::Variable`].
    Variable(&'a Positions),
    /// [`Sequence::Growing`].
    Growing(&'a Positions, &'a mut GrowingState),
}

/// The constant positions 0..n−1 of a fixed graph (made on first use, by local mixing).
#[derive(Default)]
pub(crate) struct FixedPositions {
    positions: Option<Value>,
}

/// The run-time positions of a variable-length or growing-state graph, computed once and
/// shared by the blocks.
pub(crate) struct Positions {
    /// Positions P..P+T−1 of the new tokens, i64 [sequence].
    pub(crate) rows: Value,
    /// P + T as an i64 [1] (the end of a column Slice).
    pub(crate) total: Value,
    /// Symbol of P + T.
    pub(crate) total_dim: Dim,
    /// Toeplitz index rows `idx[t][s] = s − (P + t) + n − 1`, i64 [sequence, total]
    /// (gather form only, made on first use).
    toeplitz_index: Option<Value>,
    /// The causal mask's rows P..P+T−1, columns 0..P+T−1 (aMLP, made on first use).
    mask: Option<Value>,
    /// The scalar P + T (for the Toeplitz column range).
    pub(crate) total_scalar: Value,
}

/// The state of a growing-state graph: its `past_*` inputs and the `present_*` outputs
/// made so far.
pub(crate) struct GrowingState {
    /// `past_*` graph inputs (the rows the model reads), by name.
    past: HashMap<String, Value>,
    /// `present_*` values in the order they were made.
    present: Vec<(String, Value)>,
    /// Triton's leading slot of each state, by its `present_*` name ([`Interface::Triton`]).
    slots: HashMap<String, Value>,
}

/// The `past_*` inputs of a growing state: the rows the model reads, by name, and
/// Triton's leading slot of each, by its `present_*` name ([`Interface::Triton`]).
#[derive(Default)]
pub(crate) struct GrowingInputs {
    past: HashMap<String, Value>,
    slots: HashMap<String, Value>,
}

/// The graph inputs a mode declares after `input_ids`, before the embedding: the step
/// between declaring the inputs and computing the positions from them.
pub(crate) enum DeclaredInputs {
    /// No input beyond `input_ids` (fixed length).
    Fixed,
    /// No input beyond `input_ids` (variable length).
    Variable,
    /// The `past_*` inputs of a growing state.
    Growing(GrowingInputs),
    /// The `position` and `past_*` inputs of a static state.
    Static(StaticInputs),
}

/// The sequence axis' graph parts: the inputs each mode declares, its positions, causal-mask rows and past state.
pub(crate) struct SequenceAxis;

impl SequenceAxis {
    /// Declares the inputs `mode` takes after `input_ids` (`[batch, …]` for `batch`).
    pub(crate) fn declare_sequence_inputs(
        em: &mut Emitter,
        mode: SequenceMode,
        batch: &Dim,
    ) -> Result<DeclaredInputs> {
        Ok(match mode {
            SequenceMode::Fixed => DeclaredInputs::Fixed,
            SequenceMode::Variable => DeclaredInputs::Variable,
            SequenceMode::Growing => {
                DeclaredInputs::Growing(SequenceAxis::declare_past_inputs(em, batch)?)
            }
            SequenceMode::Static => {
                DeclaredInputs::Static(StaticStatePart::declare_inputs(em, batch)?)
            }
        })
    }

    /// The [`Sequence`] of the new tokens `ids` [batch, `seq`] and the inputs `declared`
    /// (positions in the `positions` scope).
    pub(crate) fn start_sequence(
        em: &mut Emitter,
        declared: DeclaredInputs,
        ids: &Value,
        seq: &Dim,
    ) -> Result<Sequence> {
        Ok(match declared {
            DeclaredInputs::Fixed => Sequence::Fixed(FixedPositions::default()),
            DeclaredInputs::Variable => {
                Sequence::Variable(compute_positions(&mut em.g, ids, seq, None)?)
            }
            DeclaredInputs::Growing(GrowingInputs { past, slots }) => {
                let first = first_growing_input(&em.cfg, &past);
                let positions = compute_positions(&mut em.g, ids, seq, first.as_ref())?;
                let state = GrowingState {
                    past,
                    present: Vec::new(),
                    slots,
                };
                Sequence::Growing(positions, state)
            }
            DeclaredInputs::Static(inputs) => {
                Sequence::Static(Box::new(StaticStatePart::start(em, inputs, ids)?))
            }
        })
    }

    /// The `past_*` inputs of every block, `[batch, past_sequence, width]` (a window state
    /// `[batch, past_shift_sequence, width]` or `[batch, past_window_K, width]`); for
    /// [`Interface::Triton`], each with one leading slot more along its rows (see
    /// [`TritonSlot`]).
    fn declare_past_inputs(em: &mut Emitter, batch: &Dim) -> Result<GrowingInputs> {
        let mut inputs = GrowingInputs::default();
        let slot = match em.interface {
            Interface::Triton => Some(TritonSlot::new(&mut em.g)?),
            Interface::File | Interface::BoundStep | Interface::Genai { .. } => None,
        };
        for i in 0..em.cfg.layers {
            for state in block_state(&em.cfg, i) {
                let rows = Dim::Symbol(state.past_rows_symbol());
                let shape = vec![batch.clone(), rows, Dim::Fixed(state.width)];
                let v = match &slot {
                    None => em.g.input(&state.past, ElemType::F32, shape)?,
                    Some(slot) => {
                        let (rows, slot) = slot.declare(&mut em.g, &state.past, shape)?;
                        inputs.slots.insert(state.present.clone(), slot);
                        rows
                    }
                };
                inputs.past.insert(state.past.clone(), v);
            }
        }
        Ok(inputs)
    }

    /// The additive causal mask [n, n] (0 on and below the diagonal, [`MASK_VALUE`] above),
    /// shared by the blocks; [1, 1, n, n] in the fused spelling, `Attention`'s layout.
    pub(crate) fn causal_mask(em: &mut Emitter) -> Result<Value> {
        if let Some(v) = &em.causal_mask {
            return Ok(v.clone());
        }
        let n = em.cfg.seq_len();
        let mut mask = vec![0f32; n * n];
        for i in 0..n {
            mask[i * n + i + 1..(i + 1) * n].fill(MASK_VALUE);
        }
        let dims: &[usize] = if em.fused() { &[1, 1, n, n] } else { &[n, n] };
        let v =
            em.g.scoped("shared", |g| g.const_f32("causal_mask", dims, mask))?;
        em.causal_mask = Some(v.clone());
        Ok(v)
    }

    /// The causal mask for the new rows, shared by the blocks: [n, n] for a fixed length,
    /// rows P..P+T−1 and columns 0..P+T−1 of it for a variable length or growing state,
    /// [batch, sequence, n] over the state's rows for the static form.
    pub(crate) fn causal_mask_rows(em: &mut Emitter, seq: &mut Sequence) -> Result<Value> {
        match seq {
            Sequence::Fixed(_) => SequenceAxis::causal_mask(em),
            Sequence::Variable(pos) | Sequence::Growing(pos, _) => SequenceAxis::mask_rows(em, pos),
            Sequence::Static(state) => StaticStatePart::mask(em, state),
        }
    }

    /// The causal mask for the new rows: [sequence, total] ([1, 1, sequence, total] in the
    /// fused spelling), shared by the blocks.
    fn mask_rows(em: &mut Emitter, pos: &mut Positions) -> Result<Value> {
        if let Some(v) = &pos.mask {
            return Ok(v.clone());
        }
        let full = SequenceAxis::causal_mask(em)?;
        let row_axis = full.shape.len() - 2;
        let v = em.g.scoped("shared", |g| {
            let rows = pos.rows_of(g, "causal_mask_rows", &full, row_axis)?;
            pos.first_columns(g, "causal_mask_columns", &rows)
        })?;
        pos.mask = Some(v.clone());
        Ok(v)
    }

    /// `past` (a graph input of `state`) followed by `new` along the tokens; the result is
    /// also the `present_*` output `kind`.
    pub(crate) fn with_past(
        em: &mut Emitter,
        pos: &Positions,
        state: &mut GrowingState,
        past: &str,
        kind: &str,
        new: &Value,
    ) -> Result<Value> {
        let past_value =
            SequenceAxis::past_input(em, state, past, &format!("past_{kind}_cast"), new.elem)?;
        let total_dim = pos.total_dim.clone();
        let all =
            em.g.concat_symbolic(&format!("{kind}_concat"), &[&past_value, new], 1, total_dim)?;
        let present = past.replacen("past_", "present_", 1);
        SequenceAxis::push_present(em, state, present, &format!("present_{kind}_to_f32"), &all)?;
        Ok(all)
    }

    /// The graph input `past` of `state` (cast to `elem`).
    pub(crate) fn past_input(
        em: &mut Emitter,
        state: &GrowingState,
        past: &str,
        local: &str,
        elem: ElemType,
    ) -> Result<Value> {
        let value = state
            .past
            .get(past)
            .cloned()
            .ok_or_else(|| Error::Internal(format!("no graph input {past}")))?;
        em.cast_to(local, &value, elem)
    }

    /// Records `value` (cast to f32) as the graph output `present` of `state`.
    pub(crate) fn push_present(
        em: &mut Emitter,
        state: &mut GrowingState,
        present: String,
        local: &str,
        value: &Value,
    ) -> Result<()> {
        let mut value = em.cast_to(local, value, ElemType::F32)?;
        if let Some(slot) = state.slots.get(&present) {
            let total = Dim::Symbol(format!("1 + {}", value.shape[1]));
            value = em.g.concat_symbolic(
                &format!("{present}/triton_put_slot_back"),
                &[slot, &value],
                1,
                total,
            )?;
        }
        state.present.push((present, value));
        Ok(())
    }

    /// The window state `tensor` (K = its window rows) of `state`: `past` followed by
    /// `new`, returned for the computation, and its last min(L + T, K) rows as the
    /// `present_*` output.
    fn with_past_window(
        em: &mut Emitter,
        state: &mut GrowingState,
        tensor: &StateTensor,
        window: usize,
        new: &Value,
    ) -> Result<Value> {
        let kind = tensor.kind().to_string();
        let past = SequenceAxis::past_input(
            em,
            state,
            &tensor.past,
            &format!("past_{kind}_cast"),
            new.elem,
        )?;
        let full = em.g.concat_symbolic(
            &format!("{kind}_concat"),
            &[&past, new],
            1,
            Dim::Symbol(format!("{} + {}", tensor.past_rows_symbol(), new.shape[1])),
        )?;
        let len = em.g.shape_of(&format!("{kind}_rows"), &full, 1, 2)?;
        let keep =
            em.g.const_i64(&format!("{kind}_window"), &[1], vec![window as i64])?;
        let zero =
            em.g.const_i64(&format!("{kind}_window_zero"), &[1], vec![0])?;
        let over = em.g.sub(&format!("{kind}_window_over"), &len, &keep)?;
        let start = em.g.max(&format!("{kind}_window_start"), &over, &zero)?;
        let mut shape = full.shape.clone();
        shape[1] = Dim::Symbol(tensor.present_rows_symbol());
        let present = em.g.slice_dynamic(
            &format!("{kind}_window_rows"),
            &full,
            &start,
            &len,
            &[1],
            shape,
        )?;
        SequenceAxis::push_present(
            em,
            state,
            tensor.present.clone(),
            &format!("present_{kind}_to_f32"),
            &present,
        )?;
        Ok(full)
    }

    /// The block state of `kind` for block `i` (growing or window) joined with `new`.
    pub(crate) fn with_block_state(
        em: &mut Emitter,
        pos: &Positions,
        state: &mut GrowingState,
        i: usize,
        kind: &str,
        new: &Value,
    ) -> Result<Value> {
        let tensor = block_state(&em.cfg, i)
            .into_iter()
            .find(|s| s.kind() == kind)
            .ok_or_else(|| Error::Internal(format!("block {i} has no {kind} state")))?;
        match tensor.window {
            None => SequenceAxis::with_past(em, pos, state, &tensor.past, kind, new),
            Some(window) => SequenceAxis::with_past_window(em, state, &tensor, window, new),
        }
    }

    /// Absolute positions of the new rows, i64 [T]: 0..n−1 in a fixed graph, P..P+T−1
    /// otherwise.
    pub(crate) fn row_positions(em: &mut Emitter, seq: &mut LocalSequence) -> Result<Value> {
        match seq {
            LocalSequence::Fixed(fixed) => SequenceAxis::fixed_positions(em, fixed),
            LocalSequence::Variable(pos) | LocalSequence::Growing(pos, _) => Ok(pos.rows.clone()),
        }
    }

    /// Absolute positions of the rows of `keys`, which end at the last new row: i64 [S]
    /// (P + T − S ..= P + T − 1).
    pub(crate) fn key_positions(
        em: &mut Emitter,
        seq: &mut LocalSequence,
        keys: &Value,
    ) -> Result<Value> {
        match seq {
            LocalSequence::Fixed(fixed) => SequenceAxis::fixed_positions(em, fixed),
            LocalSequence::Variable(pos) => Ok(pos.rows.clone()),
            LocalSequence::Growing(pos, _) => {
                let total = pos.total_scalar.clone();
                let zero = em.g.const_i64("key_positions_zero", &[], vec![0])?;
                let one = em.g.const_i64("key_positions_one", &[], vec![1])?;
                let len = em.g.shape_of("key_positions_shape", keys, 1, 2)?;
                let len = em.g.gather("key_positions_count", &len, &zero, 0)?;
                let start = em.g.sub("key_positions_start", &total, &len)?;
                em.g.range("key_positions", &start, &total, &one, keys.shape[1].clone())
            }
        }
    }

    /// The constant positions 0..n−1 of a fixed graph, shared by the blocks.
    fn fixed_positions(em: &mut Emitter, fixed: &mut FixedPositions) -> Result<Value> {
        if let Some(v) = &fixed.positions {
            return Ok(v.clone());
        }
        let n = em.cfg.seq_len();
        let v = em.g.scoped("shared", |g| {
            g.const_i64("positions", &[n], (0..n as i64).collect())
        })?;
        fixed.positions = Some(v.clone());
        Ok(v)
    }
}

impl Sequence {
    /// This sequence as local token mixing sees it; the static state refuses local mixing
    /// (as [`SequenceMode::check`] does before anything is emitted).
    pub(crate) fn local(&mut self, cfg: &GmlpConfig) -> Result<LocalSequence<'_>> {
        match self {
            Sequence::Fixed(fixed) => Ok(LocalSequence::Fixed(fixed)),
            Sequence::Variable(pos) => Ok(LocalSequence::Variable(pos)),
            Sequence::Growing(pos, state) => Ok(LocalSequence::Growing(pos, state)),
            Sequence::Static(_) => Err(static_local_mixing_refused(
                first_local_block(cfg).unwrap_or_default(),
            )),
        }
    }

    /// The static state's positions P, i64 [batch]; `None` in the other modes.
    pub(crate) fn static_position(&self) -> Option<&Value> {
        match self {
            Sequence::Static(state) => Some(state.position()),
            _ => None,
        }
    }

    /// The static state's next position for Triton, i64 [batch, 1]
    /// ([`Interface::Triton`]); `None` otherwise.
    pub(crate) fn triton_next_position(&self) -> Option<&Value> {
        match self {
            Sequence::Static(state) => state.triton_next_position(),
            _ => None,
        }
    }

    /// The `present_*` outputs made, in the order they were made (none without state).
    pub(crate) fn into_present(self) -> Vec<(String, Value)> {
        match self {
            Sequence::Fixed(_) | Sequence::Variable(_) => Vec::new(),
            Sequence::Growing(_, state) => state.present,
            Sequence::Static(state) => state.into_present(),
        }
    }
}

impl Positions {
    /// Columns 0..P+T−1 of `x` (last axis) for rows already gathered.
    pub(crate) fn first_columns(
        &self,
        g: &mut GraphBuilder,
        local: &str,
        x: &Value,
    ) -> Result<Value> {
        let zero = g.const_i64(&format!("{local}_start"), &[1], vec![0])?;
        let last = x
            .shape
            .len()
            .checked_sub(1)
            .ok_or_else(|| Error::Internal(format!("{local}: columns of a scalar")))?;
        let mut shape = x.shape.clone();
        shape[last] = self.total_dim.clone();
        // A non-negative axis: candle-onnx 0.11 misreads Slice's negative axes.
        g.slice_dynamic(local, x, &zero, &self.total, &[last as i64], shape)
    }

    /// Rows P..P+T−1 of `x` along `axis` (fails at run time past n).
    pub(crate) fn rows_of(
        &self,
        g: &mut GraphBuilder,
        local: &str,
        x: &Value,
        axis: usize,
    ) -> Result<Value> {
        g.gather(local, x, &self.rows, axis)
    }

    /// The shared index rows `idx[t][s] = s − (P + t) + n − 1` of the Toeplitz gather form
    /// (n positions), in the `shared` scope.
    pub(crate) fn toeplitz_index_rows(&mut self, g: &mut GraphBuilder, n: usize) -> Result<Value> {
        if let Some(v) = &self.toeplitz_index {
            return Ok(v.clone());
        }
        let seq = self.rows.shape[0].clone();
        let v = g.scoped("shared", |g| {
            let zero = g.const_i64("toeplitz_zero", &[], vec![0])?;
            let one = g.const_i64("toeplitz_one", &[], vec![1])?;
            let cols = g.range(
                "toeplitz_columns",
                &zero,
                &self.total_scalar,
                &one,
                self.total_dim.clone(),
            )?;
            let rows_col = g.reshape(
                "toeplitz_rows",
                &self.rows,
                &[-1, 1],
                vec![seq, Dim::Fixed(1)],
            )?;
            let offset = g.sub("toeplitz_offset", &cols, &rows_col)?;
            let diagonal = g.const_i64("toeplitz_diagonal", &[], vec![n as i64 - 1])?;
            g.add("toeplitz_index", &offset, &diagonal)
        })?;
        self.toeplitz_index = Some(v.clone());
        Ok(v)
    }
}

/// The input of the first state that grows (block 0's `sgu` unless windowed), whose
/// length is P.
/// The shared constants of Triton's leading slot ([`Interface::Triton`]): Triton r24.10
/// gives a sequence's first request a state of one row whatever `initial_state` says
/// (docs/serving.md), so the state it keeps has one zero row in front of the model's.
struct TritonSlot {
    zero: Value,
    one: Value,
    end: Value,
}

impl TritonSlot {
    /// The constants 0, 1 and the end of every axis, i64 [1], in the `triton_state` scope.
    fn new(g: &mut GraphBuilder) -> Result<TritonSlot> {
        g.scoped("triton_state", |g| {
            Ok(TritonSlot {
                zero: g.const_i64("zero", &[1], vec![0])?,
                one: g.const_i64("one", &[1], vec![1])?,
                end: g.const_i64("end", &[1], vec![i64::MAX])?,
            })
        })
    }

    /// Declares the graph input `past` as `shape` with one more row in front, and returns
    /// the rows after it (what the model reads, `shape`) and the slot itself [batch, 1,
    /// width] (put back in front of the `present_*` output).
    fn declare(&self, g: &mut GraphBuilder, past: &str, shape: Vec<Dim>) -> Result<(Value, Value)> {
        let mut slotted = shape.clone();
        slotted[1] = Dim::Symbol(format!("1 + {}", shape[1]));
        let input = g.input(past, ElemType::F32, slotted)?;
        let mut slot_shape = shape.clone();
        slot_shape[1] = Dim::Fixed(1);
        let rows = g.slice_dynamic(
            &format!("{past}/triton_drop_slot"),
            &input,
            &self.one,
            &self.end,
            &[1],
            shape,
        )?;
        let slot = g.slice_dynamic(
            &format!("{past}/triton_keep_slot"),
            &input,
            &self.zero,
            &self.one,
            &[1],
            slot_shape,
        )?;
        Ok((rows, slot))
    }
}

fn first_growing_input(cfg: &GmlpConfig, past: &HashMap<String, Value>) -> Option<Value> {
    (0..cfg.layers)
        .flat_map(|i| block_state(cfg, i))
        .find(|s| s.window.is_none())
        .and_then(|s| past.get(&s.past).cloned())
}

/// The shared row positions P..P+T−1 of the new tokens `ids` [batch, sequence] (P the
/// length of `first_past`, the first state that grows, in a growing-state graph; 0
/// otherwise), in the `positions` scope.
fn compute_positions(
    g: &mut GraphBuilder,
    ids: &Value,
    seq: &Dim,
    first_past: Option<&Value>,
) -> Result<Positions> {
    g.scoped("positions", |g| {
        let zero = g.const_i64("zero", &[], vec![0])?;
        let one = g.const_i64("one", &[], vec![1])?;
        let ids_len = g.shape_of("sequence_shape", ids, 1, 2)?;
        let new = g.gather("sequence", &ids_len, &zero, 0)?;
        let (start, total_dim) = match first_past {
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
    })
}
