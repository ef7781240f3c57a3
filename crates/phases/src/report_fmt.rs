//! [`PhaseReport`] as a log line (`Display`) and, with the `serde` feature, as a flat record
//! (`Serialize`): the same fields under the same names, durations in seconds.

use std::fmt;
use std::time::Duration;

use crate::report::{PhaseReport, end_reason_label};

/// `12.345ms`-style text of an optional duration, `-` when absent.
struct Secs(Option<Duration>);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(d) => write!(f, "{:.6}s", d.as_secs_f64()),
            None => f.write_str("-"),
        }
    }
}

/// An optional value, `-` when absent.
struct Opt<T>(Option<T>);

impl<T: fmt::Display> fmt::Display for Opt<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.0 {
            Some(v) => v.fmt(f),
            None => f.write_str("-"),
        }
    }
}

/// One line of `key=value` pairs (logfmt): the request id, the bounded labels, the status,
/// the end reason's label, the phases (seconds, `-` when the phase did not happen), the event
/// counts, what the hedge did (`attempts/winner`, winner `-` when every attempt failed) and,
/// when the stream broke after its first token, its breaks (`resumes=`, see
/// [`Resumption`](tailguard_core::Resumption)).
///
/// ```text
/// request_id=req-1 route=/v1/chat/completions model=gpt-4o upstream=replica-1 priority=standard streamed=true status=200 end_reason=completed queue_wait=0.000000s time_to_headers=0.010000s ttft=0.200000s total=0.500000s output_events=8 events=11 hedge=2/1
/// ```
impl fmt::Display for PhaseReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let l = &self.labels;
        write!(
            f,
            "request_id={} route={} model={} upstream={} priority={} streamed={} status={} \
             end_reason={} queue_wait={} time_to_headers={} ttft={} total={} \
             output_events={} events={}",
            Opt(self.request_id.as_ref().map(|id| id.as_str())),
            l.route(),
            l.model(),
            l.upstream(),
            l.priority(),
            l.streamed(),
            Opt(self.status.map(|s| s.as_u16())),
            end_reason_label(&self.end_reason),
            Secs(self.queue_wait),
            Secs(self.time_to_headers),
            Secs(self.time_to_first_token),
            Secs(Some(self.total)),
            self.output_events,
            self.events,
        )?;
        if let Some(h) = &self.hedge {
            write!(f, " hedge={}/{}", h.attempts, Opt(h.winner))?;
        }
        if let Some(resumes) = resumes(self) {
            write!(f, " resumes={resumes}")?;
        }
        Ok(())
    }
}

/// The report's breaks (`replica-0>replica-1:transport,...`), when the stream broke.
pub(crate) fn resumes(r: &PhaseReport) -> Option<String> {
    use fmt::Write as _;
    let mut out = String::new();
    for (i, b) in r.resumes.iter().enumerate() {
        let sep = if i > 0 { "," } else { "" };
        let _ = write!(out, "{sep}{b}");
    }
    (!out.is_empty()).then_some(out)
}

#[cfg(feature = "serde")]
mod ser {
    use serde::ser::{Serialize, SerializeStruct, Serializer};

    use super::*;

    fn secs(d: Option<Duration>) -> Option<f64> {
        d.map(|d| d.as_secs_f64())
    }

    /// The fields of the log line, plus the gap summary, the usage the stream reported, the
    /// hedge's delay and what the request asked for (model, `max_tokens`, prompt bytes).
    /// Durations are seconds (`f64`); absent values are `null`.
    impl Serialize for PhaseReport {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            let l = &self.labels;
            let usage = self.usage.unwrap_or_default();
            let facts = self.facts.as_ref();
            let mut r = s.serialize_struct("PhaseReport", 30)?;
            r.serialize_field(
                "request_id",
                &self.request_id.as_ref().map(|id| id.as_str()),
            )?;
            r.serialize_field("route", l.route())?;
            r.serialize_field("model", l.model())?;
            r.serialize_field("upstream", l.upstream())?;
            r.serialize_field("operation", l.operation())?;
            r.serialize_field("provider", l.provider())?;
            r.serialize_field("priority", l.priority())?;
            r.serialize_field("streamed", &l.streamed())?;
            r.serialize_field("status", &self.status.map(|s| s.as_u16()))?;
            r.serialize_field("end_reason", end_reason_label(&self.end_reason))?;
            r.serialize_field("end_reason_reported", &self.end_reason_reported)?;
            r.serialize_field("queue_wait", &secs(self.queue_wait))?;
            r.serialize_field("time_to_headers", &secs(self.time_to_headers))?;
            r.serialize_field("ttft", &secs(self.time_to_first_token))?;
            r.serialize_field("time_per_output_token", &secs(self.time_per_output_token))?;
            r.serialize_field("total", &self.total.as_secs_f64())?;
            r.serialize_field("gap_count", &self.gaps.count)?;
            r.serialize_field("gap_mean", &secs(self.gaps.mean()))?;
            r.serialize_field(
                "gap_max",
                &secs((self.gaps.count > 0).then_some(self.gaps.max)),
            )?;
            r.serialize_field("output_events", &self.output_events)?;
            r.serialize_field("events", &self.events)?;
            r.serialize_field("done_seen", &self.done_seen)?;
            r.serialize_field("usage_prompt_tokens", &usage.prompt_tokens)?;
            r.serialize_field("usage_completion_tokens", &usage.completion_tokens)?;
            r.serialize_field("hedge_attempts", &self.hedge.as_ref().map(|h| h.attempts))?;
            r.serialize_field("hedge_winner", &self.hedge.as_ref().and_then(|h| h.winner))?;
            r.serialize_field("requested_model", &facts.and_then(|f| f.model.as_deref()))?;
            r.serialize_field("max_tokens", &facts.and_then(|f| f.max_tokens))?;
            r.serialize_field("prompt_bytes", &facts.and_then(|f| f.prompt_bytes))?;
            r.serialize_field("resumes", &super::resumes(self))?;
            r.end()
        }
    }
}
