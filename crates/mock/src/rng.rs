//! A small seeded PRNG: splitmix64, with Box-Muller normals and exponential draws.
//!
//! Written here rather than pulled from `rand` because the mock needs exactly three
//! distributions and bit-for-bit reproducibility across versions.

/// A splitmix64 generator (Steele, Lea, Flood 2014): 64 bits of state, passes BigCrush, and
/// every seed (including 0) gives a full-period sequence.
#[derive(Clone, Debug)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        SplitMix64 { state: seed }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform draw in `[0, 1)` with 53 bits of precision.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A uniform draw in `(0, 1]`: safe to take the logarithm of.
    fn next_f64_open0(&mut self) -> f64 {
        1.0 - self.next_f64()
    }

    /// A standard normal draw (Box-Muller; the second value of the pair is discarded to keep
    /// the generator stateless beyond its 64 bits).
    pub fn next_normal(&mut self) -> f64 {
        let u1 = self.next_f64_open0();
        let u2 = self.next_f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }

    /// An exponential draw with mean 1.
    pub fn next_exp(&mut self) -> f64 {
        -self.next_f64_open0().ln()
    }
}

/// Mixes two values into a seed (used to give each request its own stream: `seed ^ index`
/// alone would correlate neighbouring requests).
pub(crate) fn mix(seed: u64, index: u64) -> u64 {
    let mut r = SplitMix64::new(seed ^ index.wrapping_mul(0xD1B5_4A32_D192_ED03));
    r.next_u64()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deterministic_and_uniform_enough() {
        let mut a = SplitMix64::new(7);
        let mut b = SplitMix64::new(7);
        for _ in 0..100 {
            assert_eq!(a.next_u64(), b.next_u64());
        }
        let mut r = SplitMix64::new(1);
        let n = 100_000;
        let mean: f64 = (0..n).map(|_| r.next_f64()).sum::<f64>() / n as f64;
        assert!((mean - 0.5).abs() < 0.01, "{mean}");
        let normals: Vec<f64> = (0..n).map(|_| r.next_normal()).collect();
        let m = normals.iter().sum::<f64>() / n as f64;
        let var = normals.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n as f64;
        assert!(m.abs() < 0.02, "{m}");
        assert!((var - 1.0).abs() < 0.03, "{var}");
        let e = (0..n).map(|_| r.next_exp()).sum::<f64>() / n as f64;
        assert!((e - 1.0).abs() < 0.02, "{e}");
    }

    #[test]
    fn known_first_value() {
        // Reference value of splitmix64 seeded with 0.
        assert_eq!(SplitMix64::new(0).next_u64(), 0xE220_A839_7B1D_CDAF);
    }
}
