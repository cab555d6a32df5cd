//! Normalization over channels: the block's input norm, the spatial gating unit's norm of
//! z2, and the final norm before the head, always computed in f32. LayerNorm (paper eq. 1
//! and fig. 1; PyTorch's `nn.LayerNorm`, biased variance) is emitted as ONNX
//! `LayerNormalization` (opset 17) or its primitive form below 17; RMSNorm (gmlp-tinygrad,
//! tinygrad's `nn.RMSNorm`: `x / √(mean(x²) + ε) · γ`) with primitive ops. In the fused
//! spelling a block's input norm also adds the previous block's branch and its output bias
//! (ONNX Runtime's `SkipLayerNormalization`), so the residual costs no node of its own.

use super::super::context::Emitter;
use super::Branch;
use crate::error::Result;
use crate::gmlp::config::NormKind;
use crate::onnx::graph::{ElemType, Value};

/// The norms of a block: its input's (LayerNorm or RMSNorm, or in the fused spelling `SkipLayerNormalization` carrying the residual) and the gate's `LN(z2)`.
pub(crate) struct BlockNorm;

impl BlockNorm {
    /// A block's normalized input `h` and the residual stream it continues: `LN(x)` and `x`,
    /// or with the previous block's `pending` branch (fused spelling) `LN(x + y + b_V)` and
    /// `x + y + b_V` from one `SkipLayerNormalization` (parameters `{prefix}.weight`,
    /// `{prefix}.bias`).
    pub(crate) fn block_input(
        em: &mut Emitter,
        x: &Value,
        pending: Option<Branch>,
        prefix: &str,
    ) -> Result<(Value, Value)> {
        match pending {
            None => Ok((
                BlockNorm::norm(em, "norm", x, prefix, em.cfg.norm_eps)?,
                x.clone(),
            )),
            Some(branch) => BlockNorm::skip_norm(em, "norm", x, &branch, prefix),
        }
    }

    /// `SkipLayerNormalization` of `x + y + b_V` (`branch`) with the LayerNorm parameters
    /// `{prefix}.weight` and `{prefix}.bias`: the normalized value and the sum.
    pub(crate) fn skip_norm(
        em: &mut Emitter,
        local: &str,
        x: &Value,
        branch: &Branch,
        prefix: &str,
    ) -> Result<(Value, Value)> {
        let (w, b) = (format!("{prefix}.weight"), format!("{prefix}.bias"));
        let dims = em.spec(&w)?.shape;
        let scale = em.stored_param(&w, &w, &dims, ElemType::F32)?;
        let shift = em.stored_param(&b, &b, &dims, ElemType::F32)?;
        let eps = em.cfg.norm_eps;
        em.g.skip_layer_norm(
            local,
            x,
            &branch.y,
            &scale,
            &shift,
            branch.bias.as_ref(),
            eps,
        )
    }

    /// The configured norm with the parameters `{prefix}.weight` (and `{prefix}.bias` for
    /// LayerNorm).
    pub(crate) fn norm(
        em: &mut Emitter,
        local: &str,
        x: &Value,
        prefix: &str,
        eps: f32,
    ) -> Result<Value> {
        match em.cfg.block.norm {
            NormKind::LayerNorm => BlockNorm::layer_norm(em, local, x, prefix, eps),
            NormKind::RmsNorm => {
                let w = format!("{prefix}.weight");
                let dims = em.spec(&w)?.shape;
                let scale = em.stored_param(&w, &w, &dims, ElemType::F32)?;
                let x32 = em.cast_to(&format!("{local}_to_f32"), x, ElemType::F32)?;
                let y = em.g.rms_norm(local, &x32, &scale, eps)?;
                em.cast_to(&format!("{local}_to_f16"), &y, x.elem)
            }
        }
    }

    /// LayerNorm with the parameters `{prefix}.weight` and `{prefix}.bias`, always computed
    /// in f32 (an f16 model casts around it, keeping its scale and shift in f32).
    fn layer_norm(
        em: &mut Emitter,
        local: &str,
        x: &Value,
        prefix: &str,
        eps: f32,
    ) -> Result<Value> {
        let (w, b) = (format!("{prefix}.weight"), format!("{prefix}.bias"));
        let dims = em.spec(&w)?.shape;
        let scale = em.stored_param(&w, &w, &dims, ElemType::F32)?;
        let shift = em.stored_param(&b, &b, &dims, ElemType::F32)?;
        let x32 = em.cast_to(&format!("{local}_to_f32"), x, ElemType::F32)?;
        let y = em.g.layer_norm(local, &x32, &scale, &shift, eps)?;
        em.cast_to(&format!("{local}_to_f16"), &y, x.elem)
    }
}
