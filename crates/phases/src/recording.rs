//! The per-request state shared by the response future and the body.

use std::sync::Arc;
use std::time::Duration;

use bytes::Buf;
use http::{Extensions, HeaderMap, Response, StatusCode};
use tailguard_core::progress::{Reading, StreamProgress};
use tailguard_core::{
    AdmissionOutcome, Dialect, EndReason, EndReport, HedgeOutcome, Observation, Priority,
    RequestFacts, Upstream, UpstreamFailure,
};
use tokio::time::Instant;
use tracing::Span;

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
    /// The body or the response future was dropped before the end (after the terminal event
    /// was delivered this counts as [`End`](Observed::End)).
    Dropped,
    /// The inner service failed before headers.
    ServiceError,
}

pub(crate) struct Recording {
    cfg: Arc<Config>,
    start: Instant,
    /// The labels, kept up to date (the model and upstream may change when headers arrive).
    labels: PhaseLabels,
    request_id: Option<RequestId>,
    end_report: EndReport,
    facts: Option<RequestFacts>,
    status: Option<StatusCode>,
    head_reason: Option<EndReason>,
    time_to_headers: Option<Duration>,
    admission: Option<AdmissionOutcome>,
    hedge: Option<HedgeOutcome>,
    /// The request's progress record, and this layer's reading of the stream.
    progress: StreamProgress,
    tracker: Option<Reading>,
    ttft: Option<Duration>,
    last_token: Instant,
    gaps: GapStats,
    /// The sinks' live gap histograms (streamed responses).
    gap_hists: Vec<metrics::Histogram>,
    output_events: u64,
    events: u64,
    /// When the frame completing the stream's terminal event (`[DONE]`, `message_stop`) was
    /// handed to the caller.
    done_at: Option<Instant>,
    /// The terminal event came with no finish reason before it: the answer was cut short (see
    /// core's `Reading::finish_missing`).
    cut_short: bool,
    in_band_error: bool,
    /// The stream carried junk its dialect cannot carry (see `Observation::malformed`).
    malformed: bool,
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
        progress: StreamProgress,
    ) -> Box<Self> {
        let labels = PhaseLabels {
            operation: cfg.operations.name(&route),
            route,
            model: model_label(&cfg, facts.as_ref()),
            upstream: cfg.upstream.clone(),
            provider: cfg.provider.clone(),
            priority,
            streamed: facts.as_ref().and_then(|f| f.stream).unwrap_or(false),
        };
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
            progress,
            tracker: None,
            ttft: None,
            last_token: start,
            gaps: GapStats::default(),
            gap_hists: Vec::new(),
            output_events: 0,
            events: 0,
            done_at: None,
            cut_short: false,
            in_band_error: false,
            malformed: false,
        })
    }

    /// Takes in the response head: status, extensions, and the request id header.
    pub(crate) fn on_headers<B>(&mut self, res: &mut Response<B>) {
        self.time_to_headers = Some(Instant::now().saturating_duration_since(self.start));
        let status = res.status();
        self.status = Some(status);
        self.take_extensions(res.extensions());
        // Replaces an id the upstream chose: the client gets back the id the logs carry.
        if let (Some(h), Some(id)) = (&self.cfg.request_id_header, &self.request_id) {
            res.headers_mut()
                .insert(h.clone(), id.header_value().clone());
        }

        let headers = res.headers();
        self.head_reason = self.head_end_reason(status, headers);
        let dialect = if self.head_reason.is_some() || !status.is_success() {
            None
        } else {
            self.cfg.dialect.resolve_stream(headers)
        };
        self.labels.streamed = dialect.is_some();
        if let Some(dialect) = dialect {
            self.tracker = Some(self.progress.reading(&dialect, headers));
            let sinks = &self.cfg.sinks.0;
            self.gap_hists = sinks
                .iter()
                .filter_map(|sink| sink.gap_histogram(&self.labels))
                .collect();
        }
    }

    /// What the inner layers put into the response extensions.
    fn take_extensions(&mut self, ext: &Extensions) {
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
            self.labels.upstream = u.shared();
        }
    }

    /// The end reason the response head already decides: a rejection, an error status, or a
    /// trailers-only gRPC error.
    fn head_end_reason(&self, status: StatusCode, headers: &HeaderMap) -> Option<EndReason> {
        if self
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
        } else if self.facts.as_ref().is_some_and(|f| f.stream == Some(true))
            && headers.contains_key(http::header::CONTENT_TYPE)
            && Dialect::Auto.resolve_stream(headers).is_none()
        {
            // A whole JSON document (a completion, an error) answering a request that asked to
            // stream: the client's stream reads nothing, so it did not complete.
            Some(EndReason::UpstreamError(UpstreamFailure::Protocol))
        } else {
            None
        }
    }

    /// Scans one data frame (no allocation, no lock).
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

    fn apply(&mut self, obs: Observation) {
        self.events += u64::from(obs.events);
        if obs.done && self.done_at.is_none() {
            self.done_at = Some(Instant::now());
            self.cut_short =
                !obs.error && self.tracker.as_ref().is_some_and(Reading::finish_missing);
        }
        self.in_band_error |= obs.error;
        self.malformed |= obs.malformed;
        if obs.tokens != 0 {
            self.on_tokens(obs.tokens);
        }
    }

    /// A frame with tokens: TTFT or one gap.
    fn on_tokens(&mut self, tokens: u32) {
        let now = Instant::now();
        // No output event yet is the same as no TTFT yet: both are set by the first token.
        if self.output_events == 0 {
            self.ttft = Some(now.saturating_duration_since(self.start));
        } else {
            let gap = now.saturating_duration_since(self.last_token);
            self.gaps.add(gap);
            for h in &self.gap_hists {
                h.record(gap);
            }
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
        // The client had its whole answer when the terminal event reached it.
        let total = self
            .done_at
            .unwrap_or_else(Instant::now)
            .saturating_duration_since(self.start);
        let (end_reason, reported) = self.end_reason(observed);
        let time_per_output_token = match (self.ttft, self.output_events) {
            (Some(ttft), n) if n > 1 => Some(total.saturating_sub(ttft).div_f64((n - 1) as f64)),
            _ => None,
        };
        let usage = self.tracker.as_ref().and_then(Reading::usage);
        if self.hedge.is_none() {
            // A layer outside the hedge answered before it did (a timeout, a deadline) or the
            // client went away: the hedge reported what it did as it was dropped.
            self.hedge = self.end_report.hedge().cloned();
        }
        let this = *self;
        let priority = this.labels.priority.clone();
        let report = PhaseReport {
            request_id: this.request_id,
            labels: this.labels,
            end_reason,
            end_reason_reported: reported,
            status: this.status,
            queue_wait: this.admission.as_ref().map(|a| a.queue_wait),
            time_to_headers: this.time_to_headers,
            time_to_first_token: this.ttft,
            gaps: this.gaps,
            time_per_output_token,
            total,
            output_events: this.output_events,
            events: this.events,
            done_seen: this.done_at.is_some(),
            usage,
            admission: this.admission,
            hedge: this.hedge,
            resumes: this.end_report.resumes(),
            priority,
            facts: this.facts,
            span: span.clone(),
        };
        for sink in &this.cfg.sinks.0 {
            sink.on_report(&report);
        }
    }

    /// The end reason, and whether an inner layer reported it: the first inner report, then the
    /// reason the head decided, then what the recorder saw. Once the terminal event was
    /// delivered, a drop (the client closing after reading it) is an end, and so is an inner
    /// layer's `ClientDisconnect`.
    fn end_reason(&self, observed: Observed) -> (EndReason, bool) {
        let delivered = self.done_at.is_some();
        let observed = match observed {
            Observed::Dropped if delivered => Observed::End,
            other => other,
        };
        let own = match observed {
            // The answer said it ended without saying why: cut short by the upstream (an
            // interrupting server closes the connection right after its bare `[DONE]`).
            _ if delivered && self.cut_short && !self.in_band_error && !self.malformed => {
                EndReason::UpstreamError(UpstreamFailure::Truncated)
            }
            Observed::End if self.in_band_error => {
                EndReason::UpstreamError(UpstreamFailure::InBand)
            }
            // Junk reached the client (no layer ended the stream for it): a protocol error
            // however the body ended, even at a clean end.
            _ if self.malformed => EndReason::UpstreamError(UpstreamFailure::Protocol),
            Observed::End => EndReason::Completed,
            Observed::BodyError | Observed::ServiceError => {
                EndReason::UpstreamError(UpstreamFailure::Transport)
            }
            Observed::Dropped => EndReason::ClientDisconnect,
        };
        let reported = self
            .end_report
            .get()
            .filter(|r| !(delivered && *r == EndReason::ClientDisconnect));
        match reported {
            Some(r) => (r, true),
            None => (self.head_reason.unwrap_or(own), false),
        }
    }
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
