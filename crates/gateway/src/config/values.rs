//! The syntax of the values (durations, timers, the hedge delay, `on`/`off`), the same in a flag,
//! a variable and the file, and the checks a setting's value passes (`check` in `sections`).

use std::fmt::Display;
use std::str::FromStr;
use std::time::Duration;

use http::{HeaderName, Uri};
use serde::{Deserialize, Deserializer};
use tailguard::admission::FailMode;
use tailguard::core::Priority;

use crate::Routing;

/// Parses `250ms`, `2s`, `1.5s`, `3m`, `1h`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let Some(i) = s.find(|c: char| !(c.is_ascii_digit() || c == '.')) else {
        return Err(format!(
            "`{s}` has no unit: write e.g. `250ms`, `2s` or `1m`"
        ));
    };
    let (num, unit) = s.split_at(i);
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration: write e.g. `250ms`, `2s` or `1m`"))?;
    let secs = match unit.trim() {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        unit => return Err(format!("`{s}`: unknown unit `{unit}` (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{s}` is out of range"))
}

/// A duration as written: `250ms`, `2s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dur(pub Duration);

/// A timer as written: a duration, or `off` (`none`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timer(pub Option<Duration>);

/// The hedge delay setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HedgeDelaySetting {
    /// The adaptive p90 of recent times to first token.
    Adaptive,
    /// A fixed delay.
    Fixed(Duration),
}

/// A switch: `on` or `off` in a flag or a variable, `true` or `false` in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnOff(pub bool);

/// `FromStr` (the syntax of a flag and a variable) for each type, and `From` its resolved value.
macro_rules! values {
    ($($ty:ty => $resolved:ty, |$s:ident| $parse:expr, |$v:ident| $get:expr;)*) => {$(
        impl FromStr for $ty {
            type Err = String;
            fn from_str($s: &str) -> Result<Self, String> { $parse }
        }
        impl From<$ty> for $resolved {
            fn from($v: $ty) -> $resolved { $get }
        }
    )*};
}
values! {
    Dur => Duration, |s| parse_duration(s).map(Dur), |d| d.0;
    Timer => Option<Duration>, |s| match s.trim() {
        "off" | "none" => Ok(Timer(None)),
        s => parse_duration(s).map(|d| Timer(Some(d))),
    }, |t| t.0;
    OnOff => bool, |s| match s {
        "on" | "off" => Ok(OnOff(s == "on")),
        s => Err(format!("must be `on` or `off`, not `{s}`")),
    }, |s| s.0;
}

impl FromStr for HedgeDelaySetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "adaptive" => Ok(HedgeDelaySetting::Adaptive),
            s => parse_duration(s)
                .map(HedgeDelaySetting::Fixed)
                .map_err(|e| format!("{e}, or `adaptive`")),
        }
    }
}

/// In the file: a string in the syntax of the flag.
macro_rules! deserialize_from_str {
    ($($ty:ty),*) => {$(
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                String::deserialize(d)?.parse().map_err(serde::de::Error::custom)
            }
        }
    )*};
}
deserialize_from_str!(Dur, Timer, HedgeDelaySetting);

impl<'de> Deserialize<'de> for OnOff {
    /// In the file: `true` or `false`.
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        bool::deserialize(d).map(OnOff)
    }
}

// The checks (`check` in `sections`): each takes the value as written and returns it, or what
// it stands for, or what is wrong with it (the caller names the key and the flag).

fn ensure<T>(ok: bool, v: T, why: impl Into<String>) -> Result<T, String> {
    if ok { Ok(v) } else { Err(why.into()) }
}

pub(super) fn at_least_1<T: PartialOrd + From<u8>>(n: T) -> Result<T, String> {
    ensure(n >= T::from(1), n, "must be at least 1")
}

pub(super) fn positive(d: Dur) -> Result<Dur, String> {
    ensure(!d.0.is_zero(), d, "must be longer than 0")
}

pub(super) fn timer(t: Timer) -> Result<Timer, String> {
    ensure(
        t.0 != Some(Duration::ZERO),
        t,
        "must be longer than 0 (or `off`)",
    )
}

fn between<T: PartialOrd + Display + Copy>(v: T, min: T, max: T) -> Result<T, String> {
    let why = format!("must be between {min} and {max}, not {v}");
    ensure((min..=max).contains(&v), v, why)
}

pub(super) fn budget_ratio(r: f64) -> Result<f64, String> {
    between(r, 0.0, 4.0)
}

pub(super) fn share(r: f64) -> Result<f64, String> {
    between(r, 0.0, 1.0)
}

pub(super) fn attempts(n: u8) -> Result<u8, String> {
    between(n, 1, tailguard::hedge::MAX_ATTEMPTS)
}

pub(super) fn routing(s: String) -> Result<Routing, String> {
    match s.as_str() {
        "least-wait" => Ok(Routing::LeastWait),
        "round-robin" => Ok(Routing::RoundRobin),
        s => Err(format!("must be `least-wait` or `round-robin`, not `{s}`")),
    }
}

pub(super) fn fail_mode(s: String) -> Result<FailMode, String> {
    match s.trim() {
        "open" => Ok(FailMode::Open),
        "closed" => Ok(FailMode::Closed),
        s => Err(format!("expected open or closed, not {s:?}")),
    }
}

/// A header name, or `off`.
pub(super) fn deadline_header(s: String) -> Result<Option<HeaderName>, String> {
    match s.trim() {
        "off" => Ok(None),
        s => (s.try_into().map(Some)).map_err(|_| format!("`{s}` is not a header name (or `off`)")),
    }
}

/// A header name, or `off` (`none`, empty).
pub(super) fn priority_header(s: String) -> Result<Option<HeaderName>, String> {
    match s.trim() {
        "" | "off" | "none" => Ok(None),
        s => (s.try_into().map(Some)).map_err(|_| format!("`{s}` is not a valid header name")),
    }
}

/// Parses a class name of the standard set.
pub fn parse_priority(s: &str) -> Option<Priority> {
    Priority::standard_set()
        .into_iter()
        .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
}

pub(super) fn priority_class(s: String) -> Result<Priority, String> {
    parse_priority(&s).ok_or_else(|| {
        format!("unknown class `{s}` (one of critical, interactive, standard, batch, sheddable)")
    })
}

pub(super) fn redis_url(url: String) -> Result<String, String> {
    tailguard_redis::check_url(&url).map_err(|e| e.to_string())?;
    Ok(url)
}

pub(super) fn upstreams(urls: Vec<String>) -> Result<Vec<Uri>, String> {
    urls.iter().map(|u| upstream(u)).collect()
}

/// `http://host:port`, no path (requests keep theirs).
fn upstream(u: &str) -> Result<Uri, String> {
    let uri: Uri =
        (u.trim().trim_end_matches('/').parse()).map_err(|e| format!("`{u}` is not a URL: {e}"))?;
    if uri.scheme_str() != Some("http") || uri.authority().is_none() {
        return Err(format!("`{u}` must be an http://host:port URL"));
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return Err(format!("`{u}` must not have a path (requests keep theirs)"));
    }
    Ok(uri)
}
