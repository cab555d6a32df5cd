//! One gMLP / aMLP block as a composition of parts, one file each (paper eq. 1–4, fig. 1;
//! aMLP fig. 6):
//! ```text
//! h  = LN(x)                       norm.rs        blocks.i/norm
//! h  = shift(h)                    shift.rs       blocks.i/token_shift/...  (g-mlp-pytorch)
//! z1 = GELU(h·U1 + bU1)            channel.rs     blocks.i/proj_in_z1, blocks.i/gelu_z1
//! z2 = GELU(h·U2 + bU2)            channel.rs     blocks.i/proj_in_z2, blocks.i/gelu_z2
//! a  = attn(h)                     attention.rs   blocks.i/attn/...         (aMLP)
//! g  = W·LN(z2) + b                spatial.rs     blocks.i/sgu/norm, .../spatial_matmul
//! s  = z1 ⊙ (g + a)                gate.rs        blocks.i/sgu/attn_add, blocks.i/sgu/gate
//! y  = s·V + bV                    channel.rs     blocks.i/proj_out
//! y  = conv(y)                     fold.rs        blocks.i/fold/...         (axial fold)
//! ```
//! The norm is LayerNorm or RMSNorm, the GELU exact or tanh, the gate may have an
//! activation, and a block may mix tokens locally (a window and / or an axial fold:
//! local.rs) — see `BlockOptions`. The block returns y; the residual is the stack's
//! ([`super::stack`]). Each part that depends on the sequence mode takes the
//! [`Sequence`] and matches it once, emitting its own nodes for that mode with the state
//! `block_state` declares for it.

mod attention;
mod channel;
mod fold;
mod gate;
mod local;
mod norm;
mod shift;
mod spatial;
mod spatial_int8;

use super::context::Emitter;
use super::sequence::Sequence;
use crate::error::Result;
use crate::onnx::graph::Value;

impl Emitter {
    /// The branch y of block `i` on its input `x` over the sequence `seq` (the residual is
    /// added by the stack).
    pub(crate) fn block(&mut self, i: usize, x: &Value, seq: &mut Sequence) -> Result<Value> {
        let p = format!("blocks.{i}");
        let mut h = self.norm("norm", x, &format!("{p}.norm"), self.cfg.norm_eps)?;
        if self.cfg.shift_tokens > 0 {
            h = self.scoped("token_shift", |s| s.shift_tokens(&h, i, seq))?;
        }
        let (z1, z2) = self.proj_in(&p, &h)?;
        let attn = match self.cfg.attn_dim {
            Some(a) => Some(self.scoped("attn", |s| s.attention(&p, &h, a, i, seq))?),
            None => None,
        };
        let gated = self.spatial_gating(&p, i, &z1, &z2, attn.as_ref(), seq)?;
        let y = self.proj_out(&p, &gated)?;
        if self.cfg.block.mixing(i).fold > 1 {
            return self.scoped("fold", |s| s.fold_conv(&p, i, &y, seq));
        }
        Ok(y)
    }
}
