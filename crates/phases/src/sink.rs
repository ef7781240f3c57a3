//! Where reports go: the [`PhaseSink`] trait and the tracing sink.

use std::fmt;
use std::sync::Arc;

use tailguard_core::EndReason;

use crate::report::{PhaseLabels, PhaseReport, end_reason_label};

/// Receives one [`PhaseReport`] per request; the metrics and tracing outputs are sinks, and so is
/// anything of the user's own (access logs, billing).
///
/// Any `Fn(&PhaseReport) + Send + Sync + 'static` closure is a sink.
///
/// [`on_report`](PhaseSink::on_report) runs exactly once per request, on the task that ended it
/// (the one polling or dropping the response), so keep it short: hand heavy work to a channel.
/// It may run inside a `Drop` (a client disconnect), so it must not panic.
pub trait PhaseSink: Send + Sync + 'static {
    /// Called once, when the request ended.
    fn on_report(&self, report: &PhaseReport);

    /// Called once per streamed response when its headers arrive; a histogram returned here
    /// receives every inter-token gap (in seconds) as it happens, without waiting for the end.
    ///
    /// Gaps are the only per-frame output, so they bypass the report: the report carries a
    /// [`GapStats`](crate::GapStats) summary instead of every gap, which keeps the body path free
    /// of allocation. `labels` are final except that the end reason is not known yet.
    /// The default returns `None`.
    fn gap_histogram(&self, labels: &PhaseLabels) -> Option<metrics::Histogram> {
        let _ = labels;
        None
    }
}

impl<F> PhaseSink for F
where
    F: Fn(&PhaseReport) + Send + Sync + 'static,
{
    fn on_report(&self, report: &PhaseReport) {
        self(report)
    }
}

/// A shared list of sinks.
#[derive(Clone, Default)]
pub(crate) struct Sinks(pub(crate) Vec<Arc<dyn PhaseSink>>);

impl fmt::Debug for Sinks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{} sinks]", self.0.len())
    }
}

/// The tracing output: records every phase as a field of the request's span and emits one
/// event at the end, inside that span.
///
/// The span (`llm_request`, level INFO, target `tailguard_phases`) is opened by the recorder in
/// `call` and entered around the inner service's `call` and every poll of its response future,
/// so inner layers' spans and events up to the response head nest inside it (the body's polls
/// do not enter it). Its fields are declared at creation and filled here:
/// `request_id`, `route`, `model`, `requested_model`, `priority`, `upstream`, `streamed`,
/// `status`, `end_reason`, `queue_wait_s`, `time_to_headers_s`, `ttft_s`, `tpot_s`, `total_s`,
/// `output_events`, `events`, `gaps`, `max_gap_s`, `prompt_tokens`, `completion_tokens`,
/// `max_tokens`, `prompt_bytes`, `hedge_attempts`, `hedge_winner`, `hedge_losers_ran_s` (how
/// long each losing attempt ran, in the order they were sent), `hedge_wasted_prompt_bytes`,
/// `hedge_wasted_prompt_tokens`, `hedge_deadline_skipped`, `resumes` (each break after the
/// first token: `replica-0>replica-1:transport`, comma-separated; see
/// [`Resumption`](tailguard_core::Resumption)'s `Display`).
///
/// The end event (message `"llm request finished"`) is INFO for a completed request and WARN
/// otherwise.
#[derive(Clone, Debug, Default)]
pub struct TracingSink {
    _private: (),
}

impl TracingSink {
    /// The tracing sink.
    pub fn new() -> Self {
        Self::default()
    }
}

fn secs(d: Option<std::time::Duration>) -> Option<f64> {
    d.map(|d| d.as_secs_f64())
}

impl PhaseSink for TracingSink {
    fn on_report(&self, r: &PhaseReport) {
        let span = &r.span;
        if !span.is_disabled() {
            record_span(r);
        }
        let id = r.request_id.as_ref().map(|id| id.as_str());
        if r.end_reason == EndReason::Completed {
            tracing::info!(
                target: "tailguard_phases",
                parent: span,
                request_id = id,
                end_reason = end_reason_label(&r.end_reason),
                total_s = r.total.as_secs_f64(),
                ttft_s = secs(r.time_to_first_token),
                output_events = r.output_events,
                "llm request finished"
            );
        } else {
            tracing::warn!(
                target: "tailguard_phases",
                parent: span,
                request_id = id,
                end_reason = end_reason_label(&r.end_reason),
                total_s = r.total.as_secs_f64(),
                ttft_s = secs(r.time_to_first_token),
                output_events = r.output_events,
                "llm request finished"
            );
        }
    }
}

/// Records `value` on `span` if there is one. Recording `None` records nothing, but
/// `tracing_subscriber`'s `fmt` output still writes the separator before it (a double space in
/// the log line).
fn record_some<V: tracing::Value>(span: &tracing::Span, field: &str, value: Option<V>) {
    if let Some(value) = value {
        span.record(field, value);
    }
}

/// Fills the fields of the request's span.
fn record_span(r: &PhaseReport) {
    let span = &r.span;
    span.record("model", r.labels.model());
    span.record("upstream", r.labels.upstream());
    span.record("priority", r.labels.priority());
    span.record("streamed", r.labels.streamed());
    if let Some(s) = r.status {
        span.record("status", s.as_u16());
    }
    span.record("end_reason", end_reason_label(&r.end_reason));
    record_some(span, "queue_wait_s", secs(r.queue_wait));
    record_some(span, "time_to_headers_s", secs(r.time_to_headers));
    record_some(span, "ttft_s", secs(r.time_to_first_token));
    record_some(span, "tpot_s", secs(r.time_per_output_token));
    span.record("total_s", r.total.as_secs_f64());
    span.record("output_events", r.output_events);
    span.record("events", r.events);
    span.record("gaps", r.gaps.count);
    if r.gaps.count > 0 {
        span.record("max_gap_s", r.gaps.max.as_secs_f64());
    }
    if let Some(u) = r.usage {
        span.record("prompt_tokens", u.prompt_tokens);
        span.record("completion_tokens", u.completion_tokens);
    }
    if let Some(f) = &r.facts {
        record_some(span, "max_tokens", f.max_tokens);
        record_some(span, "prompt_bytes", f.prompt_bytes);
    }
    if let Some(h) = &r.hedge {
        span.record("hedge_attempts", h.attempts);
        record_some(span, "hedge_winner", h.winner);
        if !h.losers.is_empty() {
            let ran: Vec<f64> = h.losers.iter().map(|l| l.ran.as_secs_f64()).collect();
            span.record("hedge_losers_ran_s", tracing::field::debug(&ran));
            span.record("hedge_wasted_prompt_bytes", h.wasted_prompt_bytes);
            record_some(span, "hedge_wasted_prompt_tokens", h.wasted_prompt_tokens);
        }
        if h.deadline_skipped {
            span.record("hedge_deadline_skipped", true);
        }
    }
    if let Some(resumes) = crate::report_fmt::resumes(r) {
        span.record("resumes", resumes);
    }
}
