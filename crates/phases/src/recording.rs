//! The per-request state shared by the response future and the body.

use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use http::{HeaderMap, Response, StatusCode, header};
use tailguard_core::{
    AdmissionOutcome, Dialect, EndReason, EndReport, HedgeOutcome, Observation, Priority,
    RequestFacts, StreamTracker, UpstreamFailure,
};
use tokio::time::Instant;
use tracing::Span;

use crate::labels::Upstream;
use crate::layer::Config;
use crate::metrics_sink::Series;
use crate::report::{GapStats, PhaseLabels, PhaseReport};
use crate::request_id::RequestId;
use crate::sink::{PhaseSink, Sink};

/// How the recorder itself saw the request end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Observed {
    /// The body ended: `None`, trailers, or `is_end_stream` after a frame.
    End,
    /// The body yielded an error.
    BodyError,
    /// The body or the response future was dropped before the end.
    Dropped,
    /// The inner service failed before headers.
    ServiceError,
}

pub(crate) struct Recording {
    cfg: Arc<Config>,
    start: Instant,
    /// The labels, kept up to date (the model and upstream may change when headers arrive) and
    /// moved into the report at the end: no clones.
    labels: PhaseLabels,
    request_id: Option<RequestId>,
    end_report: EndReport,
    facts: Option<RequestFacts>,
    status: Option<StatusCode>,
    head_reason: Option<EndReason>,
    time_to_headers: Option<Duration>,
    admission: Option<AdmissionOutcome>,
    hedge: Option<HedgeOutcome>,
    tracker: Option<StreamTracker>,
    ttft: Option<Duration>,
    last_token: Instant,
    gaps: Gaps,
    gap_hists: GapHistograms,
    /// The first metrics sink's gap series (streamed responses): index in the sink list, and
    /// the series, which finds the report series without a lookup.
    metrics_gap: Option<(usize, Arc<Series>)>,
    output_events: u64,
    events: u64,
    done_seen: bool,
    in_band_error: bool,
}

impl Recording {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cfg: Arc<Config>,
        start: Instant,
        request_id: Option<RequestId>,
        end_report: EndReport,
        route: Arc<str>,
        priority: Option<Priority>,
        facts: Option<RequestFacts>,
    ) -> Box<Self> {
        let labels = PhaseLabels {
            route,
            model: model_label(&cfg, facts.as_ref()),
            upstream: cfg.upstream.clone(),
            priority,
            streamed: facts.as_ref().and_then(|f| f.stream).unwrap_or(false),
        };
        // Built in the box: the state is a few hundred bytes, not worth a copy.
        Box::new(Recording {
            cfg,
            start,
            labels,
            request_id,
            end_report,
            facts,
            status: None,
            head_reason: None,
            time_to_headers: None,
            admission: None,
            hedge: None,
            tracker: None,
            ttft: None,
            last_token: start,
            gaps: Gaps::default(),
            gap_hists: GapHistograms::default(),
            metrics_gap: None,
            output_events: 0,
            events: 0,
            done_seen: false,
            in_band_error: false,
        })
    }

    /// Takes in the response head: status, extensions, and the request id header.
    pub(crate) fn on_headers<B>(&mut self, res: &mut Response<B>) {
        let now = Instant::now();
        self.time_to_headers = Some(now.saturating_duration_since(self.start));
        let status = res.status();
        self.status = Some(status);
        let ext = res.extensions();
        self.admission = ext.get::<AdmissionOutcome>().cloned();
        self.hedge = ext.get::<HedgeOutcome>().cloned();
        if self.labels.priority.is_none() {
            self.labels.priority = ext.get::<Priority>().cloned();
        }
        if self.facts.is_none() {
            self.facts = ext.get::<RequestFacts>().cloned();
            if self.facts.is_some() {
                self.labels.model = model_label(&self.cfg, self.facts.as_ref());
            }
        }
        if let Some(u) = ext.get::<Upstream>() {
            self.labels.upstream = u.arc();
        }
        // Replaces an id the upstream chose: the client gets back the id the logs carry.
        if let (Some(h), Some(id)) = (&self.cfg.request_id_header, &self.request_id) {
            res.headers_mut()
                .insert(h.clone(), id.header_value().clone());
        }

        let headers = res.headers();
        self.head_reason = if self
            .admission
            .as_ref()
            .is_some_and(|a| a.rejected.is_some())
        {
            Some(EndReason::Rejected)
        } else if status.is_client_error() || status.is_server_error() {
            Some(EndReason::UpstreamError(UpstreamFailure::Status(status)))
        } else if grpc_error(headers) {
            // A trailers-only gRPC error: the status travels in the headers.
            Some(EndReason::UpstreamError(UpstreamFailure::InBand))
        } else {
            None
        };
        // One look at the content-type serves both questions: streamed or not, and (under
        // `Dialect::Auto`) which dialect the tracker uses.
        let dialect = if self.head_reason.is_some() || !status.is_success() {
            None
        } else if matches!(self.cfg.dialect, Dialect::Auto) {
            let ct = headers
                .get(header::CONTENT_TYPE)
                .map_or(&[][..], |v| v.as_bytes());
            stream_dialect(ct)
        } else {
            Some(self.cfg.dialect.clone())
        };
        self.labels.streamed = dialect.is_some();
        if let Some(dialect) = dialect {
            self.tracker = Some(StreamTracker::new(&dialect, headers).with_usage(self.cfg.usage));
            for (i, sink) in self.cfg.sinks.0.iter().enumerate() {
                let h = match sink {
                    Sink::Metrics(m) if self.metrics_gap.is_none() => {
                        let series = m.gap_series(&self.labels);
                        let h = m.gap_histogram_of(&series);
                        self.metrics_gap = Some((i, series));
                        Some(h)
                    }
                    Sink::Metrics(m) => m.gap_histogram(&self.labels),
                    Sink::Dyn(d) => d.gap_histogram(&self.labels),
                };
                if let Some(h) = h {
                    self.gap_hists.push(h);
                }
            }
        }
    }

    /// Scans one data frame: no allocation, no lock, the clock read only for frames with tokens.
    #[inline]
    pub(crate) fn on_data<D: Buf>(&mut self, data: &D) {
        if let Some(t) = self.tracker.as_mut() {
            let obs = t.observe(data);
            self.apply(obs);
        }
    }

    pub(crate) fn on_trailers(&mut self, trailers: &HeaderMap) {
        if let Some(t) = self.tracker.as_mut() {
            let obs = t.observe_trailers(trailers);
            self.apply(obs);
        } else if grpc_error(trailers) {
            self.in_band_error = true;
        }
    }

    #[inline]
    fn apply(&mut self, obs: Observation) {
        self.events += u64::from(obs.events);
        self.done_seen |= obs.done;
        self.in_band_error |= obs.error;
        if obs.tokens != 0 {
            self.on_tokens(obs.tokens);
        }
    }

    /// A frame with tokens: the one clock read, then TTFT or one gap.
    #[inline]
    fn on_tokens(&mut self, tokens: u32) {
        let now = Instant::now();
        // No output event yet is the same as no TTFT yet: both are set by the first token.
        if self.output_events == 0 {
            self.ttft = Some(now.saturating_duration_since(self.start));
        } else {
            let gap = now.saturating_duration_since(self.last_token);
            self.gaps.add(gap);
            self.gap_hists.record(gap);
        }
        self.last_token = now;
        self.output_events += u64::from(tokens);
    }

    /// Ends the recording and hands the report to every sink. Consumes the state, so it runs
    /// at most once.
    pub(crate) fn finish(mut self: Box<Self>, observed: Observed, span: &Span) {
        if observed == Observed::End
            && let Some(t) = self.tracker.as_mut()
        {
            let obs = t.finish();
            self.apply(obs);
        }
        let total = Instant::now().saturating_duration_since(self.start);
        let own = match observed {
            Observed::End if self.in_band_error => {
                EndReason::UpstreamError(UpstreamFailure::InBand)
            }
            Observed::End => EndReason::Completed,
            Observed::BodyError | Observed::ServiceError => {
                EndReason::UpstreamError(UpstreamFailure::Transport)
            }
            Observed::Dropped => EndReason::ClientDisconnect,
        };
        let reported = self.end_report.get();
        let end_reason = reported.or(self.head_reason).unwrap_or(own);
        let time_per_output_token = match (self.ttft, self.output_events) {
            (Some(ttft), n) if n > 1 => Some(total.saturating_sub(ttft).div_f64((n - 1) as f64)),
            _ => None,
        };
        let usage = self.tracker.as_ref().and_then(StreamTracker::usage);
        // Fields move out of the box one by one (no copy of the whole state).
        let this = self;
        let priority = this.labels.priority.clone();
        let report = PhaseReport {
            request_id: this.request_id,
            labels: this.labels,
            end_reason,
            end_reason_reported: reported.is_some(),
            status: this.status,
            queue_wait: this.admission.as_ref().map(|a| a.queue_wait),
            time_to_headers: this.time_to_headers,
            time_to_first_token: this.ttft,
            gaps: this.gaps.stats(),
            time_per_output_token,
            total,
            output_events: this.output_events,
            events: this.events,
            done_seen: this.done_seen,
            usage,
            admission: this.admission,
            hedge: this.hedge,
            priority,
            facts: this.facts,
            span: span.clone(),
        };
        for (i, sink) in this.cfg.sinks.0.iter().enumerate() {
            match sink {
                Sink::Metrics(m) => {
                    let gap = match &this.metrics_gap {
                        Some((at, series)) if *at == i => Some(&**series),
                        _ => None,
                    };
                    m.report_with(&report, gap);
                }
                Sink::Dyn(d) => d.on_report(&report),
            }
        }
    }
}

/// [`GapStats`] accumulated in nanoseconds: integer compares and adds per frame instead of
/// `Duration` arithmetic; converted (exactly) once, for the report.
struct Gaps {
    count: u64,
    sum: u64,
    /// `u64::MAX` until the first gap, so that `add` needs no first-gap branch.
    min: u64,
    max: u64,
}

impl Default for Gaps {
    fn default() -> Self {
        Gaps {
            count: 0,
            sum: 0,
            min: u64::MAX,
            max: 0,
        }
    }
}

impl Gaps {
    #[inline]
    fn add(&mut self, gap: Duration) {
        // Saturates past 584 years, which a gap between two frames does not reach.
        let ns = u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX);
        self.min = self.min.min(ns);
        self.max = self.max.max(ns);
        self.sum = self.sum.saturating_add(ns);
        self.count += 1;
    }

    fn stats(&self) -> GapStats {
        GapStats {
            count: self.count,
            sum: Duration::from_nanos(self.sum),
            min: Duration::from_nanos(if self.count == 0 { 0 } else { self.min }),
            max: Duration::from_nanos(self.max),
        }
    }
}

/// The live gap histograms of the sinks: one (the metrics sink's) without allocating.
#[derive(Default)]
struct GapHistograms {
    first: Option<metrics::Histogram>,
    more: Vec<metrics::Histogram>,
}

impl GapHistograms {
    fn push(&mut self, h: metrics::Histogram) {
        if self.first.is_none() {
            self.first = Some(h);
        } else {
            self.more.push(h);
        }
    }

    #[inline]
    fn record(&self, gap: Duration) {
        if let Some(first) = &self.first {
            // A `Duration` converts to seconds (`as_secs_f64`) inside `record`, and only when
            // the handle is live: a no-op handle (no recorder installed) costs one branch.
            first.record(gap);
            for h in &self.more {
                h.record(gap);
            }
        }
    }
}

/// Whether a response with this `content-type` value is a stream, and if so, the dialect
/// [`Dialect::Auto`] resolves to for it.
///
/// A stream's type, after leading whitespace, starts with an SSE, gRPC or NDJSON type (ASCII
/// case-insensitively), and the whole value is visible ASCII (what `HeaderValue::to_str`
/// accepts; an opaque value is not a stream). The dialect is exactly what
/// [`Dialect::resolve`] gives (both pinned by tests against the straightforward versions),
/// found in the same pass instead of a second header lookup and parse.
fn stream_dialect(ct: &[u8]) -> Option<Dialect> {
    // Leading whitespace: in a visible-ASCII value only spaces and tabs.
    let start = ct
        .iter()
        .position(|&b| b != b' ' && b != b'\t')
        .unwrap_or(ct.len());
    let rest = &ct[start..];
    // What `Dialect::resolve` compares: the media type before any `;`, trimmed. Leading
    // whitespace is gone already, and a matched prefix holds no `;`: the media type is exactly
    // the `len`-byte prefix when what follows it, up to a `;`, is whitespace.
    let exact = |len: usize, d: Dialect| {
        let tail = &rest[len..];
        let end = tail.iter().position(|&b| b == b';').unwrap_or(tail.len());
        if tail[..end].trim_ascii_end().is_empty() {
            d
        } else {
            Dialect::AnyByte
        }
    };
    let found = if starts_ci(rest, b"text/event-stream") {
        exact(17, Dialect::LlmSse)
    } else if starts_ci(rest, b"application/") {
        let sub = &rest[12..];
        if starts_ci(sub, b"grpc") {
            Dialect::Grpc
        } else if starts_ci(sub, b"x-ndjson") {
            exact(20, Dialect::Ndjson)
        } else if starts_ci(sub, b"ndjson") {
            Dialect::AnyByte
        } else if starts_ci(sub, b"jsonl") {
            exact(17, Dialect::Ndjson)
        } else {
            return None;
        }
    } else {
        return None;
    };
    // Checked last: a stream type is rare among the values that fail it. No early exit, so
    // that the loop runs a vector at a time.
    ct.iter()
        .fold(true, |ok, &b| {
            ok & (b == b'\t' || (b' '..0x7f).contains(&b))
        })
        .then_some(found)
}

/// Whether `s` starts with the lower-case pattern `p`, ASCII case-insensitively, *given* that
/// `s` is visible ASCII: `| 0x20` folds upper-case letters, and the only other bytes it maps
/// onto a pattern byte (`/` from 0x0f, `-` from 0x0d) are control bytes, which the visible-ASCII
/// check of [`stream_dialect`] rejects anyway.
#[inline]
fn starts_ci(s: &[u8], p: &[u8]) -> bool {
    const FOLD: u64 = 0x2020_2020_2020_2020;
    if s.len() < p.len() {
        return false;
    }
    let word = |b: &[u8]| {
        let mut w = [0u8; 8];
        w.copy_from_slice(b);
        u64::from_le_bytes(w)
    };
    let mut i = 0;
    while i + 8 <= p.len() {
        if word(&s[i..i + 8]) | FOLD != word(&p[i..i + 8]) {
            return false;
        }
        i += 8;
    }
    s[i..p.len()]
        .iter()
        .zip(&p[i..])
        .all(|(a, b)| a | 0x20 == *b)
}

/// The model label: the request's model normalised against the configured list.
fn model_label(cfg: &Config, facts: Option<&RequestFacts>) -> Arc<str> {
    match facts.and_then(|f| f.model.as_deref()) {
        None => cfg.unknown.clone(),
        Some(m) => cfg.models.normalise(m).unwrap_or(&cfg.other).clone(),
    }
}

fn grpc_error(headers: &HeaderMap) -> bool {
    tailguard_core::headers::grpc_status(headers).is_some_and(|code| code != 0)
}

#[cfg(test)]
mod tests {
    use http::HeaderValue;

    use super::*;

    /// The `str`-based check this crate used before `is_stream` moved to bytes: the oracle.
    fn is_stream_str(v: &HeaderValue) -> bool {
        let Ok(ct) = v.to_str() else {
            return false;
        };
        let ct = ct.trim_start();
        let starts = |p: &str| ct.len() >= p.len() && ct[..p.len()].eq_ignore_ascii_case(p);
        starts("text/event-stream")
            || starts("application/grpc")
            || starts("application/x-ndjson")
            || starts("application/ndjson")
            || starts("application/jsonl")
    }

    fn content_types() -> Vec<HeaderValue> {
        let mut v: Vec<HeaderValue> = [
            "",
            " ",
            "text/event-stream",
            "TEXT/Event-Stream",
            "text/event-stream; charset=utf-8",
            "text/event-stream ;charset=utf-8",
            "  \ttext/event-stream",
            "text/event-streamx",
            "text/event-strea",
            "text/event",
            "application/grpc",
            "application/grpc+proto",
            "application/grpc-web",
            "application/grp",
            "application/x-ndjson",
            "application/x-ndjson; charset=utf-8",
            "application/ndjson",
            "application/jsonl",
            "application/jsonlines",
            "application/json",
            "text/plain",
            " ; text/event-stream",
            ";text/event-stream",
            "text/event-stream\t",
        ]
        .into_iter()
        .map(HeaderValue::from_static)
        .collect();
        for raw in [
            &b"text/event-stream; charset=caf\xc3\xa9"[..],
            b"text/event-stream\xff",
            b"\xfftext/event-stream",
            b"application/grpc\x80",
            b"text/html\xff",
        ] {
            v.push(HeaderValue::from_bytes(raw).unwrap());
        }
        v
    }

    /// `stream_dialect` against the two checks it fuses: the `str`-based stream check and
    /// core's `Dialect::resolve`.
    #[test]
    fn stream_dialect_matches_is_stream_and_core_resolve() {
        let mut values = content_types();
        // Every single-byte corruption of a few stream types, at every position.
        for base in [
            &b"text/event-stream; charset=utf-8"[..],
            b"application/grpc+proto",
            b"application/x-ndjson",
            b"application/ndjson",
            b"application/jsonl ;x",
        ] {
            for i in 0..base.len() {
                for b in [
                    0x0d, 0x0f, b'\t', b' ', b';', b'A', b'T', b'/', b'-', 0x7f, 0x80,
                ] {
                    let mut v = base.to_vec();
                    v[i] = b;
                    if let Ok(v) = HeaderValue::from_bytes(&v) {
                        values.push(v);
                    }
                }
                if let Ok(v) = HeaderValue::from_bytes(&base[..i]) {
                    values.push(v);
                }
            }
        }
        for v in values {
            let mut h = HeaderMap::new();
            h.insert(header::CONTENT_TYPE, v.clone());
            let ours = stream_dialect(v.as_bytes());
            assert_eq!(ours.is_some(), is_stream_str(&v), "{v:?}");
            if let Some(d) = ours {
                let core = Dialect::Auto.resolve(&h);
                assert_eq!(format!("{d:?}"), format!("{core:?}"), "{v:?}");
            }
        }
        assert!(stream_dialect(b"").is_none());
    }

    #[test]
    fn gaps_min_is_zero_without_gaps() {
        let mut g = Gaps::default();
        assert_eq!(g.stats(), GapStats::default());
        g.add(Duration::from_millis(7));
        g.add(Duration::from_millis(3));
        let s = g.stats();
        assert_eq!(s.count, 2);
        assert_eq!(s.min, Duration::from_millis(3));
        assert_eq!(s.max, Duration::from_millis(7));
        assert_eq!(s.sum, Duration::from_millis(10));
    }
}
