//! Operator helpers for the activations and index arithmetic that the block variants of
//! the public gMLP implementations need: unary activations, tanh GELU, SiLU, elementwise
//! `Min` / `Abs` on i64 index tensors, RMS normalization spelled with primitive ops, and a
//! causal depthwise 1-D convolution. Each helper documents the operator's version history
//! over the builder's opset range (13..=24).

use crate::error::Result;
use crate::onnx::builder::GraphBuilder;
use crate::onnx::graph::{Attr, Dim, Value};
use crate::onnx::shape::{fmt_shape, shape_error};

impl GraphBuilder {
    fn unary(&mut self, local: &str, op: &str, x: &Value) -> Value {
        self.single(local, op, &[x], vec![], (x.elem, x.shape.clone()), 0)
    }

    /// Elementwise `Tanh`.
    ///
    /// [Tanh](https://onnx.ai/onnx/operators/onnx__Tanh.html): versions 1, 6, 13 (bfloat16); the same form in every opset here.
    pub fn tanh(&mut self, local: &str, x: &Value) -> Result<Value> {
        Ok(self.unary(local, "Tanh", x))
    }

    /// Elementwise logistic `Sigmoid`.
    ///
    /// [Sigmoid](https://onnx.ai/onnx/operators/onnx__Sigmoid.html): versions 1, 6, 13 (bfloat16); the same form in every opset here.
    pub fn sigmoid(&mut self, local: &str, x: &Value) -> Result<Value> {
        Ok(self.unary(local, "Sigmoid", x))
    }

    /// Elementwise `Relu`.
    ///
    /// [Relu](https://onnx.ai/onnx/operators/onnx__Relu.html): versions 1, 6, 13, 14 (integer types); the same form in every opset here.
    pub fn relu(&mut self, local: &str, x: &Value) -> Result<Value> {
        Ok(self.unary(local, "Relu", x))
    }

    /// Elementwise `Abs` (used on i64 index differences).
    ///
    /// [Abs](https://onnx.ai/onnx/operators/onnx__Abs.html): versions 1, 6 (integer types), 13; the same form in every opset here.
    pub fn abs(&mut self, local: &str, x: &Value) -> Result<Value> {
        Ok(self.unary(local, "Abs", x))
    }

    /// Elementwise `Min` of two values with broadcasting (used on i64 indices).
    ///
    /// [Min](https://onnx.ai/onnx/operators/onnx__Min.html): versions 1, 6, 8 (multidirectional broadcasting), 12 (integer types), 13; the two-input form with i64 operands is valid over the whole range here.
    pub fn min(&mut self, local: &str, a: &Value, b: &Value) -> Result<Value> {
        self.binary(local, "Min", a, b)
    }

    /// SiLU `x·sigmoid(x)` (PyTorch's `nn.SiLU`), as `Sigmoid` and `Mul` (ONNX has no SiLU
    /// operator; ONNX Runtime fuses this pair into `QuickGelu`-style kernels itself).
    pub fn silu(&mut self, local: &str, x: &Value) -> Result<Value> {
        let s = self.sigmoid(&format!("{local}_sigmoid"), x)?;
        self.mul(local, x, &s)
    }

    /// GELU's tanh approximation `0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`: the `Gelu`
    /// operator with `approximate = "tanh"` from opset 20, the formula spelled with
    /// `Mul`/`Add`/`Tanh` below it.
    ///
    /// [Gelu](https://onnx.ai/onnx/operators/onnx__Gelu.html): new in opset 20 (attribute `approximate`, "none" or "tanh").
    pub fn gelu_tanh(&mut self, local: &str, x: &Value) -> Result<Value> {
        if self.opset() >= 20 {
            let approximate = ("approximate".to_string(), Attr::String("tanh".into()));
            return Ok(self.single(
                local,
                "Gelu",
                &[x],
                vec![approximate],
                (x.elem, x.shape.clone()),
                0,
            ));
        }
        let c = |g: &mut Self, name: &str, v: f32| {
            g.const_float(&format!("{local}_{name}"), &[], vec![v], x.elem)
        };
        let cubic_coef = c(self, "coef", 0.044715)?;
        let root = c(self, "sqrt_2_over_pi", (2.0 / std::f32::consts::PI).sqrt())?;
        let one = c(self, "one", 1.0)?;
        let half = c(self, "half", 0.5)?;
        let x2 = self.mul(&format!("{local}_square"), x, x)?;
        let x3 = self.mul(&format!("{local}_cube"), &x2, x)?;
        let scaled_cube = self.mul(&format!("{local}_cube_coef"), &x3, &cubic_coef)?;
        let inner = self.add(&format!("{local}_inner"), x, &scaled_cube)?;
        let arg = self.mul(&format!("{local}_arg"), &inner, &root)?;
        let t = self.tanh(&format!("{local}_tanh"), &arg)?;
        let one_plus = self.add(&format!("{local}_one_plus"), &t, &one)?;
        let x_one_plus = self.mul(&format!("{local}_x_one_plus"), x, &one_plus)?;
        self.mul(local, &x_one_plus, &half)
    }

    /// RMS normalization over the last axis, `x / √(mean(x²) + ε) · γ` (tinygrad's
    /// `nn.RMSNorm`), spelled `Mul → ReduceMean → Add → Sqrt → Div → Mul` (ONNX's
    /// `RMSNormalization` is new in opset 23, past this builder's range).
    pub fn rms_norm(&mut self, local: &str, x: &Value, scale: &Value, eps: f32) -> Result<Value> {
        let square = self.mul(&format!("{local}_square"), x, x)?;
        let mean = self.reduce_mean_keeping(&format!("{local}_mean"), &square, &[-1], true)?;
        let eps = self.const_float(&format!("{local}_eps"), &[], vec![eps], x.elem)?;
        let shifted = self.add(&format!("{local}_add_eps"), &mean, &eps)?;
        let root = self.sqrt(&format!("{local}_sqrt"), &shifted)?;
        let normed = self.div(&format!("{local}_div"), x, &root)?;
        self.mul(local, &normed, scale)
    }

    /// A depthwise 1-D `Conv` over `x` [batch, channels, length] with `weight`
    /// [channels, 1, kernel] and `bias` [channels], `group = channels`, padded with
    /// `kernel − 1` zeros in front (causal) and none behind: output length = input length.
    ///
    /// [Conv](https://onnx.ai/onnx/operators/onnx__Conv.html): versions 1, 11 (`auto_pad` semantics), 22 (types); explicit `pads` and `group` are valid over the whole range here.
    pub fn conv1d_causal_depthwise(
        &mut self,
        local: &str,
        x: &Value,
        weight: &Value,
        bias: &Value,
    ) -> Result<Value> {
        let (channels, kernel) = match (&weight.shape[..], &x.shape[..]) {
            ([Dim::Fixed(c), Dim::Fixed(1), Dim::Fixed(k)], [_, Dim::Fixed(xc), _]) if c == xc => {
                (*c, *k)
            }
            _ => {
                return Err(shape_error(
                    "Conv",
                    format!(
                        "depthwise 1-D: x {} with weight {}",
                        fmt_shape(&x.shape),
                        fmt_shape(&weight.shape)
                    ),
                ))
            }
        };
        let flops = 2 * (channels * kernel * x.shape[2].size_or_one()) as u64;
        Ok(self.single(
            local,
            "Conv",
            &[x, weight, bias],
            vec![
                ("kernel_shape".to_string(), Attr::Ints(vec![kernel as i64])),
                ("group".to_string(), Attr::Int(channels as i64)),
                ("pads".to_string(), Attr::Ints(vec![kernel as i64 - 1, 0])),
            ],
            (x.elem, x.shape.clone()),
            flops,
        ))
    }
}
