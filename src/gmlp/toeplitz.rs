//! Toeplitz spatial weights (paper §4 and appendix C; docs/design.md, "Toeplitz spatial
//! weights"): `W[i, j] = w[j − i + n − 1]` with 2n − 1 parameters w, expanded to a dense
//! matrix or gathered through an index table; the least-squares fit that accepts a dense W
//! as Toeplitz; and the causal mask of W.

/// Toeplitz expansion `W[i, j] = w[j − i + n − 1]` (paper appendix C), row-major [n, n].
pub fn toeplitz_expand(w: &[f32], n: usize) -> Vec<f32> {
    let mut out = Vec::with_capacity(n * n);
    for i in 0..n {
        // Row i reads w[n-1-i ..= 2n-2-i] in order.
        out.extend_from_slice(&w[n - 1 - i..2 * n - 1 - i]);
    }
    out
}

/// The int64 index table `idx[i][j] = j − i + n − 1` such that `Gather(w, idx)` = W.
pub fn toeplitz_index(n: usize) -> Vec<i64> {
    let n = n as i64;
    (0..n)
        .flat_map(|i| (0..n).map(move |j| j - i + n - 1))
        .collect()
}

/// Zeroes the strictly upper triangle (j > i) of a row-major [n, n] matrix.
pub fn mask_upper(w: &mut [f32], n: usize) {
    for i in 0..n {
        w[i * n + i + 1..(i + 1) * n].fill(0.0);
    }
}

/// Least-squares Toeplitz fit of a dense [n, n] matrix: the mean of each diagonal, the
/// largest deviation from it, and max|W| (entries above the diagonal are left out, and
/// set to 0, when `causal`).
pub fn toeplitz_fit(w: &[f32], n: usize, causal: bool) -> (Vec<f32>, f32, f32) {
    let mut vector = vec![0f32; 2 * n - 1];
    let (mut deviation, mut scale) = (0f32, 0f32);
    for (k, slot) in vector.iter_mut().enumerate() {
        let offset = k as i64 - (n as i64 - 1);
        if causal && offset > 0 {
            continue;
        }
        let cells: Vec<f32> = (0..n as i64)
            .filter_map(|i| {
                let j = i + offset;
                (0..n as i64)
                    .contains(&j)
                    .then(|| w[i as usize * n + j as usize])
            })
            .collect();
        let mean = (cells.iter().map(|&v| f64::from(v)).sum::<f64>() / cells.len() as f64) as f32;
        for v in &cells {
            deviation = deviation.max((v - mean).abs());
            scale = scale.max(v.abs());
        }
        *slot = mean;
    }
    (vector, deviation, scale)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expand_and_gather_index_build_the_same_matrix() {
        let n = 4;
        let w: Vec<f32> = (0..2 * n - 1).map(|k| k as f32).collect();
        let dense = toeplitz_expand(&w, n);
        let gathered: Vec<f32> = toeplitz_index(n).iter().map(|&k| w[k as usize]).collect();
        assert_eq!(dense, gathered);
        // W[i, j] = w[j − i + n − 1]: the diagonal is w[n − 1], the top-right corner w[2n − 2].
        assert_eq!(dense[0], 3.0);
        assert_eq!(dense[n - 1], 6.0);
        assert_eq!(dense[(n - 1) * n], 0.0);
    }

    #[test]
    fn fitting_recovers_a_toeplitz_matrix_and_measures_deviation() {
        let n = 5;
        let w: Vec<f32> = (0..2 * n - 1).map(|k| (k as f32 - 3.0) * 0.25).collect();
        let mut dense = toeplitz_expand(&w, n);
        let (fit, deviation, scale) = toeplitz_fit(&dense, n, false);
        assert_eq!(fit, w);
        assert_eq!(deviation, 0.0);
        assert_eq!(scale, 1.25);
        dense[2 * n + 1] += 0.1; // one cell off its diagonal (offset −1)
        let (_, deviation, _) = toeplitz_fit(&dense, n, false);
        assert!((deviation - 0.075).abs() < 1e-6, "{deviation}");
    }

    #[test]
    fn causal_fit_ignores_and_zeroes_the_upper_triangle() {
        let n = 3;
        let w = vec![1.0, 2.0, 3.0, 4.0, 5.0];
        let mut dense = toeplitz_expand(&w, n);
        dense[1] = 99.0; // above the diagonal: a causal model never reads it
        let (fit, deviation, _) = toeplitz_fit(&dense, n, true);
        assert_eq!(fit, vec![1.0, 2.0, 3.0, 0.0, 0.0]);
        assert_eq!(deviation, 0.0);
        let mut m = toeplitz_expand(&w, n);
        mask_upper(&mut m, n);
        assert_eq!(m, vec![3.0, 0.0, 0.0, 2.0, 3.0, 0.0, 1.0, 2.0, 3.0]);
    }
}
