//! A small seeded PRNG for the simulator, benchmarks and tests.
//!
//! Invariant: the same seed gives the same sequence on every platform and build (no floating-point
//! state, no OS entropy), which is what makes generated traces reproducible. xorshift64* is not
//! cryptographic and needs no dependency; the seed is scrambled by SplitMix64 so that nearby
//! seeds (device 0, device 1, ...) give unrelated streams and a zero seed is harmless.

/// xorshift64* with a SplitMix64-scrambled seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        // xorshift's only fixed point is 0.
        Rng(if z == 0 { 0x2545_F491_4F6C_DD1D } else { z })
    }

    /// A generator for the `stream`-th independent stream of `seed` (e.g. one per device).
    pub fn stream(seed: u64, stream: u64) -> Rng {
        Rng::new(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Uniform in [0, n); 0 when `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        // Multiply-shift: unbiased enough for simulation and free of the modulo's slow divide.
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform integer in [lo, hi] (inclusive); `lo` when `hi < lo`.
    pub fn between(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            return lo;
        }
        lo + self.below((hi - lo) as u64 + 1) as i64
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Standard normal (Box-Muller; one of the pair is discarded to keep the state a single u64).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(f64::MIN_POSITIVE);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// One element of a non-empty slice.
    pub fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream_and_streams_differ() {
        let a: Vec<u64> = (0..8)
            .map(|_| 0)
            .scan(Rng::new(7), |r, _: u64| Some(r.next_u64()))
            .collect();
        let b: Vec<u64> = (0..8)
            .map(|_| 0)
            .scan(Rng::new(7), |r, _: u64| Some(r.next_u64()))
            .collect();
        assert_eq!(a, b);
        let mut s0 = Rng::stream(7, 0);
        let mut s1 = Rng::stream(7, 1);
        assert_ne!(s0.next_u64(), s1.next_u64());
        let mut z = Rng::new(0);
        assert_ne!(z.next_u64(), 0);
    }

    #[test]
    fn ranges_hold_and_moments_are_plausible() {
        let mut r = Rng::new(1);
        let n = 100_000;
        let (mut sum, mut sq) = (0.0, 0.0);
        for _ in 0..n {
            let u = r.unit();
            assert!((0.0..1.0).contains(&u));
            let b = r.below(10);
            assert!(b < 10);
            let k = r.between(-3, 3);
            assert!((-3..=3).contains(&k));
            let z = r.normal();
            sum += z;
            sq += z * z;
        }
        let mean = sum / n as f64;
        let var = sq / n as f64 - mean * mean;
        assert!(mean.abs() < 0.02, "mean {mean}");
        assert!((var - 1.0).abs() < 0.03, "variance {var}");
        assert_eq!(r.below(0), 0);
        assert_eq!(r.between(5, 2), 5);
    }
}
