//! Which tolerance a comparison uses: the user's `--rtol` / `--atol` where given, else the
//! default for the model's precision, read from our metadata (`gmlp_onnx.config`, field
//! `dtype`). [`default_tolerance`] is the one table of defaults, keyed by precision.

use serde::Serialize;

use crate::gmlp::Precision;
use crate::validate::compare::Tolerance;

/// Relative tolerance that TF32 on the CUDA execution provider needs (10-bit mantissa in
/// MatMuls): `--tf32` never uses a tighter one by default.
pub const TF32_RTOL: f64 = 1e-2;

/// Default agreement criterion for a model computed in `precision`; `None` (a model
/// without our metadata) is treated as f32.
///
/// - f32: rtol 1e-4, atol 1e-6 (CPU runtimes measured ≤ 4e-7 apart).
/// - f16: rtol 1e-2, atol 1e-4. f16 has an 11-bit significand (unit roundoff 4.9e-4) and
///   the runtimes round MatMul sums and GELU differently: tract vs ONNX Runtime measured
///   7e-5 to 4.1e-3 relative on 2- and 4-block models, f16 vs the f32 model up to 1.0e-3.
/// - int8 and int4: rtol 0.1, atol 1e-3 ([`Tolerance::INT8`], which says why: both
///   quantize the vocabulary head's input on the fly, and ONNX Runtime's int4 kernel
///   quantizes each projection's input per block of 32, which tract does not); the same
///   for weight-only int8.
pub fn default_tolerance(precision: Option<Precision>) -> Tolerance {
    match precision.unwrap_or_default() {
        Precision::F32 => Tolerance {
            rtol: 1e-4,
            atol: 1e-6,
        },
        Precision::F16 => Tolerance {
            rtol: 1e-2,
            atol: 1e-4,
        },
        Precision::Int8 | Precision::Int4 | Precision::Int8WeightOnly => Tolerance::INT8,
    }
}

/// The tolerance asked for: each bound given explicitly or left to the model's precision.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ToleranceRequest {
    /// `--rtol`, if given.
    pub rtol: Option<f64>,
    /// `--atol`, if given.
    pub atol: Option<f64>,
}

/// The tolerance applied and where it came from (reported beside the comparison).
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct ResolvedTolerance {
    /// The bounds applied.
    pub tolerance: Tolerance,
    /// The model's precision from its metadata (`f32`, `f16`), `None` when the file is not
    /// one of ours.
    pub precision: Option<Precision>,
}

impl ToleranceRequest {
    /// Exactly these bounds.
    pub fn exactly(tolerance: Tolerance) -> Self {
        ToleranceRequest {
            rtol: Some(tolerance.rtol),
            atol: Some(tolerance.atol),
        }
    }

    /// The bounds for a model of `precision`: the given ones, the rest from
    /// [`default_tolerance`] (with rtol at least [`TF32_RTOL`] when `tf32`).
    pub fn resolve(self, precision: Option<Precision>, tf32: bool) -> ResolvedTolerance {
        let default = default_tolerance(precision);
        let default_rtol = if tf32 {
            default.rtol.max(TF32_RTOL)
        } else {
            default.rtol
        };
        ResolvedTolerance {
            tolerance: Tolerance {
                rtol: self.rtol.unwrap_or(default_rtol),
                atol: self.atol.unwrap_or(default.atol),
            },
            precision,
        }
    }

    /// Refuses a bound that is negative, NaN or infinite, saying which.
    pub fn check(self) -> Result<Self, ToleranceError> {
        for (bound, v) in [
            (ToleranceError::Rtol, self.rtol),
            (ToleranceError::Atol, self.atol),
        ] {
            if v.is_some_and(|v| !(v.is_finite() && v >= 0.0)) {
                return Err(bound);
            }
        }
        Ok(self)
    }
}

/// Which bound of a [`ToleranceRequest`] is not a finite number ≥ 0 (a command names its
/// own flag for it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ToleranceError {
    /// The relative bound.
    #[error("the relative tolerance must be a finite number >= 0")]
    Rtol,
    /// The absolute bound.
    #[error("the absolute tolerance must be a finite number >= 0")]
    Atol,
}

impl From<ToleranceError> for crate::Error {
    fn from(e: ToleranceError) -> Self {
        crate::Error::OutOfRange(e.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_follow_the_precision_and_models_without_metadata_count_as_f32() {
        assert_eq!(default_tolerance(None), Tolerance::default());
        assert_eq!(
            default_tolerance(Some(Precision::F32)),
            Tolerance::default()
        );
        let f16 = default_tolerance(Some(Precision::F16));
        // The measured f16 disagreement between tract and ONNX Runtime must pass.
        assert!(f16.rtol >= 2.0 * 4.1e-3 && f16.rtol <= 1e-2);
        assert!(f16.atol > Tolerance::default().atol);
    }

    #[test]
    fn given_bounds_win_and_missing_ones_come_from_the_precision() {
        let none = ToleranceRequest::default();
        let r = none.resolve(Some(Precision::F16), false);
        assert_eq!(r.tolerance, default_tolerance(Some(Precision::F16)));
        assert_eq!(r.precision, Some(Precision::F16));

        let rtol_only = ToleranceRequest {
            rtol: Some(3e-3),
            atol: None,
        };
        let r = rtol_only.resolve(Some(Precision::F16), false);
        assert_eq!((r.tolerance.rtol, r.tolerance.atol), (3e-3, 1e-4));

        let exact = ToleranceRequest::exactly(Tolerance {
            rtol: 0.0,
            atol: 0.5,
        });
        let r = exact.resolve(Some(Precision::F16), true);
        assert_eq!((r.tolerance.rtol, r.tolerance.atol), (0.0, 0.5));
    }

    #[test]
    fn tf32_loosens_only_a_default_rtol_that_is_tighter() {
        let r = ToleranceRequest::default().resolve(Some(Precision::F32), true);
        assert_eq!((r.tolerance.rtol, r.tolerance.atol), (TF32_RTOL, 1e-6));
        let r = ToleranceRequest::default().resolve(None, true);
        assert_eq!(r.tolerance.rtol, TF32_RTOL);
    }

    #[test]
    fn negative_or_non_finite_bounds_are_refused_saying_which() {
        for (rtol, atol, bound) in [
            (Some(-1.0), None, ToleranceError::Rtol),
            (None, Some(f64::NAN), ToleranceError::Atol),
            (Some(f64::INFINITY), None, ToleranceError::Rtol),
        ] {
            assert_eq!(ToleranceRequest { rtol, atol }.check().unwrap_err(), bound);
        }
        assert!(ToleranceRequest {
            rtol: Some(0.0),
            atol: Some(1.0)
        }
        .check()
        .is_ok());
    }
}
