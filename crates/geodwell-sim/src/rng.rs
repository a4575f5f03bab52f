//! The seeded random numbers of the simulator, the benchmarks and the tests.
//!
//! Invariant: the same seed gives the same sequence on every platform and build, which is what
//! makes generated traces reproducible. The generator is `rand_xoshiro`'s Xoshiro256++ (seeded
//! through SplitMix64 by `seed_from_u64`, so nearby seeds give unrelated streams and a zero seed
//! is harmless), and the distributions are `rand`'s and `rand_distr`'s; this type only names the
//! draws the generators make, so that call sites read as what they mean.

use rand::{Rng as _, RngCore, SeedableRng};
use rand_distr::StandardNormal;
use rand_xoshiro::Xoshiro256PlusPlus;

/// A seeded generator with the draws the simulator uses.
#[derive(Debug, Clone)]
pub struct Rng(Xoshiro256PlusPlus);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(Xoshiro256PlusPlus::seed_from_u64(seed))
    }

    /// A generator for the `stream`-th independent stream of `seed` (e.g. one per device).
    pub fn stream(seed: u64, stream: u64) -> Rng {
        Rng::new(seed ^ stream.wrapping_mul(0xD1B5_4A32_D192_ED03))
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0.random::<f64>()
    }

    /// Uniform in [lo, hi); `lo` when the range is empty.
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        if hi > lo {
            self.0.random_range(lo..hi)
        } else {
            lo
        }
    }

    /// Uniform in [0, n); 0 when `n == 0`.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.0.random_range(0..n) }
    }

    /// Uniform integer in [lo, hi] (inclusive); `lo` when `hi < lo`.
    pub fn between(&mut self, lo: i64, hi: i64) -> i64 {
        if hi <= lo {
            lo
        } else {
            self.0.random_range(lo..=hi)
        }
    }

    /// True with probability `p` (clamped to [0, 1]).
    pub fn chance(&mut self, p: f64) -> bool {
        self.0.random_bool(p.clamp(0.0, 1.0))
    }

    /// Standard normal.
    pub fn normal(&mut self) -> f64 {
        self.0.sample(StandardNormal)
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
