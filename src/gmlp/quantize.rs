//! Build-time int8 weight quantization for `--dtype int8`: symmetric, per output channel.
//! (`--dtype int4`'s block quantization is [`crate::onnx::nbits`].)
//!
//! A MatMul weight `W` is stored `[in, out]`; each output column `c` gets one scale
//! `s[c] = max_r |W[r, c]| / 127` and the stored values are `q = round(W / s)` clamped to
//! [−127, 127] (−128 is never used, so the grid is symmetric and a zero point of 0 is exact).
//! A column whose weights are all zero would give `s = 0` (and `W / s` = NaN): it gets
//! `s = 1` instead, which stores the zeros exactly; no NaN or infinity ever reaches the file.
//! Non-finite weights are refused before this point (`check_values`).
//!
//! At run time the graph quantizes each activation tensor on the fly
//! (`DynamicQuantizeLinear`: u8, per tensor, asymmetric), multiplies in integers
//! (`MatMulInteger`, i32 accumulators) and scales back with `x_scale · s[c]`.

/// Largest stored magnitude (the symmetric int8 grid is [−127, 127]).
pub const QMAX: f32 = 127.0;

/// Per-column scales of a row-major `[rows, cols]` matrix: `max |column| / 127`, or 1 for
/// an all-zero column (the documented fallback, so that no scale is 0).
pub fn column_scales(w: &[f32], cols: usize) -> Vec<f32> {
    let mut max = vec![0f32; cols];
    for row in w.chunks_exact(cols) {
        for (m, x) in max.iter_mut().zip(row) {
            *m = m.max(x.abs());
        }
    }
    max.into_iter().map(scale_for).collect()
}

/// The scale for a column whose largest magnitude is `max_abs`.
pub fn scale_for(max_abs: f32) -> f32 {
    let s = max_abs / QMAX;
    if s > 0.0 && s.is_finite() {
        s
    } else {
        1.0
    }
}

/// Quantizes a row-major `[rows, cols]` matrix with the given per-column scales; the
/// integers are returned as f32 (the writer stores them as int8).
pub fn quantize_columns(mut w: Vec<f32>, scales: &[f32]) -> Vec<f32> {
    let cols = scales.len();
    for row in w.chunks_exact_mut(cols) {
        for (x, s) in row.iter_mut().zip(scales) {
            *x = (*x / s).round().clamp(-QMAX, QMAX);
        }
    }
    w
}

/// Columns `[start, end)` of a row-major matrix with `cols` columns (in a recycled
/// buffer, `w`'s given back: [`crate::tensor::recycled`]).
pub fn column_range(w: Vec<f32>, cols: usize, start: usize, end: usize) -> Vec<f32> {
    let width = end - start;
    let mut out = crate::tensor::recycled::zeroed(w.len() / cols.max(1) * width);
    for (dst, row) in out.chunks_exact_mut(width.max(1)).zip(w.chunks_exact(cols)) {
        dst.copy_from_slice(&row[start..end]);
    }
    crate::tensor::recycled::give(w);
    out
}

pub use crate::tensor::transpose;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scales_are_per_column_and_zero_columns_fall_back_to_one() {
        // [3, 3]: column 0 max 2.54, column 1 all zero, column 2 max 1.27.
        let w = [2.54, 0.0, -1.27, -1.0, 0.0, 0.5, 0.0, 0.0, 1.0];
        let s = column_scales(&w, 3);
        assert!((s[0] - 0.02).abs() < 1e-7 && s[1] == 1.0 && (s[2] - 0.01).abs() < 1e-7);
        let q = quantize_columns(w.to_vec(), &s);
        assert_eq!(
            q,
            vec![127.0, 0.0, -127.0, -50.0, 0.0, 50.0, 0.0, 0.0, 100.0]
        );
    }

    #[test]
    fn round_trip_error_is_at_most_half_a_step() {
        let w: Vec<f32> = (0..64)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.013)
            .collect();
        let s = column_scales(&w, 8);
        let q = quantize_columns(w.clone(), &s);
        for (k, (x, qv)) in w.iter().zip(&q).enumerate() {
            assert!(qv.abs() <= QMAX && qv.fract() == 0.0);
            assert!((x - qv * s[k % 8]).abs() <= 0.5 * s[k % 8] + 1e-7);
        }
    }

    #[test]
    fn scale_is_never_zero_nan_or_infinite() {
        for m in [0.0, f32::MIN_POSITIVE / 1e3, f32::NAN, f32::INFINITY] {
            let s = scale_for(m);
            assert!(s > 0.0 && s.is_finite(), "{m} -> {s}");
        }
        let tiny = 1e-30f32;
        let q = quantize_columns(vec![tiny, -tiny], &[scale_for(tiny)]);
        assert!(q.iter().all(|v| v.is_finite()));
    }

    #[test]
    fn slicing_and_transposing() {
        let w: Vec<f32> = (0..6).map(|i| i as f32).collect(); // [2, 3]
        assert_eq!(column_range(w.clone(), 3, 1, 3), vec![1.0, 2.0, 4.0, 5.0]);
        assert_eq!(transpose(&w, 2, 3), vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
    }
}
