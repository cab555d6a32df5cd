//! Block-quantized weights in the layout of ONNX Runtime's `com.microsoft.MatMulNBits`
//! (the onnxruntime repository's docs/ContribOperators.md): `Y = A · dequant(B)` with a
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
//! The quantization is symmetric, each block's scale chosen for the least squared error:
//! - the start is the rule of ggml's `Q4_0` (which tract's block-quant format also uses):
//!   `m` is the block's value of largest magnitude, with its sign, and `scale = m /
//!   −2^(bits−1)`, so `m` maps to the lowest code exactly and the grid covers
//!   [−2^(bits−1), 2^(bits−1) − 1] steps;
//! - then, as llama.cpp's `make_qx_quants` (ggml-quants.c) searches, the codes of the
//!   grids that map `m` to −(2^(bits−1) + j/10) for j in `SEARCH` are each refitted with
//!   their least-squares scale `Σ w·q / Σ q²`, and the block keeps the scale, of all these,
//!   whose round-to-nearest codes give the smallest `Σ (w − q·scale)²` (the `Q4_0` one on a
//!   tie, so no block is ever worse than under that rule).
//!
//! Every scale is rounded to the nearest f16 before its codes are rounded and its error
//! counted (tract stores block scales as f16: with an f16-exact scale both runtimes
//! dequantize to the same weights). A block of zeros, or one whose scale is below f16's
//! smallest subnormal (|m| < 2^(bits−1) · 3e-8), gets scale 1 and codes 0 (no scale is ever
//! 0, NaN or infinite); a block whose scale would overflow f16 (|m| > 2^(bits−1) · 65504) is
//! refused. A last block shorter than `block_size` (K not a multiple of it) is padded with
//! zeros.

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

/// The code of `x` on a grid of step `1 / inverse`, as an f32: the nearest code (ties to
/// even) in the code range [lo, hi]. Rounds by adding and subtracting 1.5 · 2^23 after the
/// clamp (exact for the |value| ≤ 128 left by it): plain arithmetic that the search's loops
/// vectorize, where `f32::round` is a libm call on baseline x86-64.
#[inline]
fn grid_code(x: f32, inverse: f32, lo: f32, hi: f32) -> f32 {
    const ROUND: f32 = 12_582_912.0;
    (x * inverse).max(lo).min(hi) + ROUND - ROUND
}

/// The code range of `bits`-bit codes, [−2^(bits−1), 2^(bits−1) − 1], as f32.
fn code_range(bits: usize) -> (f32, f32) {
    (
        -((1i32 << (bits - 1)) as f32),
        ((1i32 << (bits - 1)) - 1) as f32,
    )
}

/// Lanes of the search's sums: eight partial sums, so that the loops vectorize (a single
/// f32 sum is one dependency chain, which the compiler may not reorder).
const LANES: usize = 8;

/// Σ over the block of `term(x)` in [`LANES`] partial sums, then added up.
#[inline]
fn lane_sum(block: &[f32], term: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0f32; LANES];
    let chunks = block.chunks_exact(LANES);
    let tail: f32 = chunks.remainder().iter().map(|&x| term(x)).sum();
    for chunk in chunks {
        for (a, &x) in acc.iter_mut().zip(chunk) {
            *a += term(x);
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// Σ (x − code(x)·scale)² over the block.
fn squared_error(block: &[f32], scale: f32, bits: usize) -> f32 {
    let (lo, hi) = code_range(bits);
    let inverse = 1.0 / scale;
    lane_sum(block, |x| {
        let d = x - grid_code(x, inverse, lo, hi) * scale;
        d * d
    })
}

/// The grids the search refits, as j in "m maps to −(2^(bits−1) + j/10)": every third of
/// llama.cpp's j = −9..=9, which on Gaussian, Laplace and Student-t(3) blocks of 32 gives
/// the same squared error as all eighteen (within 0.1%: 0.888 against 0.887 of `Q4_0`'s
/// on Gaussian 4-bit blocks, 0.914 against 0.913 on Laplace) at a third of the work.
const SEARCH: [i32; 6] = [-9, -6, -3, 3, 6, 9];

/// The scale of one block: the `Q4_0` rule's, or the refitted scale of a nearby grid
/// where that has a smaller squared error (the search of the module doc).
fn best_scale(block: &[f32], bits: usize) -> Result<f32> {
    let m = block
        .iter()
        .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
    let start = block_scale(m, bits).ok_or_else(|| {
        Error::BadTensor(format!(
            "a weight of magnitude {:e} is too large for {bits}-bit block quantization (its scale, stored as f16, would overflow; the limit is {:e})",
            m.abs(),
            65504.0 * (1u32 << (bits - 1)) as f32
        ))
    })?;
    let steps = (1u32 << (bits - 1)) as f32;
    if half::f16::from_f32(m / -steps).to_f32() == 0.0 {
        // Zeros, or below f16's smallest scale: scale 1, codes 0.
        return Ok(start);
    }
    let (mut best, mut best_error) = (start, squared_error(block, start, bits));
    for j in SEARCH {
        let inverse = -(steps + j as f32 / 10.0) / m;
        let (lo, hi) = code_range(bits);
        let xq = lane_sum(block, |x| x * grid_code(x, inverse, lo, hi));
        let qq = lane_sum(block, |x| {
            let q = grid_code(x, inverse, lo, hi);
            q * q
        });
        if qq == 0.0 {
            continue;
        }
        let refit = half::f16::from_f32(xq / qq).to_f32();
        if refit == 0.0 || !refit.is_finite() {
            continue;
        }
        let error = squared_error(block, refit, bits);
        if error < best_error {
            (best, best_error) = (refit, error);
        }
    }
    Ok(best)
}

/// Columns `first..` of the row-major `[k, n]` weight `w`, as many as `scales` holds
/// (`k_blocks` each), into `codes` (`k_blocks · block_size` each) and `scales`.
#[allow(clippy::too_many_arguments)]
fn quantize_columns(
    w: &[f32],
    k: usize,
    n: usize,
    first: usize,
    bits: usize,
    block_size: usize,
    codes: &mut [i8],
    scales: &mut [f32],
) -> Result<()> {
    let kb = k.div_ceil(block_size);
    let per_col = kb * block_size;
    let (lo, hi) = code_range(bits);
    let mut block = Vec::with_capacity(block_size);
    for (c, (codes, scales)) in codes
        .chunks_mut(per_col)
        .zip(scales.chunks_mut(kb))
        .enumerate()
    {
        let col = first + c;
        for (b, scale) in scales.iter_mut().enumerate() {
            let rows = b * block_size..((b + 1) * block_size).min(k);
            block.clear();
            block.extend(rows.clone().map(|r| w[r * n + col]));
            *scale = best_scale(&block, bits)?;
            let inverse = 1.0 / *scale;
            for (r, &x) in rows.zip(&block) {
                codes[r] = grid_code(x, inverse, lo, hi) as i8;
            }
        }
    }
    Ok(())
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
    let mut codes = vec![0i8; n * per_col];
    let mut scales = vec![0f32; n * kb];
    // Columns are independent: a share of them per core (the scale search rounds every
    // weight 19 times).
    let threads = std::thread::available_parallelism().map_or(1, |t| t.get());
    let share = n.div_ceil(threads.min(n));
    std::thread::scope(|scope| {
        let workers: Vec<_> = codes
            .chunks_mut(share * per_col)
            .zip(scales.chunks_mut(share * kb))
            .enumerate()
            .map(|(i, (codes, scales))| {
                let first = i * share;
                scope.spawn(move || {
                    quantize_columns(w, k, n, first, bits, block_size, codes, scales)
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|h| h.join().expect("a quantization thread panicked"))
    })?;
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

    /// Gaussian values from a fixed SplitMix64 stream (Box–Muller).
    fn gaussian(len: usize) -> Vec<f32> {
        let mut rng = crate::rng::SplitMix64::keyed(7, "nbits-search");
        (0..len)
            .map(|_| {
                let (u, v) = (rng.next_f64().max(1e-12), rng.next_f64());
                ((-2.0 * u.ln()).sqrt() * (std::f64::consts::TAU * v).cos()) as f32
            })
            .collect()
    }

    #[test]
    fn the_scale_search_is_never_worse_than_q4_0_and_better_on_gaussian_weights() {
        let (k, n) = (256, 64);
        let w = gaussian(k * n);
        for (bits, at_most) in [(4, 0.92), (8, 0.92)] {
            let q = quantize(&w, k, n, bits, BLOCK_SIZE).unwrap();
            let deq = q.dequantized();
            let (mut searched, mut q4_0) = (0f64, 0f64);
            for col in 0..n {
                for b in 0..k / BLOCK_SIZE {
                    let block: Vec<f32> = (b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE)
                        .map(|r| w[r * n + col])
                        .collect();
                    let m = block
                        .iter()
                        .fold(0f32, |m, &x| if x.abs() > m.abs() { x } else { m });
                    let start = block_scale(m, bits).unwrap();
                    let rule = f64::from(squared_error(&block, start, bits));
                    let ours: f64 = (b * BLOCK_SIZE..(b + 1) * BLOCK_SIZE)
                        .map(|r| f64::from(w[r * n + col] - deq[r * n + col]).powi(2))
                        .sum();
                    assert!(
                        ours <= rule * (1.0 + 1e-5),
                        "bits {bits} column {col} block {b}"
                    );
                    searched += ours;
                    q4_0 += rule;
                }
            }
            let ratio = searched / q4_0;
            eprintln!("bits {bits}: squared error {ratio:.3} of the Q4_0 rule's");
            assert!(ratio <= at_most, "bits {bits}: {ratio}");
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
        assert!(matches!(err, Error::BadTensor(_)), "{err:?}");
    }

    #[test]
    fn bad_sizes_are_refused() {
        assert!(quantize(&[1.0; 6], 3, 2, 3, 32).is_err());
        assert!(quantize(&[1.0; 6], 3, 2, 4, 24).is_err());
        assert!(quantize(&[1.0; 5], 3, 2, 4, 32).is_err());
        let err = dequantize_packed(&[0; 3], &[1.0; 2], 3, 2, 4, 16).unwrap_err();
        assert!(matches!(err, Error::BadTensor(_)), "{err:?}");
        // Attributes of a hostile file: no overflow, no allocation, one error.
        let err = dequantize_packed(&[0; 16], &[1.0], usize::MAX, usize::MAX, 4, 32).unwrap_err();
        assert!(matches!(err, Error::BadTensor(_)), "{err:?}");
    }
}
