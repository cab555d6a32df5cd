//! The per-token (channel) projections of a block (paper eq. 1–2, fig. 1):
//! `z = GELU(h·U + b_U)` split into the halves z1, z2 of e = f/2 channels each, and
//! `y = g·V + b_V` back to d channels. U's two halves are two MatMuls on column slices of
//! U (no `Split` of z; block-quantized weights: one `MatMulNBits` and a `Split`), each
//! bias `Add` directly after its MatMul, and GELU spelled as
//! ONNX Runtime's `GeluFusion` / `BiasGeluFusion` match it (see the graph builder's `gelu`),
//! or in its tanh form (gmlp-tinygrad). Also the GEGLU feed-forward of a reversible stack.

use super::super::context::Emitter;
use crate::error::{Error, Result};
use crate::gmlp::config::GeluForm;
use crate::onnx::graph::Value;

impl Emitter {
    /// `GELU(h·U[:, :e] + b_U[:e])` and `GELU(h·U[:, e:] + b_U[e:])` for block prefix `p`.
    pub(crate) fn proj_in(&mut self, p: &str, h: &Value) -> Result<(Value, Value)> {
        let e = self.cfg.gate_dim();
        let form = self.projection_form();
        let [z1, z2]: [Value; 2] = self
            .dense_parts(
                "proj_in",
                &["proj_in_z1", "proj_in_z2"],
                h,
                &format!("{p}.proj_in.weight"),
                Some(&format!("{p}.proj_in.bias")),
                &[(0, e), (e, 2 * e)],
                form,
            )?
            .try_into()
            .map_err(|_| Error::Internal("proj_in: two halves".into()))?;
        let z1 = self.channel_gelu("gelu_z1", &z1)?;
        let z2 = self.channel_gelu("gelu_z2", &z2)?;
        Ok((z1, z2))
    }

    /// The channel projection's GELU in the configured form (exact, or tanh).
    fn channel_gelu(&mut self, local: &str, z: &Value) -> Result<Value> {
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
            let [a, b]: [Value; 2] = s
                .dense_parts(
                    "proj_in",
                    &["proj_in_a", "proj_in_b"],
                    x,
                    &w1,
                    Some(&b1),
                    &[(0, inner), (inner, 2 * inner)],
                    form,
                )?
                .try_into()
                .map_err(|_| Error::Internal("feed-forward: two halves".into()))?;
            let b = s.g.gelu("gelu", &b)?;
            let product = s.g.mul("geglu", &a, &b)?;
            s.linear(
                "proj_out",
                &product,
                &format!("{p}.ff.proj_out.weight"),
                Some(&format!("{p}.ff.proj_out.bias")),
            )
        })
    }

    /// `g·V + b_V` for block prefix `p`.
    pub(crate) fn proj_out(&mut self, p: &str, gated: &Value) -> Result<Value> {
        self.linear(
            "proj_out",
            gated,
            &format!("{p}.proj_out.weight"),
            Some(&format!("{p}.proj_out.bias")),
        )
    }
}
