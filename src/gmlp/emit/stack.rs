//! The stack of blocks, in the node scopes `blocks.{i}`: sequential, `x ← x + f_i(x)`
//! (paper eq. 1, fig. 1), or reversible (g-mlp-gpt 0.0.15 `ReversibleSequence`, evaluated
//! forward as upstream's inference does): x1 = x2 = x, then per block
//! `y1 = x1 + f_i(x2)`, `y2 = x2 + g_i(y1)` with g_i the GEGLU feed-forward, and the
//! output y1 + y2. Each block reads its input normalized (`h = LN(x)`, block/norm.rs); in the
//! fused spelling the residual of a sequential stack is added by the next block's norm
//! (`SkipLayerNormalization` of x + y + b_V), and by the final norm after the last block.

use super::block::Branch;
use super::context::Emitter;
use super::sequence::Sequence;
use crate::error::Result;
use crate::gmlp::config::StackKind;
use crate::gmlp::emit::block::BlockNorm;
use crate::gmlp::emit::block::ChannelProjections;
use crate::onnx::graph::Value;

/// What the stack hands the head: the residual stream x, and the last block's branch
/// where the fused spelling left its residual to the final norm.
pub(crate) struct Stacked {
    /// The residual stream (without the pending branch).
    pub(crate) x: Value,
    /// The last block's branch, not yet added to `x`.
    pub(crate) pending: Option<Branch>,
}

impl Emitter {
    /// Every block in order on the embedded input `x`, over the sequence `seq`.
    pub(crate) fn stack(&mut self, x: Value, seq: &mut Sequence) -> Result<Stacked> {
        match self.cfg.block.stack {
            StackKind::Sequential => self.sequential(x, seq),
            StackKind::Reversible { ff_inner } => {
                let x = self.reversible(x, ff_inner, seq)?;
                Ok(Stacked { x, pending: None })
            }
        }
    }

    fn sequential(&mut self, mut x: Value, seq: &mut Sequence) -> Result<Stacked> {
        let mut pending = None;
        for i in 0..self.cfg.layers {
            let p = format!("blocks.{i}");
            (x, pending) = self.scoped(&p, |s| {
                let (h, x) = BlockNorm::block_input(s, &x, pending.take(), &format!("{p}.norm"))?;
                let branch = s.block(i, &h, seq)?;
                match branch.bias {
                    None => Ok((s.g.add("residual", &x, &branch.y)?, None)),
                    Some(_) => Ok((x, Some(branch))),
                }
            })?;
        }
        Ok(Stacked { x, pending })
    }

    fn reversible(&mut self, x: Value, ff_inner: usize, seq: &mut Sequence) -> Result<Value> {
        let (mut x1, mut x2) = (x.clone(), x);
        for i in 0..self.cfg.layers {
            let p = format!("blocks.{i}");
            (x1, x2) = self.scoped(&p, |s| {
                let (h, _) = BlockNorm::block_input(s, &x2, None, &format!("{p}.norm"))?;
                let branch = s.block(i, &h, seq)?;
                let f = s.branch_value(branch)?;
                let y1 = s.g.add("residual", &x1, &f)?;
                let g = ChannelProjections::feed_forward(s, &p, &y1, ff_inner)?;
                let y2 = s.g.add("ff_residual", &x2, &g)?;
                Ok((y1, y2))
            })?;
        }
        self.g.add("reversible_sum", &x1, &x2)
    }
}
