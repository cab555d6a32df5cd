//! Block-quantized weights in the layout of ONNX Runtime's `com.microsoft.MatMulNBits`
//! (docs/ContribOperators.md in the onnxruntime repository): `Y = A · dequant(B)` with a
//! constant weight of K input and N output features, quantized in blocks of `block_size`
//! consecutive values along K, one scale per (output column, block), codes of `bits` bits.
//!
//! - `B`: uint8 `[N, k_blocks, block_size · bits / 8]`, `k_blocks = ⌈K / block_size⌉`: column
//!   n's codes along K, block by block, packed low bits first (for 4 bits the first code
//!   of a byte pair is the byte's low nibble, the second its high nibble);
//! - `scales`: `[N, k_blocks]`, same type as A;
//! - no `zero_points` input: the default zero point 2^(bits−1) (8 for 4 bits, 128 for 8);
//! - `w = (code − 2^(bits−1)) · scale`.
//!
//! The quantization is symmetric round-to-nearest with the rule of ggml's `Q4_0` (which
//! tract's block-quant format also uses): in each block, `m` is the value of largest
//! magnitude, with its sign, and `scale = m / −2^(bits−1)`, so `m` maps to the lowest code
//! exactly and the grid covers [−2^(bits−1), 2^(bits−1) − 1] steps. The scale is rounded to
//! the nearest f16 (tract stores block scales as f16: with an f16-exact scale both runtimes
//! dequantize to the same weights) and the codes are rounded with that scale. A block of
//! zeros, or one whose scale is below f16's smallest subnormal (|m| < 2^(bits−1) · 3e-8),
//! gets scale 1 and codes 0 (no scale is ever 0, NaN or infinite); a block whose scale
//! would overflow f16 (|m| > 2^(bits−1) · 65504) is refused. A last block shorter than
//! `block_size` (K not a multiple of it) is padded with zeros.

use crate::error::{Error, Result};

/// Block size along K of the weights this tool writes.
pub const BLOCK_SIZE: usize = 32;

/// A weight matrix quantized in blocks along K.
#[derive(Clone, Debug, PartialEq)]
pub struct BlockQuantized {
    /// Input features (rows of the `[K, N]` weight).
    pub k: usize,
    /// Output features (columns of the `[K, N]` weight).
    pub n: usize,
    /// Bits per code (4 or 8).
    pub bits: usize,
    /// Values per block along K.
    pub block_size: usize,
    /// Signed codes in [−2^(bits−1), 2^(bits−1) − 1], `[N, k_blocks · block_size]` (column
    /// by column, the padding of the last block included).
    pub codes: Vec<i8>,
    /// Scales `[N, k_blocks]`, each exactly representable in f16.
    pub scales: Vec<f32>,
}

impl BlockQuantized {
    /// Blocks per column, `⌈K / block_size⌉`.
    pub fn k_blocks(&self) -> usize {
        self.k.div_ceil(self.block_size)
    }

    /// Bytes of one packed block (`block_size · bits / 8`).
    pub fn blob_size(&self) -> usize {
        self.block_size * self.bits / 8
    }

    /// The dimensions of MatMulNBits' `B` input, `[N, k_blocks, blob_size]`.
    pub fn packed_dims(&self) -> [usize; 3] {
        [self.n, self.k_blocks(), self.blob_size()]
    }

    /// The dimensions of MatMulNBits' `scales` input, `[N, k_blocks]`.
    pub fn scale_dims(&self) -> [usize; 2] {
        [self.n, self.k_blocks()]
    }

    /// MatMulNBits' `B`: unsigned codes (code + 2^(bits−1)), packed low bits first.
    pub fn packed(&self) -> Vec<u8> {
        let offset = 1i16 << (self.bits - 1);
        let unsigned = self.codes.iter().map(|&c| (c as i16 + offset) as u8);
        match self.bits {
            4 => {
                let u: Vec<u8> = unsigned.collect();
                u.chunks_exact(2).map(|p| p[0] | (p[1] << 4)).collect()
            }
            _ => unsigned.collect(),
        }
    }

    /// The dequantized weight `[K, N]` row-major (the padding dropped).
    pub fn dequantized(&self) -> Vec<f32> {
        let (k, n, kb) = (self.k, self.n, self.k_blocks());
        let per_col = kb * self.block_size;
        let mut w = vec![0f32; k * n];
        for col in 0..n {
            for row in 0..k {
                let s = self.scales[col * kb + row / self.block_size];
                w[row * n + col] = f32::from(self.codes[col * per_col + row]) * s;
            }
        }
        w
    }
}

/// The scale of a block whose value of largest magnitude is `m`: `m / −2^(bits−1)` rounded
/// to f16, or 1 where that rounds to 0; `None` where it is not finite in f16.
pub fn block_scale(m: f32, bits: usize) -> Option<f32> {
    let s = half::f16::from_f32(m / -((1u32 << (bits - 1)) as f32)).to_f32();
    if !s.is_finite() {
        None
    } else if s == 0.0 {
        Some(1.0)
    } else {
        Some(s)
    }
}

/// Quantizes the row-major `[k, n]` weight `w` in blocks of `block_size` along K.
pub fn quantize(
    w: &[f32],
    k: usize,
    n: usize,
    bits: usize,
    block_size: usize,
) -> Result<BlockQuantized> {
    if !matches!(bits, 4 | 8) || block_size < 16 || !block_size.is_power_of_two() {
        return Err(Error::Internal(format!(
            "block quantization needs bits 4 or 8 and a power-of-two block of at least 16 (got {bits}, {block_size})"
        )));
    }
    if w.len() != k * n || k == 0 || n == 0 {
        return Err(Error::Internal(format!(
            "block quantization of {} values as [{k}, {n}]",
            w.len()
        )));
    }
    let kb = k.div_ceil(block_size);
    let per_col = kb * block_size;
    let (lo, hi) = (-(1i32 << (bits - 1)), (1i32 << (bits - 1)) - 1);
    let mut codes = vec![0i8; n * per_col];
    let mut scales = vec![0f32; n * kb];
    for col in 0..n {
        for b in 0..kb {
            let rows = b * block_size..((b + 1) * block_size).min(k);
            let m = rows.clone().map(|r| w[r * n + col]).fold(0f32, |m, x| {
                if x.abs() > m.abs() {
                    x
                } else {
                    m
                }
            });
            let s = block_scale(m, bits).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "a weight of magnitude {:e} is too large for {bits}-bit block quantization (its scale, stored as f16, would overflow; the limit is {:e})",
                    m.abs(),
                    65504.0 * (1u32 << (bits - 1)) as f32
                ))
            })?;
            scales[col * kb + b] = s;
            for r in rows {
                let q = (w[r * n + col] / s).round().clamp(lo as f32, hi as f32);
                codes[col * per_col + r] = q as i8;
            }
        }
    }
    Ok(BlockQuantized {
        k,
        n,
        bits,
        block_size,
        codes,
        scales,
    })
}

/// The dequantized `[K, N]` weight (row-major) of MatMulNBits inputs `packed`
/// (`[N, k_blocks, blob]`) and `scales` (`[N, k_blocks]`), without zero points; refuses
/// inputs whose sizes do not match `k`, `n`, `bits` and `block_size`.
pub fn dequantize_packed(
    packed: &[u8],
    scales: &[f32],
    k: usize,
    n: usize,
    bits: usize,
    block_size: usize,
) -> Result<Vec<f32>> {
    let blob = block_size.checked_mul(bits).filter(|x| x.is_multiple_of(8));
    let (true, Some(blob)) = (matches!(bits, 2 | 4 | 8) && block_size > 0, blob) else {
        return Err(Error::BadTensor(format!(
            "MatMulNBits with bits {bits} and block_size {block_size} is not supported here"
        )));
    };
    let blob = blob / 8;
    let kb = k.div_ceil(block_size);
    // Checked: the sizes come from a file's attributes (the output is then at most
    // 32 / bits floats per packed byte, in proportion to the file).
    let need = n
        .checked_mul(kb)
        .and_then(|x| Some((x, x.checked_mul(blob)?)));
    let ok = need.is_some_and(|(s, p)| packed.len() == p && scales.len() == s && k > 0);
    if !ok {
        let (s, p) = need.map_or(("overflow".into(), "overflow".into()), |(s, p)| {
            (s.to_string(), p.to_string())
        });
        return Err(Error::BadTensor(format!(
            "MatMulNBits K={k} N={n} bits={bits} block_size={block_size} needs {p} packed bytes and {s} scales, got {} and {}",
            packed.len(),
            scales.len()
        )));
    }
    let per_byte = 8 / bits;
    let mask = ((1u16 << bits) - 1) as u8;
    let zero = (1i32 << (bits - 1)) as f32;
    let mut w = vec![0f32; k * n];
    for col in 0..n {
        for row in 0..k {
            let (b, i) = (row / block_size, row % block_size);
            let byte = packed[(col * kb + b) * blob + i / per_byte];
            let code = (byte >> (bits * (i % per_byte))) & mask;
            w[row * n + col] = (f32::from(code) - zero) * scales[col * kb + b];
        }
    }
    Ok(w)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A hand-computed case: K = 3 (one block of 16, padded), N = 2, 4 bits.
    ///
    /// Column 0 = [1.0, −0.5, 0.25]: m = 1.0, scale = 1/−8 = −0.125 (exact in f16);
    /// codes round(w / s) = [−8, 4, −2], unsigned +8 = [0, 12, 6] (+ 13 padding 8s).
    /// Column 1 = [0, 0, 0]: scale 1, codes 0, unsigned 8.
    /// Packed, low nibble first: column 0 → 0x00 | 12 << 4 = 0xC0, then 6 | 8 << 4 = 0x86,
    /// then 0x88 × 6; column 1 → 0x88 × 8.
    #[test]
    fn packs_a_hand_computed_block_low_nibble_first() {
        let w = [1.0, 0.0, -0.5, 0.0, 0.25, 0.0];
        let q = quantize(&w, 3, 2, 4, 16).unwrap();
        assert_eq!(q.scales, vec![-0.125, 1.0]);
        assert_eq!(&q.codes[..3], &[-8, 4, -2]);
        assert!(q.codes[3..].iter().all(|&c| c == 0));
        assert_eq!(q.packed_dims(), [2, 1, 8]);
        let mut expected = vec![0xC0, 0x86];
        expected.extend([0x88; 6]);
        expected.extend([0x88; 8]);
        assert_eq!(q.packed(), expected);
        // Unpacking the bytes gives back the exact weights (all on the grid here).
        let back = dequantize_packed(&q.packed(), &q.scales, 3, 2, 4, 16).unwrap();
        assert_eq!(back, w.to_vec());
        assert_eq!(q.dequantized(), w.to_vec());
    }

    #[test]
    fn eight_bit_codes_are_bytes_offset_by_128() {
        // K = 2, N = 1, one block: m = −2.54, scale = −2.54 / −128 rounded to f16.
        let w = [-2.54, 1.27];
        let q = quantize(&w, 2, 1, 8, 16).unwrap();
        let s = half::f16::from_f32(2.54 / 128.0).to_f32();
        assert_eq!(q.scales, vec![s]);
        let c1 = (1.27 / s).round() as i32;
        assert_eq!(q.codes[0], -128);
        assert_eq!(i32::from(q.codes[1]), c1);
        let p = q.packed();
        assert_eq!(p.len(), 16);
        assert_eq!((p[0], i32::from(p[1])), (0, c1 + 128));
        assert!(p[2..].iter().all(|&b| b == 128));
    }

    #[test]
    fn round_trip_error_is_at_most_half_a_step_and_unpacking_matches() {
        let (k, n) = (70, 5); // three blocks of 32 per column, the last one padded
        let w: Vec<f32> = (0..k * n)
            .map(|i| ((i * 37 % 29) as f32 - 14.0) * 0.013 + (i % 3) as f32 * 0.001)
            .collect();
        for bits in [4, 8] {
            let q = quantize(&w, k, n, bits, BLOCK_SIZE).unwrap();
            assert_eq!(q.packed().len(), n * 3 * BLOCK_SIZE * bits / 8);
            let deq = q.dequantized();
            let unpacked = dequantize_packed(&q.packed(), &q.scales, k, n, bits, 32).unwrap();
            assert_eq!(deq, unpacked);
            for (idx, (x, y)) in w.iter().zip(&deq).enumerate() {
                let (row, col) = (idx / n, idx % n);
                let s = q.scales[col * 3 + row / 32].abs();
                // Half a step, or a whole one for the value clamped at the top code.
                assert!((x - y).abs() <= s + 1e-7, "bits {bits} [{row}, {col}]");
            }
            for s in &q.scales {
                assert_eq!(half::f16::from_f32(*s).to_f32(), *s);
            }
        }
    }

    #[test]
    fn scales_are_never_zero_nan_or_infinite() {
        for m in [0.0, 1e-30, -1e-30, 1e5, -3.0] {
            let s = block_scale(m, 4).unwrap();
            assert!(s != 0.0 && s.is_finite(), "{m} -> {s}");
        }
        assert_eq!(block_scale(0.0, 4), Some(1.0));
        assert_eq!(block_scale(1e6, 4), None);
        assert_eq!(block_scale(f32::NAN, 4), None);
        let q = quantize(&[0.0; 64], 32, 2, 4, 32).unwrap();
        assert!(q.scales.iter().all(|&s| s == 1.0));
        assert!(q.dequantized().iter().all(|&x| x == 0.0));
        let err = quantize(&[1e6, 0.0], 2, 1, 4, 16).unwrap_err();
        assert!(err.to_string().contains("too large for 4-bit"), "{err}");
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(quantize(&[1.0; 6], 3, 2, 3, 32).is_err());
        assert!(quantize(&[1.0; 6], 3, 2, 4, 24).is_err());
        assert!(quantize(&[1.0; 5], 3, 2, 4, 32).is_err());
        let err = dequantize_packed(&[0; 3], &[1.0; 2], 3, 2, 4, 16).unwrap_err();
        assert!(err.to_string().contains("needs 16 packed bytes"), "{err}");
        // Attributes of a hostile file: no overflow, no allocation, one error.
        let err = dequantize_packed(&[0; 16], &[1.0], usize::MAX, usize::MAX, 4, 32).unwrap_err();
        assert!(err.to_string().contains("overflow"), "{err}");
    }
}
