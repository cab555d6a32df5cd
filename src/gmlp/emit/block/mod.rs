//! One gMLP / aMLP block as a composition of parts, one type and file each (paper eq. 1–4,
//! fig. 1; aMLP fig. 6), the one recipe of every graph the emitter writes:
//! ```text
//! h  = LN(x)             BlockNorm           norm.rs       blocks.i/norm          (the stack's)
//! h  = shift(h)          TokenShift          shift.rs      blocks.i/token_shift/  (g-mlp-pytorch)
//! z1 = GELU(h·U1 + bU1)  ChannelProjections  channel.rs    blocks.i/proj_in_z1, blocks.i/gelu_z1
//! z2 = GELU(h·U2 + bU2)  ChannelProjections  channel.rs    blocks.i/proj_in_z2, blocks.i/gelu_z2
//! a  = attn(h)           TinyAttention       attention.rs  blocks.i/attn/...      (aMLP)
//! g  = W·LN(z2) + b      SpatialProjection   spatial.rs    blocks.i/sgu/norm, .../spatial_matmul
//! s  = z1 ⊙ act(g + a)   SpatialGatingUnit   gate.rs       blocks.i/sgu/attn_add, blocks.i/sgu/gate
//! y  = s·V + bV          ChannelProjections  channel.rs    blocks.i/proj_out
//! y  = conv(y)           AxialFold           fold.rs       blocks.i/fold/...      (axial fold)
//! ```
//! Each part's functions take the [`Emitter`] they write into; the block's recipe
//! ([`Emitter::block`]) calls them in this order.
//! The norm is LayerNorm or RMSNorm, the GELU exact or tanh, the gate may have an
//! activation, and a block may mix tokens locally (a window and / or an axial fold:
//! local.rs) — see `BlockOptions`. The block returns its branch y; the residual is the
//! stack's (stack.rs). Each part that depends on the sequence mode takes the
//! [`Sequence`] and matches it once, emitting its own nodes for that mode with the state
//! `block_state` declares for it.
//!
//! Each part also has the emitter's [`Spelling`]: in ONNX Runtime's fused kernels
//! (`--target onnxruntime`; docs/static-state.md, "The onnxruntime step") the same recipe
//! writes fewer nodes (on a GPU every node is at least one kernel launch):
//! ```text
//! h, x  = SkipLayerNormalization(x, y_prev, bias = b_V,prev)  norm.rs   (block 0: LN)
//! z1, z2, q, k, v = Split(h · [U | W_qkv] + [b_U | b_qkv])   channel.rs (one MatMul)
//! a     = Attention(q, K, V, mask) · W_o, b_o                  attention.rs
//! gate  = Sum(W[rows] · LN(z2), b[rows], a, b_o)               spatial.rs, gate.rs
//! y     = (z1 ⊙ act(gate)) · V                                 b_V goes to the next SkipLN
//! ```
//! with the static state written by `TensorScatter` and read as it is (static_state.rs).

mod attention;
mod channel;
mod fold;
mod gate;
mod local;
mod norm;
mod shift;
mod spatial;
mod spatial_int8;

pub(crate) use attention::TinyAttention;
pub(crate) use channel::ChannelProjections;
pub(crate) use fold::AxialFold;
pub(crate) use gate::SpatialGatingUnit;
pub(crate) use local::LocalMixing;
pub(crate) use norm::BlockNorm;
pub(crate) use shift::TokenShift;
pub(crate) use spatial::SpatialProjection;

use super::context::{Emitter, Joins, Spelling};
use super::sequence::Sequence;
use crate::error::Result;
use crate::onnx::graph::Value;

/// A block's branch: y, and in the fused spelling its output projection's bias b_V, left
/// to the next norm (`SkipLayerNormalization` adds x + y + b_V in one kernel).
pub(crate) struct Branch {
    /// `s·V` (with b_V added unless `bias` holds it).
    pub(crate) y: Value,
    /// b_V, f32 [d], not yet added.
    pub(crate) bias: Option<Value>,
}

impl Emitter {
    /// The branch of block `i` on its normalized input `h` over the sequence `seq` (the
    /// stack adds the residual).
    pub(crate) fn block(&mut self, i: usize, h: &Value, seq: &mut Sequence) -> Result<Branch> {
        let p = format!("blocks.{i}");
        let mut h = h.clone();
        if self.cfg.shift_tokens > 0 {
            h = self.scoped("token_shift", |s| TokenShift::emit(s, &h, i, seq))?;
        }
        let projected = ChannelProjections::proj_in(self, &p, &h)?;
        let attn = match self.cfg.attn_dim {
            Some(a) => {
                let qkv = projected.qkv.clone();
                Some(self.scoped("attn", |s| TinyAttention::emit(s, &p, &h, a, qkv, i, seq))?)
            }
            None => None,
        };
        let gated = SpatialGatingUnit::emit(
            self,
            &p,
            i,
            &projected.z1,
            &projected.z2,
            attn.unwrap_or_default(),
            seq,
        )?;
        let branch = ChannelProjections::proj_out(self, &p, &gated)?;
        if self.cfg.block.mixing(i).fold > 1 {
            let y = self.branch_value(branch)?;
            let y = self.scoped("fold", |s| AxialFold::fold_conv(s, &p, i, &y, seq))?;
            return Ok(Branch { y, bias: None });
        }
        Ok(branch)
    }

    /// `y + b_V` of `branch` (y itself where the bias is already added).
    pub(crate) fn branch_value(&mut self, branch: Branch) -> Result<Value> {
        match branch.bias {
            None => Ok(branch.y),
            Some(bias) => self.g.add("proj_out_bias", &branch.y, &bias),
        }
    }

    /// Whether the parts are spelled in ONNX Runtime's fused kernels.
    pub(crate) fn fused(&self) -> bool {
        matches!(self.spelling, Spelling::Fused(_))
    }

    /// Whether the fused parts also join nodes as the static step does ([`Joins::Step`]).
    pub(crate) fn joins_step(&self) -> bool {
        self.spelling == Spelling::Fused(Joins::Step)
    }
}
