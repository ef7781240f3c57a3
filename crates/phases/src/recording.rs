//! The per-request state shared by the response future and the body.

use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use http::{HeaderMap, HeaderName, Response, StatusCode, header};
use tailguard_core::{
    AdmissionOutcome, Dialect, EndReason, EndReport, HedgeOutcome, Observation, Priority,
    RequestFacts, StreamTracker, UpstreamFailure,
};
use tokio::time::Instant;
use tracing::Span;

use crate::labels::Upstream;
use crate::layer::Config;
use crate::report::{GapStats, PhaseLabels, PhaseReport};
use crate::request_id::RequestId;

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
    request_id: Option<RequestId>,
    end_report: EndReport,
    route: Arc<str>,
    priority: Option<Priority>,
    facts: Option<RequestFacts>,
    upstream: Arc<str>,
    streamed: bool,
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
    ) -> Self {
        let upstream = cfg.upstream.clone();
        let streamed = facts.as_ref().and_then(|f| f.stream).unwrap_or(false);
        Recording {
            cfg,
            start,
            request_id,
            end_report,
            route,
            priority,
            facts,
            upstream,
            streamed,
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
            output_events: 0,
            events: 0,
            done_seen: false,
            in_band_error: false,
        }
    }

    fn labels(&self) -> PhaseLabels {
        let model = match self.facts.as_ref().and_then(|f| f.model.as_deref()) {
            None => self.cfg.unknown.clone(),
            Some(m) => self
                .cfg
                .models
                .normalise(m)
                .unwrap_or(&self.cfg.other)
                .clone(),
        };
        PhaseLabels {
            route: self.route.clone(),
            model,
            upstream: self.upstream.clone(),
            priority: self.priority.clone(),
            streamed: self.streamed,
        }
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
        if self.priority.is_none() {
            self.priority = ext.get::<Priority>().cloned();
        }
        if self.facts.is_none() {
            self.facts = ext.get::<RequestFacts>().cloned();
        }
        if let Some(u) = ext.get::<Upstream>() {
            self.upstream = u.arc();
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
        self.streamed = self.head_reason.is_none()
            && status.is_success()
            && (!matches!(self.cfg.dialect, Dialect::Auto) || is_stream(headers));
        if self.streamed {
            self.tracker =
                Some(StreamTracker::new(&self.cfg.dialect, headers).with_usage(self.cfg.usage));
            let labels = self.labels();
            for h in self
                .cfg
                .sinks
                .0
                .iter()
                .filter_map(|s| s.gap_histogram(&labels))
            {
                self.gap_hists.push(h);
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
        if obs.tokens == 0 {
            return;
        }
        let now = Instant::now();
        if self.ttft.is_none() {
            self.ttft = Some(now.saturating_duration_since(self.start));
        } else {
            let gap = now.saturating_duration_since(self.last_token);
            self.gaps.add(gap);
            self.gap_hists.record(gap);
        }
        self.last_token = now;
        self.output_events += u64::from(obs.tokens);
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
        let labels = self.labels();
        let report = PhaseReport {
            request_id: self.request_id.take(),
            labels,
            end_reason,
            end_reason_reported: reported.is_some(),
            status: self.status,
            queue_wait: self.admission.as_ref().map(|a| a.queue_wait),
            time_to_headers: self.time_to_headers,
            time_to_first_token: self.ttft,
            gaps: self.gaps.stats(),
            time_per_output_token,
            total,
            output_events: self.output_events,
            events: self.events,
            done_seen: self.done_seen,
            usage,
            admission: self.admission.take(),
            hedge: self.hedge.take(),
            priority: self.priority.take(),
            facts: self.facts.take(),
            span: span.clone(),
        };
        for sink in &self.cfg.sinks.0 {
            sink.on_report(&report);
        }
    }
}

/// [`GapStats`] accumulated in nanoseconds: integer compares and adds per frame instead of
/// `Duration` arithmetic; converted (exactly) once, for the report.
#[derive(Default)]
struct Gaps {
    count: u64,
    sum: u64,
    min: u64,
    max: u64,
}

impl Gaps {
    #[inline]
    fn add(&mut self, gap: Duration) {
        // Saturates past 584 years, which a gap between two frames does not reach.
        let ns = u64::try_from(gap.as_nanos()).unwrap_or(u64::MAX);
        if self.count == 0 || ns < self.min {
            self.min = ns;
        }
        self.max = self.max.max(ns);
        self.sum = self.sum.saturating_add(ns);
        self.count += 1;
    }

    fn stats(&self) -> GapStats {
        GapStats {
            count: self.count,
            sum: Duration::from_nanos(self.sum),
            min: Duration::from_nanos(self.min),
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
            let secs = gap.as_secs_f64();
            first.record(secs);
            for h in &self.more {
                h.record(secs);
            }
        }
    }
}

fn is_stream(headers: &HeaderMap) -> bool {
    let Some(ct) = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
    else {
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

/// Parsed once: `HeaderMap::get` with a `&str` parses (and checks) the name on every call.
const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

fn grpc_error(headers: &HeaderMap) -> bool {
    headers
        .get(GRPC_STATUS)
        .is_some_and(|v| v.as_bytes() != b"0")
}
