//! Math operators: `MatMul`, element-wise binary arithmetic with broadcasting (`Add`,
//! `Sub`, `Mul`, `Div`, `Max`, `Min`; `Sum` of several), `CumSum`, and unary functions (`Sqrt`, `Abs`,
//! `Tanh`, `Sigmoid`, `Relu`).

use crate::error::Result;
use crate::onnx::builder::GraphBuilder;
use crate::onnx::graph::{Attr, ElemType, Value};
use crate::onnx::shape::{broadcast, fmt_shape, shape_error};

impl GraphBuilder {
    /// `MatMul` with numpy broadcasting of the batch dimensions; records 2·M·K·N FLOPs per
    /// broadcast batch element (symbolic dimensions count as 1).
    ///
    /// [MatMul](https://onnx.ai/onnx/operators/onnx__MatMul.html): versions 1, 9, 13 (types only); the same form in every opset here.
    pub fn matmul(&mut self, local: &str, a: &Value, b: &Value) -> Result<Value> {
        if a.shape.len() < 2 || b.shape.len() < 2 {
            return Err(shape_error("MatMul", "operands must have rank >= 2".into()));
        }
        let (ar, br) = (a.shape.len(), b.shape.len());
        let (m, k) = (&a.shape[ar - 2], &a.shape[ar - 1]);
        let (k2, n) = (&b.shape[br - 2], &b.shape[br - 1]);
        if k != k2 || a.elem != b.elem {
            return Err(shape_error(
                "MatMul",
                format!("{} x {}", fmt_shape(&a.shape), fmt_shape(&b.shape)),
            ));
        }
        let mut shape = broadcast("MatMul", &a.shape[..ar - 2], &b.shape[..br - 2])?;
        let batch: u64 = shape.iter().map(|d| d.size_or_one() as u64).product();
        let flops = 2 * batch * (m.size_or_one() * k.size_or_one() * n.size_or_one()) as u64;
        shape.push(m.clone());
        shape.push(n.clone());
        Ok(self.single(local, "MatMul", &[a, b], vec![], (a.elem, shape), flops))
    }

    pub(crate) fn binary(&mut self, local: &str, op: &str, a: &Value, b: &Value) -> Result<Value> {
        if a.elem != b.elem {
            return Err(shape_error(
                op,
                format!("element types {:?} and {:?} differ", a.elem, b.elem),
            ));
        }
        let shape = broadcast(op, &a.shape, &b.shape)?;
        Ok(self.single(local, op, &[a, b], vec![], (a.elem, shape), 0))
    }

    /// `CumSum` of `x` along the i64 scalar `axis`; `exclusive` starts each sum at 0
    /// (element k is the sum of the k before it), so that a tensor of ones becomes the
    /// indices 0, 1, … along `axis` computed from data alone (no `Shape`).
    ///
    /// [CumSum](https://onnx.ai/onnx/operators/onnx__CumSum.html): versions 11, 14 (types only); the same form in every opset here.
    pub fn cum_sum(
        &mut self,
        local: &str,
        x: &Value,
        axis: &Value,
        exclusive: bool,
    ) -> Result<Value> {
        if !axis.shape.is_empty() || axis.elem != ElemType::I64 {
            return Err(shape_error(
                "CumSum",
                format!("axis must be an i64 scalar, got {}", fmt_shape(&axis.shape)),
            ));
        }
        Ok(self.single(
            local,
            "CumSum",
            &[x, axis],
            vec![("exclusive".to_string(), Attr::Int(i64::from(exclusive)))],
            (x.elem, x.shape.clone()),
            0,
        ))
    }

    /// Elementwise `Sum` of two or more values with broadcasting: one node (one kernel)
    /// where a chain of `Add`s would be several.
    ///
    /// [Sum](https://onnx.ai/onnx/operators/onnx__Sum.html): versions 1, 6, 8 (multidirectional broadcasting), 13 (bfloat16); the variadic form with broadcasting is valid from 8 on.
    pub fn sum(&mut self, local: &str, terms: &[&Value]) -> Result<Value> {
        let Some((first, rest)) = terms.split_first() else {
            return Err(shape_error("Sum", "needs at least one input".into()));
        };
        let mut shape = first.shape.clone();
        for t in rest {
            if t.elem != first.elem {
                return Err(shape_error(
                    "Sum",
                    format!("element types {:?} and {:?} differ", first.elem, t.elem),
                ));
            }
            shape = broadcast("Sum", &shape, &t.shape)?;
        }
        Ok(self.single(local, "Sum", terms, vec![], (first.elem, shape), 0))
    }

    /// Elementwise `Add` with broadcasting.
    ///
    /// [Add](https://onnx.ai/onnx/operators/onnx__Add.html): versions 1, 6, 7 (multidirectional broadcasting), 13, 14 (types); the same form since 7.
    pub fn add(&mut self, local: &str, a: &Value, b: &Value) -> Result<Value> {
        self.binary(local, "Add", a, b)
    }

    /// Elementwise `Mul` with broadcasting.
    ///
    /// [Mul](https://onnx.ai/onnx/operators/onnx__Mul.html): versions 1, 6, 7 (multidirectional broadcasting), 13, 14 (types); the same form since 7.
    pub fn mul(&mut self, local: &str, a: &Value, b: &Value) -> Result<Value> {
        self.binary(local, "Mul", a, b)
    }

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

    pub(super) fn unary(&mut self, local: &str, op: &str, x: &Value) -> Value {
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
}
