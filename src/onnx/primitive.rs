//! Primitive spellings for consumers that lack an operator or misread one of its forms
//! (chosen through [`crate::onnx::forms::OpForms`]): the elementwise helpers they need,
//! `ReduceSum`, the mean in either form, and LayerNorm as primitive ops. Each helper
//! documents the operator's version history over the builder's opset range (13..=24).

use crate::error::Result;
use crate::onnx::builder::GraphBuilder;
use crate::onnx::forms::MeanForm;
use crate::onnx::graph::{Attr, Dim, Value};
use crate::onnx::ops::reduced_shape;
use crate::onnx::shape::{fmt_shape, normalize_axis, shape_error};

impl GraphBuilder {
    /// Elementwise `Sub` with broadcasting.
    ///
    /// [Sub](https://onnx.ai/onnx/operators/onnx__Sub.html): versions 1, 6, 7 (multidirectional broadcasting), 13, 14 (types); the same form since 7.
    pub fn sub(&mut self, local: &str, a: &Value, b: &Value) -> Result<Value> {
        self.binary(local, "Sub", a, b)
    }

    /// Elementwise `Max` of two values with broadcasting (used on i64 sizes).
    ///
    /// [Max](https://onnx.ai/onnx/operators/onnx__Max.html): versions 1, 6, 8 (multidirectional broadcasting), 12 (integer types), 13 (bfloat16); the two-input form with i64 operands is valid over the whole range here.
    pub fn max(&mut self, local: &str, a: &Value, b: &Value) -> Result<Value> {
        self.binary(local, "Max", a, b)
    }

    /// Elementwise `Div` with broadcasting.
    ///
    /// [Div](https://onnx.ai/onnx/operators/onnx__Div.html): versions 1, 6, 7 (multidirectional broadcasting), 13, 14 (types); the same form since 7.
    pub fn div(&mut self, local: &str, a: &Value, b: &Value) -> Result<Value> {
        self.binary(local, "Div", a, b)
    }

    /// Elementwise `Sqrt`.
    ///
    /// [Sqrt](https://onnx.ai/onnx/operators/onnx__Sqrt.html): versions 1, 6, 13 (types); the same form in every opset here.
    pub fn sqrt(&mut self, local: &str, x: &Value) -> Result<Value> {
        Ok(self.single(local, "Sqrt", &[x], vec![], (x.elem, x.shape.clone()), 0))
    }

    /// `ReduceSum` over `axes` (kept as size-1 dimensions when `keep` is set). The axes are
    /// written non-negative (candle-onnx 0.11 casts them to unsigned).
    ///
    /// [ReduceSum](https://onnx.ai/onnx/operators/onnx__ReduceSum.html): versions 1, 11, 13 (`axes` moves from an attribute to an optional input, five opsets before the other reductions); the input form is valid over the whole range here.
    pub fn reduce_sum(
        &mut self,
        local: &str,
        x: &Value,
        axes: &[i64],
        keep: bool,
    ) -> Result<Value> {
        let rank = x.shape.len();
        let norm: Vec<usize> = axes
            .iter()
            .map(|&a| normalize_axis("ReduceSum", a, rank))
            .collect::<Result<_>>()?;
        let axes_value = self.const_i64(
            &format!("{local}_axes"),
            &[norm.len()],
            norm.iter().map(|&a| a as i64).collect(),
        )?;
        let shape = reduced_shape(&x.shape, &norm, keep);
        Ok(self.single(
            local,
            "ReduceSum",
            &[x, &axes_value],
            vec![("keepdims".to_string(), Attr::Int(i64::from(keep)))],
            (x.elem, shape),
            0,
        ))
    }

    /// The mean over `axes` (kept as size-1 dimensions when `keep` is set), in the graph's
    /// [`MeanForm`]: `ReduceMean` in its opset's form, or `ReduceSum` then `Div` by the
    /// (fixed) number of elements reduced. Both are the sum divided by the count, up to
    /// the order of the additions.
    pub fn mean(&mut self, local: &str, x: &Value, axes: &[i64], keep: bool) -> Result<Value> {
        match self.forms().mean {
            MeanForm::ReduceMean => self.reduce_mean_keeping(local, x, axes, keep),
            MeanForm::SumThenDivide => {
                let rank = x.shape.len();
                let mut count = 1usize;
                for &a in axes {
                    match &x.shape[normalize_axis("ReduceSum", a, rank)?] {
                        Dim::Fixed(n) => count *= n,
                        d => {
                            return Err(shape_error(
                                "ReduceSum",
                                format!("a mean over the symbolic dimension {d}"),
                            ))
                        }
                    }
                }
                let sum = self.reduce_sum(&format!("{local}_sum"), x, axes, keep)?;
                let n =
                    self.const_float(&format!("{local}_count"), &[], vec![count as f32], x.elem)?;
                self.div(local, &sum, &n)
            }
        }
    }

    /// LayerNorm over the last axis as primitive ops, for opsets below 17 (no
    /// `LayerNormalization`) and consumers without the operator:
    /// `μ = mean(x)`, `c = x − μ`, `σ² = mean(c·c)`, `y = c / √(σ² + ε) · scale + bias`,
    /// the means in the graph's [`MeanForm`]. It is the operator's definition spelled out
    /// (two-pass variance), so it agrees with `LayerNormalization` to float rounding. The
    /// last node is named `local`, like the operator's.
    pub fn layer_norm_decomposed(
        &mut self,
        local: &str,
        x: &Value,
        scale: &Value,
        bias: &Value,
        epsilon: f32,
    ) -> Result<Value> {
        if x.shape.last().is_none() || scale.shape.last() != x.shape.last() {
            return Err(shape_error(
                "LayerNormalization",
                format!(
                    "x {} with scale {}",
                    fmt_shape(&x.shape),
                    fmt_shape(&scale.shape)
                ),
            ));
        }
        let mean = self.mean(&format!("{local}_mean"), x, &[-1], true)?;
        let centered = self.sub(&format!("{local}_centered"), x, &mean)?;
        let squared = self.mul(&format!("{local}_squared"), &centered, &centered)?;
        let variance = self.mean(&format!("{local}_variance"), &squared, &[-1], true)?;
        let eps = self.const_float(&format!("{local}_epsilon"), &[], vec![epsilon], x.elem)?;
        let shifted = self.add(&format!("{local}_variance_eps"), &variance, &eps)?;
        let std = self.sqrt(&format!("{local}_std"), &shifted)?;
        let normalized = self.div(&format!("{local}_normalized"), &centered, &std)?;
        let scaled = self.mul(&format!("{local}_scale"), &normalized, scale)?;
        self.add(local, &scaled, bias)
    }
}
