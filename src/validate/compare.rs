//! Numerical comparison of two runtimes' outputs.
//!
//! Criterion (normwise, documented in docs/validate.md): an output agrees when
//! `max|a − b| ≤ atol + rtol · max|reference|`. Elementwise, an element is counted as
//! mismatched when its own `|a − b|` exceeds that same bound. Non-finite values that
//! differ count as an infinite difference.

use serde::Serialize;

use crate::error::{Error, Result};
use crate::tensor::NamedTensor;

/// Tolerances of the agreement criterion.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Tolerance {
    /// Relative tolerance, scaled by the largest magnitude of the reference output.
    pub rtol: f64,
    /// Absolute tolerance.
    pub atol: f64,
}

impl Default for Tolerance {
    /// f32 parity between CPU runtimes: rtol 1e-4, atol 1e-6.
    fn default() -> Self {
        Tolerance {
            rtol: 1e-4,
            atol: 1e-6,
        }
    }
}

impl Tolerance {
    /// The default for models built with `--dtype int8`: rtol 0.1, atol 1e-3. Two
    /// runtimes quantize the activations of an int8 model on the fly
    /// (`DynamicQuantizeLinear`) and can round a value at a step boundary to neighbouring
    /// steps; a one-step difference in an early layer propagates, so int8 files differ
    /// between tract and ONNX Runtime at the level of the quantization error itself
    /// (measured 1e-3 to 3e-2 normwise, see docs/speed.md), not at f32 rounding level.
    pub const INT8: Tolerance = Tolerance {
        rtol: 0.1,
        atol: 1e-3,
    };
}

/// How one output differs between a reference and another result.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct OutputDiff {
    /// Output name.
    pub output: String,
    /// Number of elements compared.
    pub elements: usize,
    /// max |a − b|.
    pub max_abs: f64,
    /// max |a − b| / max |reference| (0 when both are all zero).
    pub max_rel: f64,
    /// Elements whose difference exceeds the bound.
    pub mismatched: usize,
    /// Cosine similarity of the two outputs as flat vectors (1 when both are all zero, 0
    /// when only one is).
    pub cosine: f64,
    /// The bound `atol + rtol · max|reference|` that was applied.
    pub bound: f64,
    /// True when `max_abs ≤ bound`.
    pub pass: bool,
}

/// Compares `other` against `reference` (same name and shape required).
pub fn compare(reference: &NamedTensor, other: &NamedTensor, tol: Tolerance) -> Result<OutputDiff> {
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
    let bound = tol.atol + tol.rtol * max_ref;
    let (mut max_abs, mut mismatched) = (0f64, 0usize);
    let (mut dot, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (&x, &y) in a.iter().zip(&b) {
        let d = if x.is_finite() && y.is_finite() {
            (x - y).abs()
        } else if x == y {
            0.0
        } else {
            f64::INFINITY
        };
        if d > bound || d.is_nan() {
            mismatched += 1;
        }
        max_abs = max_abs.max(d);
        dot += x * y;
        na += x * x;
        nb += y * y;
    }
    // Defined everywhere: two all-zero outputs point the same way (1); an all-zero output
    // and a non-zero one share no direction (0).
    let cosine = match (na == 0.0, nb == 0.0) {
        (true, true) => 1.0,
        (true, false) | (false, true) => 0.0,
        (false, false) => dot / (na.sqrt() * nb.sqrt()),
    };
    let max_rel = if max_ref > 0.0 {
        max_abs / max_ref
    } else if max_abs == 0.0 {
        0.0
    } else {
        f64::INFINITY
    };
    Ok(OutputDiff {
        output: reference.name.clone(),
        elements: a.len(),
        max_abs,
        max_rel,
        mismatched,
        cosine,
        bound,
        pass: mismatched == 0 && max_abs <= bound,
    })
}

/// Compares every output of `other` with the output of the same name in `reference`.
pub fn compare_all(
    reference: &[NamedTensor],
    other: &[NamedTensor],
    tol: Tolerance,
) -> Result<Vec<OutputDiff>> {
    reference
        .iter()
        .map(|r| {
            let o = other.iter().find(|o| o.name == r.name).ok_or_else(|| {
                Error::BadTensor(format!("output {} is missing from one result", r.name))
            })?;
            compare(r, o, tol)
        })
        .collect()
}

/// Comparison of one pair: two runtimes, or `expected` outputs (`--expected`) and a runtime.
#[derive(Clone, Debug, Serialize)]
pub struct PairReport {
    /// Runtime (or `expected`) taken as reference.
    pub reference: String,
    /// Runtime compared with it.
    pub other: String,
    /// Per-output differences.
    pub outputs: Vec<OutputDiff>,
    /// True when every output agrees.
    pub pass: bool,
}

/// The comparison of `reference` and `other`, passing when every output agrees.
pub fn pair(reference: &str, other: &str, outputs: Vec<OutputDiff>) -> PairReport {
    PairReport {
        reference: reference.into(),
        other: other.into(),
        pass: outputs.iter().all(|o| o.pass),
        outputs,
    }
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
    fn the_bound_is_normwise_and_mismatches_are_counted() {
        let tol = Tolerance {
            rtol: 0.1,
            atol: 0.0,
        };
        let d = compare(&t(&[10.0, -2.0, 0.0]), &t(&[10.5, -2.0, 0.9]), tol).unwrap();
        assert_eq!(d.bound, 1.0);
        assert!(d.pass && d.mismatched == 0, "{d:?}");
        assert!((d.max_abs - 0.9).abs() < 1e-6 && (d.max_rel - 0.09).abs() < 1e-6);
        let d = compare(&t(&[10.0, -2.0, 0.0]), &t(&[10.0, -0.5, 1.5]), tol).unwrap();
        assert!(!d.pass && d.mismatched == 2, "{d:?}");
    }

    #[test]
    fn cosine_is_defined_when_an_output_is_all_zero() {
        let tol = Tolerance::default();
        let zero = compare(&t(&[0.0, 0.0]), &t(&[0.0, 0.0]), tol).unwrap();
        assert_eq!((zero.cosine, zero.max_rel, zero.pass), (1.0, 0.0, true));
        let one_side = compare(&t(&[0.0, 0.0]), &t(&[1.0, 0.0]), tol).unwrap();
        assert_eq!(one_side.cosine, 0.0);
        assert!(!one_side.pass && one_side.max_rel.is_infinite());
        let other_side = compare(&t(&[1.0, 0.0]), &t(&[0.0, 0.0]), tol).unwrap();
        assert_eq!(other_side.cosine, 0.0);
    }

    #[test]
    fn non_finite_values_count_as_infinite_differences_unless_equal() {
        let tol = Tolerance::default();
        let same = compare(&t(&[f32::INFINITY, 1.0]), &t(&[f32::INFINITY, 1.0]), tol).unwrap();
        assert!(same.pass, "{same:?}");
        let nan = compare(&t(&[1.0, 1.0]), &t(&[f32::NAN, 1.0]), tol).unwrap();
        assert!(!nan.pass && nan.mismatched == 1 && nan.max_abs.is_infinite());
    }

    #[test]
    fn shapes_and_names_must_match() {
        let tol = Tolerance::default();
        assert!(compare(&t(&[1.0]), &t(&[1.0, 2.0]), tol).is_err());
        let err = compare_all(&[t(&[1.0])], &[], tol).unwrap_err();
        assert!(matches!(err, Error::BadTensor(_)), "{err:?}");
    }
}
