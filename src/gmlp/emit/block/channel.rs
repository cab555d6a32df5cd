//! The per-token (channel) projections of a block (paper eq. 1–2, fig. 1):
//! `z = GELU(h·U + b_U)` split into the halves z1, z2 of e = f/2 channels each, and
//! `y = g·V + b_V` back to d channels. U's two halves are two MatMuls on column slices of
//! U (no `Split` of z), each bias `Add` directly after its MatMul, and GELU spelled as
//! ONNX Runtime's `GeluFusion` / `BiasGeluFusion` match it (see the graph builder's `gelu`),
//! or in its tanh form (gmlp-tinygrad). Also the GEGLU feed-forward of a reversible stack.

use super::super::context::Emitter;
use crate::error::Result;
use crate::gmlp::config::GeluForm;
use crate::onnx::graph::Value;

impl Emitter {
    /// `GELU(h·U[:, :e] + b_U[:e])` and `GELU(h·U[:, e:] + b_U[e:])` for block prefix `p`.
    pub(crate) fn proj_in(&mut self, p: &str, h: &Value) -> Result<(Value, Value)> {
        let e = self.cfg.gate_dim();
        let z1 = self.proj_in_half(p, h, 1, (0, e))?;
        let z2 = self.proj_in_half(p, h, 2, (e, 2 * e))?;
        Ok((z1, z2))
    }

    /// Half `k` (1 or 2) of proj_in: U's output columns `cols`, then GELU.
    fn proj_in_half(
        &mut self,
        p: &str,
        h: &Value,
        k: usize,
        cols: (usize, usize),
    ) -> Result<Value> {
        let form = self.projection_form();
        let z = self.dense(
            &format!("proj_in_z{k}"),
            h,
            &format!("{p}.proj_in.weight"),
            Some(&format!("{p}.proj_in.bias")),
            Some(cols),
            form,
        )?;
        self.channel_gelu(&format!("gelu_z{k}"), &z)
    }

    /// The channel projection's GELU in the configured form (exact, or tanh).
    pub(crate) fn channel_gelu(&mut self, local: &str, z: &Value) -> Result<Value> {
        match self.cfg.block.gelu {
            GeluForm::Erf => self.g.gelu(local, z),
            GeluForm::Tanh => self.g.gelu_tanh(local, z),
        }
    }

    /// The GEGLU feed-forward g of a reversible block (g-mlp-gpt's `FeedForward`):
    /// `(a ⊙ GELU(b))·W2 + b2` with `[a, b] = x·W1 + b1`, the two halves as two MatMuls on
    /// column slices of W1, in the `ff` scope.
    pub(crate) fn feed_forward(&mut self, p: &str, x: &Value, inner: usize) -> Result<Value> {
        let form = self.projection_form();
        self.scoped("ff", |s| {
            let (w1, b1) = (
                format!("{p}.ff.proj_in.weight"),
                format!("{p}.ff.proj_in.bias"),
            );
            let a = s.dense("proj_in_a", x, &w1, Some(&b1), Some((0, inner)), form)?;
            let b = s.dense(
                "proj_in_b",
                x,
                &w1,
                Some(&b1),
                Some((inner, 2 * inner)),
                form,
            )?;
            let b = s.g.gelu("gelu", &b)?;
            let product = s.g.mul("geglu", &a, &b)?;
            let out_form = s.output_projection_form();
            s.dense(
                "proj_out",
                &product,
                &format!("{p}.ff.proj_out.weight"),
                Some(&format!("{p}.ff.proj_out.bias")),
                None,
                out_form,
            )
        })
    }

    /// `g·V + b_V` for block prefix `p`.
    pub(crate) fn proj_out(&mut self, p: &str, gated: &Value) -> Result<Value> {
        let form = self.output_projection_form();
        self.dense(
            "proj_out",
            gated,
            &format!("{p}.proj_out.weight"),
            Some(&format!("{p}.proj_out.bias")),
            None,
            form,
        )
    }
}
