//! `validate --plot`: where the elementwise differences of each compared pair lie. For every
//! pair (two runtimes, or the `--expected` outputs and a runtime) and every output, the
//! relative error of each element, `|a − b| / max|b|` with b the pair's reference (the
//! same scale as the report's `max_rel`), is counted on a logarithmic axis
//! ([`crate::plot::bins`]) and drawn with the agreement bound (`rtol + atol / max|b|`, see
//! [`crate::validate::compare`](mod@crate::validate::compare)), so a near-miss shows where it is.

use std::path::Path;

use crate::error::{Error, Result};
use crate::plot::bins::LogHistogram;
use crate::plot::histogram::HistogramPlot;
use crate::plot::{file_name, write_pngs, PlotFile};
use crate::tensor::NamedTensor;
use crate::validate::compare::Tolerance;

/// Bins per decade of the error histograms.
pub const PER_DECADE: u32 = 4;

/// The elementwise errors of one output of one pair.
#[derive(Clone, Debug, PartialEq)]
pub struct ErrorHistogram {
    /// The pair's reference (a runtime, or `expected`).
    pub reference: String,
    /// The runtime compared with it.
    pub other: String,
    /// The output.
    pub output: String,
    /// Counts of `|a − b| / max|b|` per element (of `|a − b|` when the reference is all zero).
    pub histogram: LogHistogram,
    /// max|b| over the reference's finite values.
    pub max_reference: f64,
    /// The agreement bound in the histogram's units: `rtol + atol / max|b|` (`atol` when
    /// the reference is all zero).
    pub bound: f64,
}

/// The error histogram of `other` against `reference` (same shape required).
pub fn error_histogram(
    reference_name: &str,
    other_name: &str,
    reference: &NamedTensor,
    other: &NamedTensor,
    tol: Tolerance,
) -> Result<ErrorHistogram> {
    if reference.value.shape() != other.value.shape() {
        return Err(Error::BadTensor(format!(
            "output {}: shapes differ, {:?} vs {:?}",
            reference.name,
            reference.value.shape(),
            other.value.shape()
        )));
    }
    let a = reference.value.to_f64();
    let b = other.value.to_f64();
    let max_ref = a
        .iter()
        .fold(0f64, |m, v| if v.is_finite() { m.max(v.abs()) } else { m });
    let scale = if max_ref > 0.0 { max_ref } else { 1.0 };
    let errors: Vec<f64> = a
        .iter()
        .zip(&b)
        .map(|(&x, &y)| {
            if x.is_finite() && y.is_finite() {
                (x - y).abs() / scale
            } else if x == y {
                0.0
            } else {
                f64::INFINITY
            }
        })
        .collect();
    Ok(ErrorHistogram {
        reference: reference_name.to_string(),
        other: other_name.to_string(),
        output: reference.name.clone(),
        histogram: LogHistogram::of(&errors, PER_DECADE),
        max_reference: max_ref,
        bound: if max_ref > 0.0 {
            tol.rtol + tol.atol / max_ref
        } else {
            tol.atol
        },
    })
}

/// Error histograms of every output of `other` against `reference`.
pub fn error_histograms(
    reference_name: &str,
    other_name: &str,
    reference: &[NamedTensor],
    other: &[NamedTensor],
    tol: Tolerance,
) -> Result<Vec<ErrorHistogram>> {
    reference
        .iter()
        .map(|r| {
            let o = other.iter().find(|o| o.name == r.name).ok_or_else(|| {
                Error::BadTensor(format!("output {} is missing from one result", r.name))
            })?;
            error_histogram(reference_name, other_name, r, o, tol)
        })
        .collect()
}

/// The file name of a histogram: `REFERENCE_vs_OTHER_OUTPUT.png`.
pub fn histogram_file(h: &ErrorHistogram) -> String {
    file_name(&[&h.reference, "vs", &h.other, &h.output])
}

/// Draws every histogram into `dir` (created if missing); all files or none.
pub fn write_histograms(dir: &Path, histograms: &[ErrorHistogram]) -> Result<Vec<PlotFile>> {
    let pictures = histograms
        .iter()
        .map(|h| {
            let c = &h.histogram;
            let relative = h.max_reference > 0.0;
            let measure = if relative {
                "|a - b| / max|b|"
            } else {
                "|a - b| (b is all zero)"
            };
            let finite_max = c.max;
            let status = if c.above(h.bound) == 0 && finite_max <= h.bound {
                "within the bound"
            } else {
                "BEYOND the bound"
            };
            let lines = vec![
                format!(
                    "{} elements; largest {measure} = {:.2e}, {status} {:.2e} (rtol + atol / max|b|)",
                    c.total,
                    if c.not_finite > 0 { f64::INFINITY } else { finite_max },
                    h.bound
                ),
                format!(
                    "b = {} (the pair's reference, max|b| = {}), a = {}; exactly equal: {}, not finite: {}",
                    h.reference,
                    crate::plot::number(h.max_reference),
                    h.other,
                    c.zeros,
                    c.not_finite
                ),
                "bars: blue below the bound, orange the bin that holds it, red above it".to_string(),
            ];
            let plot = HistogramPlot {
                title: format!("{}: {} vs {}", h.output, h.reference, h.other),
                lines,
                histogram: c,
                bound: Some(h.bound),
                x_label: format!("{measure} per element"),
            };
            Ok((histogram_file(h), plot.render()?))
        })
        .collect::<Result<Vec<_>>>()?;
    write_pngs(dir, &pictures)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tensor::TensorValue;

    fn t(values: &[f32]) -> NamedTensor {
        NamedTensor {
            name: "y".into(),
            value: TensorValue::F32(
                ndarray::ArrayD::from_shape_vec(ndarray::IxDyn(&[values.len()]), values.to_vec())
                    .unwrap(),
            ),
        }
    }

    #[test]
    fn errors_are_relative_to_the_largest_reference_value() {
        let tol = Tolerance {
            rtol: 1e-4,
            atol: 1e-6,
        };
        let h = error_histogram(
            "r",
            "o",
            &t(&[10.0, -2.0, 0.0]),
            &t(&[10.0, -1.0, 1e-3]),
            tol,
        )
        .unwrap();
        assert_eq!(h.max_reference, 10.0);
        assert!((h.bound - (1e-4 + 1e-7)).abs() < 1e-18);
        // Errors 0, 0.1, 1e-4: one zero, bins at 1e-4 and 1e-1.
        assert_eq!(h.histogram.zeros, 1);
        assert_eq!(h.histogram.counts.iter().sum::<u64>(), 2);
        assert!((h.histogram.max - 0.1).abs() < 1e-12);
        assert_eq!(histogram_file(&h), "r_vs_o_y.png");
        // An all-zero reference: absolute errors, the bound is atol.
        let z = error_histogram("r", "o", &t(&[0.0, 0.0]), &t(&[0.0, 2.0]), tol).unwrap();
        assert_eq!(
            (z.max_reference, z.bound, z.histogram.max),
            (0.0, 1e-6, 2.0)
        );
        // A NaN against a number is infinitely far.
        let n = error_histogram("r", "o", &t(&[1.0]), &t(&[f32::NAN]), tol).unwrap();
        assert_eq!(n.histogram.not_finite, 1);
        assert!(error_histogram("r", "o", &t(&[1.0]), &t(&[1.0, 2.0]), tol).is_err());
    }
}
