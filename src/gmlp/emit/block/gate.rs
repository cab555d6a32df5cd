//! The spatial gating unit's gate (paper eq. 3, fig. 1; aMLP fig. 6):
//! `s(z) = z1 ⊙ act(W · LN(z2) + b [+ attn(h)])`, emitted in the `sgu` scope; `act` is
//! g-mlp-pytorch's and g-mlp-gpt's gate activation (`act`, identity by default), applied
//! after the attention is added, as upstream's `self.act(gate) * res`. The gate's terms
//! (the spatial projection and its bias, the attention and its output bias) are added
//! one `Add` at a time, or in the fused spelling, where the parts leave the biases apart,
//! in one `Sum`.

use super::super::context::{Emitter, Joins, Spelling};
use super::super::sequence::Sequence;
use crate::error::Result;
use crate::gmlp::config::GateAct;
use crate::gmlp::emit::block::BlockNorm;
use crate::gmlp::emit::block::SpatialProjection;
use crate::onnx::graph::Value;

/// The spatial gating unit (paper eq. 2–3): `s = z1 ⊙ act(W·LN(z2) + b + a)`.
pub(crate) struct SpatialGatingUnit;

impl SpatialGatingUnit {
    /// `z1 ⊙ act(W · LN(z2) + b [+ attn])` of block `i` (prefix `p`), with `attn` the
    /// attention's terms (none in a gMLP).
    pub(crate) fn emit(
        em: &mut Emitter,
        p: &str,
        i: usize,
        z1: &Value,
        z2: &Value,
        attn: Vec<Value>,
        seq: &mut Sequence,
    ) -> Result<Value> {
        let sgu_eps = em.cfg.sgu_norm_eps;
        em.scoped("sgu", |s| {
            let u = BlockNorm::norm(s, "norm", z2, &format!("{p}.sgu.norm"), sgu_eps)?;
            let mut terms = SpatialProjection::emit(s, &u, p, i, seq)?;
            terms.extend(attn);
            let gate = SpatialGatingUnit::sum(s, &terms)?;
            let gate = SpatialGatingUnit::activation(s, &gate)?;
            s.g.mul("gate", z1, &gate)
        })
    }

    /// The sum of the gate's terms: the spatial projection plus the attention (`attn_add`),
    /// or in the fused static step every term and bias in one node (`gate_sum`).
    fn sum(em: &mut Emitter, terms: &[Value]) -> Result<Value> {
        let step = em.spelling == Spelling::Fused(Joins::Step);
        match (step, terms) {
            (_, [only]) => Ok(only.clone()),
            (false, [gate, attn]) => em.g.add("attn_add", gate, attn),
            (true, [a, b]) => em.g.add("gate_sum", a, b),
            _ => {
                let refs: Vec<&Value> = terms.iter().collect();
                em.g.sum("gate_sum", &refs)
            }
        }
    }

    /// The gate activation (none for the paper's block).
    pub(crate) fn activation(em: &mut Emitter, gate: &Value) -> Result<Value> {
        let local = "gate_act";
        match em.cfg.block.gate_act {
            GateAct::Identity => Ok(gate.clone()),
            GateAct::Tanh => em.g.tanh(local, gate),
            GateAct::Sigmoid => em.g.sigmoid(local, gate),
            GateAct::Relu => em.g.relu(local, gate),
            GateAct::Gelu => em.g.gelu(local, gate),
            GateAct::Silu => em.g.silu(local, gate),
        }
    }
}
