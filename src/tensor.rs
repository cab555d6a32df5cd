//! Tensors as they go in and out of runtimes, NumPy files and checkpoints: an n-dimensional
//! array of one of the element types the tool exchanges (f32, f64, i32, i64), with a name.

use ndarray::ArrayD;

/// `with_array!(value, a => expr)`: `expr` evaluated with `a` bound to the array inside a
/// [`TensorValue`] (or a reference to one), whatever its element type, for the code that
/// treats every element type alike (handing arrays to a runtime, reading shapes).
macro_rules! with_array {
    ($value:expr, $a:ident => $body:expr) => {
        match $value {
            $crate::tensor::TensorValue::F32($a) => $body,
            $crate::tensor::TensorValue::F64($a) => $body,
            $crate::tensor::TensorValue::I32($a) => $body,
            $crate::tensor::TensorValue::I64($a) => $body,
        }
    };
}
pub(crate) use with_array;

/// Tensor contents exchanged with runtimes.
#[derive(Clone, Debug, PartialEq)]
pub enum TensorValue {
    /// f32 tensor (ONNX `FLOAT`).
    F32(ArrayD<f32>),
    /// f64 tensor (ONNX `DOUBLE`).
    F64(ArrayD<f64>),
    /// i32 tensor (ONNX `INT32`).
    I32(ArrayD<i32>),
    /// i64 tensor (ONNX `INT64`).
    I64(ArrayD<i64>),
}

impl TensorValue {
    /// The shape.
    pub fn shape(&self) -> &[usize] {
        with_array!(self, a => a.shape())
    }
    /// The NumPy name of the element type (`float32`, `float64`, `int32`, `int64`).
    pub fn dtype(&self) -> &'static str {
        match self {
            TensorValue::F32(_) => "float32",
            TensorValue::F64(_) => "float64",
            TensorValue::I32(_) => "int32",
            TensorValue::I64(_) => "int64",
        }
    }
    /// The values as f64 (for comparisons), row-major.
    pub fn to_f64(&self) -> Vec<f64> {
        match self {
            TensorValue::F32(a) => a.iter().map(|&v| f64::from(v)).collect(),
            TensorValue::F64(a) => a.iter().copied().collect(),
            TensorValue::I32(a) => a.iter().map(|&v| f64::from(v)).collect(),
            TensorValue::I64(a) => a.iter().map(|&v| v as f64).collect(),
        }
    }
}

/// A named tensor: a model input or output.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedTensor {
    /// Input or output name in the graph.
    pub name: String,
    /// Contents.
    pub value: TensorValue,
}
