//! The stack of blocks, in the node scopes `blocks.{i}`: sequential, `x ← x + f_i(x)`
//! (paper eq. 1, fig. 1), or reversible (g-mlp-gpt 0.0.15 `ReversibleSequence`, evaluated
//! forward as upstream's inference does): x1 = x2 = x, then per block
//! `y1 = x1 + f_i(x2)`, `y2 = x2 + g_i(y1)` with g_i the GEGLU feed-forward, and the
//! output y1 + y2.

use super::context::Emitter;
use super::sequence::Sequence;
use crate::error::Result;
use crate::gmlp::config::StackKind;
use crate::onnx::graph::Value;

impl Emitter {
    /// Every block in order on the embedded input `x`, over the sequence `seq`.
    pub(crate) fn stack(&mut self, x: Value, seq: &mut Sequence) -> Result<Value> {
        match self.cfg.block.stack {
            StackKind::Sequential => self.sequential(x, seq),
            StackKind::Reversible { ff_inner } => self.reversible(x, ff_inner, seq),
        }
    }

    fn sequential(&mut self, mut x: Value, seq: &mut Sequence) -> Result<Value> {
        for i in 0..self.cfg.layers {
            x = self.scoped(&format!("blocks.{i}"), |s| {
                let y = s.block(i, &x, seq)?;
                s.g.add("residual", &x, &y)
            })?;
        }
        Ok(x)
    }

    fn reversible(&mut self, x: Value, ff_inner: usize, seq: &mut Sequence) -> Result<Value> {
        let (mut x1, mut x2) = (x.clone(), x);
        for i in 0..self.cfg.layers {
            (x1, x2) = self.scoped(&format!("blocks.{i}"), |s| {
                let f = s.block(i, &x2, seq)?;
                let y1 = s.g.add("residual", &x1, &f)?;
                let g = s.feed_forward(&format!("blocks.{i}"), &y1, ff_inner)?;
                let y2 = s.g.add("ff_residual", &x2, &g)?;
                Ok((y1, y2))
            })?;
        }
        self.g.add("reversible_sum", &x1, &x2)
    }
}
