//! Latencies: fixed, or drawn from a seeded distribution, and their header syntax.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use crate::rng::SplitMix64;
use crate::syntax::{DurationFmt, ParseError, parse_duration, parse_f64, split_top, strip_call};

/// The longest latency a distribution can draw (one hour): keeps a heavy-tailed draw from
/// overflowing a `Duration` or a timer.
pub const MAX_LATENCY: Duration = Duration::from_secs(3600);

/// A latency: fixed, or drawn from a seeded distribution.
///
/// Draws are deterministic: a replica gives request number *k* the same draw on every run with
/// the same seed, whatever the interleaving of concurrent requests.
#[derive(Clone, Debug, PartialEq)]
pub enum Latency {
    /// Always this long.
    Fixed(Duration),
    /// Log-normal with the given median and shape `sigma` (the standard deviation of the
    /// logarithm): `median * exp(sigma * N(0,1))`. `sigma = 0.5` gives p99 ≈ 3.2× the median.
    LogNormal {
        /// The median draw.
        median: Duration,
        /// Standard deviation of `ln(latency)`; must be finite and ≥ 0.
        sigma: f64,
    },
    /// With probability `slow_fraction` a draw from `slow`, otherwise from `base`: "5% of
    /// requests take 10x".
    Mixture {
        /// The usual latency.
        base: Box<Latency>,
        /// The latency of the slow fraction.
        slow: Box<Latency>,
        /// Probability of a slow draw, in `[0, 1]`.
        slow_fraction: f64,
    },
}

impl Default for Latency {
    /// Zero: the mock answers as fast as the machine allows unless told otherwise.
    fn default() -> Self {
        Latency::Fixed(Duration::ZERO)
    }
}

impl From<Duration> for Latency {
    fn from(d: Duration) -> Self {
        Latency::Fixed(d)
    }
}

impl Latency {
    /// A fixed latency of `ms` milliseconds.
    pub fn ms(ms: u64) -> Self {
        Latency::Fixed(Duration::from_millis(ms))
    }

    /// A log-normal latency.
    pub fn log_normal(median: Duration, sigma: f64) -> Self {
        Latency::LogNormal { median, sigma }
    }

    /// `base`, except a `slow_fraction` of draws come from `slow`.
    pub fn mixture(base: Latency, slow: Latency, slow_fraction: f64) -> Self {
        Latency::Mixture {
            base: Box::new(base),
            slow: Box::new(slow),
            slow_fraction,
        }
    }

    /// One draw, capped at [`MAX_LATENCY`]. Invalid parameters (negative or non-finite sigma
    /// or fraction) are clamped, never a panic.
    pub fn sample(&self, rng: &mut SplitMix64) -> Duration {
        match self {
            Latency::Fixed(d) => (*d).min(MAX_LATENCY),
            Latency::LogNormal { median, sigma } => {
                let sigma = if sigma.is_finite() {
                    sigma.max(0.0)
                } else {
                    0.0
                };
                let z = rng.next_normal();
                let secs = median.as_secs_f64() * (sigma * z).exp();
                Duration::try_from_secs_f64(secs)
                    .unwrap_or(MAX_LATENCY)
                    .min(MAX_LATENCY)
            }
            Latency::Mixture {
                base,
                slow,
                slow_fraction,
            } => {
                let f = if slow_fraction.is_finite() {
                    slow_fraction.clamp(0.0, 1.0)
                } else {
                    0.0
                };
                if rng.next_f64() < f {
                    slow.sample(rng)
                } else {
                    base.sample(rng)
                }
            }
        }
    }

    /// The value of a fixed latency.
    pub fn as_fixed(&self) -> Option<Duration> {
        match self {
            Latency::Fixed(d) => Some(*d),
            _ => None,
        }
    }
}

impl fmt::Display for Latency {
    /// The header syntax: `250ms`, `lognormal(200ms,0.5)`, `mix(0.05,100ms,1s)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Latency::Fixed(d) => write!(f, "{}", DurationFmt(*d)),
            Latency::LogNormal { median, sigma } => {
                write!(f, "lognormal({},{sigma})", DurationFmt(*median))
            }
            Latency::Mixture {
                base,
                slow,
                slow_fraction,
            } => write!(f, "mix({slow_fraction},{base},{slow})"),
        }
    }
}

impl FromStr for Latency {
    type Err = ParseError;

    fn from_str(s: &str) -> Result<Self, ParseError> {
        let s = s.trim();
        if let Some(inner) = strip_call(s, "lognormal") {
            let parts = split_top(inner, ',');
            if parts.len() != 2 {
                return Err(ParseError::new(s, "lognormal takes (median,sigma)"));
            }
            let median = parse_duration(parts[0])?;
            let sigma = parse_f64(parts[1])?;
            if sigma < 0.0 {
                return Err(ParseError::new(s, "sigma must be >= 0"));
            }
            return Ok(Latency::LogNormal { median, sigma });
        }
        if let Some(inner) = strip_call(s, "mix") {
            let parts = split_top(inner, ',');
            if parts.len() != 3 {
                return Err(ParseError::new(s, "mix takes (slow_fraction,base,slow)"));
            }
            let frac = parse_f64(parts[0])?;
            if !(0.0..=1.0).contains(&frac) {
                return Err(ParseError::new(s, "slow_fraction must be in [0,1]"));
            }
            return Ok(Latency::mixture(parts[1].parse()?, parts[2].parse()?, frac));
        }
        if let Some(inner) = strip_call(s, "fixed") {
            return Ok(Latency::Fixed(parse_duration(inner)?));
        }
        Ok(Latency::Fixed(parse_duration(s)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_are_seeded_and_capped() {
        let l: Latency = "mix(0.1,lognormal(100ms,0.5),10s)".parse().unwrap();
        let mut a = SplitMix64::new(1);
        let mut b = SplitMix64::new(1);
        let xs: Vec<_> = (0..1000).map(|_| l.sample(&mut a)).collect();
        let ys: Vec<_> = (0..1000).map(|_| l.sample(&mut b)).collect();
        assert_eq!(xs, ys);
        let slow = xs.iter().filter(|d| **d == Duration::from_secs(10)).count();
        assert!((60..=140).contains(&slow), "{slow}");
        let huge = Latency::log_normal(Duration::from_secs(3000), 50.0);
        let mut r = SplitMix64::new(3);
        for _ in 0..100 {
            assert!(huge.sample(&mut r) <= MAX_LATENCY);
        }
    }
}
