//! Fixed-size state written in place (`--with-past static`; docs/static-state.md). Every
//! state tensor is `past_*` [batch, n, width] in and `present_*` [batch, n, width] out,
//! and a `position` input [batch] gives each sequence's P. The T new tokens of sequence b
//! sit at rows P_b..P_b+T−1; a run writes only those rows into each state (`ScatterND` at
//! indices (b, P_b + t), or opset 24's `TensorScatter` at write index P_b) and then reads
//! the whole state: the spatial projection's row of W at P_b + t (a `Gather`, constant
//! shapes, no `Slice` or `Concat`) is zero past the diagonal, and the attention is masked
//! by position, so rows after a sequence's last token never count. What the buffer holds
//! in those rows never reaches an output either: the spatial projection and the attention
//! read the state through a `Gather` of rows that reads each row s ≤ P_b + T − 1 (written
//! by this run or an earlier one) as it is and every row after it as row P_b + T − 1 (a
//! NaN left there, times a weight of 0, would still be NaN). The rows are checked once:
//! a position outside 0..n fails at a `Gather` instead of reading or writing out of
//! bounds.
//!
//! That is the standard spelling's state ([`FloatRows`]: f32 index arithmetic, which every
//! consumer runs on its fastest device). The fused spelling's (int_rows.rs) computes the
//! rows in i64 and reads the state as it is, for a file that declares its state must start
//! zeroed. `--target tract`'s, which declares the same, reads each state as it is at the
//! rows its sequences have reached only ([`FloatRead::Prefix`]).

mod genai;
mod int_rows;

pub(crate) use genai::GenaiInterface;

use std::collections::HashMap;

use super::context::{Emitter, Spelling};
use super::MASK_VALUE;
use crate::error::{Error, Result};
use crate::gmlp::interface::{
    first_local_block, mode_state, static_local_mixing_refused, Interface, SequenceMode,
    StateStart, POSITION, SEQUENCE,
};
use crate::onnx::graph::{Dim, ElemType, Value};
use crate::onnx::ops::TENSOR_SCATTER_OPSET;
use genai::GenaiState;
use int_rows::IntRows;

/// The operator that writes a run's new rows into a static state: opset 24's
/// `TensorScatter` from [`TENSOR_SCATTER_OPSET`] on (`--target onnxruntime`), `ScatterND` below
/// (which tract also reads). The emitter's one choice, which the build's summary asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateScatter {
    /// `ScatterND` at indices (b, P_b + t).
    ScatterNd,
    /// `TensorScatter` at write index P_b.
    TensorScatter,
}

impl StateScatter {
    /// The scatter the emitter writes at `opset`.
    pub fn at_opset(opset: i64) -> StateScatter {
        if opset >= TENSOR_SCATTER_OPSET {
            StateScatter::TensorScatter
        } else {
            StateScatter::ScatterNd
        }
    }

    /// The operator's ONNX name.
    pub fn op_type(self) -> &'static str {
        match self {
            StateScatter::ScatterNd => "ScatterND",
            StateScatter::TensorScatter => "TensorScatter",
        }
    }
}

/// The inputs of a static-state graph, declared before the embedding.
pub(crate) struct StaticInputs {
    /// Each sequence's position P, i64 [batch]: the `position` input, or its
    /// [batch, 1] column for Triton flattened.
    pub(crate) position: Value,
    /// Whether `position` is Triton's state, advanced by the graph ([`Interface::Triton`]).
    pub(crate) counted_by_triton: bool,
    /// The `past_*` inputs [batch, n, width], by name (genai's `[batch, 1, n, width]`
    /// key or value for [`Interface::Genai`]).
    pub(crate) past: HashMap<String, Value>,
    /// genai's names and spares ([`Interface::Genai`]).
    genai: Option<GenaiState>,
}

/// The static state of a graph (the `Static` variant of sequence.rs's `Sequence`): the checked rows of
/// the new tokens, the `past_*` inputs and the `present_*` outputs made so far. Made only
/// for a model whose every block mixes tokens globally ([`StaticStatePart::start`]).
pub(crate) struct StaticState {
    /// Each sequence's position P, i64 [batch].
    position: Value,
    /// `position` + the request's token count, i64 [batch, 1], for Triton
    /// ([`Interface::Triton`]).
    triton_next_position: Option<Value>,
    /// The rows of the new tokens and the index tensors derived from them.
    rows: StaticRows,
    past: HashMap<String, Value>,
    present: Vec<(String, Value)>,
    /// genai's names and spares ([`Interface::Genai`]).
    genai: Option<GenaiState>,
}

/// The rows of a static state in the emitter's spelling (one per graph, inside the boxed
/// `Sequence::Static`, so the variants' sizes do not matter).
#[allow(clippy::large_enum_variant)]
enum StaticRows {
    /// Standard: f32 arithmetic, the state read through a guard.
    Float(FloatRows),
    /// Fused: i64 arithmetic, the state read as it is (it starts zeroed).
    Int(IntRows),
}

impl StaticState {
    /// The `present_*` outputs in the order they were made (for [`Interface::Genai`],
    /// genai's, the spares after them).
    pub(crate) fn into_present(self) -> Vec<(String, Value)> {
        let mut present = self.present;
        present.extend(self.genai.map(GenaiState::into_spares).unwrap_or_default());
        present
    }

    /// Each sequence's position P, i64 [batch].
    pub(crate) fn position(&self) -> &Value {
        &self.position
    }

    /// `position` + the request's token count, i64 [batch, 1] ([`Interface::Triton`]).
    pub(crate) fn triton_next_position(&self) -> Option<&Value> {
        self.triton_next_position.as_ref()
    }

    /// The checked positions P_b + t of the new tokens, i64 [batch, sequence].
    pub(crate) fn rows(&self) -> &Value {
        match &self.rows {
            StaticRows::Float(r) => &r.rows,
            StaticRows::Int(r) => &r.rows,
        }
    }

    /// Block `i`'s spatial bias at the new rows, f32 [batch, sequence, 1], where the
    /// biases of all blocks were read together (int_rows.rs); `None` otherwise.
    pub(crate) fn stacked_spatial_bias(&self, i: usize) -> Option<Value> {
        match &self.rows {
            StaticRows::Float(_) => None,
            StaticRows::Int(r) => r.spatial_biases.as_ref()?.get(i).cloned(),
        }
    }
}

/// The per-sequence positions of a static-state graph, computed once and shared by the
/// blocks (the derived index tensors are made on first use). The arithmetic is in f32
/// (exact for integers below 2^24, far above any n): ONNX Runtime Web's WebGPU execution
/// provider has no i64 arithmetic kernels (without its `enableInt64` option) and would run
/// an i64 chain on its CPU provider, while it runs these f32 nodes and the `Cast`s to i64
/// that make the indices. Only the two `Cast`s reading the i64 inputs (`position`,
/// `input_ids`) stay on its CPU.
pub(crate) struct FloatRows {
    /// The checked positions P_b + t of the new tokens, i64 [batch, sequence]: a run
    /// whose rows leave 0..n fails at the `Gather`s that check them.
    pub(crate) rows: Value,
    /// The same in f32 [batch, sequence].
    rows_f: Value,
    /// The same in f32 [batch, sequence, 1].
    rows3: Value,
    /// Each sequence's checked P (the first row), i64 [batch] (`TensorScatter`'s write
    /// index), made on first use.
    start: Option<Value>,
    /// The positions 0..n−1, f32 [n] (the state's rows).
    table: Value,
    /// The index b of each new token's sequence, f32 [batch, sequence].
    batch_index: Value,
    /// `ScatterND` indices (b, P_b + t), i64 [batch, sequence, 2].
    scatter_indices: Option<Value>,
    /// The additive causal mask over the state's rows, f32 [batch, sequence, n] (n: the
    /// rows read, [`FloatRead`]).
    mask: Option<Value>,
    /// Toeplitz index rows `s − (P_b + t) + n − 1`, i64 [batch, sequence, n] (n: the rows
    /// read, [`FloatRead`]).
    toeplitz_index: Option<Value>,
    /// How a reader that weighs every row reads each state.
    read: FloatRead,
}

/// How the standard spelling reads a static state for a reader that weighs every row (the
/// spatial projection, the attention), by what the file says its buffers start as.
enum FloatRead {
    /// [`StateStart::Any`]: all n rows, every row after each sequence's last written one
    /// read as that row (one `Gather` of n rows, [`StaticStatePart::read_index`]), made on
    /// first use.
    Guarded(Option<Value>),
    /// [`StateStart::Zeroed`] (`--target tract`): rows 0..max_b(P_b + T) − 1 of each state
    /// as they are (a `Gather`; the rows after, which no sequence has reached, never count),
    /// and the mask and the spatial weights over those rows only. A step then reads and
    /// multiplies the rows its sequences have reached, not all n: tract packs every
    /// non-constant operand of a product on every run, and the spatial state was the largest
    /// (BENCHMARKS.md, "tract and ONNX Runtime: tract at its own limit"). Made on first use.
    Prefix(Option<ReadPrefix>),
}

/// The rows 0..max_b(P_b + T) − 1 a [`FloatRead::Prefix`] reads.
#[derive(Clone)]
struct ReadPrefix {
    /// The positions 0..max_b(P_b + T) − 1, f32 [`READ_ROWS`] (a `Range`, in f32 as all
    /// the standard spelling's position arithmetic), for the mask and the Toeplitz index.
    table: Value,
    /// The same in i64: the index every state and weight row is gathered at, so that all
    /// have the one size, the one `Range`'s (tract gives each `Slice` with computed ends a
    /// size of its own, and 0.23's loses track of it: a `Slice` of the table 0..n−1 read
    /// its length as the batch's).
    index: Value,
}

/// The symbolic number of state rows a `--target tract` run reads, max_b(P_b + T). Its
/// `unk__` prefix is ONNX shape inference's for a size no input names: tract reads a
/// `value_info` size as a fact, and any other name would contradict the size its `Range`
/// of a computed length makes for itself (tract-hir 0.23 `Range::wire`).
const READ_ROWS: &str = "unk__read_rows";

/// The static state's graph parts: its inputs, the rows each sequence writes, the scatter that writes them and the reads of the blocks.
pub(crate) struct StaticStatePart;

impl StaticStatePart {
    /// The `position` input [batch] (for Triton [batch, 1], the shape of a Triton state
    /// of dims `[ 1 ]`, flattened for the model) and the `past_*` inputs [batch, n, width].
    pub(crate) fn declare_inputs(em: &mut Emitter, batch: &Dim) -> Result<StaticInputs> {
        let (position, counted_by_triton) = match em.interface {
            Interface::Triton => {
                let column =
                    em.g.input(POSITION, ElemType::I64, vec![batch.clone(), Dim::Fixed(1)])?;
                let flat = em.g.scoped("triton_position", |g| {
                    g.reshape("flatten", &column, &[-1], vec![batch.clone()])
                })?;
                (flat, true)
            }
            Interface::Genai { .. } => (GenaiInterface::position(em, batch)?, false),
            Interface::File | Interface::BoundStep => (
                em.g.input(POSITION, ElemType::I64, vec![batch.clone()])?,
                false,
            ),
        };
        if let Interface::Genai { .. } = em.interface {
            let (past, genai) = GenaiInterface::declare_state(em, batch)?;
            return Ok(StaticInputs {
                position,
                counted_by_triton,
                past,
                genai: Some(genai),
            });
        }
        let n = em.cfg.seq_len();
        let mut past = HashMap::new();
        for state in mode_state(&em.cfg, SequenceMode::Static) {
            let shape = vec![batch.clone(), Dim::Fixed(n), Dim::Fixed(state.width)];
            let v = em.g.input(&state.past, ElemType::F32, shape)?;
            past.insert(state.past.clone(), v);
        }
        Ok(StaticInputs {
            position,
            counted_by_triton,
            past,
            genai: None,
        })
    }

    /// The checked rows P_b + t of the new tokens `ids` [batch, sequence], in the
    /// `positions` scope: each row is looked up in the table 0..n−1 at the row and at the
    /// row − n, so that a row ≥ n (the first lookup) or < 0 (the second: below −n) fails
    /// where ONNX's `Gather` would otherwise wrap a negative index. Refuses a model with
    /// local token mixing (a window's rows do not fit the fixed state).
    pub(crate) fn start(
        em: &mut Emitter,
        inputs: StaticInputs,
        ids: &Value,
    ) -> Result<StaticState> {
        if let Some(i) = first_local_block(&em.cfg) {
            return Err(static_local_mixing_refused(i));
        }
        let rows = match em.spelling {
            Spelling::Standard => {
                StaticRows::Float(StaticStatePart::float_rows(em, &inputs.position, ids)?)
            }
            Spelling::Fused(_) => {
                StaticRows::Int(StaticStatePart::int_rows(em, &inputs.position, ids)?)
            }
        };
        let mut state = StaticState {
            position: inputs.position,
            triton_next_position: None,
            rows,
            past: inputs.past,
            present: Vec::new(),
            genai: inputs.genai,
        };
        if inputs.counted_by_triton {
            state.triton_next_position =
                Some(StaticStatePart::triton_next_position(em, state.rows())?);
        }
        Ok(state)
    }

    /// `position` + the request's token count, i64 [batch, 1], for Triton: the last new
    /// row P_b + T − 1 plus one (from the rows, not from `Shape`, whose values tract keeps
    /// symbolic).
    fn triton_next_position(em: &mut Emitter, rows: &Value) -> Result<Value> {
        let batch = rows.shape[0].clone();
        em.g.scoped("triton_position", |g| {
            let minus_one = g.const_i64("last", &[1], vec![-1])?;
            let end = g.const_i64("end", &[1], vec![i64::MAX])?;
            let one = g.const_i64("one", &[1], vec![1])?;
            let last = g.slice_dynamic(
                "last_row",
                rows,
                &minus_one,
                &end,
                &[1],
                vec![batch, Dim::Fixed(1)],
            )?;
            g.add("advance", &last, &one)
        })
    }

    /// The standard spelling's rows (f32 arithmetic; see [`FloatRows`]).
    fn float_rows(em: &mut Emitter, position: &Value, ids: &Value) -> Result<FloatRows> {
        let n = em.cfg.seq_len();
        let batch = ids.shape[0].clone();
        let seq = Dim::Symbol(SEQUENCE.into());
        let read = match em.state_start {
            StateStart::Any => FloatRead::Guarded(None),
            StateStart::Zeroed => FloatRead::Prefix(None),
        };
        em.g.scoped("positions", |g| {
            let zero = g.const_f32("zero", &[], vec![0.0])?;
            let one = g.const_f32("one", &[], vec![1.0])?;
            let axis0 = g.const_i64("axis_batch", &[], vec![0])?;
            let axis1 = g.const_i64("axis_tokens", &[], vec![1])?;
            // A 1 for every new token, f32 [batch, sequence], from the ids' values: the
            // indices below are running sums of it, so no node reads a shape and every
            // node can run on a GPU (a step can be captured as a CUDA graph).
            let ids_f = g.cast("token_ids_f32", ids, ElemType::F32)?;
            let ids_zero = g.mul("token_zero", &ids_f, &zero)?;
            let ones = g.add("token_one", &ids_zero, &one)?;
            let offsets = g.cum_sum("offsets", &ones, &axis1, true)?;
            let position_f = g.cast("position_f32", position, ElemType::F32)?;
            let start_col = g.reshape(
                "position_column",
                &position_f,
                &[-1, 1],
                vec![batch.clone(), 1.into()],
            )?;
            let raw = g.add("rows_unchecked", &start_col, &offsets)?;
            let table = g.const_f32("table", &[n], (0..n).map(|s| s as f32).collect())?;
            let n_c = g.const_f32("n", &[], vec![n as f32])?;
            let below = g.sub("rows_minus_n", &raw, &n_c)?;
            let raw_i = g.cast("rows_unchecked_index", &raw, ElemType::I64)?;
            let below_i = g.cast("rows_minus_n_index", &below, ElemType::I64)?;
            let upper = g.gather("check_below_n", &table, &raw_i, 0)?;
            let lower = g.gather("check_not_negative", &table, &below_i, 0)?;
            let rows_f = g.max("rows_f32", &upper, &lower)?;
            let rows = g.cast("rows", &rows_f, ElemType::I64)?;
            let rows3 = g.reshape(
                "rows_column",
                &rows_f,
                &[0, 0, 1],
                vec![batch.clone(), seq.clone(), 1.into()],
            )?;
            let batch_index = g.cum_sum("batch_index", &ones, &axis0, true)?;
            Ok(FloatRows {
                rows,
                rows_f,
                rows3,
                start: None,
                table,
                batch_index,
                scatter_indices: None,
                mask: None,
                toeplitz_index: None,
                read,
            })
        })
    }

    /// Each sequence's checked P, i64 [batch] (`TensorScatter`'s write indices), shared.
    fn static_start(em: &mut Emitter, r: &mut FloatRows) -> Result<Value> {
        if let Some(v) = &r.start {
            return Ok(v.clone());
        }
        let v = em.g.scoped("shared", |g| {
            let first = g.const_i64("start_token", &[], vec![0])?;
            let start = g.gather("start_f32", &r.rows_f, &first, 1)?;
            g.cast("start", &start, ElemType::I64)
        })?;
        r.start = Some(v.clone());
        Ok(v)
    }

    /// The `ScatterND` indices (b, P_b + t), i64 [batch, sequence, 2], shared.
    fn scatter_indices(em: &mut Emitter, r: &mut FloatRows) -> Result<Value> {
        if let Some(v) = &r.scatter_indices {
            return Ok(v.clone());
        }
        let v = em.g.scoped("shared", |g| {
            let b3 = g.reshape(
                "scatter_batch_column",
                &r.batch_index,
                &[0, 0, 1],
                r.rows3.shape.clone(),
            )?;
            let indices = g.concat("scatter_indices_f32", &[&b3, &r.rows3], 2)?;
            g.cast("scatter_indices", &indices, ElemType::I64)
        })?;
        r.scatter_indices = Some(v.clone());
        Ok(v)
    }

    /// The rows the computation reads of each state, i64 [batch, n] into the state seen as
    /// [batch·n, width]: b·n + min(s, P_b + T − 1), i.e. row s itself where this run or an
    /// earlier one wrote it, and the sequence's last written row after that (shared).
    fn read_index(em: &mut Emitter, r: &mut FloatRows) -> Result<Value> {
        if let FloatRead::Guarded(Some(v)) = &r.read {
            return Ok(v.clone());
        }
        let n = em.cfg.seq_len();
        let v = em.g.scoped("shared", |g| {
            let last = g.reduce_max_keeping("last_row", &r.rows_f, &[1], true)?;
            let n_c = g.const_f32("read_n", &[], vec![n as f32])?;
            let base = g.mul("read_sequence_start", &r.batch_index, &n_c)?;
            let base = g.reduce_max_keeping("read_sequence_base", &base, &[1], true)?;
            let rows = g.min("read_rows", &r.table, &last)?;
            let index = g.add("read_index_f32", &base, &rows)?;
            g.cast("read_index", &index, ElemType::I64)
        })?;
        r.read = FloatRead::Guarded(Some(v.clone()));
        Ok(v)
    }

    /// The rows a [`FloatRead::Prefix`] reads (shared): 0..max_b(P_b + T) − 1, from the
    /// checked rows.
    fn read_prefix(em: &mut Emitter, r: &mut FloatRows) -> Result<ReadPrefix> {
        if let FloatRead::Prefix(Some(p)) = &r.read {
            return Ok(p.clone());
        }
        let prefix = em.g.scoped("shared", |g| {
            let last = g.reduce_max_keeping("read_last_row", &r.rows_f, &[0, 1], false)?;
            let one = g.const_f32("read_one", &[], vec![1.0])?;
            let end = g.add("read_end", &last, &one)?;
            let start = g.const_f32("read_start", &[], vec![0.0])?;
            let rows = Dim::Symbol(READ_ROWS.into());
            let table = g.range("read_table", &start, &end, &one, rows)?;
            let index = g.cast("read_index", &table, ElemType::I64)?;
            Ok(ReadPrefix { table, index })
        })?;
        r.read = FloatRead::Prefix(Some(prefix.clone()));
        Ok(prefix)
    }

    /// The positions of the rows a reader that weighs every row reads, f32 [n] or
    /// [`READ_ROWS`].
    fn read_table(em: &mut Emitter, r: &mut FloatRows) -> Result<Value> {
        match r.read {
            FloatRead::Guarded(_) => Ok(r.table.clone()),
            FloatRead::Prefix(_) => Ok(StaticStatePart::read_prefix(em, r)?.table),
        }
    }

    /// `v`'s rows 0..max_b(P_b + T) − 1 on `axis` ([`FloatRead::Prefix`]).
    fn gather_prefix(
        em: &mut Emitter,
        r: &mut FloatRows,
        local: &str,
        v: &Value,
        axis: usize,
    ) -> Result<Value> {
        let prefix = StaticStatePart::read_prefix(em, r)?;
        em.g.gather(local, v, &prefix.index, axis)
    }

    /// The spatial weight's rows `w` [.., n] at the new rows, gathered at the rows the
    /// state is read at ([`FloatRead::Prefix`]); as they are otherwise.
    pub(crate) fn read_columns(
        em: &mut Emitter,
        state: &mut StaticState,
        w: Value,
    ) -> Result<Value> {
        match &mut state.rows {
            StaticRows::Float(r) if matches!(r.read, FloatRead::Prefix(_)) => {
                let axis = w.shape.len() - 1;
                StaticStatePart::gather_prefix(em, r, "spatial_weight_read", &w, axis)
            }
            _ => Ok(w),
        }
    }

    /// `present` [batch, n, width] with every row after each sequence's last written one
    /// read as that row ([`StaticStatePart::read_index`]; one `Gather` of n rows).
    fn read_rows(
        em: &mut Emitter,
        rows: &mut FloatRows,
        kind: &str,
        present: &Value,
    ) -> Result<Value> {
        let index = StaticStatePart::read_index(em, rows)?;
        let width = present.shape[2].clone();
        let flat = em.g.reshape(
            &format!("{kind}_flat_state"),
            present,
            &[-1, width_i64(&width)?],
            vec![Dim::Symbol("batch * n".into()), width],
        )?;
        em.g.gather(&format!("{kind}_written_rows"), &flat, &index, 0)
    }

    /// Writes `new` [batch, sequence, width] into the state of `kind` of block `i` at the
    /// new rows; the result is the `present_*` output. Returned (cast to `new`'s type) for
    /// the computation, which reads all n rows: with `Written::Only`, every row after the
    /// sequence's last written one reads as that last row (a `Gather` of rows), whatever
    /// the buffer holds there, so what it holds never reaches an output (those rows count
    /// with a weight of 0, and 0 times a NaN left there would still be NaN); with
    /// `Written::Any` as it is (a reader that picks written rows only). A state whose
    /// buffers start zeroed ([`StateStart::Zeroed`]) is read as it is either way: all n
    /// rows in the fused spelling, the rows its sequences reached for `--target tract`
    /// ([`FloatRead::Prefix`]).
    pub(crate) fn update(
        em: &mut Emitter,
        state: &mut StaticState,
        i: usize,
        kind: &str,
        new: &Value,
        read: Written,
    ) -> Result<Value> {
        let (tensor, past) = static_state_input(&em.cfg, &state.past, i, kind)?;
        let update = em.cast_to(&format!("{kind}_update_to_f32"), new, ElemType::F32)?;
        if state.genai.is_some() {
            let (name, present4, view) =
                GenaiInterface::write_state(em, state, &tensor, &past, &update, kind)?;
            state.present.push((name, present4));
            return StaticStatePart::read(em, state, kind, view, read, new.elem);
        }
        let local = format!("{kind}_update");
        let present = match (&mut state.rows, StateScatter::at_opset(em.g.opset())) {
            (StaticRows::Int(r), _) => em.g.tensor_scatter(&local, &past, &update, &r.start, 1)?,
            (StaticRows::Float(r), StateScatter::TensorScatter) => {
                let start = StaticStatePart::static_start(em, r)?;
                em.g.tensor_scatter(&local, &past, &update, &start, 1)?
            }
            (StaticRows::Float(r), StateScatter::ScatterNd) => {
                let indices = StaticStatePart::scatter_indices(em, r)?;
                em.g.scatter_nd(&local, &past, &indices, &update)?
            }
        };
        state
            .present
            .push((tensor.present.clone(), present.clone()));
        StaticStatePart::read(em, state, kind, present, read, new.elem)
    }

    /// What the computation reads of the written state `present` [batch, n, width] (see
    /// [`StaticStatePart::update`]), cast to `elem`.
    fn read(
        em: &mut Emitter,
        state: &mut StaticState,
        kind: &str,
        present: Value,
        read: Written,
        elem: ElemType,
    ) -> Result<Value> {
        let read_value = match (&mut state.rows, read) {
            (StaticRows::Float(r), Written::Only) => match r.read {
                FloatRead::Guarded(_) => StaticStatePart::read_rows(em, r, kind, &present)?,
                FloatRead::Prefix(_) => {
                    let local = format!("{kind}_read_rows");
                    StaticStatePart::gather_prefix(em, r, &local, &present, 1)?
                }
            },
            (StaticRows::Float(_), Written::Any) | (StaticRows::Int(_), _) => present,
        };
        em.cast_to(&format!("{kind}_state_cast"), &read_value, elem)
    }

    /// The additive causal mask over the state's rows, f32 [batch, sequence, n]: 0 for rows
    /// s ≤ P_b + t, [`MASK_VALUE`] after (shared by the blocks); the fused spelling's is
    /// `Attention`'s [batch, 1, sequence, n].
    pub(crate) fn mask(em: &mut Emitter, state: &mut StaticState) -> Result<Value> {
        let r = match &mut state.rows {
            StaticRows::Float(r) => r,
            StaticRows::Int(r) => return StaticStatePart::int_mask(em, r),
        };
        if let Some(v) = &r.mask {
            return Ok(v.clone());
        }
        let table = StaticStatePart::read_table(em, r)?;
        let v = em.g.scoped("shared", |g| {
            let zero = g.const_f32("mask_zero", &[], vec![0.0])?;
            let one = g.const_f32("mask_one", &[], vec![1.0])?;
            // 1 where s > P_b + t: min(max(s − row, 0), 1).
            let after = g.sub("mask_after", &table, &r.rows3)?;
            let after = g.max("mask_after_floor", &after, &zero)?;
            let after = g.min("mask_after_clamped", &after, &one)?;
            let fill = g.const_f32("mask_value", &[], vec![MASK_VALUE])?;
            g.mul("static_causal_mask", &after, &fill)
        })?;
        r.mask = Some(v.clone());
        Ok(v)
    }

    /// The Toeplitz gather form's index rows `s − (P_b + t) + n − 1`, i64
    /// [batch, sequence, n], always within 0..2n−1 (shared by the blocks).
    pub(crate) fn toeplitz_index(em: &mut Emitter, state: &mut StaticState) -> Result<Value> {
        let r = match &mut state.rows {
            StaticRows::Float(r) => r,
            StaticRows::Int(r) => return StaticStatePart::int_toeplitz_index(em, r),
        };
        if let Some(v) = &r.toeplitz_index {
            return Ok(v.clone());
        }
        let n = em.cfg.seq_len();
        let table = StaticStatePart::read_table(em, r)?;
        let v = em.g.scoped("shared", |g| {
            let offset = g.sub("toeplitz_offset", &table, &r.rows3)?;
            let diagonal = g.const_f32("toeplitz_diagonal", &[], vec![n as f32 - 1.0])?;
            let index = g.add("toeplitz_index_f32", &offset, &diagonal)?;
            g.cast("toeplitz_index", &index, ElemType::I64)
        })?;
        r.toeplitz_index = Some(v.clone());
        Ok(v)
    }

    /// Rows P_b + t − `back` of `all` [batch, n, width] (the whole state of each sequence),
    /// zero where that row is before 0: [batch, sequence, width]. One `Gather` on the
    /// state seen as [batch·n, width] at b·n + max(row − back, 0), a row this run or an
    /// earlier one wrote.
    pub(crate) fn rows_back(
        em: &mut Emitter,
        state: &StaticState,
        local: &str,
        all: &Value,
        back: usize,
    ) -> Result<Value> {
        let n = em.cfg.seq_len();
        let StaticRows::Float(r) = &state.rows else {
            return Err(Error::Internal(format!(
                "{local}: the token shift reads a static state in the standard spelling"
            )));
        };
        let (rows, rows3, batch_index) = (&r.rows_f, &r.rows3, &r.batch_index);
        let width = all.shape[2].clone();
        let g = &mut em.g;
        let back_c = g.const_f32(&format!("{local}_back"), &[], vec![back as f32])?;
        let zero = g.const_f32(&format!("{local}_zero"), &[], vec![0.0])?;
        let one = g.const_f32(&format!("{local}_one"), &[], vec![1.0])?;
        let n_c = g.const_f32(&format!("{local}_n"), &[], vec![n as f32])?;
        let source = g.sub(&format!("{local}_source"), rows, &back_c)?;
        let clamped = g.max(&format!("{local}_source_floor"), &source, &zero)?;
        let base = g.mul(&format!("{local}_sequence_start"), batch_index, &n_c)?;
        let flat_index = g.add(&format!("{local}_flat_index_f32"), &base, &clamped)?;
        let flat_index = g.cast(&format!("{local}_flat_index"), &flat_index, ElemType::I64)?;
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
        let valid = if all.elem == ElemType::F32 {
            valid
        } else {
            g.cast(&format!("{local}_valid_float"), &valid, all.elem)?
        };
        g.mul(local, &picked, &valid)
    }
}

/// What the computation reads of a static state ([`StaticStatePart::update`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Written {
    /// The written rows, each row after them read as the last written one (whatever the
    /// buffer holds there): for a reader that multiplies every row with a weight, 0 past
    /// the diagonal (the spatial projection, the attention's masked scores and values).
    Only,
    /// The state as it is: for a reader that picks written rows only (the token shift).
    Any,
}

/// Block `i`'s static state tensor of `kind` and its `past_*` input among `past`.
pub(crate) fn static_state_input(
    cfg: &crate::gmlp::config::GmlpConfig,
    past: &HashMap<String, Value>,
    i: usize,
    kind: &str,
) -> Result<(crate::gmlp::interface::StateTensor, Value)> {
    let tensor = mode_state(cfg, SequenceMode::Static)
        .into_iter()
        .find(|s| s.block == i && s.kind() == kind)
        .ok_or_else(|| Error::Internal(format!("block {i} has no {kind} state")))?;
    let input = past
        .get(&tensor.past)
        .cloned()
        .ok_or_else(|| Error::Internal(format!("no graph input {}", tensor.past)))?;
    Ok((tensor, input))
}

fn width_i64(width: &Dim) -> Result<i64> {
    match width {
        Dim::Fixed(w) => Ok(*w as i64),
        Dim::Symbol(s) => Err(Error::Internal(format!("state width {s} is not fixed"))),
    }
}
