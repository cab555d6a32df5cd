//! Tensors as they go in and out of runtimes, NumPy files and checkpoints: an n-dimensional
//! array of one of the element types the tool exchanges (f32, f64, i32, i64), with a name.

use std::borrow::Cow;

use ndarray::ArrayD;

use crate::error::Result;

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
/// PyTorch `Linear.weight [out, in]` read as `[in, out]`.
pub fn transpose(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    assert_eq!(
        values.len(),
        rows * cols,
        "transpose: {rows} x {cols} values"
    );
    let mut out = recycled::zeroed(rows * cols);
    for (block, r0) in values
        .chunks(TRANSPOSE_ROWS * cols.max(1))
        .zip((0..).step_by(TRANSPOSE_ROWS))
    {
        transpose_block(block, r0, rows, cols, &mut out);
    }
    out
}

/// Where a producer of f32 values hands them: consecutive runs, in order, each a borrowed
/// slice (copied out in pieces the writer keeps in cache) or an owned vector (moved as it
/// is). A refusal from the sink stops the producer.
pub type F32Sink<'s> = dyn FnMut(Cow<'_, [f32]>) -> Result<()> + 's;

/// Floats in a run a producer hands on at once (512 KB; a strip of
/// [`transpose_in_strips`] is about as large): small enough to stay in cache until the
/// writer has copied it into the file.
pub const RUN: usize = 1 << 17;

/// The transpose (`cols × rows`, row-major) of a `rows × cols` row-major matrix whose row
/// parts `read(r, c0..c1, out)` writes into `out`, handed to `sink` a strip of output rows
/// at a time (about [`RUN`] floats): each strip built in cache from 16-row blocks, so the
/// transpose never goes through a full-size buffer (no fresh pages, one pass over memory).
pub fn transpose_in_strips(
    rows: usize,
    cols: usize,
    mut read: impl FnMut(usize, std::ops::Range<usize>, &mut [f32]),
    sink: &mut F32Sink<'_>,
) -> Result<()> {
    // Output rows per strip: a multiple of 16 (a 64-byte line of each input row).
    let width = (RUN / rows.max(1) / TRANSPOSE_ROWS * TRANSPOSE_ROWS).max(TRANSPOSE_ROWS);
    let mut strip = vec![0f32; width.min(cols) * rows];
    let mut block = vec![0f32; TRANSPOSE_ROWS * width.min(cols)];
    for c0 in (0..cols).step_by(width) {
        let c1 = (c0 + width).min(cols);
        let w = c1 - c0;
        let strip = &mut strip[..w * rows];
        for r0 in (0..rows).step_by(TRANSPOSE_ROWS) {
            let r1 = (r0 + TRANSPOSE_ROWS).min(rows);
            let block = &mut block[..(r1 - r0) * w];
            for (i, part) in block.chunks_exact_mut(w).enumerate() {
                read(r0 + i, c0..c1, part);
            }
            transpose_block(block, r0, rows, w, strip);
        }
        sink(Cow::Borrowed(strip))?;
    }
    Ok(())
}

/// Rows of the input a transpose reads at once: 16 f32 make one 64-byte line of each
/// output row, written whole while the 16 input rows stream through the cache.
pub const TRANSPOSE_ROWS: usize = 16;

/// The transpose of the `rows × cols` matrix whose rows `r0..r0 + n` the closure writes
/// (row-major, `n ≤ TRANSPOSE_ROWS`) into the buffer it is given: a stored tensor's bytes
/// decoded a block of rows at a time, each block transposed while it is in cache.
pub fn transpose_with(
    rows: usize,
    cols: usize,
    mut fill: impl FnMut(std::ops::Range<usize>, &mut [f32]),
) -> Vec<f32> {
    let mut out = recycled::zeroed(rows * cols);
    let mut block = vec![0f32; TRANSPOSE_ROWS * cols];
    for r0 in (0..rows).step_by(TRANSPOSE_ROWS) {
        let r1 = (r0 + TRANSPOSE_ROWS).min(rows);
        let block = &mut block[..(r1 - r0) * cols];
        fill(r0..r1, block);
        transpose_block(block, r0, rows, cols, &mut out);
    }
    out
}

/// Writes the rows `r0..` of a `rows × cols` matrix held in `block` (row-major, whole
/// rows) into their columns of `out`, the transpose.
fn transpose_block(block: &[f32], r0: usize, rows: usize, cols: usize, out: &mut [f32]) {
    if cols == 0 {
        return;
    }
    let n = block.len() / cols;
    for (c, column) in out.chunks_exact_mut(rows).enumerate() {
        for (value, row) in column[r0..r0 + n].iter_mut().zip(block.chunks_exact(cols)) {
            *value = row[c];
        }
    }
}

/// Weight buffers used again: the model writer gives each tensor's values back once they
/// are written, and the reads that produce the next tensor (decodes, transposes) take
/// them, so that a build's weights go through memory already mapped rather than fresh
/// pages faulted in one by one (amlp-base, 538 MB: 171k page faults and 1.4 s of kernel
/// time per build without it). A few buffers at most are kept, and none once a write ends.
pub mod recycled {
    use std::sync::Mutex;

    static POOL: Mutex<Vec<Vec<f32>>> = Mutex::new(Vec::new());
    /// Buffers kept at most (the writer's three tensors in flight, the matrices they are
    /// cut from, spares).
    const KEEP: usize = 8;
    /// Smaller buffers (1 MB) are not kept: the allocator reuses them itself.
    const SMALLEST: usize = 1 << 18;

    fn pool() -> std::sync::MutexGuard<'static, Vec<Vec<f32>>> {
        POOL.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `len` zeros, in the smallest kept buffer that holds them, else newly allocated.
    pub fn zeroed(len: usize) -> Vec<f32> {
        let found = {
            let mut pool = pool();
            let best = (0..pool.len())
                .filter(|&k| pool[k].capacity() >= len)
                .min_by_key(|&k| pool[k].capacity());
            best.map(|k| pool.swap_remove(k))
        };
        match found {
            Some(mut buffer) => {
                buffer.clear();
                buffer.resize(len, 0.0);
                buffer
            }
            None => vec![0f32; len],
        }
    }

    /// Keeps `buffer` for a later [`zeroed`] (in place of a smaller one when enough are
    /// kept).
    pub fn give(buffer: Vec<f32>) {
        if buffer.capacity() < SMALLEST {
            return;
        }
        let mut pool = pool();
        if pool.len() < KEEP {
            pool.push(buffer);
        } else if let Some(k) = (0..pool.len()).min_by_key(|&k| pool[k].capacity()) {
            if pool[k].capacity() < buffer.capacity() {
                pool[k] = buffer;
            }
        }
    }

    /// Frees every kept buffer.
    pub fn release_all() {
        pool().clear();
    }
}

/// The flat index of the first value of `values` that is not finite, if any: a scan
/// without branches (it vectorizes) over blocks, the offender located only on failure.
pub fn first_not_finite(values: &[f32]) -> Option<usize> {
    const BLOCK: usize = 4096;
    values
        .chunks(BLOCK)
        .enumerate()
        .find(|(_, c)| !c.iter().fold(true, |ok, v| ok & v.is_finite()))
        .and_then(|(b, c)| c.iter().position(|v| !v.is_finite()).map(|k| b * BLOCK + k))
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
    use super::{first_not_finite, transpose, transpose_in_strips, transpose_with};

    /// Tiled as it is, the transpose is the element-by-element one, at sizes on and off the
    /// tile (1, 31, 32, 33, 70) and across strips (9000 × 40).
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
            // Several strips of 16 output rows, the last one short.
            (9000, 40),
        ] {
            let values: Vec<f32> = (0..rows * cols).map(|k| k as f32 * 0.5 - 7.0).collect();
            let mut plain = vec![0f32; rows * cols];
            for r in 0..rows {
                for c in 0..cols {
                    plain[c * rows + r] = values[r * cols + c];
                }
            }
            assert_eq!(transpose(&values, rows, cols), plain, "{rows} x {cols}");
            let filled = transpose_with(rows, cols, |at, block| {
                block.copy_from_slice(&values[at.start * cols..at.end * cols])
            });
            assert_eq!(filled, plain, "{rows} x {cols}, filled by blocks");
            let mut strips = Vec::new();
            transpose_in_strips(
                rows,
                cols,
                |r, at, part| part.copy_from_slice(&values[r * cols + at.start..r * cols + at.end]),
                &mut |run| {
                    strips.extend_from_slice(&run);
                    Ok(())
                },
            )
            .unwrap();
            assert_eq!(strips, plain, "{rows} x {cols}, in strips");
        }
    }

    #[test]
    fn the_first_value_not_finite_is_found_in_any_block() {
        let mut values = vec![1.5f32; 10_000];
        assert_eq!(first_not_finite(&values), None);
        for (k, bad) in [
            (9_999, f32::NAN),
            (4_096, f32::INFINITY),
            (3, f32::NEG_INFINITY),
        ] {
            values[k] = bad;
            assert_eq!(first_not_finite(&values), Some(k));
        }
        assert_eq!(first_not_finite(&[]), None);
    }
}
