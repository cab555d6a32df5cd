//! Toeplitz spatial weights (paper §4 and appendix C; docs/design.md, "Toeplitz spatial
//! weights"): `W[i, j] = w[j − i + n − 1]` with 2n − 1 parameters w, expanded to a dense
//! matrix or gathered through an index table; the least-squares fit that accepts a dense W
//! as Toeplitz; the causal mask of W; and how much of a learned W is Toeplitz
//! ([`ToeplitzEnergy`]).

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

/// How much of a matrix W is Toeplitz (shift-invariant: `W[i, j]` a function of `j − i`
/// alone), over the cells a model reads.
///
/// The nearest Toeplitz matrix in the Frobenius norm, T(W), replaces every cell by the mean
/// of its diagonal `j − i = k` (the least-squares fit, as [`toeplitz_fit`]). The
/// *Toeplitz-ness* is the share of W's energy that T(W) keeps,
/// `‖T(W)‖² / ‖W‖² = Σ_k (Σ_{j−i=k} W[i, j])² / c_k  ÷  Σ W[i, j]²`
/// (c_k cells on diagonal k), in [0, 1] because T is an orthogonal projection: 1 exactly
/// when W is Toeplitz (including the zero matrix), and for i.i.d. zero-mean entries about
/// D / C, the number of diagonals over the number of cells ([`Self::random_level`]:
/// (2n − 1)/n² for a full n×n matrix). A constant offset is Toeplitz too: a W with a large
/// mean scores high whatever its fluctuations are.
///
/// Cells a model never reads (above the diagonal of a causal W, past a window) are left out
/// of both sums: they are structurally zero and say nothing about what was learned. For a
/// causal n×n W this gives the same number as counting them as zeros, because each
/// diagonal lies wholly inside or wholly outside the triangle. Rectangular matrices (a
/// local window's [w, 2w]) use the same diagonals `j − i = k`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ToeplitzEnergy {
    /// ‖T(W)‖² over the read cells.
    pub toeplitz: f64,
    /// ‖W‖² over the read cells.
    pub total: f64,
    /// Read cells.
    pub cells: usize,
    /// Diagonals with at least one read cell.
    pub diagonals: usize,
}

impl ToeplitzEnergy {
    /// The energies of a row-major `[rows, cols]` matrix over the cells where
    /// `read(i, j)`; `None` when a read value is not finite.
    pub fn of(
        w: &[f32],
        rows: usize,
        cols: usize,
        read: impl Fn(usize, usize) -> bool,
    ) -> Option<Self> {
        // Diagonal k = j − i + rows − 1 ∈ [0, rows + cols − 1).
        let mut sums = vec![0f64; rows + cols - 1];
        let mut counts = vec![0usize; rows + cols - 1];
        let mut e = ToeplitzEnergy::default();
        for i in 0..rows {
            for j in 0..cols {
                if !read(i, j) {
                    continue;
                }
                let v = f64::from(w[i * cols + j]);
                if !v.is_finite() {
                    return None;
                }
                let k = j + rows - 1 - i;
                sums[k] += v;
                counts[k] += 1;
                e.total += v * v;
                e.cells += 1;
            }
        }
        for (s, &c) in sums.iter().zip(&counts) {
            if c > 0 {
                e.toeplitz += s * s / c as f64;
                e.diagonals += 1;
            }
        }
        Some(e)
    }

    /// Both energies of two matrices together (the gating heads of one block).
    pub fn plus(self, other: Self) -> Self {
        ToeplitzEnergy {
            toeplitz: self.toeplitz + other.toeplitz,
            total: self.total + other.total,
            cells: self.cells + other.cells,
            diagonals: self.diagonals + other.diagonals,
        }
    }

    /// The Toeplitz-ness ‖T(W)‖² / ‖W‖² in [0, 1]; 1 for a zero matrix (which is Toeplitz).
    pub fn share(&self) -> f64 {
        if self.total > 0.0 {
            (self.toeplitz / self.total).clamp(0.0, 1.0)
        } else {
            1.0
        }
    }

    /// What an i.i.d. zero-mean W of the same cells scores on average: diagonals / cells
    /// (0 when no cell is read).
    pub fn random_level(&self) -> f64 {
        if self.cells == 0 {
            0.0
        } else {
            self.diagonals as f64 / self.cells as f64
        }
    }
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

    #[test]
    fn a_toeplitz_matrix_scores_one_and_a_random_one_about_diagonals_over_cells() {
        let n = 24;
        let w: Vec<f32> = (0..2 * n - 1).map(|k| ((k * 7) % 5) as f32 - 2.0).collect();
        let t = ToeplitzEnergy::of(&toeplitz_expand(&w, n), n, n, |_, _| true).unwrap();
        assert!((t.share() - 1.0).abs() < 1e-12, "{t:?}");
        assert_eq!((t.cells, t.diagonals), (n * n, 2 * n - 1));
        // I.i.d. uniform entries: E‖T(W)‖² / E‖W‖² = (2n − 1)/n² (≈ 0.082 for n = 24).
        let mut rng = crate::rng::SplitMix64::keyed(3, "toeplitz-ness");
        let mut shares = Vec::new();
        for _ in 0..50 {
            let dense = rng.uniform_f32(n * n, -1.0, 1.0);
            shares.push(
                ToeplitzEnergy::of(&dense, n, n, |_, _| true)
                    .unwrap()
                    .share(),
            );
        }
        let mean = shares.iter().sum::<f64>() / shares.len() as f64;
        let level = (2 * n - 1) as f64 / (n * n) as f64;
        assert!((mean - level).abs() < 0.2 * level, "{mean} vs {level}");
        assert!(shares.iter().all(|&s| s < 0.2), "{shares:?}");
    }

    #[test]
    fn toeplitz_ness_is_the_energy_of_the_diagonal_means() {
        // [[1, 2], [3, 4]]: diagonals {3}, {1, 4}, {2}; T = [[2.5, 2], [3, 2.5]].
        let e = ToeplitzEnergy::of(&[1.0, 2.0, 3.0, 4.0], 2, 2, |_, _| true).unwrap();
        assert_eq!(e.total, 30.0);
        assert_eq!(e.toeplitz, 9.0 + 12.5 + 4.0);
        assert!((e.share() - 25.5 / 30.0).abs() < 1e-15);
        // The zero matrix is Toeplitz; a non-finite value has no score.
        assert_eq!(
            ToeplitzEnergy::of(&[0.0; 4], 2, 2, |_, _| true)
                .unwrap()
                .share(),
            1.0
        );
        assert!(ToeplitzEnergy::of(&[f32::NAN, 0.0], 1, 2, |_, _| true).is_none());
        // ...unless the model never reads it.
        assert!(ToeplitzEnergy::of(&[1.0, f32::NAN], 1, 2, |_, j| j == 0).is_some());
    }

    #[test]
    fn unread_cells_are_left_out_and_heads_add_up() {
        // A causal Toeplitz W with garbage above the diagonal scores 1 over the read cells,
        // and the same as its masked copy.
        let n = 6;
        let w: Vec<f32> = (0..2 * n - 1).map(|k| k as f32 - 4.0).collect();
        let mut dense = toeplitz_expand(&w, n);
        dense[1] = 50.0;
        let causal = |i: usize, j: usize| j <= i;
        let read = ToeplitzEnergy::of(&dense, n, n, causal).unwrap();
        assert!((read.share() - 1.0).abs() < 1e-12);
        assert_eq!((read.cells, read.diagonals), (n * (n + 1) / 2, n));
        mask_upper(&mut dense, n);
        let zeros = ToeplitzEnergy::of(&dense, n, n, |_, _| true).unwrap();
        assert!((zeros.share() - read.share()).abs() < 1e-12);
        // Rectangular: a [2, 4] window matrix, constant along j − i.
        let band = [1.0, 2.0, 3.0, 4.0, 0.0, 1.0, 2.0, 3.0];
        let e = ToeplitzEnergy::of(&band, 2, 4, |_, _| true).unwrap();
        assert!((e.share() - 1.0).abs() < 1e-12 && e.diagonals == 5);
        // Two heads: the energies add, so the block's score weighs heads by energy.
        let both = e.plus(ToeplitzEnergy::of(&[1.0, 2.0, 3.0, 4.0], 2, 2, |_, _| true).unwrap());
        assert!((both.share() - (e.toeplitz + 25.5) / (e.total + 30.0)).abs() < 1e-15);
    }
}
