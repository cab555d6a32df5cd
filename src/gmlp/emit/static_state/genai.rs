//! onnxruntime-genai's interface to a static state ([`Interface::Genai`]; docs/genai.md),
//! written as the graph is emitted:
//!
//! - each state tensor is the key or value of its genai layer ([`genai_layers`]), declared
//!   `[batch, 1, n, width]`; its scatter writes the rank-4 tensor, which is the graph
//!   output (genai binds one buffer as past and present, so the state is written in place),
//!   and a `Reshape` (no copy) gives the blocks the `[batch, n, width]` view the file's
//!   graph reads: `ScatterND` at (b, 0, P_b + t), or `TensorScatter` along axis 2 of an
//!   update with a new axis 1;
//! - a spare key or value (a layer without a partner) is an input passed through;
//! - `position` is `position_ids[:, 0]` (genai gives every token its position, a row's
//!   first is its P); `attention_mask` is declared and unread;
//! - with an added end token, the logits get one more entry, −∞, and `input_ids` are read
//!   through `Min(input_ids, vocab − 1)` (genai's pads read the last real embedding row).

use std::collections::HashMap;

use super::{FloatRows, StateScatter, StaticRows, StaticState};
use crate::error::{Error, Result};
use crate::gmlp::config::Task;
use crate::gmlp::emit::context::Emitter;
use crate::gmlp::emit::static_state::StaticStatePart;
use crate::gmlp::genai::{genai_layers, Slot, ATTENTION_MASK, POSITION_IDS};
use crate::gmlp::interface::{StateTensor, SEQUENCE};
use crate::onnx::graph::{Dim, ElemType, Value};

/// Node-name scope of the interface's own nodes.
const SCOPE: &str = "genai";
/// Symbol of `attention_mask`'s second dimension (genai's past plus new tokens).
const TOTAL_SEQUENCE: &str = "total_sequence";

/// What genai's interface adds to a static state: its names and the spares.
pub(super) struct GenaiState {
    /// genai's present name of each file state tensor, by the file's `present_*` name.
    present_names: HashMap<String, String>,
    /// The spare keys and values passed through, (genai's present name, value).
    spares: Vec<(String, Value)>,
    /// `ScatterND` indices (b, 0, P_b + t), i64 [batch, sequence, 3], made on first use.
    scatter_indices: Option<Value>,
}

impl GenaiState {
    /// The spares' outputs, (genai's present name, value).
    pub(super) fn into_spares(self) -> Vec<(String, Value)> {
        self.spares
    }
}

/// onnxruntime-genai's interface of a static state (`Interface::Genai`): its positions, rank-4 state tensors and end token.
pub(crate) struct GenaiInterface;

impl GenaiInterface {
    /// `position` = `position_ids[:, 0]`, i64 [batch], with `position_ids`
    /// [batch, sequence] and the unread `attention_mask` [batch, total_sequence] declared.
    pub(super) fn position(em: &mut Emitter, batch: &Dim) -> Result<Value> {
        let ids = em.g.input(
            POSITION_IDS,
            ElemType::I64,
            vec![batch.clone(), Dim::Symbol(SEQUENCE.into())],
        )?;
        em.g.input(
            ATTENTION_MASK,
            ElemType::I64,
            vec![batch.clone(), Dim::Symbol(TOTAL_SEQUENCE.into())],
        )?;
        em.g.scoped(SCOPE, |g| {
            let first = g.const_i64("first_position", &[], vec![0])?;
            g.gather("position", &ids, &first, 1)
        })
    }

    /// genai's key and value inputs `[batch, 1, n, width]` of every layer: the file's
    /// state tensors by their `past_*` name, and the spares passed through.
    pub(super) fn declare_state(
        em: &mut Emitter,
        batch: &Dim,
    ) -> Result<(HashMap<String, Value>, GenaiState)> {
        let n = em.cfg.seq_len();
        let mut past = HashMap::new();
        let mut state = GenaiState {
            present_names: HashMap::new(),
            spares: Vec::new(),
            scatter_indices: None,
        };
        for layer in genai_layers(&em.cfg) {
            let shape = vec![
                batch.clone(),
                Dim::Fixed(1),
                Dim::Fixed(n),
                Dim::Fixed(layer.width),
            ];
            for (k, (past4, present4, slot)) in layer.tensors().into_iter().enumerate() {
                let input = em.g.input(&past4, ElemType::F32, shape.clone())?;
                match slot {
                    Slot::State {
                        past: name,
                        present,
                    } => {
                        past.insert(name.clone(), input);
                        state.present_names.insert(present.clone(), present4);
                    }
                    Slot::Spare => {
                        let local = format!("spare.{}.{k}", layer.index);
                        let through = em.g.scoped(SCOPE, |g| g.identity(&local, &input))?;
                        state.spares.push((present4, through));
                    }
                }
            }
        }
        Ok((past, state))
    }

    /// `ids` read through `Min(ids, vocab − 1)`: an id at or past the vocabulary (genai's
    /// pad, the added end token) reads the last real embedding row.
    pub(crate) fn ids_in_vocabulary(em: &mut Emitter, ids: &Value) -> Result<Value> {
        let Task::Tokens { vocab_size, .. } = em.cfg.task else {
            return Err(Error::Internal(
                "genai's interface is a token model's".into(),
            ));
        };
        em.g.scoped(SCOPE, |g| {
            let last = g.const_i64("last_id", &[], vec![vocab_size as i64 - 1])?;
            g.min("input_ids_in_vocabulary", ids, &last)
        })
    }

    /// `logits` [batch, sequence, vocab] with one more entry, −∞, the added end token
    /// (computed from the first logit, so that its shape follows the batch and sequence).
    pub(crate) fn end_logit(em: &mut Emitter, logits: &Value) -> Result<Value> {
        em.g.scoped(SCOPE, |g| {
            let first = g.slice("first_logit", logits, 2, 0, 1)?;
            let zero = g.const_f32("zero", &[], vec![0.0])?;
            let minus_inf = g.const_f32("minus_inf", &[], vec![f32::NEG_INFINITY])?;
            let zero_logit = g.mul("zero_logit", &first, &zero)?;
            let never = g.add("end_logit", &zero_logit, &minus_inf)?;
            g.concat("logits", &[logits, &never], 2)
        })
    }

    /// Writes `update` [batch, sequence, width] into the rank-4 state `past4` of `tensor`
    /// at the new rows. Returns genai's present name, the written `[batch, 1, n, width]`
    /// tensor (the graph output) and its `[batch, n, width]` view (what the blocks read).
    pub(super) fn write_state(
        em: &mut Emitter,
        state: &mut StaticState,
        tensor: &StateTensor,
        past4: &Value,
        update: &Value,
        kind: &str,
    ) -> Result<(String, Value, Value)> {
        let StaticState { rows, genai, .. } = state;
        let genai = genai
            .as_mut()
            .ok_or_else(|| Error::Internal("a genai state write without genai's state".into()))?;
        let name = genai
            .present_names
            .get(&tensor.present)
            .cloned()
            .ok_or_else(|| Error::Internal(format!("no genai layer holds {}", tensor.present)))?;
        let width = tensor.width;
        let (batch, seq) = (update.shape[0].clone(), update.shape[1].clone());
        let start = match rows {
            StaticRows::Int(r) => Some(r.start.clone()),
            StaticRows::Float(r)
                if StateScatter::at_opset(em.g.opset()) == StateScatter::TensorScatter =>
            {
                Some(StaticStatePart::static_start(em, r)?)
            }
            StaticRows::Float(_) => None,
        };
        let present4 = match (start, rows) {
            (Some(start), _) => {
                let update4 = em.g.reshape(
                    &format!("{kind}_genai_update"),
                    update,
                    &[0, 1, -1, width as i64],
                    vec![batch.clone(), Dim::Fixed(1), seq, Dim::Fixed(width)],
                )?;
                em.g.tensor_scatter(&format!("{kind}_update"), past4, &update4, &start, 2)?
            }
            (None, StaticRows::Float(r)) => {
                let indices = GenaiInterface::scatter_indices(em, genai, r)?;
                em.g.scatter_nd(&format!("{kind}_update"), past4, &indices, update)?
            }
            (None, StaticRows::Int(_)) => {
                return Err(Error::Internal(
                    "the fused state always writes with TensorScatter".into(),
                ))
            }
        };
        let n = em.cfg.seq_len();
        let view = em.g.reshape(
            &format!("{kind}_genai_view"),
            &present4,
            &[0, n as i64, width as i64],
            vec![batch, Dim::Fixed(n), Dim::Fixed(width)],
        )?;
        Ok((name, present4, view))
    }

    /// `ScatterND` indices (b, 0, P_b + t) into the rank-4 state, i64 [batch, sequence, 3]
    /// (shared by every state).
    fn scatter_indices(em: &mut Emitter, genai: &mut GenaiState, r: &FloatRows) -> Result<Value> {
        if let Some(v) = &genai.scatter_indices {
            return Ok(v.clone());
        }
        let v = em.g.scoped("shared", |g| {
            let b3 = g.reshape(
                "genai_scatter_batch_column",
                &r.batch_index,
                &[0, 0, 1],
                r.rows3.shape.clone(),
            )?;
            let zero = g.const_f32("genai_scatter_head_zero", &[], vec![0.0])?;
            let head = g.mul("genai_scatter_head", &b3, &zero)?;
            let indices = g.concat("genai_scatter_indices_f32", &[&b3, &head, &r.rows3], 2)?;
            g.cast("genai_scatter_indices", &indices, ElemType::I64)
        })?;
        genai.scatter_indices = Some(v.clone());
        Ok(v)
    }
}
