//! Colours for signed values (weights, errors): a diverging scale symmetric about zero, so
//! that the sign reads as hue and the magnitude as depth, with zero near white.
//!
//! The scale is ColorBrewer's 11-class RdBu (Cynthia Brewer, colorbrewer2.org; the colours
//! from the `colorous` crate), linearly interpolated between its classes so that zero is
//! exactly its middle colour `#f7f7f7` (colorous' own continuous form is a B-spline, which
//! passes near but not through the classes): blue for negative values, red for positive
//! ones (the usual orientation for weight matrices).

/// An sRGB colour.
pub type Rgb = [u8; 3];

/// Cells a model never reads (above a causal diagonal, outside a window): a mid grey,
/// darker than the near-white of zero.
pub const MASKED: Rgb = [0xa8, 0xa8, 0xa8];

/// Values that are not finite (NaN, ±∞): black.
pub const NOT_FINITE: Rgb = [0, 0, 0];

/// The colour of `value` on the symmetric scale [−limit, limit]; values beyond the limit
/// take the end colours, and a non-positive or non-finite limit maps every finite value to
/// the colour of zero.
pub fn diverging(value: f64, limit: f64) -> Rgb {
    if !value.is_finite() {
        return NOT_FINITE;
    }
    let x = if limit > 0.0 && limit.is_finite() {
        (value / limit).clamp(-1.0, 1.0)
    } else {
        0.0
    };
    // RdBu's classes run from red (0) through white (5) to blue (10).
    let t = (1.0 - x) * 5.0;
    let i = (t.floor() as usize).min(9);
    let f = t - i as f64;
    let (a, b) = (
        colorous::RED_BLUE.eval_rational(i, 11),
        colorous::RED_BLUE.eval_rational(i + 1, 11),
    );
    let mix = |p: u8, q: u8| (f64::from(p) + (f64::from(q) - f64::from(p)) * f).round() as u8;
    [mix(a.r, b.r), mix(a.g, b.g), mix(a.b, b.b)]
}

/// The limit of a symmetric scale for `values`: the largest finite magnitude (0 when there
/// is none).
pub fn symmetric_limit(values: impl IntoIterator<Item = f64>) -> f64 {
    values
        .into_iter()
        .filter(|v| v.is_finite())
        .fold(0.0, |m, v| m.max(v.abs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lightness(c: Rgb) -> u32 {
        c.iter().map(|&v| u32::from(v)).sum()
    }

    #[test]
    fn zero_is_near_white_and_the_ends_are_brewer_s_dark_blue_and_red() {
        assert_eq!(diverging(0.0, 1.0), [0xf7, 0xf7, 0xf7]);
        assert_eq!(diverging(-1.0, 1.0), [0x05, 0x30, 0x61]);
        assert_eq!(diverging(1.0, 1.0), [0x67, 0x00, 0x1f]);
        // Beyond the limit: the end colours.
        assert_eq!(diverging(-7.0, 2.0), diverging(-2.0, 2.0));
        assert_eq!(diverging(7.0, 2.0), diverging(2.0, 2.0));
    }

    #[test]
    fn sign_is_hue_and_magnitude_is_depth() {
        for k in 1..=10 {
            let v = f64::from(k) / 10.0;
            let (pos, neg) = (diverging(v, 1.0), diverging(-v, 1.0));
            assert!(pos[0] > pos[2], "{v}: {pos:?} is not red");
            assert!(neg[2] > neg[0], "{v}: {neg:?} is not blue");
            let (pos_prev, neg_prev) = (diverging(v - 0.1, 1.0), diverging(0.1 - v, 1.0));
            assert!(lightness(pos) < lightness(pos_prev), "{v}");
            assert!(lightness(neg) < lightness(neg_prev), "{v}");
        }
    }

    #[test]
    fn degenerate_inputs_have_defined_colours() {
        assert_eq!(diverging(f64::NAN, 1.0), NOT_FINITE);
        assert_eq!(diverging(f64::INFINITY, 1.0), NOT_FINITE);
        assert_eq!(diverging(0.3, 0.0), diverging(0.0, 1.0));
        assert_eq!(diverging(0.3, f64::NAN), diverging(0.0, 1.0));
        assert_ne!(MASKED, diverging(0.0, 1.0));
        assert_eq!(symmetric_limit([0.5, -2.0, f64::NAN, f64::INFINITY]), 2.0);
        assert_eq!(symmetric_limit(std::iter::empty()), 0.0);
    }
}
