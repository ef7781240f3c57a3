//! The result of a run: [`LoadReport`] (histograms and counts), its serialisable
//! [`LoadSummary`] of [`Percentiles`], and the human-readable table.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::{EndReason, HIST_MAX_US};

/// The outcome of one request.
#[derive(Debug, Default)]
pub(super) struct Sample {
    pub(super) status: Option<u16>,
    pub(super) end: Option<EndReason>,
    pub(super) headers: Option<Duration>,
    pub(super) ttft: Option<Duration>,
    pub(super) gaps: Vec<Duration>,
    pub(super) total: Option<Duration>,
    pub(super) tokens: u64,
}

impl Sample {
    /// The outcome of a request that ended with `reason` and nothing else to tell.
    pub(super) fn ended(reason: EndReason) -> Self {
        Sample {
            end: Some(reason),
            ..Sample::default()
        }
    }
}

/// The result of a run: histograms (microseconds) and counts.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LoadReport {
    /// Requests scheduled within the window (sent or dropped).
    pub scheduled: u64,
    /// Length of the sending window actually used (to the last scheduled arrival).
    pub window: Duration,
    /// Time from the start to the end of the drain.
    pub elapsed: Duration,
    /// Target rate, requests per second.
    pub target_rate: f64,
    /// Time to response headers, from the scheduled send time.
    pub headers: Histogram<u64>,
    /// Time to first token, from the scheduled send time.
    pub ttft: Histogram<u64>,
    /// Gaps between consecutive token events.
    pub gap: Histogram<u64>,
    /// Total time to the end of the response, from the scheduled send time.
    pub total: Histogram<u64>,
    /// Token events received, over all requests.
    pub tokens: u64,
    /// Count per HTTP status.
    pub statuses: BTreeMap<u16, u64>,
    /// Count per end reason.
    pub end_reasons: BTreeMap<EndReason, u64>,
}

fn histogram() -> Histogram<u64> {
    // Valid bounds: cannot fail.
    Histogram::new_with_max(HIST_MAX_US, 3).expect("valid histogram bounds")
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl LoadReport {
    pub(super) fn new(target_rate: f64) -> Self {
        LoadReport {
            scheduled: 0,
            window: Duration::ZERO,
            elapsed: Duration::ZERO,
            target_rate,
            headers: histogram(),
            ttft: histogram(),
            gap: histogram(),
            total: histogram(),
            tokens: 0,
            statuses: BTreeMap::new(),
            end_reasons: BTreeMap::new(),
        }
    }

    pub(super) fn add(&mut self, s: Sample) {
        if let Some(st) = s.status {
            *self.statuses.entry(st).or_default() += 1;
        }
        if let Some(end) = s.end {
            *self.end_reasons.entry(end).or_default() += 1;
        }
        if let Some(d) = s.headers {
            self.headers.saturating_record(us(d));
        }
        if let Some(d) = s.ttft {
            self.ttft.saturating_record(us(d));
        }
        for g in s.gaps {
            self.gap.saturating_record(us(g));
        }
        if let Some(d) = s.total {
            self.total.saturating_record(us(d));
        }
        self.tokens += s.tokens;
    }

    /// Requests that ended with `reason`.
    pub fn count(&self, reason: EndReason) -> u64 {
        self.end_reasons.get(&reason).copied().unwrap_or(0)
    }

    /// The serialisable summary (percentiles in seconds).
    pub fn summary(&self) -> LoadSummary {
        LoadSummary {
            scheduled: self.scheduled,
            target_rate: self.target_rate,
            achieved_rate: if self.window.is_zero() {
                0.0
            } else {
                self.scheduled as f64 / self.window.as_secs_f64()
            },
            window_seconds: self.window.as_secs_f64(),
            elapsed_seconds: self.elapsed.as_secs_f64(),
            tokens: self.tokens,
            statuses: self
                .statuses
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            end_reasons: self
                .end_reasons
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), *v))
                .collect(),
            headers: Percentiles::of(&self.headers),
            ttft: Percentiles::of(&self.ttft),
            gap: Percentiles::of(&self.gap),
            total: Percentiles::of(&self.total),
        }
    }
}

/// Percentiles of one histogram, in seconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Smallest sample.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
}

impl Percentiles {
    /// Percentiles of a microsecond histogram.
    pub fn of(h: &Histogram<u64>) -> Self {
        let s = |v: u64| v as f64 / 1e6;
        if h.is_empty() {
            return Percentiles {
                count: 0,
                min: 0.0,
                mean: 0.0,
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                p999: 0.0,
                max: 0.0,
            };
        }
        Percentiles {
            count: h.len(),
            min: s(h.min()),
            mean: h.mean() / 1e6,
            p50: s(h.value_at_quantile(0.5)),
            p90: s(h.value_at_quantile(0.9)),
            p99: s(h.value_at_quantile(0.99)),
            p999: s(h.value_at_quantile(0.999)),
            max: s(h.max()),
        }
    }
}

/// The JSON shape of a [`LoadReport`].
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct LoadSummary {
    /// Requests scheduled.
    pub scheduled: u64,
    /// Target rate (req/s).
    pub target_rate: f64,
    /// Scheduled requests over the window (req/s).
    pub achieved_rate: f64,
    /// The sending window (s).
    pub window_seconds: f64,
    /// The whole run (s).
    pub elapsed_seconds: f64,
    /// Token events received.
    pub tokens: u64,
    /// Count per HTTP status.
    pub statuses: BTreeMap<String, u64>,
    /// Count per end reason.
    pub end_reasons: BTreeMap<String, u64>,
    /// Time to headers.
    pub headers: Percentiles,
    /// Time to first token.
    pub ttft: Percentiles,
    /// Inter-token gaps.
    pub gap: Percentiles,
    /// Total time.
    pub total: Percentiles,
}

impl LoadSummary {
    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serialisation cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

impl fmt::Display for LoadReport {
    /// A human-readable table: percentiles in milliseconds, then the counts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.summary();
        writeln!(
            f,
            "scheduled {} requests in {:.3}s ({:.1} req/s, target {:.1}); run took {:.3}s; {} tokens",
            s.scheduled,
            s.window_seconds,
            s.achieved_rate,
            s.target_rate,
            s.elapsed_seconds,
            s.tokens
        )?;
        writeln!(
            f,
            "{:<8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "ms", "count", "p50", "p90", "p99", "p99.9", "max"
        )?;
        for (name, p) in [
            ("headers", &s.headers),
            ("ttft", &s.ttft),
            ("gap", &s.gap),
            ("total", &s.total),
        ] {
            writeln!(
                f,
                "{:<8} {:>8} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>10.3}",
                name,
                p.count,
                p.p50 * 1e3,
                p.p90 * 1e3,
                p.p99 * 1e3,
                p.p999 * 1e3,
                p.max * 1e3
            )?;
        }
        let statuses: Vec<String> = s.statuses.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let ends: Vec<String> = s
            .end_reasons
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        writeln!(f, "status: {}", statuses.join(" "))?;
        write!(f, "end:    {}", ends.join(" "))
    }
}
