//! Normalization over channels: the block's input norm, the spatial gating unit's norm of
//! z2, and the final norm before the head, always computed in f32. LayerNorm (paper eq. 1
//! and fig. 1; PyTorch's `nn.LayerNorm`, biased variance) is emitted as ONNX
//! `LayerNormalization` (opset 17) or its primitive form below 17; RMSNorm (gmlp-tinygrad,
//! tinygrad's `nn.RMSNorm`: `x / √(mean(x²) + ε) · γ`) with primitive ops.

use super::super::context::Emitter;
use crate::error::Result;
use crate::gmlp::config::NormKind;
use crate::onnx::graph::{ElemType, Value};

impl Emitter {
    /// The configured norm with the parameters `{prefix}.weight` (and `{prefix}.bias` for
    /// LayerNorm).
    pub(crate) fn norm(&mut self, local: &str, x: &Value, prefix: &str, eps: f32) -> Result<Value> {
        match self.cfg.block.norm {
            NormKind::LayerNorm => self.layer_norm(local, x, prefix, eps),
            NormKind::RmsNorm => {
                let w = format!("{prefix}.weight");
                let dims = self.spec(&w)?.shape;
                let scale = self.lazy_param_as(&w, &dims, ElemType::F32, |v| v)?;
                let x32 = self.cast_to(&format!("{local}_to_f32"), x, ElemType::F32)?;
                let y = self.g.rms_norm(local, &x32, &scale, eps)?;
                self.cast_to(&format!("{local}_to_f16"), &y, x.elem)
            }
        }
    }

    /// LayerNorm with the parameters `{prefix}.weight` and `{prefix}.bias`, always computed
    /// in f32 (an f16 model casts around it, keeping its scale and shift in f32).
    fn layer_norm(&mut self, local: &str, x: &Value, prefix: &str, eps: f32) -> Result<Value> {
        let (w, b) = (format!("{prefix}.weight"), format!("{prefix}.bias"));
        let dims = self.spec(&w)?.shape;
        let scale = self.lazy_param_as(&w, &dims, ElemType::F32, |v| v)?;
        let shift = self.lazy_param_as(&b, &dims, ElemType::F32, |v| v)?;
        let x32 = self.cast_to(&format!("{local}_to_f32"), x, ElemType::F32)?;
        let y = self.g.layer_norm(local, &x32, &scale, &shift, eps)?;
        self.cast_to(&format!("{local}_to_f16"), &y, x.elem)
    }
}
