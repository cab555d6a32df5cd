//! Histograms on a logarithmic axis, for non-negative quantities that span many decades
//! (relative errors between runtimes: most at f32 rounding level, a near-miss decades above).
//!
//! Bin `k` covers `[10^(k/p), 10^((k+1)/p))` with `p` bins per decade; exact zeros and
//! non-finite values are counted apart (they have no place on a log axis).

/// Most decades one histogram spans: smaller positive values are counted in its first bin
/// (and in [`LogHistogram::clipped`]).
pub const MAX_DECADES: i32 = 16;

/// Counts of values per logarithmic bin.
#[derive(Clone, Debug, PartialEq)]
pub struct LogHistogram {
    /// Bins per decade.
    pub per_decade: u32,
    /// Index of the first bin: it starts at `10^(first / per_decade)`.
    pub first: i32,
    /// Values per bin, from `first` on; empty when no value is positive and finite.
    pub counts: Vec<u64>,
    /// Values that are exactly zero.
    pub zeros: u64,
    /// Values that are NaN or infinite.
    pub not_finite: u64,
    /// Positive values below the first bin's lower edge, counted in the first bin (only
    /// when the values span more than [`MAX_DECADES`]).
    pub clipped: u64,
    /// The largest finite value (0 when there is none).
    pub max: f64,
    /// All values counted.
    pub total: u64,
}

/// The lower edge of bin `k` with `p` bins per decade.
pub fn edge(k: i32, p: u32) -> f64 {
    10f64.powf(f64::from(k) / f64::from(p))
}

/// The bin of a positive finite `v`: `edge(k) ≤ v < edge(k + 1)` (the logarithm corrected
/// by comparing with the edges themselves, so values on an edge land in the bin it opens).
fn bin_of(v: f64, p: u32) -> i32 {
    let mut k = (v.log10() * f64::from(p)).floor() as i32;
    if v < edge(k, p) {
        k -= 1;
    } else if v >= edge(k + 1, p) {
        k += 1;
    }
    k
}

impl LogHistogram {
    /// Counts `values` (negative values are counted as their magnitude) with `per_decade`
    /// bins per decade (at least 1).
    pub fn of(values: &[f64], per_decade: u32) -> Self {
        let p = per_decade.max(1);
        let mut h = LogHistogram {
            per_decade: p,
            first: 0,
            counts: Vec::new(),
            zeros: 0,
            not_finite: 0,
            clipped: 0,
            max: 0.0,
            total: values.len() as u64,
        };
        let (mut lo, mut hi) = (f64::INFINITY, 0f64);
        for &v in values {
            let v = v.abs();
            if !v.is_finite() {
                h.not_finite += 1;
            } else if v == 0.0 {
                h.zeros += 1;
            } else {
                lo = lo.min(v);
                hi = hi.max(v);
            }
        }
        h.max = hi;
        if hi == 0.0 {
            return h;
        }
        let last = bin_of(hi, p);
        h.first = bin_of(lo, p).max(last - MAX_DECADES * p as i32 + 1);
        h.counts = vec![0; (last - h.first + 1) as usize];
        for &v in values {
            let v = v.abs();
            if v.is_finite() && v > 0.0 {
                let k = bin_of(v, p);
                if k < h.first {
                    h.clipped += 1;
                }
                h.counts[(k.max(h.first) - h.first) as usize] += 1;
            }
        }
        h
    }

    /// The `[lower, upper)` edges of the `i`-th bin of [`Self::counts`].
    pub fn bin_edges(&self, i: usize) -> (f64, f64) {
        let k = self.first + i as i32;
        (edge(k, self.per_decade), edge(k + 1, self.per_decade))
    }

    /// Values certainly above `bound`: those in bins whose lower edge exceeds it, and the
    /// non-finite ones (the bin that contains `bound` is [`Self::straddling`]).
    pub fn above(&self, bound: f64) -> u64 {
        (0..self.counts.len())
            .filter(|&i| self.bin_edges(i).0 > bound)
            .map(|i| self.counts[i])
            .sum::<u64>()
            + self.not_finite
    }

    /// The index of the bin that contains `bound`, if any.
    pub fn straddling(&self, bound: f64) -> Option<usize> {
        (0..self.counts.len()).find(|&i| {
            let (lo, hi) = self.bin_edges(i);
            lo <= bound && bound < hi
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_on_an_edge_open_their_bin() {
        for p in [1, 2, 4, 10] {
            for k in -40..10 {
                let e = edge(k, p);
                assert_eq!(bin_of(e, p), k, "edge {e} with {p} per decade");
            }
        }
        assert_eq!(bin_of(1e-3, 4), -12);
        assert_eq!(bin_of(0.99e-3, 4), -13);
        assert_eq!(bin_of(5e-7, 1), -7);
    }

    #[test]
    fn counts_zeros_and_non_finite_values_apart() {
        let values = [0.0, 0.0, 1e-7, 3e-7, -2e-7, 1e-3, f64::NAN, f64::INFINITY];
        let h = LogHistogram::of(&values, 1);
        assert_eq!((h.zeros, h.not_finite, h.total), (2, 2, 8));
        assert_eq!(h.first, -7);
        assert_eq!(h.counts, vec![3, 0, 0, 0, 1]);
        assert_eq!(h.max, 1e-3);
        assert_eq!(h.bin_edges(4), (1e-3, 1e-2));
        // Above 1e-4: the 1e-3 value and the two non-finite ones.
        assert_eq!(h.above(1e-4), 3);
        assert_eq!(h.straddling(2e-5), Some(2));
        assert_eq!(h.straddling(1.0), None);
        assert_eq!(
            h.counts.iter().sum::<u64>() + h.zeros + h.not_finite,
            h.total
        );
    }

    #[test]
    fn spans_are_limited_and_empty_inputs_have_no_bins() {
        let h = LogHistogram::of(&[1e-30, 1e-20, 1.0], 2);
        assert_eq!(h.counts.len(), (MAX_DECADES * 2) as usize);
        assert_eq!(h.first, 1 - MAX_DECADES * 2);
        assert_eq!((h.clipped, h.counts[0]), (2, 2));
        let none = LogHistogram::of(&[0.0, f64::NAN], 4);
        assert!(none.counts.is_empty() && none.max == 0.0);
        assert_eq!(LogHistogram::of(&[], 4).total, 0);
    }
}
