//! g-mlp-pytorch's token shift of the normalized block input (`shift_tokens`, upstream's
//! `shift` helper in g_mlp_pytorch.py): the channels are split into chunks, chunk k moves
//! along the tokens by `amounts[k]` positions with zero fill, and any remaining channels
//! stay (see `GmlpConfig::shift_amounts`). A variable-length graph pads in front and keeps
//! the first T rows; a with-past graph keeps the block's last s normalized inputs as the
//! window state `past_shift.{i}`; a static-state graph keeps all n of them (see
//! [`super::super::static_state`]).

use std::cmp::Ordering;

use super::super::context::Emitter;
use super::super::sequence::{GrowingState, Sequence};
use super::super::static_state::{StaticState, Written};
use crate::error::{Error, Result};
use crate::gmlp::emit::sequence::SequenceAxis;
use crate::gmlp::emit::static_state::StaticStatePart;
use crate::gmlp::interface::{PAST_SHIFT_SEQUENCE, PRESENT_SHIFT_SEQUENCE, SEQUENCE};
use crate::onnx::graph::{Dim, Value};

/// g-mlp-pytorch's token shift (`PreShiftTokens`): chunks of the block's input shifted along the sequence.
pub(crate) struct TokenShift;

impl TokenShift {
    /// The token shift of `h` in block `i`, in the form of the sequence `seq`.
    pub(crate) fn emit(em: &mut Emitter, h: &Value, i: usize, seq: &mut Sequence) -> Result<Value> {
        match seq {
            Sequence::Fixed(_) => TokenShift::fixed(em, h),
            Sequence::Variable(_) => TokenShift::variable(em, h),
            Sequence::Growing(_, state) => TokenShift::with_past(em, state, h, i),
            Sequence::Static(state) => TokenShift::static_rows(em, state, h, i),
        }
    }

    /// With static state (causal shifts a ≥ 0): `past_shift.{i}` [batch, n, d] holds the
    /// block's normalized input of every position; the new rows are written into it, and
    /// chunk k of new row P_b + t reads the state's row P_b + t − a (zero before 0).
    fn static_rows(
        em: &mut Emitter,
        state: &mut StaticState,
        h: &Value,
        i: usize,
    ) -> Result<Value> {
        let all = StaticStatePart::update(em, state, i, "shift", h, Written::Any)?;
        let amounts = em.cfg.shift_amounts();
        let d = em.cfg.d_model;
        let chunk = d / amounts.len();
        let mut parts = Vec::with_capacity(amounts.len() + 1);
        for (k, &a) in amounts.iter().enumerate() {
            let source = match usize::try_from(a) {
                Ok(0) => h.clone(),
                Ok(a) => {
                    StaticStatePart::rows_back(em, state, &format!("shift_{k}_source"), &all, a)?
                }
                Err(_) => {
                    return Err(Error::Internal(
                        "a token shift with state must be causal".into(),
                    ))
                }
            };
            parts.push(em.g.slice(
                &format!("shift_{k}"),
                &source,
                2,
                k * chunk,
                (k + 1) * chunk,
            )?);
        }
        if chunk * amounts.len() < d {
            parts.push(em.g.slice("rest", h, 2, chunk * amounts.len(), d)?);
        }
        let refs: Vec<&Value> = parts.iter().collect();
        em.g.concat("concat", &refs, -1)
    }

    /// Splits `h` into the shift's channel chunks (`Split` on the last axis; a remainder
    /// chunk, if any, stays), passes each with its amount (0 for the remainder) to
    /// `shift_one`, and concatenates the results back along the channels.
    fn chunks(
        em: &mut Emitter,
        h: &Value,
        mut shift_one: impl FnMut(&mut Emitter, usize, &Value, i64) -> Result<Value>,
    ) -> Result<Value> {
        let amounts = em.cfg.shift_amounts();
        let d = em.cfg.d_model;
        let chunk = d / amounts.len();
        let rest = d - chunk * amounts.len();
        let mut sizes = vec![chunk; amounts.len()];
        if rest > 0 {
            sizes.push(rest);
        }
        let parts = em.g.split("split", h, -1, &sizes)?;
        let mut shifted = Vec::with_capacity(parts.len());
        for (k, part) in parts.iter().enumerate() {
            let a = amounts.get(k).copied().unwrap_or(0);
            shifted.push(shift_one(em, k, part, a)?);
        }
        let refs: Vec<&Value> = shifted.iter().collect();
        em.g.concat("concat", &refs, -1)
    }

    /// The whole sequence of n tokens: slice off a rows at one end, pad a zeros at the other.
    fn fixed(em: &mut Emitter, h: &Value) -> Result<Value> {
        let n = em.cfg.seq_len();
        TokenShift::chunks(em, h, |s, k, part, a| match a.cmp(&0) {
            Ordering::Equal => Ok(part.clone()),
            Ordering::Greater => {
                let a = a as usize;
                let kept = s.g.slice(&format!("keep_{k}"), part, 1, 0, n - a)?;
                s.g.pad_axis(&format!("shift_{k}"), &kept, 1, a, 0)
            }
            Ordering::Less => {
                let a = a.unsigned_abs() as usize;
                let kept = s.g.slice(&format!("keep_{k}"), part, 1, a, n)?;
                s.g.pad_axis(&format!("shift_{k}"), &kept, 1, 0, a)
            }
        })
    }

    /// A variable length (causal shifts a ≥ 0 only): pad a zeros in front, keep the first
    /// T positions.
    fn variable(em: &mut Emitter, h: &Value) -> Result<Value> {
        TokenShift::chunks(em, h, |s, k, part, a| {
            let a = match usize::try_from(a) {
                Ok(0) => return Ok(part.clone()),
                Ok(a) => a,
                Err(_) => {
                    return Err(Error::Internal(
                        "a variable-length token shift must be causal".into(),
                    ))
                }
            };
            let padded = s.g.pad_axis_symbolic(
                &format!("shift_{k}_pad"),
                part,
                1,
                (a, 0),
                Dim::Symbol(format!("{SEQUENCE} + {a}")),
            )?;
            let start = s.g.const_i64(&format!("shift_{k}_start"), &[1], vec![0])?;
            let end =
                s.g.const_i64(&format!("shift_{k}_end"), &[1], vec![-(a as i64)])?;
            s.g.slice_dynamic(
                &format!("shift_{k}"),
                &padded,
                &start,
                &end,
                &[1],
                part.shape.clone(),
            )
        })
    }

    /// With state (causal shifts a ≥ 0): `past_shift.{i}` holds the block's last
    /// L = min(P, s) normalized inputs, `full` = past ‖ h has L + T rows, and chunk k of
    /// new row t reads full's row L + t − a, zero before position 0: pad a zeros in front
    /// of the chunk and keep rows L..L+T. `present_shift.{i}` = the last min(L + T, s)
    /// rows of `full`.
    fn with_past(em: &mut Emitter, state: &mut GrowingState, h: &Value, i: usize) -> Result<Value> {
        let past = SequenceAxis::past_input(
            em,
            state,
            &format!("past_shift.{i}"),
            "past_shift_cast",
            h.elem,
        )?;
        let full_rows = format!("{PAST_SHIFT_SEQUENCE} + {SEQUENCE}");
        let full = em.g.concat_symbolic(
            "past_concat",
            &[&past, h],
            1,
            Dim::Symbol(full_rows.clone()),
        )?;
        let kept = em.g.shape_of("past_rows", &past, 1, 2)?;
        let len = em.g.shape_of("all_rows", &full, 1, 2)?;
        let window =
            em.g.const_i64("window", &[1], vec![em.cfg.shift_tokens as i64])?;
        let zero = em.g.const_i64("window_zero", &[1], vec![0])?;
        let over = em.g.sub("window_over", &len, &window)?;
        let start = em.g.max("window_start", &over, &zero)?;
        let mut window_shape = full.shape.clone();
        window_shape[1] = Dim::Symbol(PRESENT_SHIFT_SEQUENCE.into());
        let present =
            em.g.slice_dynamic("window_rows", &full, &start, &len, &[1], window_shape)?;
        SequenceAxis::push_present(
            em,
            state,
            format!("present_shift.{i}"),
            "present_shift_to_f32",
            &present,
        )?;
        let new_rows = h.shape[1].clone();
        TokenShift::chunks(em, &full, |s, k, part, a| {
            let source = match usize::try_from(a) {
                Ok(0) => part.clone(),
                Ok(a) => s.g.pad_axis_symbolic(
                    &format!("shift_{k}_pad"),
                    part,
                    1,
                    (a, 0),
                    Dim::Symbol(format!("{full_rows} + {a}")),
                )?,
                Err(_) => {
                    return Err(Error::Internal(
                        "a token shift with state must be causal".into(),
                    ))
                }
            };
            let mut rows = part.shape.clone();
            rows[1] = new_rows.clone();
            s.g.slice_dynamic(&format!("shift_{k}"), &source, &kept, &len, &[1], rows)
        })
    }
}
