//! Deterministic random numbers for seeded weights and generated inputs: SplitMix64 streams
//! keyed by a seed and a name, so a value never depends on the order things are drawn in.

/// SplitMix64 (Steele, Lea, Flood 2014): a small, well-mixed 64-bit generator.
#[derive(Clone, Debug)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A stream for `seed` and a key string (FNV-1a hashed).
    pub fn keyed(seed: u64, key: &str) -> Self {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in key.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let mut s = SplitMix64(seed ^ h.rotate_left(17));
        s.next_u64();
        s
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1) with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.next_f64()
    }
    /// `len` values uniform in [lo, hi) in f32, two 24-bit draws per 64 random bits (the
    /// fast path for large weight tensors).
    pub fn uniform_f32(&mut self, len: usize, lo: f32, hi: f32) -> Vec<f32> {
        const SCALE: f32 = 1.0 / (1u32 << 24) as f32;
        let span = hi - lo;
        let mut out = vec![0f32; len];
        let mut pairs = out.chunks_exact_mut(2);
        for pair in &mut pairs {
            let x = self.next_u64();
            pair[0] = lo + span * ((x >> 40) as f32 * SCALE);
            pair[1] = lo + span * (((x >> 8) & 0xff_ffff) as f32 * SCALE);
        }
        if let [last] = pairs.into_remainder() {
            *last = lo + span * ((self.next_u64() >> 40) as f32 * SCALE);
        }
        out
    }
    /// Uniform integer in [0, bound).
    pub fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streams_are_keyed_by_seed_and_name() {
        let a: Vec<u64> = (0..4)
            .map(|_| SplitMix64::keyed(1, "w").next_u64())
            .collect();
        assert!(a.windows(2).all(|p| p[0] == p[1]), "same key, same stream");
        assert_ne!(
            SplitMix64::keyed(1, "w").next_u64(),
            SplitMix64::keyed(2, "w").next_u64()
        );
        assert_ne!(
            SplitMix64::keyed(1, "w").next_u64(),
            SplitMix64::keyed(1, "v").next_u64()
        );
    }

    #[test]
    fn uniform_draws_stay_in_range_and_below_is_bounded() {
        let mut r = SplitMix64::keyed(0, "x");
        let v = r.uniform_f32(1001, -0.5, 0.25);
        assert_eq!(v.len(), 1001);
        assert!(v.iter().all(|&x| (-0.5..0.25).contains(&x)));
        let mean = v.iter().map(|&x| f64::from(x)).sum::<f64>() / v.len() as f64;
        assert!((mean + 0.125).abs() < 0.02, "mean {mean}");
        assert!((0..1000).all(|_| r.below(7) < 7));
        assert!((0..1000).all(|_| (2.0..3.0).contains(&r.uniform(2.0, 3.0))));
    }
}
