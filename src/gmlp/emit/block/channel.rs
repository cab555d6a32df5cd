//! The per-token (channel) projections of a block (paper eq. 1–2, fig. 1):
//! `z = GELU(h·U + b_U)` split into the halves z1, z2 of e = f/2 channels each, and
//! `y = g·V + b_V` back to d channels. U's two halves are two MatMuls on column slices of
//! U (no `Split` of z), each bias `Add` directly after its MatMul, and GELU spelled as
//! ONNX Runtime's `GeluFusion` / `BiasGeluFusion` match it (see the graph builder's `gelu`),
//! or in its tanh form (gmlp-tinygrad). Also the GEGLU feed-forward of a reversible stack.
//! In the fused spelling U and the attention's W_qkv are one joined MatMul and a `Split`,
//! and b_V is left to the next block's `SkipLayerNormalization`.

use super::super::context::Emitter;
use super::super::linear::JoinedColumns;
use super::Branch;
use crate::error::{Error, Result};
use crate::gmlp::config::GeluForm;
use crate::onnx::graph::{ElemType, Value};

/// What a block's input projection gives: the gate halves z1, z2 (after GELU) and, where
/// the projection joined the attention's into its own (fused spelling), q, k and v.
pub(crate) struct Projected {
    /// `GELU(h·U1 + b_U1)`.
    pub(crate) z1: Value,
    /// `GELU(h·U2 + b_U2)`.
    pub(crate) z2: Value,
    /// The attention's q, k, v from the joined projection; `None` where the attention
    /// projects them itself.
    pub(crate) qkv: Option<[Value; 3]>,
}

/// The channel projections of a block (paper eq. 1, 4): `GELU(h·U + b_U)` in, `s·V + b_V` out, and the feed-forward of a reversible stack.
pub(crate) struct ChannelProjections;

impl ChannelProjections {
    /// `GELU(h·U[:, :e] + b_U[:e])` and `GELU(h·U[:, e:] + b_U[e:])` for block prefix `p`:
    /// two MatMuls on column slices of U, or (the fused static step) one MatMul of
    /// `[U | W_qkv]` and a `Split` into z1, z2 (and q, k, v in an aMLP).
    pub(crate) fn proj_in(em: &mut Emitter, p: &str, h: &Value) -> Result<Projected> {
        let e = em.cfg.gate_dim();
        if em.joins_step() {
            return ChannelProjections::proj_in_joined(em, p, h, e);
        }
        let z1 = ChannelProjections::proj_in_half(em, p, h, 1, (0, e))?;
        let z2 = ChannelProjections::proj_in_half(em, p, h, 2, (e, 2 * e))?;
        Ok(Projected { z1, z2, qkv: None })
    }

    /// `h · [U | W_qkv] + [b_U | b_qkv]` as one projection, split into z1, z2 (GELU) and
    /// q, k, v.
    fn proj_in_joined(em: &mut Emitter, p: &str, h: &Value, e: usize) -> Result<Projected> {
        let mut parts = vec![JoinedColumns {
            weight: format!("{p}.proj_in.weight"),
            bias: Some(format!("{p}.proj_in.bias")),
            cols: (0, 2 * e),
        }];
        let mut sizes = vec![e, e];
        if let Some(a) = em.cfg.attn_dim {
            parts.push(JoinedColumns {
                weight: format!("{p}.attn.qkv.weight"),
                bias: em
                    .cfg
                    .block
                    .attn_qkv_bias
                    .then(|| format!("{p}.attn.qkv.bias")),
                cols: (0, 3 * a),
            });
            sizes.extend([a, a, a]);
        }
        let joined = match em.cfg.attn_dim {
            Some(_) => format!("{p}.proj_in_attn_qkv.weight"),
            None => format!("{p}.proj_in.weight"),
        };
        let form = em.projection_form();
        let pre = em.dense_joined("proj_in", h, &joined, &parts, form)?;
        let split = em.g.split("proj_in_split", &pre, -1, &sizes)?;
        let (z1, z2, qkv) = match &split[..] {
            [z1, z2] => (z1, z2, None),
            [z1, z2, q, k, v] => (z1, z2, Some([q.clone(), k.clone(), v.clone()])),
            _ => return Err(Error::Internal("proj_in_split: one value per part".into())),
        };
        let z1 = ChannelProjections::channel_gelu(em, "gelu_z1", z1)?;
        let z2 = ChannelProjections::channel_gelu(em, "gelu_z2", z2)?;
        Ok(Projected { z1, z2, qkv })
    }

    /// Half `k` (1 or 2) of proj_in: U's output columns `cols`, then GELU.
    fn proj_in_half(
        em: &mut Emitter,
        p: &str,
        h: &Value,
        k: usize,
        cols: (usize, usize),
    ) -> Result<Value> {
        let form = em.projection_form();
        let z = em.dense(
            &format!("proj_in_z{k}"),
            h,
            &format!("{p}.proj_in.weight"),
            Some(&format!("{p}.proj_in.bias")),
            Some(cols),
            form,
        )?;
        ChannelProjections::channel_gelu(em, &format!("gelu_z{k}"), &z)
    }

    /// The channel projection's GELU in the configured form (exact, or tanh).
    pub(crate) fn channel_gelu(em: &mut Emitter, local: &str, z: &Value) -> Result<Value> {
        match em.cfg.block.gelu {
            GeluForm::Erf => em.g.gelu(local, z),
            GeluForm::Tanh => em.g.gelu_tanh(local, z),
        }
    }

    /// The GEGLU feed-forward g of a reversible block (g-mlp-gpt's `FeedForward`):
    /// `(a ⊙ GELU(b))·W2 + b2` with `[a, b] = x·W1 + b1`, the two halves as two MatMuls on
    /// column slices of W1, in the `ff` scope.
    pub(crate) fn feed_forward(
        em: &mut Emitter,
        p: &str,
        x: &Value,
        inner: usize,
    ) -> Result<Value> {
        let form = em.projection_form();
        em.scoped("ff", |s| {
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

    /// `g·V + b_V` for block prefix `p`; in the fused spelling `g·V` with b_V (f32) beside
    /// it, for the next norm (`SkipLayerNormalization`) to add.
    pub(crate) fn proj_out(em: &mut Emitter, p: &str, gated: &Value) -> Result<Branch> {
        let form = em.output_projection_form();
        let (w, b) = (format!("{p}.proj_out.weight"), format!("{p}.proj_out.bias"));
        if !em.fused() {
            let y = em.dense("proj_out", gated, &w, Some(&b), None, form)?;
            return Ok(Branch { y, bias: None });
        }
        let y = em.dense("proj_out", gated, &w, None, None, form)?;
        let dims = em.spec(&b)?.shape;
        let bias = em.stored_param(&b, &b, &dims, ElemType::F32)?;
        Ok(Branch {
            y,
            bias: Some(bias),
        })
    }
}
