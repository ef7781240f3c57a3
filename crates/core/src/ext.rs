//! Extension types that layers write into, and read from, request and response extensions.
//!
//! Layer crates never depend on each other: they cooperate only through the types here. A layer
//! that produces a fact inserts it; a layer that consumes it reads it if present and does without
//! it otherwise, so any subset of layers composes.

use std::cmp::Ordering;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::Duration;

use http::StatusCode;

use crate::outcome::{HedgeOutcome, Resumption};

/// The class a request belongs to: an ordered level and a name.
///
/// A greater [`level`](Priority::level) is more important; the lowest class is shed first.
/// Two priorities compare by level only, so configure one name per level. The five standard
/// classes are provided as constructors; any other class is built with [`Priority::new`].
///
/// Written by `PriorityClass` into request extensions; read by admission (reserved shares,
/// shedding order), hedging (per-class switch), timeouts (per-class defaults) and the recorder
/// (the `priority` label).
#[derive(Clone)]
pub struct Priority {
    level: u8,
    name: Arc<str>,
}

impl Priority {
    /// Builds a class with the given level (greater is more important) and name.
    pub fn new(level: u8, name: impl Into<Arc<str>>) -> Self {
        Priority {
            level,
            name: name.into(),
        }
    }

    /// `critical` (level 40): health checks, control traffic; never shed before anything else.
    pub fn critical() -> Self {
        Priority::new(40, "critical")
    }

    /// `interactive` (level 30): a person is waiting for the first token.
    pub fn interactive() -> Self {
        Priority::new(30, "interactive")
    }

    /// `standard` (level 20): the default class of unclassified traffic.
    pub fn standard() -> Self {
        Priority::new(20, "standard")
    }

    /// `batch` (level 10): offline or bulk work that tolerates queueing.
    pub fn batch() -> Self {
        Priority::new(10, "batch")
    }

    /// `sheddable` (level 0): best-effort work, the first to go under load.
    pub fn sheddable() -> Self {
        Priority::new(0, "sheddable")
    }

    /// The five standard classes, most important first.
    pub fn standard_set() -> [Priority; 5] {
        [
            Priority::critical(),
            Priority::interactive(),
            Priority::standard(),
            Priority::batch(),
            Priority::sheddable(),
        ]
    }

    /// The level; greater is more important.
    pub fn level(&self) -> u8 {
        self.level
    }

    /// The class name, e.g. `"interactive"`; bounded by configuration, so usable as a label.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Debug for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Priority({}:{})", self.name, self.level)
    }
}

impl fmt::Display for Priority {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl PartialEq for Priority {
    fn eq(&self, other: &Self) -> bool {
        self.level == other.level
    }
}

impl Eq for Priority {}

impl PartialOrd for Priority {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Priority {
    fn cmp(&self, other: &Self) -> Ordering {
        self.level.cmp(&other.level)
    }
}

impl std::hash::Hash for Priority {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.level.hash(state);
    }
}

/// Per-class policy that one classification hands to every layer of the stack.
///
/// `PriorityClass` inserts the policy of the class it chose into request extensions next to the
/// [`Priority`]. Every field is optional: `None` means "the layer's own configuration decides".
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct ClassPolicy {
    /// Whether requests of this class may be hedged.
    pub hedge: Option<bool>,
    /// Time allowed from `call` until response headers.
    pub head_timeout: Option<Duration>,
    /// Time allowed until the first token.
    pub first_token_timeout: Option<Duration>,
    /// Longest allowed gap between progress events after the first token.
    pub idle_timeout: Option<Duration>,
    /// Longest allowed gap in which no bytes at all arrive, after response headers.
    pub liveness_timeout: Option<Duration>,
    /// Deadline for the whole stream.
    pub total_timeout: Option<Duration>,
    /// Share of admission capacity reserved for this class under contention, in `0.0..=1.0`.
    pub reserved_share: Option<f64>,
}

impl ClassPolicy {
    /// A policy that decides nothing (every field `None`).
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets whether this class may be hedged.
    pub fn with_hedge(mut self, hedge: bool) -> Self {
        self.hedge = Some(hedge);
        self
    }

    /// Sets the head timeout of this class.
    pub fn with_head_timeout(mut self, d: Duration) -> Self {
        self.head_timeout = Some(d);
        self
    }

    /// Sets the first-token timeout of this class.
    pub fn with_first_token_timeout(mut self, d: Duration) -> Self {
        self.first_token_timeout = Some(d);
        self
    }

    /// Sets the idle timeout of this class.
    pub fn with_idle_timeout(mut self, d: Duration) -> Self {
        self.idle_timeout = Some(d);
        self
    }

    /// Sets the liveness timeout of this class.
    pub fn with_liveness_timeout(mut self, d: Duration) -> Self {
        self.liveness_timeout = Some(d);
        self
    }

    /// Sets the total deadline of this class.
    pub fn with_total_timeout(mut self, d: Duration) -> Self {
        self.total_timeout = Some(d);
        self
    }

    /// Sets the reserved share of this class (clamped to `0.0..=1.0`).
    pub fn with_reserved_share(mut self, share: f64) -> Self {
        self.reserved_share = Some(share.clamp(0.0, 1.0));
        self
    }
}

/// Facts about a request that whoever parsed its body already knows (typically a gateway).
///
/// No tailguard layer parses request bodies to fill this in; layers use what is present (cost
/// functions read `max_tokens` and `prompt_bytes`, the recorder reads all of it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestFacts {
    /// The requested model, as the client sent it (normalise before using it as a label).
    pub model: Option<String>,
    /// The output limit the client asked for: the largest of `max_tokens`,
    /// `max_completion_tokens` and `max_output_tokens` it sent.
    pub max_tokens: Option<u32>,
    /// Whether the client asked for a streamed response.
    pub stream: Option<bool>,
    /// Size of the prompt in bytes (the request body, or the prompt text alone).
    pub prompt_bytes: Option<u64>,
    /// Size of the prompt in tokens, when whoever parsed the request counted them.
    pub prompt_tokens: Option<u64>,
}

impl RequestFacts {
    /// Empty facts.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the model.
    pub fn with_model(mut self, model: impl Into<String>) -> Self {
        self.model = Some(model.into());
        self
    }

    /// Sets `max_tokens`.
    pub fn with_max_tokens(mut self, max_tokens: u32) -> Self {
        self.max_tokens = Some(max_tokens);
        self
    }

    /// Sets whether the response is streamed.
    pub fn with_stream(mut self, stream: bool) -> Self {
        self.stream = Some(stream);
        self
    }

    /// Sets the prompt size in bytes.
    pub fn with_prompt_bytes(mut self, bytes: u64) -> Self {
        self.prompt_bytes = Some(bytes);
        self
    }

    /// Sets the prompt size in tokens.
    pub fn with_prompt_tokens(mut self, tokens: u64) -> Self {
        self.prompt_tokens = Some(tokens);
        self
    }
}

/// Why an upstream attempt failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum UpstreamFailure {
    /// The upstream answered with an error status.
    Status(StatusCode),
    /// The connection failed or was reset, or the body ended with an error.
    Transport,
    /// The stream carried an in-band error event.
    InBand,
    /// The stream broke the framing rules (e.g. an event over the size cap).
    Protocol,
    /// The body ended without the dialect's terminal event (OpenAI `[DONE]`, Anthropic
    /// `message_stop`, gRPC trailers with a `grpc-status`): the answer was cut short.
    Truncated,
}

impl UpstreamFailure {
    /// A bounded label: `"4xx"`, `"5xx"`, `"transport"`, `"in_band"`, `"protocol"` or
    /// `"truncated"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            UpstreamFailure::Status(s) if s.is_client_error() => "4xx",
            UpstreamFailure::Status(s) if s.is_server_error() => "5xx",
            UpstreamFailure::Status(_) => "other_status",
            UpstreamFailure::Transport => "transport",
            UpstreamFailure::InBand => "in_band",
            UpstreamFailure::Protocol => "protocol",
            UpstreamFailure::Truncated => "truncated",
        }
    }
}

/// How a request's stream ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum EndReason {
    /// The stream ended normally.
    Completed,
    /// Response headers did not arrive in time.
    HeadTimeout,
    /// The first token did not arrive in time.
    FirstTokenTimeout,
    /// A gap between progress events after the first token was too long.
    IdleTimeout,
    /// No bytes at all (not even a keepalive) arrived for too long after response headers.
    LivenessTimeout,
    /// The total deadline of the stream passed.
    Deadline,
    /// The upstream failed.
    UpstreamError(UpstreamFailure),
    /// The client went away (the response or its body was dropped before the end).
    ClientDisconnect,
    /// A layer refused the request (admission, shedding).
    Rejected,
}

impl EndReason {
    /// A bounded label, e.g. `"completed"`, `"idle_timeout"`, `"upstream_error"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            EndReason::Completed => "completed",
            EndReason::HeadTimeout => "head_timeout",
            EndReason::FirstTokenTimeout => "first_token_timeout",
            EndReason::IdleTimeout => "idle_timeout",
            EndReason::LivenessTimeout => "liveness_timeout",
            EndReason::Deadline => "deadline",
            EndReason::UpstreamError(_) => "upstream_error",
            EndReason::ClientDisconnect => "client_disconnect",
            EndReason::Rejected => "rejected",
        }
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EndReason::UpstreamError(kind) => write!(f, "upstream error ({})", kind.as_str()),
            other => f.write_str(&other.as_str().replace('_', " ")),
        }
    }
}

/// The channel through which an inner layer tells an outer layer why a stream ended.
///
/// The rules every tailguard layer follows (the layers' own docs refer here):
///
/// * **Who creates it.** The outer layer that wants to know, `LatencyPhaseRecorder`, creates an
///   `EndReport` and inserts it into the request extensions before calling inward. Without one
///   in the request extensions nothing is reported.
/// * **Who writes it.** A layer that ends a stream (or a request) for a reason of its own clones
///   the report out of the request extensions in `call` and [`report`](EndReport::report)s that
///   reason: `SseIdleTimeout` the timeout that fired ([`EndReason::HeadTimeout`],
///   [`EndReason::FirstTokenTimeout`], [`EndReason::IdleTimeout`],
///   [`EndReason::LivenessTimeout`], [`EndReason::Deadline`]),
///   `BoundedAdmission` [`EndReason::Rejected`] for a request it refuses, `FirstTokenHedge`
///   [`EndReason::UpstreamError`] when every attempt failed before its first token. The hedge
///   gives each attempt it races a report of its own and forwards the winner's reason to the
///   outer one, so the end of a dropped loser is never reported. The outer reader decides the
///   rest itself ([`EndReason::Completed`], [`EndReason::ClientDisconnect`]) when nothing was
///   reported.
/// * **When.** Before the layer yields the final frame, the error or the refusal, so the outer
///   layer finds the reason when it sees the end.
/// * **The first report wins.** [`report`](EndReport::report) keeps the first reason and
///   ignores later ones: the innermost cause is kept.
/// * **A race cut short.** A hedge normally tells the outer layer what it did through the
///   response extensions ([`HedgeOutcome`]). When a layer outside ends the request before the
///   hedge has a response (a first-token timeout, a deadline, the client going away), the hedge
///   [`report_hedge`](EndReport::report_hedge)s its outcome here instead, as it is dropped;
///   the reader takes it from [`hedge`](EndReport::hedge) when the response carried none.
/// * **Resumes.** A stream resumed on another replica breaks while its body streams, after the
///   response head: the resume layer [`report_resume`](EndReport::report_resume)s each break
///   and what came of it, and the reader takes them all from
///   [`resumes`](EndReport::resumes) at the end.
///
/// Clones share one report.
#[derive(Clone, Debug, Default)]
pub struct EndReport(Arc<Reported>);

#[derive(Debug, Default)]
struct Reported {
    reason: OnceLock<EndReason>,
    hedge: OnceLock<HedgeOutcome>,
    resumes: Mutex<Vec<Resumption>>,
}

impl EndReport {
    /// A fresh, empty report.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `reason` if nothing was reported yet; returns whether this call set it.
    pub fn report(&self, reason: EndReason) -> bool {
        self.0.reason.set(reason).is_ok()
    }

    /// The reported reason, if any.
    pub fn get(&self) -> Option<EndReason> {
        self.0.reason.get().copied()
    }

    /// Records what a hedge did with a request it never answered, if nothing was recorded yet;
    /// returns whether this call set it.
    pub fn report_hedge(&self, outcome: HedgeOutcome) -> bool {
        self.0.hedge.set(outcome).is_ok()
    }

    /// What a hedge reported through [`report_hedge`](EndReport::report_hedge), if anything.
    pub fn hedge(&self) -> Option<&HedgeOutcome> {
        self.0.hedge.get()
    }

    /// Records one break of the stream after its first token and what came of it, in order.
    pub fn report_resume(&self, resumption: Resumption) {
        self.lock_resumes().push(resumption);
    }

    /// The breaks recorded so far through [`report_resume`](EndReport::report_resume).
    pub fn resumes(&self) -> Vec<Resumption> {
        self.lock_resumes().clone()
    }

    fn lock_resumes(&self) -> MutexGuard<'_, Vec<Resumption>> {
        self.0
            .resumes
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Reports `reason` to the `EndReport` in `extensions`, if there is one.
    pub fn report_to(extensions: &http::Extensions, reason: EndReason) -> bool {
        extensions
            .get::<EndReport>()
            .is_some_and(|r| r.report(reason))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priorities_order_by_level() {
        let mut set = Priority::standard_set().to_vec();
        set.sort();
        let names: Vec<_> = set.iter().map(Priority::name).collect();
        assert_eq!(
            names,
            ["sheddable", "batch", "standard", "interactive", "critical"]
        );
        assert!(Priority::interactive() > Priority::batch());
    }

    #[test]
    fn first_report_wins() {
        let r = EndReport::new();
        let inner = r.clone();
        assert_eq!(r.get(), None);
        assert!(inner.report(EndReason::IdleTimeout));
        assert!(!inner.report(EndReason::Completed));
        assert_eq!(r.get(), Some(EndReason::IdleTimeout));
    }

    #[test]
    fn a_hedge_outcome_is_kept_once_and_shared_by_clones() {
        let r = EndReport::new();
        let inner = r.clone();
        assert!(r.hedge().is_none());
        assert!(inner.report_hedge(HedgeOutcome::all_failed(2, None)));
        assert!(!inner.report_hedge(HedgeOutcome::all_failed(3, None)));
        assert_eq!(r.hedge().map(|h| (h.attempts, h.winner)), Some((2, None)));
        assert_eq!(r.get(), None, "the reason is reported on its own");
    }

    #[test]
    fn report_to_extensions() {
        let mut ext = http::Extensions::new();
        assert!(!EndReport::report_to(&ext, EndReason::Deadline));
        let r = EndReport::new();
        ext.insert(r.clone());
        assert!(EndReport::report_to(&ext, EndReason::Deadline));
        assert_eq!(r.get(), Some(EndReason::Deadline));
    }

    #[test]
    fn labels_are_bounded() {
        let s = EndReason::UpstreamError(UpstreamFailure::Status(StatusCode::BAD_GATEWAY));
        assert_eq!(s.as_str(), "upstream_error");
        assert_eq!(s.to_string(), "upstream error (5xx)");
        assert_eq!(
            EndReason::FirstTokenTimeout.to_string(),
            "first token timeout"
        );
    }
}

/// The name of the upstream that served a request, as a bounded metric label.
///
/// A service that picks among several upstreams (a `ReplicaSet` of `tailguard-route`, a
/// balancer of your own) inserts it into the *response* extensions; the recorder of
/// `tailguard-phases` labels the request with it, over the name its layer was configured with.
/// The set of names must stay bounded (replica names, not URLs with request data).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Upstream(Arc<str>);

impl Upstream {
    /// An upstream label.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Upstream(name.into())
    }

    /// The label value.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The label value, shared (a reference count, no copy).
    pub fn shared(&self) -> Arc<str> {
        self.0.clone()
    }
}

impl fmt::Debug for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Upstream({})", &*self.0)
    }
}
