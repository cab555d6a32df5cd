//! The spatial gating unit's gate (paper eq. 3, fig. 1; aMLP fig. 6):
//! `s(z) = z1 ⊙ (W · LN(z2) + b [+ attn(h)])`, emitted in the `sgu` scope.

use super::super::context::Emitter;
use crate::error::Result;
use crate::onnx::graph::Value;

impl Emitter {
    /// `z1 ⊙ (W · LN(z2) + b [+ attn])` of block `i` (prefix `p`).
    pub(crate) fn spatial_gating(
        &mut self,
        p: &str,
        i: usize,
        z1: &Value,
        z2: &Value,
        attn: Option<&Value>,
    ) -> Result<Value> {
        let sgu_eps = self.cfg.sgu_norm_eps;
        self.scoped("sgu", |s| {
            let u = s.layer_norm("norm", z2, &format!("{p}.sgu.norm"), sgu_eps)?;
            let mut gate = s.spatial_projection(&u, p, i)?;
            if let Some(attn) = attn {
                gate = s.g.add("attn_add", &gate, attn)?;
            }
            s.g.mul("gate", z1, &gate)
        })
    }
}
