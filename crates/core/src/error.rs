//! Concrete, inspectable error types shared by the layers.
//!
//! Every error here has a lower-case `Display`, implements [`std::error::Error`], and is meant to
//! travel as a [`BoxError`] and be recovered with `downcast_ref`.

use std::fmt;
use std::time::Duration;

use http::StatusCode;

/// The boxed error type that tower services in tailguard return.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The phase of a request that a timer guards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Phase {
    /// From `call` until response headers.
    Head,
    /// Until the first token of the response body.
    FirstToken,
    /// A gap between progress events after the first token.
    Idle,
    /// A gap in which no bytes at all arrived (keepalives count), after response headers.
    Liveness,
    /// The whole request, through the end of the body.
    Total,
}

impl Phase {
    /// A bounded label: `"head"`, `"first_token"`, `"idle"`, `"liveness"` or `"total"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Phase::Head => "head",
            Phase::FirstToken => "first_token",
            Phase::Idle => "idle",
            Phase::Liveness => "liveness",
            Phase::Total => "total",
        }
    }

    /// The end reason a timeout in this phase produces.
    pub fn end_reason(&self) -> crate::EndReason {
        match self {
            Phase::Head => crate::EndReason::HeadTimeout,
            Phase::FirstToken => crate::EndReason::FirstTokenTimeout,
            Phase::Idle => crate::EndReason::IdleTimeout,
            Phase::Liveness => crate::EndReason::LivenessTimeout,
            Phase::Total => crate::EndReason::Deadline,
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.as_str().replace('_', " "))
    }
}

/// A timer of a phase expired.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TimeoutError {
    phase: Phase,
    limit: Duration,
    elapsed: Duration,
    events: u64,
    since_last_event: Option<Duration>,
    measured: Option<Duration>,
}

impl TimeoutError {
    /// A timeout of `phase`, whose limit was `limit`, after `elapsed` since the request started.
    pub fn new(phase: Phase, limit: Duration, elapsed: Duration) -> Self {
        TimeoutError {
            phase,
            limit,
            elapsed,
            events: 0,
            since_last_event: None,
            measured: None,
        }
    }

    /// Sets the number of events the stream had produced.
    pub fn with_events(mut self, events: u64) -> Self {
        self.events = events;
        self
    }

    /// Sets the time since the last progress event.
    pub fn with_since_last_event(mut self, since: Duration) -> Self {
        self.since_last_event = Some(since);
        self
    }

    /// Sets the time the limit was measured against: from the start of the phase's clock (the
    /// request, the response headers, the last event or the last bytes) to the moment the
    /// timer fired. Without it the message reads the time since the last event (idle and
    /// liveness) or since the request started (the other phases).
    pub fn with_measured(mut self, measured: Duration) -> Self {
        self.measured = Some(measured);
        self
    }

    /// The time the limit was measured against, when the layer that fired it said.
    pub fn measured(&self) -> Option<Duration> {
        self.measured
    }

    /// The phase whose timer fired.
    pub fn phase(&self) -> Phase {
        self.phase
    }

    /// The configured limit of that phase.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Time since the request started.
    pub fn elapsed(&self) -> Duration {
        self.elapsed
    }

    /// Events the stream had produced before the timeout.
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Time since the last progress event, when there was one.
    pub fn since_last_event(&self) -> Option<Duration> {
        self.since_last_event
    }
}

impl fmt::Display for TimeoutError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Says which duration is which: the gap the idle limit measures, or the time since the
        // request started that every other limit measures.
        let (phase, limit, elapsed, events) = (self.phase, self.limit, self.elapsed, self.events);
        if let Some(measured) = self.measured {
            // The limit next to the time measured against it, named by what it waits for.
            let what = match phase {
                Phase::Head => "without response headers",
                Phase::FirstToken => "without a first token",
                Phase::Idle => "since the last event",
                Phase::Liveness => "without a byte",
                Phase::Total => "in all",
            };
            return write!(
                f,
                "{phase} timeout: {measured:?} {what} (limit {limit:?}); \
                 {elapsed:?} into the request, {events} events seen"
            );
        }
        match self.since_last_event {
            Some(gap) => write!(
                f,
                "{phase} timeout: {gap:?} since the last event (limit {limit:?}); \
                 {elapsed:?} into the request, {events} events seen"
            ),
            None => write!(
                f,
                "{phase} timeout: {elapsed:?} into the request (limit {limit:?}); \
                 {events} events seen"
            ),
        }
    }
}

impl std::error::Error for TimeoutError {}

/// Why admission refused a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OverloadReason {
    /// The wait queue was full on arrival.
    QueueFull,
    /// The request waited past its queue deadline.
    QueueTimeout,
    /// A more important request took its place in a full queue.
    Evicted,
    /// The request's cost can never fit the configured capacity.
    TooCostly,
    /// The request's deadline leaves less time than it would wait in the queue, so it was
    /// refused at once instead of timing out there.
    DeadlineTooShort,
    /// The store of the cluster-wide admission limit is unreachable and the gate is configured
    /// to refuse (fail closed) rather than fall back to its local limit.
    ClusterUnavailable,
}

impl OverloadReason {
    /// A bounded label: `"queue_full"`, `"queue_timeout"`, `"evicted"`, `"too_costly"`,
    /// `"deadline_too_short"` or `"cluster_unavailable"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            OverloadReason::QueueFull => "queue_full",
            OverloadReason::QueueTimeout => "queue_timeout",
            OverloadReason::Evicted => "evicted",
            OverloadReason::TooCostly => "too_costly",
            OverloadReason::DeadlineTooShort => "deadline_too_short",
            OverloadReason::ClusterUnavailable => "cluster_unavailable",
        }
    }
}

impl fmt::Display for OverloadReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            OverloadReason::QueueFull => "the wait queue is full",
            OverloadReason::QueueTimeout => "the queue deadline passed",
            OverloadReason::Evicted => "evicted by a more important request",
            OverloadReason::TooCostly => "the request costs more than the capacity allows",
            OverloadReason::DeadlineTooShort => {
                "the request's deadline is shorter than the expected queue wait"
            }
            OverloadReason::ClusterUnavailable => "the cluster admission store is unreachable",
        })
    }
}

/// The service is overloaded and refused the request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Overloaded {
    reason: OverloadReason,
    status: StatusCode,
    retry_after: Option<Duration>,
    queue_wait: Duration,
}

impl Overloaded {
    /// A refusal for `reason`, answered with `status` (429 or 503 in practice).
    pub fn new(reason: OverloadReason, status: StatusCode) -> Self {
        Overloaded {
            reason,
            status,
            retry_after: None,
            queue_wait: Duration::ZERO,
        }
    }

    /// Sets the estimated time after which a retry may succeed.
    pub fn with_retry_after(mut self, retry_after: Duration) -> Self {
        self.retry_after = Some(retry_after);
        self
    }

    /// Sets how long the request waited before it was refused.
    pub fn with_queue_wait(mut self, wait: Duration) -> Self {
        self.queue_wait = wait;
        self
    }

    /// Why the request was refused.
    pub fn reason(&self) -> OverloadReason {
        self.reason
    }

    /// The HTTP status the refusal maps to.
    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// Estimated time after which a retry may succeed.
    pub fn retry_after(&self) -> Option<Duration> {
        self.retry_after
    }

    /// Time spent queued before the refusal.
    pub fn queue_wait(&self) -> Duration {
        self.queue_wait
    }
}

impl fmt::Display for Overloaded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "overloaded: {}", self.reason)?;
        if let Some(after) = self.retry_after {
            write!(
                f,
                " (retry after {}s)",
                crate::render::retry_after_secs(after)
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for Overloaded {}

/// A scanner met a line, event or message longer than its cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScanError {
    limit: usize,
    what: &'static str,
}

impl ScanError {
    /// An item (`what`: "sse line", "sse event", "grpc message", "ndjson line") went over `limit`.
    pub fn too_long(what: &'static str, limit: usize) -> Self {
        ScanError { limit, what }
    }

    /// The cap that was exceeded, in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// What went over the cap.
    pub fn what(&self) -> &'static str {
        self.what
    }
}

impl fmt::Display for ScanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} longer than the {} byte cap", self.what, self.limit)
    }
}

impl std::error::Error for ScanError {}

/// An upstream answered with an error status, or failed before it produced a token.
///
/// Used by layers that turn an upstream failure into an error of their own (e.g. when every
/// hedge attempt failed in the error flavour).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UpstreamError {
    failure: crate::UpstreamFailure,
    message: String,
}

impl UpstreamError {
    /// An upstream failure with a human-readable message.
    pub fn new(failure: crate::UpstreamFailure, message: impl Into<String>) -> Self {
        UpstreamError {
            failure,
            message: message.into(),
        }
    }

    /// The kind of failure.
    pub fn failure(&self) -> crate::UpstreamFailure {
        self.failure
    }
}

impl fmt::Display for UpstreamError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "upstream failed ({}): {}",
            self.failure.as_str(),
            self.message
        )
    }
}

impl std::error::Error for UpstreamError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_lower_case_and_downcastable() {
        let e: BoxError = Box::new(
            TimeoutError::new(Phase::Idle, Duration::from_secs(5), Duration::from_secs(9))
                .with_events(12)
                .with_since_last_event(Duration::from_secs(5)),
        );
        assert_eq!(
            e.to_string(),
            "idle timeout: 5s since the last event (limit 5s); 9s into the request, 12 events seen"
        );
        let first = TimeoutError::new(
            Phase::FirstToken,
            Duration::from_secs(5),
            Duration::from_secs(5),
        );
        assert_eq!(
            first.to_string(),
            "first token timeout: 5s into the request (limit 5s); 0 events seen"
        );
        // The limit next to the time measured against it (issue 32: a first-token limit
        // measured from headers read as if it fired early next to the time since an event).
        let measured = TimeoutError::new(
            Phase::FirstToken,
            Duration::from_secs(5),
            Duration::from_millis(5012),
        )
        .with_since_last_event(Duration::from_micros(4_999_500))
        .with_measured(Duration::from_millis(5000));
        assert_eq!(
            measured.to_string(),
            "first token timeout: 5s without a first token (limit 5s); 5.012s into the request, \
             0 events seen"
        );
        let t = e.downcast_ref::<TimeoutError>().expect("downcast");
        assert_eq!(t.phase(), Phase::Idle);
        assert_eq!(t.events(), 12);

        let o: BoxError = Box::new(
            Overloaded::new(OverloadReason::QueueFull, StatusCode::TOO_MANY_REQUESTS)
                .with_retry_after(Duration::from_millis(1200)),
        );
        assert_eq!(
            o.to_string(),
            "overloaded: the wait queue is full (retry after 2s)"
        );
        assert!(o.downcast_ref::<Overloaded>().is_some());
    }
}
