//! Static shape rules shared by the operator helpers: NumPy broadcasting and axis
//! normalization, as the ONNX operators define them.

use crate::error::{Error, Result};
use crate::onnx::graph::Dim;

/// A shape or type mismatch found while emitting `op`: a bug in the caller.
pub fn shape_error(op: &str, detail: String) -> Error {
    Error::Internal(format!("shape mismatch in {op}: {detail}"))
}

/// A shape as `[batch, 12, 16]`.
pub fn fmt_shape(shape: &[Dim]) -> String {
    let parts: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    format!("[{}]", parts.join(", "))
}

/// Numpy-style broadcast of two shapes.
pub fn broadcast(op: &str, a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>> {
    let rank = a.len().max(b.len());
    let mut out = Vec::with_capacity(rank);
    for i in 0..rank {
        let da = (i + a.len()).checked_sub(rank).map(|k| &a[k]);
        let db = (i + b.len()).checked_sub(rank).map(|k| &b[k]);
        let d = match (da, db) {
            (Some(x), None) | (None, Some(x)) => x.clone(),
            (Some(x), Some(y)) if x == y => x.clone(),
            (Some(Dim::Fixed(1)), Some(y)) => y.clone(),
            (Some(x), Some(Dim::Fixed(1))) => x.clone(),
            _ => {
                return Err(shape_error(
                    op,
                    format!("cannot broadcast {} with {}", fmt_shape(a), fmt_shape(b)),
                ))
            }
        };
        out.push(d);
    }
    Ok(out)
}

/// `axis` (negative counts from the end) as an index below `rank`.
pub fn normalize_axis(op: &str, axis: i64, rank: usize) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(shape_error(
            op,
            format!("axis {axis} out of range for rank {rank}"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(spec: &[&str]) -> Vec<Dim> {
        spec.iter()
            .map(|s| {
                s.parse()
                    .map_or_else(|_| Dim::Symbol(s.to_string()), Dim::Fixed)
            })
            .collect()
    }

    #[test]
    fn broadcasting_follows_numpy() {
        let b = |x: &[&str], y: &[&str]| broadcast("Add", &dims(x), &dims(y));
        assert_eq!(
            b(&["batch", "12", "16"], &["16"]).unwrap(),
            dims(&["batch", "12", "16"])
        );
        assert_eq!(
            b(&["12", "1"], &["batch", "12", "16"]).unwrap(),
            dims(&["batch", "12", "16"])
        );
        assert_eq!(b(&["1", "5"], &["7", "1"]).unwrap(), dims(&["7", "5"]));
        assert_eq!(b(&[], &["3"]).unwrap(), dims(&["3"]));
        assert_eq!(b(&["batch"], &["batch"]).unwrap(), dims(&["batch"]));
        let err = b(&["3", "4"], &["5"]).unwrap_err();
        assert!(matches!(err, Error::Internal(_)), "{err:?}");
        assert!(
            b(&["batch"], &["seq"]).is_err(),
            "two different symbols do not broadcast"
        );
    }

    #[test]
    fn axes_normalize_from_either_end() {
        assert_eq!(normalize_axis("Split", -1, 3).unwrap(), 2);
        assert_eq!(normalize_axis("Split", 0, 3).unwrap(), 0);
        assert_eq!(normalize_axis("Split", -3, 3).unwrap(), 0);
        assert!(normalize_axis("Split", 3, 3).is_err());
        assert!(normalize_axis("Split", -4, 3).is_err());
        assert_eq!(fmt_shape(&dims(&["batch", "2"])), "[batch, 2]");
    }
}
