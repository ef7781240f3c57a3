//! The per-request report every sink receives.

use std::sync::Arc;
use std::time::Duration;

use http::StatusCode;
use tailguard_core::{
    AdmissionOutcome, EndReason, HedgeOutcome, Priority, RequestFacts, Resumption, UpstreamFailure,
    Usage,
};

use crate::labels::UNKNOWN;
use crate::request_id::RequestId;

/// The bounded labels of one request: everything a metric may be labelled with.
///
/// Every value comes from configuration or from a fixed set (see
/// [`LatencyPhaseRecorderLayer`](crate::LatencyPhaseRecorderLayer)); none is a raw client
/// string, so the label set stays bounded however many distinct requests arrive.
#[derive(Clone, Debug)]
pub struct PhaseLabels {
    pub(crate) route: Arc<str>,
    pub(crate) model: Arc<str>,
    pub(crate) upstream: Arc<str>,
    pub(crate) operation: Arc<str>,
    pub(crate) provider: Arc<str>,
    pub(crate) priority: Option<Priority>,
    pub(crate) streamed: bool,
}

impl PhaseLabels {
    /// The route label (a configured route, a [`Route`](crate::Route), or `other`).
    pub fn route(&self) -> &str {
        &self.route
    }

    /// The model label: a configured model name, `other`, or `unknown` when the request carried
    /// no [`RequestFacts::model`].
    pub fn model(&self) -> &str {
        &self.model
    }

    /// The upstream label.
    pub fn upstream(&self) -> &str {
        &self.upstream
    }

    /// The operation name of the route (OpenTelemetry `gen_ai.operation.name`): from
    /// [`with_operations`](crate::LatencyPhaseRecorderLayer::with_operations) or
    /// [`DEFAULT_OPERATIONS`](crate::DEFAULT_OPERATIONS), else the route label.
    pub fn operation(&self) -> &str {
        &self.operation
    }

    /// The provider label (OpenTelemetry `gen_ai.provider.name`), from
    /// [`with_provider`](crate::LatencyPhaseRecorderLayer::with_provider).
    pub fn provider(&self) -> &str {
        &self.provider
    }

    /// The priority label: the [`Priority`] name, or `unknown` when the request had none.
    pub fn priority(&self) -> &str {
        self.priority.as_ref().map_or(UNKNOWN, Priority::name)
    }

    /// Whether the response was a stream (SSE, gRPC, NDJSON, or any body under an explicit
    /// dialect); `"true"` / `"false"` as a label.
    pub fn streamed(&self) -> bool {
        self.streamed
    }

    /// [`streamed`](PhaseLabels::streamed) as a label value.
    pub fn streamed_str(&self) -> &'static str {
        if self.streamed { "true" } else { "false" }
    }
}

/// Summary of the gaps between output events after the first token.
///
/// One gap is recorded per body frame that carries output events, measured from the previous
/// such frame: events that complete in the same frame arrived at the same instant, so the
/// zero-length gaps between them (an artefact of how the transport batched bytes, not of the
/// model) are not recorded. They still count in [`PhaseReport::output_events`] and so in
/// [`PhaseReport::time_per_output_token`], which is the per-token view.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GapStats {
    /// Gaps recorded.
    pub count: u64,
    /// Sum of the gaps.
    pub sum: Duration,
    /// Shortest gap (zero when none).
    pub min: Duration,
    /// Longest gap (zero when none).
    pub max: Duration,
}

impl GapStats {
    /// Mean gap, when any was recorded.
    pub fn mean(&self) -> Option<Duration> {
        u32::try_from(self.count)
            .ok()
            .filter(|&n| n > 0)
            .map(|n| self.sum / n)
    }

    /// Counts one more gap.
    pub(crate) fn add(&mut self, gap: Duration) {
        self.min = if self.count == 0 {
            gap
        } else {
            self.min.min(gap)
        };
        self.max = self.max.max(gap);
        self.sum = self.sum.saturating_add(gap);
        self.count += 1;
    }
}

/// Everything the recorder learnt about one request, handed to every
/// [`PhaseSink`](crate::PhaseSink) exactly once, when the request ends (normal end, error,
/// client disconnect, or the response future dropped before headers).
///
/// All durations are measured from the moment the recorder's `call` ran.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PhaseReport {
    /// The request id (client-sent or generated); never a metric label.
    pub request_id: Option<RequestId>,
    /// The bounded labels.
    pub labels: PhaseLabels,
    /// How the request ended: the reason an inner layer reported through
    /// [`EndReport`](tailguard_core::EndReport) if any, else what the recorder observed.
    ///
    /// Once the frame carrying the stream's terminal event ([`done_seen`](PhaseReport::done_seen))
    /// was handed on, the client had its whole answer: a drop of the body after it is
    /// [`Completed`](EndReason::Completed) (or an in-band upstream error if the stream carried
    /// one), never [`ClientDisconnect`](EndReason::ClientDisconnect), and an inner layer's
    /// `ClientDisconnect` report is overruled the same way. Any other reported reason still wins.
    pub end_reason: EndReason,
    /// Whether [`end_reason`](PhaseReport::end_reason) was reported by an inner layer.
    pub end_reason_reported: bool,
    /// The response status, when headers arrived.
    pub status: Option<StatusCode>,
    /// Time spent in the admission queue (from [`AdmissionOutcome`]).
    pub queue_wait: Option<Duration>,
    /// Time until the response headers.
    pub time_to_headers: Option<Duration>,
    /// Time until the first token (streamed responses that produced one).
    pub time_to_first_token: Option<Duration>,
    /// Gaps between output events after the first token.
    pub gaps: GapStats,
    /// `(total - time_to_first_token) / (output_events - 1)`, when `output_events > 1`.
    pub time_per_output_token: Option<Duration>,
    /// Time until the frame carrying the stream's terminal event was handed on, when
    /// [`done_seen`](PhaseReport::done_seen); else time until the request ended.
    pub total: Duration,
    /// Output (token) events of a streamed response. With usage extraction on (the default) a
    /// chunk that carries only the finish reason is not output; with it off such a chunk counts
    /// (the tracker then reads only the first bytes of each event after the first token).
    pub output_events: u64,
    /// Events of every class (tokens, meta, keepalives, done, error).
    pub events: u64,
    /// Whether the stream carried its own end marker (`[DONE]`, `message_stop`, NDJSON
    /// `"done": true`) and the frame carrying it was handed on.
    pub done_seen: bool,
    /// Token usage the stream reported (`include_usage`, Anthropic `usage`).
    pub usage: Option<Usage>,
    /// What admission did (queue wait, rejection).
    pub admission: Option<AdmissionOutcome>,
    /// What the hedge did (attempts, winner) and what its losing attempts cost (how long each
    /// ran, the prompt bytes and tokens sent on them). From the response extensions, or, when a
    /// layer outside the hedge ended the request during its race (a timeout, the client gone),
    /// from the request's [`EndReport`](tailguard_core::EndReport), with no winner.
    pub hedge: Option<HedgeOutcome>,
    /// Each break of the stream after its first token, in order, and what came of it (why,
    /// from which upstream to which), as the resume layer of `tailguard-hedge` reported them;
    /// empty when none broke or no resume layer runs. A resume's pause is one of the
    /// [`gaps`](PhaseReport::gaps).
    pub resumes: Vec<Resumption>,
    /// The request's class, when one was assigned.
    pub priority: Option<Priority>,
    /// Facts about the request (raw model, `max_tokens`, streamed, prompt bytes).
    pub facts: Option<RequestFacts>,
    /// The request's span (disabled when spans are off); the tracing sink records into it.
    pub span: tracing::Span,
}

/// The bounded `end_reason` label of a reason: [`EndReason::as_str`], except that upstream
/// errors carry their class (`upstream_error_4xx`, `upstream_error_5xx`,
/// `upstream_error_transport`, `upstream_error_in_band`, `upstream_error_protocol`,
/// `upstream_error_truncated`, `upstream_error_other_status`).
pub fn end_reason_label(reason: &EndReason) -> &'static str {
    match reason {
        EndReason::UpstreamError(f) => match f {
            UpstreamFailure::Status(s) if s.is_client_error() => "upstream_error_4xx",
            UpstreamFailure::Status(s) if s.is_server_error() => "upstream_error_5xx",
            UpstreamFailure::Status(_) => "upstream_error_other_status",
            UpstreamFailure::Transport => "upstream_error_transport",
            UpstreamFailure::InBand => "upstream_error_in_band",
            UpstreamFailure::Protocol => "upstream_error_protocol",
            UpstreamFailure::Truncated => "upstream_error_truncated",
            _ => "upstream_error",
        },
        other => other.as_str(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gaps_min_is_zero_without_gaps() {
        let mut g = GapStats::default();
        assert_eq!(g.min, Duration::ZERO);
        g.add(Duration::from_millis(7));
        g.add(Duration::from_millis(3));
        assert_eq!(g.count, 2);
        assert_eq!(g.min, Duration::from_millis(3));
        assert_eq!(g.max, Duration::from_millis(7));
        assert_eq!(g.sum, Duration::from_millis(10));
    }

    /// The labels are the ones `end_reason_label`'s doc and the README list, written out here
    /// (not taken from the code under test).
    #[test]
    fn end_reason_labels_are_the_documented_ones() {
        use UpstreamFailure::*;
        let status = |code| UpstreamError(Status(StatusCode::from_u16(code).unwrap()));
        use EndReason::*;
        let expected = [
            (Completed, "completed"),
            (HeadTimeout, "head_timeout"),
            (FirstTokenTimeout, "first_token_timeout"),
            (IdleTimeout, "idle_timeout"),
            (LivenessTimeout, "liveness_timeout"),
            (Deadline, "deadline"),
            (ClientDisconnect, "client_disconnect"),
            (Rejected, "rejected"),
            (status(404), "upstream_error_4xx"),
            (status(502), "upstream_error_5xx"),
            (status(200), "upstream_error_other_status"),
            (UpstreamError(Transport), "upstream_error_transport"),
            (UpstreamError(InBand), "upstream_error_in_band"),
            (UpstreamError(Protocol), "upstream_error_protocol"),
            (UpstreamError(Truncated), "upstream_error_truncated"),
        ];
        for (reason, label) in expected {
            assert_eq!(end_reason_label(&reason), label, "{reason:?}");
        }
    }
}
