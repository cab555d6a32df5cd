//! Quantized operators: the dynamically quantized integer MatMul of `--dtype int8`
//! (`DynamicQuantizeLinear` + `MatMulInteger`, the form ONNX Runtime's `quantize_dynamic`
//! emits and its `DynamicQuantizeMatMulFusion` / `MatMulIntegerToFloatFusion` rewrite into
//! one integer kernel; tract runs the same nodes), and ONNX Runtime's block-quantized
//! weight-only `com.microsoft.MatMulNBits` (`--dtype int4`, `int8-weight-only`; packing in
//! `onnx/nbits.rs`).

use crate::error::{Error, Result};
use crate::onnx::builder::GraphBuilder;
use crate::onnx::graph::{Attr, Dim, ElemType, Value};
use crate::onnx::shape::{broadcast, fmt_shape, shape_error};

/// First opset with every operator of the dynamic int8 form (`DynamicQuantizeLinear` is
/// new in 11; `MatMulInteger` in 10).
pub const MIN_INT8_OPSET: i64 = 11;

/// Attributes of a `com.microsoft.MatMulNBits` node (see [`crate::onnx::nbits`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NBits {
    /// Input features K.
    pub k: usize,
    /// Output features N.
    pub n: usize,
    /// Bits per code.
    pub bits: usize,
    /// Values per block along K.
    pub block_size: usize,
    /// `accuracy_level`: 0 (unset) computes with A as given; 4 lets ONNX Runtime's CPU
    /// kernel quantize A to int8 per block of K inside the node.
    pub accuracy_level: i64,
}

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

    /// `Y = A · dequant(B)` for f32 `a` `[…, K]`, a packed u8 weight `b`
    /// `[N, ⌈K / block⌉, block · bits / 8]` and f32 `scales` `[N, ⌈K / block⌉]`, no zero points
    /// (the default 2^(bits−1)), and an optional f32 `bias` `[N]` (input 5, added in the
    /// kernel); records 2·M·K·N FLOPs like
    /// [`GraphBuilder::matmul`].
    ///
    /// [MatMulNBits](https://github.com/microsoft/onnxruntime/blob/main/docs/ContribOperators.md#com.microsoft.MatMulNBits):
    /// ONNX Runtime contrib operator, domain `com.microsoft` version 1 (its only version;
    /// in ONNX Runtime since 1.17); works with any `ai.onnx` opset.
    pub fn matmul_nbits(
        &mut self,
        local: &str,
        a: &Value,
        b: &Value,
        scales: &Value,
        bias: Option<&Value>,
        attrs: NBits,
    ) -> Result<Value> {
        let NBits {
            k,
            n,
            bits,
            block_size,
            accuracy_level,
        } = attrs;
        let kb = k.div_ceil(block_size.max(1));
        let fixed = |v: &Value| -> Vec<usize> {
            v.shape
                .iter()
                .map(|d| match d {
                    Dim::Fixed(x) => *x,
                    Dim::Symbol(_) => 0,
                })
                .collect()
        };
        let ar = a.shape.len();
        let ok = a.elem == ElemType::F32
            && ar >= 2
            && a.shape[ar - 1] == Dim::Fixed(k)
            && b.elem == ElemType::U8
            && fixed(b) == [n, kb, block_size * bits / 8]
            && scales.elem == ElemType::F32
            && fixed(scales) == [n, kb]
            && bias.is_none_or(|b| b.elem == ElemType::F32 && fixed(b) == [n]);
        if !ok {
            return Err(shape_error(
                "MatMulNBits",
                format!(
                    "{:?}{} x {:?}{} scales {} for K={k} N={n} bits={bits} block_size={block_size}",
                    a.elem,
                    fmt_shape(&a.shape),
                    b.elem,
                    fmt_shape(&b.shape),
                    fmt_shape(&scales.shape)
                ),
            ));
        }
        let batch: u64 = a.shape[..ar - 1]
            .iter()
            .map(|d| d.size_or_one() as u64)
            .product();
        let mut shape = a.shape.clone();
        shape[ar - 1] = Dim::Fixed(n);
        let int = |x: usize| Attr::Int(x as i64);
        let mut attributes = vec![
            ("K".to_string(), int(k)),
            ("N".to_string(), int(n)),
            ("bits".to_string(), int(bits)),
            ("block_size".to_string(), int(block_size)),
        ];
        if accuracy_level != 0 {
            attributes.push(("accuracy_level".to_string(), Attr::Int(accuracy_level)));
        }
        // Inputs 3 and 4 (zero points, g_idx) stay empty: the default zero point.
        let absent = Value {
            name: String::new(),
            elem: ElemType::F32,
            shape: Vec::new(),
        };
        let inputs: Vec<&Value> = match bias {
            Some(bias) => vec![a, b, scales, &absent, &absent, bias],
            None => vec![a, b, scales],
        };
        Ok(self.single(
            local,
            "MatMulNBits",
            &inputs,
            attributes,
            (ElemType::F32, shape),
            2 * batch * (k * n) as u64,
        ))
    }
}
