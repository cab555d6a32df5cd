//! The spatial weights W of each block of a file `gmlp-onnx build` wrote (paper eq. 2,
//! `f(Z) = W·Z + b` over the n tokens), read back from the initializers the emitter names
//! after [`crate::gmlp::weights`], with the cells each block reads, and how Toeplitz
//! (shift-invariant) they are ([`ToeplitzEnergy`]).
//!
//! Stored forms, all brought to the matrix the block multiplies by, `[heads, rows, cols]`:
//! - `dense` / `toeplitz-expand`: `blocks.{i}.sgu.spatial.weight` [h?, n, n] (f32 or f16);
//! - `toeplitz-gather`: the vector w [h?, 2n − 1], expanded `W[i, j] = w[j − i + n − 1]`;
//! - `window`: g-mlp-gpt's `CausalLocalSGU` weight [h?, w, 2w] (stored flat), row i of a
//!   window of w reading the previous window (j < w) and its own (j ≥ w);
//! - a global block with an axial fold: [h?, n, n] stored flat;
//! - `int8`: `….weight.transposed.int8` Wᵀ [h?, n, n] with per-column scales
//!   `….weight.transposed.scale` [h?, 1, n] (see `crate::gmlp::quantize`), dequantized.
//!
//! Read cells: every cell of a non-causal W; `j ≤ i` of a causal one; with a fold of e,
//! only the first m = ⌈n/e⌉ rows and columns (the sub-sequences are m long); with a window
//! w, `j ≤ i + w`, and the previous window (j < w) only for rows that have one (i + w < m).

mod read;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::gmlp::toeplitz::{toeplitz_expand, ToeplitzEnergy};

pub use read::{recorded_config, spatial_weights};

/// Most values a Toeplitz vector is expanded to for a picture (heads × n × n); a stored
/// dense matrix is as large as the file already holds.
pub const MAX_EXPANDED: u64 = 1 << 26;

/// How a block's W is stored.
#[derive(Clone, Debug)]
enum Values {
    /// The matrix itself, `[heads, rows, cols]`.
    Matrix(Vec<f32>),
    /// Toeplitz vectors `[heads, 2n − 1]`.
    Vector(Vec<f32>),
}

/// One block's W.
#[derive(Clone, Debug)]
pub struct SpatialWeights {
    /// Block index.
    pub block: usize,
    /// Gating heads (each with its own W).
    pub heads: usize,
    /// Rows of each head's W (output tokens).
    pub rows: usize,
    /// Columns (input tokens; 2w for a window).
    pub cols: usize,
    /// The stored form: `dense`, `toeplitz-expand`, `toeplitz-gather`, `window`, `int8`.
    pub stored: &'static str,
    /// The initializer read.
    pub initializer: String,
    /// Its element type (NumPy name).
    pub dtype: String,
    /// Causal block (j ≤ i).
    pub causal: bool,
    /// Local window w.
    pub window: Option<usize>,
    /// Axial fold e (1: none).
    pub fold: usize,
    /// Sub-sequence length m = ⌈n / fold⌉.
    sub: usize,
    values: Values,
}

/// What `inspect` reports of one block's W.
#[derive(Clone, Debug, Serialize)]
pub struct SpatialSummary {
    /// Block index.
    pub block: usize,
    /// `[heads, rows, cols]` of W as the block applies it.
    pub shape: Vec<usize>,
    /// The stored form (see the module doc).
    pub stored: String,
    /// The initializer holding it.
    pub initializer: String,
    /// Its element type.
    pub dtype: String,
    /// Which cells the block reads, in words.
    pub reads: String,
    /// ‖T(W)‖² / ‖W‖² over the read cells of every head (`null` when a value is not
    /// finite); see [`ToeplitzEnergy`].
    pub toeplitz_ness: Option<f64>,
    /// The same per head.
    pub head_toeplitz_ness: Vec<Option<f64>>,
    /// What an i.i.d. zero-mean W of the same read cells scores on average.
    pub random_level: f64,
    /// The largest finite |W| over the read cells.
    pub max_abs: f64,
    /// The mean of W over the read cells of every head (a constant offset is Toeplitz, so a
    /// large mean alone gives a high Toeplitz-ness; `null` when a value is not finite).
    pub mean: Option<f64>,
}

impl SpatialWeights {
    /// True when the block reads cell (i, j) of its W (see the module doc).
    pub fn reads(&self, i: usize, j: usize) -> bool {
        let m = self.sub;
        match self.window {
            Some(w) => j <= i + w && ((i < m && j >= w) || i + w < m),
            None => i < m && j < m && (!self.causal || j <= i),
        }
    }

    /// The read cells in words.
    pub fn reads_text(&self) -> String {
        let mut parts = Vec::new();
        if let Some(w) = self.window {
            parts.push(format!(
                "window {w}: j <= i + {w} (j < {w}: the previous window)"
            ));
        } else if self.causal {
            parts.push("causal: j <= i".to_string());
        } else {
            parts.push("all".to_string());
        }
        if self.fold > 1 {
            parts.push(format!(
                "fold {}: sub-sequences of {} positions",
                self.fold, self.sub
            ));
        }
        parts.join(", ")
    }

    /// The Toeplitz energies of head `h` over the read cells (`None`: a value is not finite).
    pub fn energy(&self, h: usize) -> Option<ToeplitzEnergy> {
        match &self.values {
            Values::Matrix(v) => {
                let len = self.rows * self.cols;
                ToeplitzEnergy::of(&v[h * len..(h + 1) * len], self.rows, self.cols, |i, j| {
                    self.reads(i, j)
                })
            }
            Values::Vector(v) => {
                // W[i, j] = w[j − i + n − 1] is Toeplitz: T(W) = W, each diagonal k holding
                // n − |k − (n − 1)| cells (the causal part only, k ≤ n − 1, when causal).
                let n = self.rows;
                let w = &v[h * (2 * n - 1)..(h + 1) * (2 * n - 1)];
                let mut e = ToeplitzEnergy::default();
                for (k, &x) in w.iter().enumerate() {
                    if self.causal && k > n - 1 {
                        continue;
                    }
                    let x = f64::from(x);
                    if !x.is_finite() {
                        return None;
                    }
                    let c = n - k.abs_diff(n - 1);
                    e.total += c as f64 * x * x;
                    e.cells += c;
                    e.diagonals += 1;
                }
                e.toeplitz = e.total;
                Some(e)
            }
        }
    }

    /// Head `h`'s W as a row-major `[rows, cols]` matrix (a Toeplitz vector expanded).
    pub fn matrix(&self, h: usize) -> Result<Vec<f32>> {
        match &self.values {
            Values::Matrix(v) => {
                let len = self.rows * self.cols;
                Ok(v[h * len..(h + 1) * len].to_vec())
            }
            Values::Vector(v) => {
                self.check_expandable()?;
                let n = self.rows;
                Ok(toeplitz_expand(
                    &v[h * (2 * n - 1)..(h + 1) * (2 * n - 1)],
                    n,
                ))
            }
        }
    }

    /// Refuses a Toeplitz vector whose matrices would hold more than [`MAX_EXPANDED`]
    /// values (a stored matrix is as large as the file already is).
    pub fn check_expandable(&self) -> Result<()> {
        let total = (self.heads as u64)
            .saturating_mul(self.rows as u64)
            .saturating_mul(self.cols as u64);
        if matches!(self.values, Values::Vector(_)) && total > MAX_EXPANDED {
            return Err(Error::TooLarge(format!(
                "block {}: W expands to {total} values, more than the {MAX_EXPANDED} a picture is drawn from",
                self.block
            )));
        }
        Ok(())
    }

    /// The row-major mask of read cells, `[rows, cols]`.
    pub fn read_mask(&self) -> Vec<bool> {
        (0..self.rows)
            .flat_map(|i| (0..self.cols).map(move |j| (i, j)))
            .map(|(i, j)| self.reads(i, j))
            .collect()
    }

    /// The report of this block.
    pub fn summary(&self) -> SpatialSummary {
        let heads: Vec<Option<ToeplitzEnergy>> = (0..self.heads).map(|h| self.energy(h)).collect();
        let all = heads
            .iter()
            .copied()
            .try_fold(ToeplitzEnergy::default(), |acc, e| e.map(|e| acc.plus(e)));
        let max_abs = match &self.values {
            Values::Matrix(v) => {
                let len = self.rows * self.cols;
                (0..v.len())
                    .filter(|&c| self.reads((c % len) / self.cols, c % self.cols))
                    .map(|c| f64::from(v[c]))
                    .filter(|x| x.is_finite())
                    .fold(0f64, |m, x| m.max(x.abs()))
            }
            Values::Vector(v) => {
                let n = self.rows;
                v.iter()
                    .enumerate()
                    .filter(|(k, _)| !self.causal || k % (2 * n - 1) < n)
                    .map(|(_, &x)| f64::from(x))
                    .filter(|x| x.is_finite())
                    .fold(0f64, |m, x| m.max(x.abs()))
            }
        };
        let mean = all.map(|e| {
            let sum: f64 = (0..self.heads).map(|h| self.read_sum(h)).sum();
            if e.cells == 0 {
                0.0
            } else {
                sum / e.cells as f64
            }
        });
        SpatialSummary {
            block: self.block,
            shape: vec![self.heads, self.rows, self.cols],
            stored: self.stored.to_string(),
            initializer: self.initializer.clone(),
            dtype: self.dtype.clone(),
            reads: self.reads_text(),
            toeplitz_ness: all.map(|e| e.share()),
            head_toeplitz_ness: heads.iter().map(|e| e.map(|e| e.share())).collect(),
            random_level: heads
                .iter()
                .flatten()
                .next()
                .map_or(0.0, ToeplitzEnergy::random_level),
            max_abs,
            mean,
        }
    }

    /// The sum of head `h`'s W over the read cells.
    fn read_sum(&self, h: usize) -> f64 {
        match &self.values {
            Values::Matrix(v) => {
                let len = self.rows * self.cols;
                (0..len)
                    .filter(|&c| self.reads(c / self.cols, c % self.cols))
                    .map(|c| f64::from(v[h * len + c]))
                    .sum()
            }
            Values::Vector(v) => {
                let n = self.rows;
                let w = &v[h * (2 * n - 1)..(h + 1) * (2 * n - 1)];
                w.iter()
                    .enumerate()
                    .filter(|(k, _)| !self.causal || *k < n)
                    .map(|(k, &x)| (n - k.abs_diff(n - 1)) as f64 * f64::from(x))
                    .sum()
            }
        }
    }
}

/// The `spatial` lines of the text report, one per block.
pub fn spatial_lines(blocks: &[SpatialSummary]) -> String {
    let score = |s: Option<f64>| {
        s.map_or("n/a (a value is not finite)".to_string(), |v| {
            format!("{v:.3}")
        })
    };
    let mut out = String::new();
    for b in blocks {
        let heads = if b.head_toeplitz_ness.len() > 1 {
            let each: Vec<String> = b.head_toeplitz_ness.iter().map(|&s| score(s)).collect();
            format!(" (heads {})", each.join(", "))
        } else {
            String::new()
        };
        let shape = if b.shape[0] > 1 {
            format!("{} x [{}, {}]", b.shape[0], b.shape[1], b.shape[2])
        } else {
            format!("[{}, {}]", b.shape[1], b.shape[2])
        };
        let form = if b.stored == b.dtype {
            b.stored.clone()
        } else {
            format!("{} {}", b.stored, b.dtype)
        };
        out += &format!(
            "spatial     block {}: W {shape} {form}, reads {}; Toeplitz-ness {}{heads}, i.i.d. random ~{:.3}; max|W| {}, mean {}\n",
            b.block,
            b.reads,
            score(b.toeplitz_ness),
            b.random_level,
            crate::plot::number(b.max_abs),
            b.mean.map_or("n/a".into(), crate::plot::number)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weights(n: usize, window: Option<usize>, fold: usize, causal: bool) -> SpatialWeights {
        let (rows, cols) = window.map_or((n, n), |w| (w, 2 * w));
        SpatialWeights {
            block: 0,
            heads: 1,
            rows,
            cols,
            stored: "dense",
            initializer: String::new(),
            dtype: "float32".into(),
            causal,
            window,
            fold,
            sub: n.div_ceil(fold),
            values: Values::Matrix(vec![1.0; rows * cols]),
        }
    }

    /// The cells of W a block reads, by enumerating positions as the emitter's index maps
    /// do (the formulas of the local-mixing emitter: sub-positions t' = t div e, residues
    /// equal, s ≤ t; a window's j = s' − (t' div w − 1)·w ≥ 0).
    fn enumerated(n: usize, window: Option<usize>, fold: usize, causal: bool) -> Vec<bool> {
        let (rows, cols) = window.map_or((n, n), |w| (w, 2 * w));
        let mut read = vec![false; rows * cols];
        for t in 0..n {
            for s in 0..n {
                if (causal && s > t) || t % fold != s % fold {
                    continue;
                }
                let (tp, sp) = (t / fold, s / fold);
                let (i, j) = match window {
                    None => (tp as i64, sp as i64),
                    Some(w) => {
                        let w = w as i64;
                        let j = sp as i64 - (tp as i64 / w - 1) * w;
                        (tp as i64 % w, j)
                    }
                };
                if j >= 0 && (j as usize) < cols {
                    read[i as usize * cols + j as usize] = true;
                }
            }
        }
        read
    }

    #[test]
    fn read_cells_match_the_positions_a_block_mixes() {
        for (n, window, fold, causal) in [
            (7, None, 1, false),
            (7, None, 1, true),
            (32, None, 3, true),
            (10, None, 4, true),
            (32, Some(8), 1, true),
            (32, Some(8), 2, true),
            (20, Some(8), 3, true),
            (9, Some(4), 5, true),
        ] {
            let w = weights(n, window, fold, causal);
            assert_eq!(
                w.read_mask(),
                enumerated(n, window, fold, causal),
                "n {n} window {window:?} fold {fold}"
            );
        }
    }

    #[test]
    fn a_toeplitz_vector_scores_one_without_being_expanded() {
        let n = 5;
        let v: Vec<f32> = (0..2 * n - 1).map(|k| k as f32 - 3.0).collect();
        let mut w = weights(n, None, 1, true);
        w.values = Values::Vector(v.clone());
        let e = w.energy(0).unwrap();
        let dense = toeplitz_expand(&v, n);
        let expected = ToeplitzEnergy::of(&dense, n, n, |i, j| j <= i).unwrap();
        assert!((e.total - expected.total).abs() < 1e-9);
        assert_eq!((e.cells, e.diagonals), (expected.cells, expected.diagonals));
        assert_eq!(w.summary().toeplitz_ness, Some(1.0));
        assert_eq!(w.matrix(0).unwrap(), dense);
        assert_eq!(w.summary().max_abs, 3.0); // causal part: w[0..=4] = −3..=1
        let mean = dense
            .iter()
            .enumerate()
            .filter(|(c, _)| c % n <= c / n)
            .map(|(_, &x)| f64::from(x))
            .sum::<f64>()
            / 15.0;
        assert!((w.summary().mean.unwrap() - mean).abs() < 1e-12);
        // Too large to expand for a picture, though its score needs no expansion.
        let big = 10_000;
        w.rows = big;
        w.cols = big;
        w.sub = big;
        w.values = Values::Vector(vec![0.5; 2 * big - 1]);
        assert_eq!(w.summary().toeplitz_ness, Some(1.0));
        let err = w.matrix(0).unwrap_err();
        assert!(matches!(err, Error::TooLarge(_)), "{err:?}");
    }
}
