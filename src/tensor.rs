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

/// The `rows × cols` row-major matrix `values` transposed (`cols × rows`, row-major): a
/// PyTorch `Linear.weight [out, in]` read as `[in, out]` ([`transpose_with`]).
pub fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(
        values.len(),
        rows * cols,
        "transpose: {rows} x {cols} values"
    );
    transpose_with(rows, cols, |k| values[k])
}

/// The transpose of the `rows × cols` row-major matrix whose element at flat index `k`
/// is `element(k)` (a stored tensor's bytes decoded where they lie), in tiles of 32 × 32:
/// each output row of a tile is written in one run while the tile's input rows stay in
/// cache (the 32000 × 512 head of amlp-base in one pass).
pub fn transpose_with(rows: usize, cols: usize, element: impl Fn(usize) -> f32) -> Vec<f32> {
    const TILE: usize = 32;
    let mut out = vec![0f32; rows * cols];
    for r0 in (0..rows).step_by(TILE) {
        let r1 = (r0 + TILE).min(rows);
        for c0 in (0..cols).step_by(TILE) {
            for c in c0..(c0 + TILE).min(cols) {
                let run = &mut out[c * rows + r0..c * rows + r1];
                for (value, r) in run.iter_mut().zip(r0..r1) {
                    *value = element(r * cols + c);
                }
            }
        }
    }
    out
}

/// A named tensor: a model input or output.
#[derive(Clone, Debug, PartialEq)]
pub struct NamedTensor {
    /// Input or output name in the graph.
    pub name: String,
    /// Contents.
    pub value: TensorValue,
}

#[cfg(test)]
mod transpose_tests {
    use super::transpose;

    /// Tiled as it is, the transpose is the element-by-element one, at sizes on and off the
    /// tile (1, 31, 32, 33, 70).
    #[test]
    fn the_tiled_transpose_is_the_plain_one() {
        for (rows, cols) in [
            (1, 1),
            (1, 70),
            (70, 1),
            (31, 33),
            (32, 32),
            (33, 70),
            (70, 33),
        ] {
            let values: Vec<f32> = (0..rows * cols).map(|k| k as f32 * 0.5 - 7.0).collect();
            let mut plain = vec![0f32; rows * cols];
            for r in 0..rows {
                for c in 0..cols {
                    plain[c * rows + r] = values[r * cols + c];
                }
            }
            assert_eq!(transpose(&values, rows, cols), plain, "{rows} x {cols}");
        }
    }
}
