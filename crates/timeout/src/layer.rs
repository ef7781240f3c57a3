//! [`SseIdleTimeoutLayer`]: the configuration of the timeouts.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Duration;

use http::HeaderName;
use tailguard_core::{
    ClassPolicy, ClientDeadline, Deadlines, Dialect, Fail, Phase, Priority, Respond,
};
use tokio::sync::watch;
use tokio::time::Instant;
use tower_layer::Layer;

use crate::service::SseIdleTimeout;

/// The five timers of one request; each is optional.
///
/// Used three ways: as the layer's defaults, as per-[`Priority`] defaults
/// ([`SseIdleTimeoutLayer::with_priority_timeouts`]), and as a per-request override inserted into
/// the request extensions. In the last two, a field left `None` falls through to the next source
/// (see [`SseIdleTimeoutLayer`] for the order); to switch a timer off for one request, give it a
/// duration longer than the request can last.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Timeouts {
    /// From `call` until response headers.
    pub head: Option<Duration>,
    /// Until the first token (from `call` or from the headers, per [`FirstTokenClock`]).
    pub first_token: Option<Duration>,
    /// The longest gap between progress events after the first token.
    pub idle: Option<Duration>,
    /// The longest gap in which no bytes at all arrive (keepalives count), from the headers.
    pub liveness: Option<Duration>,
    /// From `call` until the end of the body.
    pub total: Option<Duration>,
}

impl Timeouts {
    /// No timer set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the head timeout.
    pub fn with_head(mut self, d: Duration) -> Self {
        self.head = Some(d);
        self
    }

    /// Sets the first-token timeout.
    pub fn with_first_token(mut self, d: Duration) -> Self {
        self.first_token = Some(d);
        self
    }

    /// Sets the idle timeout.
    pub fn with_idle(mut self, d: Duration) -> Self {
        self.idle = Some(d);
        self
    }

    /// Sets the liveness timeout.
    pub fn with_liveness(mut self, d: Duration) -> Self {
        self.liveness = Some(d);
        self
    }

    /// Sets the total deadline.
    pub fn with_total(mut self, d: Duration) -> Self {
        self.total = Some(d);
        self
    }

    /// The timer of `phase`.
    pub fn get(&self, phase: Phase) -> Option<Duration> {
        match phase {
            Phase::Head => self.head,
            Phase::FirstToken => self.first_token,
            Phase::Idle => self.idle,
            Phase::Liveness => self.liveness,
            _ => self.total,
        }
    }

    fn slot(&mut self, phase: Phase) -> &mut Option<Duration> {
        match phase {
            Phase::Head => &mut self.head,
            Phase::FirstToken => &mut self.first_token,
            Phase::Idle => &mut self.idle,
            Phase::Liveness => &mut self.liveness,
            _ => &mut self.total,
        }
    }

    /// Field by field: `self`'s value where it has one, `other`'s otherwise.
    pub fn or(self, other: Timeouts) -> Timeouts {
        Timeouts {
            head: self.head.or(other.head),
            first_token: self.first_token.or(other.first_token),
            idle: self.idle.or(other.idle),
            liveness: self.liveness.or(other.liveness),
            total: self.total.or(other.total),
        }
    }

    fn from_policy(p: &ClassPolicy) -> Timeouts {
        Timeouts {
            head: p.head_timeout,
            first_token: p.first_token_timeout,
            idle: p.idle_timeout,
            liveness: p.liveness_timeout,
            total: p.total_timeout,
        }
    }
}

/// Where the first-token timer starts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FirstTokenClock {
    /// At `call` (the default): the limit is the time to first token as the caller sees it,
    /// queueing and time to headers included, which is what a person waiting for an answer
    /// experiences. The timer also runs before headers: if it expires first, the request ends
    /// as a first-token timeout before headers.
    #[default]
    FromCall,
    /// When the response headers arrive: the limit covers prefill and nothing before it (pair it
    /// with a head timeout).
    FromHeaders,
}

/// How a stream ends when a timer expires, or the upstream fails (see the
/// [crate documentation](crate#when-the-upstream-fails)), *after* response headers.
///
/// Whatever the choice, the inner body is dropped at once (the upstream sees the request
/// cancelled) and the end reason is reported to an [`EndReport`](tailguard_core::EndReport) in
/// the request extensions before the final frame is yielded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum OnExpiry {
    /// Per stream dialect (the default, so one layer serves SSE, NDJSON and gRPC alike):
    /// SSE and NDJSON end with [`InBand`](OnExpiry::InBand), gRPC with
    /// [`GrpcTrailers`](OnExpiry::GrpcTrailers), other bodies with
    /// [`BodyError`](OnExpiry::BodyError).
    #[default]
    Auto,
    /// A terminal in-band error event in the stream's dialect, then a clean end: OpenAI
    /// `data: {"error":{..}}` and `data: [DONE]`, Anthropic `event: error`, an NDJSON error line.
    /// The bytes of an event the client has not fully received are held back, so the client
    /// never sees half an event. Falls back as `Auto` does where the dialect has no in-band form.
    InBand,
    /// Trailers `grpc-status: 4` and a `grpc-message`, so a gRPC client gets a
    /// `DEADLINE_EXCEEDED` status (`14`, `UNAVAILABLE`, when the upstream failed or cut the
    /// stream short; `13`, `INTERNAL`, when it broke the framing); a partly received message
    /// is held back as above.
    GrpcTrailers,
    /// A body error of type [`TimeoutError`](crate::error::TimeoutError) with the phase, the
    /// elapsed time, the events seen and the time since the last event. Nothing is held back.
    /// When the upstream failed: its own body error, or an
    /// [`UpstreamError`](tailguard_core::UpstreamError) for a stream cut short, an event
    /// over the scanner's cap, or junk.
    BodyError,
}

#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) defaults: Timeouts,
    pub(crate) per_priority: Vec<(Priority, Timeouts)>,
    pub(crate) headers: Vec<(Phase, HeaderName)>,
    pub(crate) first_token_clock: FirstTokenClock,
    pub(crate) keepalive_resets_idle: bool,
    pub(crate) dialect: Dialect,
    pub(crate) on_expiry: OnExpiry,
    /// `None`: per dialect (see [`SseIdleTimeoutLayer::with_require_terminal_event`]).
    pub(crate) require_terminal_event: Option<bool>,
    pub(crate) client_deadline: ClientDeadline,
    pub(crate) shutdown: Option<watch::Receiver<bool>>,
}

impl Config {
    /// The timers in force for a request: the override in the extensions, then the opt-in
    /// headers, then the request's [`ClassPolicy`], then the per-[`Priority`] defaults, then the
    /// layer's defaults, field by field.
    pub(crate) fn resolve<B>(&self, req: &http::Request<B>) -> Timeouts {
        let ext = req.extensions();
        let mut t = ext.get::<Timeouts>().copied().unwrap_or_default();
        for (phase, name) in &self.headers {
            let slot = t.slot(*phase);
            if slot.is_none() {
                *slot = req
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .and_then(|s| s.trim().parse::<u64>().ok())
                    .map(Duration::from_millis);
            }
        }
        if let Some(policy) = ext.get::<ClassPolicy>() {
            t = t.or(Timeouts::from_policy(policy));
        }
        if !self.per_priority.is_empty()
            && let Some(prio) = ext.get::<Priority>()
            && let Some((_, pt)) = self.per_priority.iter().find(|(p, _)| p == prio)
        {
            t = t.or(*pt);
        }
        t.or(self.defaults)
    }

    /// The timers of a request that starts at `start`, after its client's deadline and any
    /// [`Deadlines`] already in its extensions: the first-token (from `call`) and total limits
    /// shrink to the time left. Leaves the tightened deadlines in the extensions and the budget
    /// left in the outgoing headers.
    pub(crate) fn prepare<B>(&self, req: &mut http::Request<B>, start: Instant) -> Timeouts {
        self.client_deadline.accept(req, start);
        let mut t = self.resolve(req);
        Deadlines::tighten_in(req.extensions_mut(), self.deadlines(&t, start));
        if let Some(d) = req.extensions().get::<Deadlines>() {
            t.total = d.total_left(start).or(t.total);
            if self.first_token_clock == FirstTokenClock::FromCall {
                let left = d.first_token.map(|at| at.saturating_duration_since(start));
                t.first_token = left.or(t.first_token);
            }
        }
        tailguard_core::deadline::propagate(req, start);
        t
    }

    /// The first-token and total deadlines of a request that started at `start` with timers
    /// `t`. With [`FirstTokenClock::FromHeaders`] the first-token deadline is known only once
    /// the headers arrive; the latest it can be, `start + head + first_token`, stands for it
    /// when a head timeout bounds the headers (none otherwise).
    pub(crate) fn deadlines(&self, t: &Timeouts, start: Instant) -> Deadlines {
        let at = |d: Option<Duration>| start.checked_add(d?);
        let first_token = match self.first_token_clock {
            FirstTokenClock::FromCall => t.first_token,
            FirstTokenClock::FromHeaders => t
                .head
                .zip(t.first_token)
                .and_then(|(head, first)| head.checked_add(first)),
        };
        Deadlines {
            first_token: at(first_token),
            total: at(t.total),
        }
    }

    /// Whether a stream of `dialect` (resolved for the response) must end with its terminal
    /// event.
    pub(crate) fn require_terminal_event(&self, dialect: &Dialect) -> bool {
        self.require_terminal_event.unwrap_or(matches!(
            dialect,
            Dialect::OpenAi | Dialect::Anthropic | Dialect::LlmSse | Dialect::Grpc
        ))
    }
}

/// Applies first-token, idle, total and head timeouts to streamed responses.
///
/// See the [crate documentation](crate) for the behaviour. The layer is a cheap-to-clone
/// configuration value; with [`new`](SseIdleTimeoutLayer::new) no timer is set, because the
/// right limits depend on the model, the hardware and the traffic class: set them with the
/// `with_*` methods. Without timers the layer still sees that streams end cleanly (a stream
/// cut short, a body error mid-stream, an event over the scanner's cap, junk: see the
/// [crate documentation](crate#when-the-upstream-fails)); other responses pass through
/// untouched.
///
/// The timers of a request are chosen field by field, first match wins:
/// 1. a [`Timeouts`] value in the request extensions (set by trusted server code);
/// 2. the opt-in override headers ([`with_override_header`](Self::with_override_header));
/// 3. a [`ClassPolicy`] in the request extensions (written by `PriorityClass`);
/// 4. the defaults for the request's [`Priority`]
///    ([`with_priority_timeouts`](Self::with_priority_timeouts));
/// 5. the layer's defaults.
///
/// Before it calls the inner service, the layer puts the request's effective first-token and
/// total deadlines (after every override above, as instants) into the request extensions as a
/// [`Deadlines`], so that a layer inside it (the hedge) stays within the time left. A
/// [`Deadlines`] already there (from an outer layer) is [tightened](Deadlines::tighten), never
/// loosened or replaced. With [`FirstTokenClock::FromHeaders`] the first-token deadline is the
/// latest it can be, `call + head + first_token`, or none without a head timeout.
///
/// # Modes
///
/// In response mode ([`Respond`], the default, because a gateway's clients expect an HTTP
/// answer) a timer that expires *before* response headers is answered with a response: status
/// 504 with an OpenAI-shaped JSON error body; for a gRPC request (`content-type:
/// application/grpc*`) a trailers-only gRPC response with `grpc-status: 4`
/// (`DEADLINE_EXCEEDED`), which a gRPC client reads as that status. The service's error type
/// is the inner service's, so the layer goes under axum's `Router::layer` as it is.
///
/// In error mode ([`Fail`], [`with_error_mode`](Self::with_error_mode)) the service returns a
/// boxed [`TimeoutError`](crate::error::TimeoutError) instead, and its error type is
/// [`BoxError`](crate::error::BoxError), for stacks that handle errors themselves.
///
/// After headers both modes end the stream as [`OnExpiry`] says.
///
/// # State
///
/// The layer holds configuration only; like every tailguard layer, one layer value is one
/// piece of state shared by every service it builds (here there is nothing to share).
pub struct SseIdleTimeoutLayer<M = Respond> {
    config: Arc<Config>,
    _mode: PhantomData<fn() -> M>,
}

impl<M> Clone for SseIdleTimeoutLayer<M> {
    fn clone(&self) -> Self {
        SseIdleTimeoutLayer {
            config: self.config.clone(),
            _mode: PhantomData,
        }
    }
}

impl<M> fmt::Debug for SseIdleTimeoutLayer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SseIdleTimeoutLayer")
            .field("config", &self.config)
            .field("mode", &std::any::type_name::<M>())
            .finish()
    }
}

impl Default for SseIdleTimeoutLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl SseIdleTimeoutLayer<Respond> {
    /// A layer in response mode with no timer set, [`Dialect::Auto`], first-token timing from
    /// `call`, keepalives that do not reset the idle timer, [`OnExpiry::Auto`], the terminal
    /// event required per dialect and the client's deadline honoured
    /// ([`ClientDeadline::new`]).
    pub fn new() -> Self {
        SseIdleTimeoutLayer {
            _mode: PhantomData,
            config: Arc::new(Config {
                defaults: Timeouts::default(),
                per_priority: Vec::new(),
                headers: Vec::new(),
                first_token_clock: FirstTokenClock::FromCall,
                keepalive_resets_idle: false,
                dialect: Dialect::Auto,
                on_expiry: OnExpiry::Auto,
                require_terminal_event: None,
                client_deadline: ClientDeadline::new(),
                shutdown: None,
            }),
        }
    }

    /// Switches to error mode ([`Fail`]): an expiry before headers is an `Err` holding a
    /// [`TimeoutError`](crate::error::TimeoutError), and the service's error type is
    /// [`BoxError`](crate::error::BoxError).
    pub fn with_error_mode(self) -> SseIdleTimeoutLayer<Fail> {
        SseIdleTimeoutLayer {
            config: self.config,
            _mode: PhantomData,
        }
    }
}

impl<M> SseIdleTimeoutLayer<M> {
    fn edit(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.config));
        self
    }

    /// Sets the default time allowed from `call` until response headers (default: none).
    pub fn with_head_timeout(self, d: Duration) -> Self {
        self.edit(|c| c.defaults.head = Some(d))
    }

    /// Sets the default time allowed until the first token (default: none).
    pub fn with_first_token_timeout(self, d: Duration) -> Self {
        self.edit(|c| c.defaults.first_token = Some(d))
    }

    /// Sets the default longest gap between progress events after the first token
    /// (default: none).
    pub fn with_idle_timeout(self, d: Duration) -> Self {
        self.edit(|c| c.defaults.idle = Some(d))
    }

    /// Sets the default deadline for the whole request, body included (default: none).
    pub fn with_total_timeout(self, d: Duration) -> Self {
        self.edit(|c| c.defaults.total = Some(d))
    }

    /// Sets the default longest gap in which no bytes at all arrive, after response headers
    /// (default: none). Unlike the idle timer, every byte resets it: keepalive comments, pings,
    /// empty events, part of an event. Pair a short liveness limit with a long idle one to
    /// catch a silent connection quickly while a slow generation that sends keepalives gets
    /// the longer progress limit. Its end reason is
    /// [`LivenessTimeout`](tailguard_core::EndReason::LivenessTimeout).
    pub fn with_liveness_timeout(self, d: Duration) -> Self {
        self.edit(|c| c.defaults.liveness = Some(d))
    }

    /// Sets how the client's own deadline is read and sent on (default
    /// [`ClientDeadline::new`]: `grpc-timeout`, and `x-request-timeout` on HTTP, read; only
    /// `grpc-timeout` sent on). The first-token and total timers of a request are the minimum
    /// of their own limit and the time its [`Deadlines`] leave.
    pub fn with_client_deadline(self, client_deadline: ClientDeadline) -> Self {
        self.edit(|c| c.client_deadline = client_deadline)
    }

    /// Sets all default timers at once (fields left `None` switch that timer off).
    pub fn with_timeouts(self, t: Timeouts) -> Self {
        self.edit(|c| c.defaults = t)
    }

    /// Sets the defaults for requests whose extensions carry `priority` (replacing an earlier
    /// entry of the same level). Fields left `None` fall through to the layer's defaults.
    pub fn with_priority_timeouts(self, priority: Priority, t: Timeouts) -> Self {
        self.edit(|c| {
            c.per_priority.retain(|(p, _)| *p != priority);
            c.per_priority.push((priority, t));
        })
    }

    /// Lets requests set the timer of `phase` with header `name`, whose value is a whole number
    /// of milliseconds (off by default: the header comes from the client, so enable it only
    /// where clients are trusted to choose their limits). Values that do not parse are ignored.
    pub fn with_override_header(self, phase: Phase, name: HeaderName) -> Self {
        self.edit(|c| {
            c.headers.retain(|(p, _)| *p != phase);
            c.headers.push((phase, name));
        })
    }

    /// Sets where the first-token timer starts (default [`FirstTokenClock::FromCall`]).
    pub fn with_first_token_clock(self, clock: FirstTokenClock) -> Self {
        self.edit(|c| c.first_token_clock = clock)
    }

    /// Whether keepalives (SSE comments, `event: ping`) reset the idle timer (default `false`:
    /// the point of this layer is that a stalled generation behind keepalives still times out).
    /// Keepalives never count as the first token.
    pub fn with_keepalive_resets_idle(self, resets: bool) -> Self {
        self.edit(|c| c.keepalive_resets_idle = resets)
    }

    /// Sets how tokens are found in response bodies (default [`Dialect::Auto`], which chooses
    /// per response from its `content-type`). The stream is read once per request (core's
    /// [`progress`](tailguard_core::progress)): the timeout, innermost of the layers that read
    /// streams, usually reads it, and the recorder and admission outside follow its reading.
    pub fn with_dialect(self, dialect: Dialect) -> Self {
        self.edit(|c| c.dialect = dialect)
    }

    /// Sets how a stream ends on expiry after headers (default [`OnExpiry::Auto`]).
    pub fn with_on_expiry(self, on_expiry: OnExpiry) -> Self {
        self.edit(|c| c.on_expiry = on_expiry)
    }

    /// Whether a stream must end with its dialect's terminal event (default: per dialect, see
    /// below): OpenAI `data: [DONE]`, Anthropic `message_stop`, gRPC trailers carrying a
    /// `grpc-status`. An in-band error event of the upstream's own counts as an ending too.
    ///
    /// When it must, a body that ends (a clean end, or trailers) without it (for gRPC: trailers
    /// after a partial message) was cut short: the bytes of an unfinished event are dropped
    /// (after the terminal event, a fragment is dropped quietly), the stream ends as on an
    /// expiry ([`OnExpiry`]) with an `upstream_error` whose code is `upstream_error_truncated`
    /// (gRPC: `grpc-status: 14`, `UNAVAILABLE`), and the end reason is
    /// [`UpstreamError(Truncated)`](tailguard_core::UpstreamFailure::Truncated), so an SDK
    /// raises an error instead of returning a cut answer as complete.
    ///
    /// On an OpenAI or Anthropic stream the terminal event must also follow a finish reason
    /// (`finish_reason`, `stop_reason`): a bare `[DONE]` is how an interrupting server cuts a
    /// running answer short, and it ends the same way, with a message that says so.
    ///
    /// The default is on for [`Dialect::OpenAi`], [`Dialect::Anthropic`], [`Dialect::LlmSse`]
    /// (what [`Dialect::Auto`] picks for `text/event-stream`) and [`Dialect::Grpc`]: their
    /// servers always send the terminal event, so a stream without it lost its end. It is off
    /// for [`Dialect::AnySse`], [`Dialect::AnyByte`], [`Dialect::Ndjson`] and custom
    /// dialects: they have no terminal event, or one that not every server sends (NDJSON
    /// streams end with `"done": true` or just at the end of the body), so its absence proves
    /// nothing; with the check off the end of the body passes through as the upstream sent it.
    /// Only 2xx responses whose `content-type` is a stream type are checked, so a non-streamed
    /// answer (`application/json`) is never affected. Turn it off for an upstream known to end
    /// without the event: an OpenAI-compatible server that omits `[DONE]`, or OpenAI
    /// Responses API streams, which end with `event: response.completed`, an event the
    /// presets do not classify as terminal.
    pub fn with_require_terminal_event(self, require: bool) -> Self {
        self.edit(|c| c.require_terminal_event = Some(require))
    }

    /// Ends every stream still running when `signal` turns `true` (a server's shutdown grace
    /// period is over), as an expiry ends one ([`OnExpiry`]): after the last whole event, an
    /// in-band error the client may retry (status 503, type `server_shutdown`, code `shutdown`;
    /// gRPC: `UNAVAILABLE`), reported as [`EndReason::Deadline`]. A stream that already sent its
    /// terminal event ends quietly. Only bodies are ended: a request still waiting for its
    /// response head is left to the server's own stop. Default: no signal.
    ///
    /// [`EndReason::Deadline`]: tailguard_core::EndReason::Deadline
    pub fn with_shutdown(self, signal: watch::Receiver<bool>) -> Self {
        self.edit(|c| c.shutdown = Some(signal))
    }
}

impl<S, M> Layer<S> for SseIdleTimeoutLayer<M> {
    type Service = SseIdleTimeout<S, M>;

    fn layer(&self, inner: S) -> Self::Service {
        SseIdleTimeout::from_config(inner, self.config.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_order_is_field_by_field() {
        let layer = SseIdleTimeoutLayer::new()
            .with_head_timeout(Duration::from_secs(1))
            .with_first_token_timeout(Duration::from_secs(2))
            .with_idle_timeout(Duration::from_secs(3))
            .with_total_timeout(Duration::from_secs(4))
            .with_priority_timeouts(
                Priority::batch(),
                Timeouts::new()
                    .with_first_token(Duration::from_secs(20))
                    .with_idle(Duration::from_secs(30)),
            )
            .with_override_header(Phase::Idle, HeaderName::from_static("x-idle-ms"));
        let c = &layer.config;

        let plain = http::Request::new(());
        assert_eq!(c.resolve(&plain), c.defaults);

        let mut req = http::Request::builder()
            .header("x-idle-ms", "750")
            .body(())
            .unwrap();
        req.extensions_mut().insert(Priority::batch());
        req.extensions_mut()
            .insert(ClassPolicy::new().with_total_timeout(Duration::from_secs(40)));
        req.extensions_mut()
            .insert(Timeouts::new().with_head(Duration::from_millis(10)));
        let t = c.resolve(&req);
        assert_eq!(t.head, Some(Duration::from_millis(10)));
        assert_eq!(t.first_token, Some(Duration::from_secs(20)));
        assert_eq!(t.idle, Some(Duration::from_millis(750)));
        assert_eq!(t.total, Some(Duration::from_secs(40)));

        let bad = http::Request::builder()
            .header("x-idle-ms", "soon")
            .body(())
            .unwrap();
        assert_eq!(c.resolve(&bad).idle, Some(Duration::from_secs(3)));
    }
}
