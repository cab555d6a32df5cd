//! The stack of blocks: each block's branch added to its input, `x ← x + f_i(x)`
//! (paper eq. 1, fig. 1), in the node scope `blocks.{i}`.

use super::context::Emitter;
use crate::error::Result;
use crate::onnx::graph::Value;

impl Emitter {
    /// Every block in order on the embedded input `x`.
    pub(crate) fn stack(&mut self, mut x: Value) -> Result<Value> {
        for i in 0..self.cfg.layers {
            x = self.scoped(&format!("blocks.{i}"), |s| {
                let y = s.block(i, &x)?;
                s.g.add("residual", &x, &y)
            })?;
        }
        Ok(x)
    }
}
