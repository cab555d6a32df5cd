//! Operator helpers for dynamically quantized integer MatMuls (`--dtype int8`), in the form
//! ONNX Runtime's `quantize_dynamic` emits and its `DynamicQuantizeMatMulFusion` /
//! `MatMulIntegerToFloatFusion` rewrite into one integer kernel; tract runs the same nodes.

use crate::error::{Error, Result};
use crate::onnx::builder::GraphBuilder;
use crate::onnx::graph::{ElemType, Value};
use crate::onnx::shape::{broadcast, fmt_shape, shape_error};

/// First opset with every operator of the dynamic int8 form (`DynamicQuantizeLinear` is
/// new in 11; `MatMulInteger` in 10).
pub const MIN_INT8_OPSET: i64 = 11;

impl GraphBuilder {
    /// `DynamicQuantizeLinear`: `x` (f32) → (`y` u8, `y_scale` f32 scalar, `y_zero_point` u8
    /// scalar), per tensor, asymmetric over [min(x, 0), max(x, 0)].
    ///
    /// [DynamicQuantizeLinear](https://onnx.ai/onnx/operators/onnx__DynamicQuantizeLinear.html): new in opset 11 (its only version).
    pub fn dynamic_quantize_linear(
        &mut self,
        local: &str,
        x: &Value,
    ) -> Result<(Value, Value, Value)> {
        if x.elem != ElemType::F32 || self.opset() < MIN_INT8_OPSET {
            return Err(Error::Internal(format!(
                "DynamicQuantizeLinear needs f32 input and opset >= {MIN_INT8_OPSET}"
            )));
        }
        let mut out = self.node(
            local,
            "DynamicQuantizeLinear",
            &[x],
            vec![],
            vec![
                (ElemType::U8, x.shape.clone()),
                (ElemType::F32, vec![]),
                (ElemType::U8, vec![]),
            ],
            0,
        );
        let zero_point = out.pop().expect("three outputs");
        let scale = out.pop().expect("three outputs");
        let y = out.pop().expect("three outputs");
        Ok((y, scale, zero_point))
    }

    /// `MatMulInteger(a, b, a_zero_point)` with u8 `a`, i8 `b` (zero point 0, omitted), i32
    /// output; records 2·M·K·N FLOPs per broadcast batch element like [`GraphBuilder::matmul`].
    ///
    /// [MatMulInteger](https://onnx.ai/onnx/operators/onnx__MatMulInteger.html): new in opset 10 (its only version).
    pub fn matmul_integer(
        &mut self,
        local: &str,
        a: &Value,
        b: &Value,
        a_zero_point: &Value,
    ) -> Result<Value> {
        let (ar, br) = (a.shape.len(), b.shape.len());
        let ok_types = a.elem == ElemType::U8
            && b.elem == ElemType::I8
            && a_zero_point.elem == ElemType::U8
            && a_zero_point.shape.is_empty();
        if ar < 2 || br < 2 || !ok_types || a.shape[ar - 1] != b.shape[br - 2] {
            return Err(shape_error(
                "MatMulInteger",
                format!(
                    "{:?}{} x {:?}{}",
                    a.elem,
                    fmt_shape(&a.shape),
                    b.elem,
                    fmt_shape(&b.shape)
                ),
            ));
        }
        let (m, k, n) = (&a.shape[ar - 2], &a.shape[ar - 1], &b.shape[br - 1]);
        let mut shape = broadcast("MatMulInteger", &a.shape[..ar - 2], &b.shape[..br - 2])?;
        let batch: u64 = shape.iter().map(|d| d.size_or_one() as u64).product();
        let flops = 2 * batch * (m.size_or_one() * k.size_or_one() * n.size_or_one()) as u64;
        shape.push(m.clone());
        shape.push(n.clone());
        Ok(self.single(
            local,
            "MatMulInteger",
            &[a, b, a_zero_point],
            vec![],
            (ElemType::I32, shape),
            flops,
        ))
    }
}
