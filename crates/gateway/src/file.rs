//! The TOML file of the gateway's configuration, and the syntax of its values (durations,
//! timers, the hedge delay), shared with the flags.

use std::net::SocketAddr;
use std::time::Duration;

use serde::Deserialize;
use tailguard::admission::FailMode;

/// A timer value: a duration, or `off`.
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

/// Parses `250ms`, `2s`, `1.5s`, `3m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => {
            return Err(format!(
                "`{s}` has no unit: write e.g. `250ms`, `2s` or `1m`"
            ));
        }
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration: write e.g. `250ms`, `2s` or `1m`"))?;
    let unit = unit.trim();
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{s}` is out of range"))
}

pub(crate) fn parse_timer(s: &str) -> Result<Timer, String> {
    match s.trim() {
        "off" | "none" => Ok(Timer(None)),
        other => parse_duration(other).map(|d| Timer(Some(d))),
    }
}

pub(crate) fn parse_hedge_delay(s: &str) -> Result<HedgeDelaySetting, String> {
    match s.trim() {
        "adaptive" => Ok(HedgeDelaySetting::Adaptive),
        other => parse_duration(other)
            .map(HedgeDelaySetting::Fixed)
            .map_err(|e| format!("{e}, or `adaptive`")),
    }
}

/// Parses the cluster failure mode: `open` or `closed`.
pub(crate) fn parse_fail(s: &str) -> Result<FailMode, String> {
    match s.trim() {
        "open" => Ok(FailMode::Open),
        "closed" => Ok(FailMode::Closed),
        other => Err(format!("expected open or closed, not {other:?}")),
    }
}

macro_rules! string_de {
    ($ty:ty, $parse:path) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                $parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A duration in the TOML file (`"250ms"`).
#[derive(Clone, Copy, Debug)]
pub struct Dur(pub Duration);
fn parse_dur(s: &str) -> Result<Dur, String> {
    parse_duration(s).map(Dur)
}
string_de!(Dur, parse_dur);
string_de!(Timer, parse_timer);
string_de!(HedgeDelaySetting, parse_hedge_delay);

/// The TOML file: every key optional, unknown keys refused.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    /// `listen`
    pub listen: Option<SocketAddr>,
    /// `upstreams`
    pub upstreams: Vec<String>,
    /// `models`
    pub models: Vec<String>,
    /// `shutdown_grace`
    pub shutdown_grace: Option<Dur>,
    /// `max_request_bytes`
    pub max_request_bytes: Option<usize>,
    /// `header_read_timeout`
    pub header_read_timeout: Option<Dur>,
    /// `keep_alive_timeout`
    pub keep_alive_timeout: Option<Dur>,
    /// `max_connections`
    pub max_connections: Option<usize>,
    /// `[hedge]`
    pub hedge: HedgeFile,
    /// `[timeout]`
    pub timeout: TimeoutFile,
    /// `[admission]`
    pub admission: AdmissionFile,
    /// `[priority]`
    pub priority: PriorityFile,
    /// `[mock]`
    pub mock: MockFile,
    /// `[cluster]`
    pub cluster: ClusterFile,
}

/// `[hedge]`
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct HedgeFile {
    /// `max_attempts`
    pub max_attempts: Option<u8>,
    /// `delay`
    pub delay: Option<HedgeDelaySetting>,
    /// `budget_ratio`
    pub budget_ratio: Option<f64>,
    /// `failover_budget_ratio`
    pub failover_budget_ratio: Option<f64>,
    /// `routing`
    pub routing: Option<String>,
    /// `outlier_ejection`
    pub outlier_ejection: Option<bool>,
    /// `replica_slots`
    pub replica_slots: Option<u32>,
}

/// `[timeout]`
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutFile {
    /// `head`
    pub head: Option<Timer>,
    /// `first_token`
    pub first_token: Option<Timer>,
    /// `idle`
    pub idle: Option<Timer>,
    /// `liveness`
    pub liveness: Option<Timer>,
    /// `total`
    pub total: Option<Timer>,
    /// `deadline_header` (a header name, or `off`)
    pub deadline_header: Option<String>,
    /// `propagate_deadline`
    pub propagate_deadline: Option<bool>,
}

/// `[admission]`
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionFile {
    /// `capacity`
    pub capacity: Option<u32>,
    /// `adaptive`
    pub adaptive: Option<bool>,
    /// `min_limit`
    pub min_limit: Option<u32>,
    /// `queue_len`
    pub queue_len: Option<usize>,
    /// `queue_timeout`
    pub queue_timeout: Option<Dur>,
}

/// `[priority]`
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct PriorityFile {
    /// `header`
    pub header: Option<String>,
    /// `default`
    pub default: Option<String>,
    /// `interactive_share`
    pub interactive_share: Option<f64>,
}

/// `[mock]`
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct MockFile {
    /// `replicas`
    pub replicas: Option<usize>,
    /// `script`
    pub script: Option<String>,
    /// `congested_script`
    pub congested_script: Option<String>,
}

/// `[cluster]`
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterFile {
    /// `redis`
    pub redis: Option<String>,
    /// `capacity`
    pub capacity: Option<u32>,
    /// `name`
    pub name: Option<String>,
    /// `fail` (`open` | `closed`)
    pub fail: Option<String>,
    /// `timeout`
    pub timeout: Option<Dur>,
    /// `lease_ttl`
    pub lease_ttl: Option<Dur>,
}

/// The dotted key (`timeout.idle`) of the `key = value` line holding byte `offset` of `text`.
pub(crate) fn key_at(text: &str, offset: usize) -> Option<String> {
    let before = text.get(..offset)?;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next()?;
    let key = line.split_once('=')?.0.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('[') || key.starts_with('#') {
        return None;
    }
    let table = before[..line_start].lines().rev().find_map(|l| {
        let l = l.trim();
        (l.starts_with('[') && !l.starts_with("[[")).then(|| l.trim_matches(['[', ']']).trim())
    });
    Some(match table {
        Some(t) if !t.is_empty() => format!("{t}.{key}"),
        _ => key.to_owned(),
    })
}
