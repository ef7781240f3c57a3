//! `FirstTokenHedgeLayer`: the configuration of the hedge.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};

use http::request::Parts;
use http::{HeaderName, StatusCode};
use tailguard_core::{Dialect, Fail, GrpcCode, Priority, Respond};
use tower_layer::Layer;

use crate::budget::HedgeBudget;
use crate::config::{Config, MAX_ATTEMPTS};
use crate::delay::HedgeDelay;
use crate::service::FirstTokenHedge;
use crate::state::HedgeState;

/// Hedges LLM streaming calls on the first token: see [`FirstTokenHedge`].
///
/// A `Clone + Debug` configuration value.
///
/// # State
///
/// One layer value is one hedge: every service it builds (every call to [`Layer::layer`],
/// e.g. once per route under axum's `Router::layer`) and every clone of the layer share the
/// same TTFT estimate, budgets and rollout counter, as one `BoundedAdmissionLayer` is one
/// gate. Each `with_*` call starts a new state with the changed configuration. For a hedge of
/// its own, build another layer value.
///
/// # Modes
///
/// In response mode ([`Respond`], the default) the service's error type is the inner
/// service's: when every attempt failed the client gets the most informative failure as a
/// response (see [`FirstTokenHedge`]), or the inner service's own error when no attempt got a
/// response at all; a request body that fails while it is buffered is answered with a `400`.
/// In error mode ([`Fail`], [`with_error_mode`](Self::with_error_mode)) the error type is
/// [`BoxError`](crate::error::BoxError) and every such end is an `Err`.
pub struct FirstTokenHedgeLayer<M = Respond> {
    pub(crate) config: Config,
    shared: Arc<OnceLock<Arc<HedgeState>>>,
    _mode: PhantomData<fn() -> M>,
}

impl<M> Clone for FirstTokenHedgeLayer<M> {
    fn clone(&self) -> Self {
        FirstTokenHedgeLayer {
            config: self.config.clone(),
            shared: self.shared.clone(),
            _mode: PhantomData,
        }
    }
}

impl Default for FirstTokenHedgeLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl FirstTokenHedgeLayer<Respond> {
    /// A layer in response mode with the defaults:
    ///
    /// * **2 attempts** (one backup): a second replica removes most of the tail; each further
    ///   attempt adds load for a smaller gain;
    /// * **2 further attempts** after streams that ended without a token (see
    ///   [`with_empty_stream_retries`](Self::with_empty_stream_retries)): a single-slot server
    ///   that interrupts its running stream for a newer request ends it with a bare `[DONE]`,
    ///   and interrupted attempts would leave the client with a 502 that a freed slot answers
    ///   (on real llama-cpp-python with mid-stream resume on, a continuation interrupted one
    ///   attempt and the server's other clients the next two: three were not enough);
    /// * delay [`HedgeDelay::adaptive`] (p90 of recent TTFTs), see [`AdaptiveDelay`](crate::AdaptiveDelay);
    /// * budget [`HedgeBudget::new`] (10% of requests, no floor) for delay-triggered hedges,
    ///   and a separate failover budget [`HedgeBudget::failover`] (20% of requests, floor
    ///   1/s) for attempts sent at once after a failure before the first token;
    /// * retryable statuses **429, 500, 502, 503, 504**: the statuses another replica may well
    ///   not return (overload, crash, bad gateway, timeout); other statuses are answers about
    ///   the request itself and are returned as they are;
    /// * retryable gRPC codes **8, 13, 14** (`RESOURCE_EXHAUSTED`, `INTERNAL`, `UNAVAILABLE`),
    ///   the gRPC counterparts of those statuses, found in trailers-only responses and in
    ///   trailers that end a stream before its first message;
    /// * replay cap [`DEFAULT_REPLAY_CAP`](tailguard_core::DEFAULT_REPLAY_CAP) (4 MiB): larger
    ///   request bodies are sent once, unhedged;
    /// * pre-token cap **256 KiB**: frames an attempt sends before its first token are held for
    ///   replay up to this size; an attempt that sends more without a token is committed as the
    ///   winner (the race fails open rather than buffer without bound);
    /// * dialect [`Dialect::Auto`] (OpenAI / Anthropic SSE, gRPC, NDJSON by `content-type`);
    /// * eligibility: `POST` requests whose response is expected to stream, i.e. every `POST`
    ///   except one whose [`RequestFacts::stream`](tailguard_core::RequestFacts::stream) says
    ///   `false` (see [`with_predicate`](Self::with_predicate)); not opted out with
    ///   [`OPT_OUT_HEADER`](crate::OPT_OUT_HEADER); every priority (see [`with_priorities`](Self::with_priorities)); rollout 100%;
    /// * attempt header [`ATTEMPT_HEADER`](tailguard_core::attempt::ATTEMPT_HEADER) set on every
    ///   attempt;
    /// * when every attempt fails, the most informative failure is answered as it is (an
    ///   upstream's error status or in-band error, replayed; the inner error, returned), and a
    ///   `2xx` stream that failed before its first token with a rendered `502`, see
    ///   [`FirstTokenHedge`]: a proxy passes the upstream's own status and `Retry-After` on,
    ///   and a client never gets a `200` that carries no answer (see
    ///   [`with_error_mode`](Self::with_error_mode)).
    pub fn new() -> Self {
        let config = Config::default();
        FirstTokenHedgeLayer {
            config,
            shared: Arc::default(),
            _mode: PhantomData,
        }
    }

    /// Switches to error mode ([`Fail`]): when every attempt fails the response future
    /// resolves to an [`UpstreamError`](tailguard_core::UpstreamError) (its kind that of the
    /// most informative failure) instead of answering with that failure (replayed, rendered as
    /// a `502`, or the inner error), and a request body that fails while buffered is an `Err`
    /// holding a [`RequestBodyError`](crate::error::RequestBodyError). For stacks that render
    /// errors in one place.
    pub fn with_error_mode(mut self) -> FirstTokenHedgeLayer<Fail> {
        self.config.as_errors = true;
        FirstTokenHedgeLayer {
            config: self.config,
            shared: Arc::default(),
            _mode: PhantomData,
        }
    }
}

impl<M> FirstTokenHedgeLayer<M> {
    fn with(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(&mut self.config);
        self.shared = Arc::default();
        self
    }

    /// The state every service of this layer value shares, made on first use.
    pub(crate) fn shared(&self) -> Arc<HedgeState> {
        self.shared
            .get_or_init(|| Arc::new(HedgeState::new(self.config.clone())))
            .clone()
    }

    /// Sets the most attempts per request, the primary included (clamped to `1..=5`; `1`
    /// disables hedging: every request passes straight through).
    pub fn with_max_attempts(self, n: u8) -> Self {
        self.with(|c| {
            c.max_attempts = n.clamp(1, MAX_ATTEMPTS);
        })
    }

    /// Sets how many attempts beyond [`with_max_attempts`](Self::with_max_attempts) a stream
    /// that ended without a token (its terminal event or `grpc-status` 0, and no output: what an
    /// interrupting server sends) may send, each at once and from the failover budget, up to
    /// [`MAX_ATTEMPTS`] in all. Such an attempt no longer races, so it does not count against
    /// `max_attempts` for the delay's backups either: its failover is backed up after the
    /// delay as a primary is. Other failures (statuses, transport errors, in-band errors)
    /// stay within `max_attempts`. `0`: none.
    pub fn with_empty_stream_retries(self, n: u8) -> Self {
        self.with(|c| {
            c.empty_retries = n;
        })
    }

    /// Sets the hedge delay (a [`HedgeDelay`], an [`AdaptiveDelay`](crate::AdaptiveDelay) or a
    /// `Duration` for a fixed delay).
    pub fn with_delay(self, delay: impl Into<HedgeDelay>) -> Self {
        self.with(|c| {
            c.delay = delay.into();
        })
    }

    /// Sets the budget of delay-triggered hedges. Every backup takes a token from it,
    /// including a probe's (core's `Attempt::mark_probe`: its primary went to a replica chosen on
    /// a decayed estimate; it is backed up at the delay, or after twice its alternative's
    /// expected wait when the placer gave one and that is sooner:
    /// `Attempt::mark_probe_against`). A backup the budget refuses is asked for again after
    /// twice the delay, then four times it, and so on while the race lasts (a zero delay is not
    /// asked again): the deposits of the requests that came meanwhile may pay for it. From its
    /// third ask, its primary then seven delays late (stuck, not merely slow), it borrows from
    /// the deposits to come, at most one max balance deep, repaid before any other withdrawal:
    /// hedging works from the first request of a quiet route whose replica stopped answering.
    /// [`HedgeBudget::none`] lends nothing, and a budget shared across gateways only withdraws.
    pub fn with_budget(self, budget: HedgeBudget) -> Self {
        self.with(|c| {
            c.budget = budget;
        })
    }

    /// Sets the budget of failovers: attempts sent at once because an earlier attempt failed
    /// before its first token (transport error, retryable status, in-band error, a stream that
    /// ended with no token).
    pub fn with_failover_budget(self, budget: HedgeBudget) -> Self {
        self.with(|c| {
            c.failover_budget = budget;
        })
    }

    /// Sets the HTTP statuses that count as a failed attempt (a backup is sent at once).
    pub fn with_retryable_statuses(self, statuses: impl IntoIterator<Item = StatusCode>) -> Self {
        self.with(|c| {
            c.retryable = statuses.into_iter().collect();
        })
    }

    /// Sets the gRPC status codes that count as a failed attempt.
    pub fn with_retryable_grpc_codes(self, codes: impl IntoIterator<Item = GrpcCode>) -> Self {
        self.with(|c| {
            c.retryable_grpc = codes.into_iter().collect();
        })
    }

    /// Sets the most request-body bytes buffered for replay.
    pub fn with_replay_cap(self, bytes: usize) -> Self {
        self.with(|c| {
            c.replay_cap = bytes;
        })
    }

    /// Sets the most response bytes held per attempt before its first token.
    pub fn with_pre_token_cap(self, bytes: usize) -> Self {
        self.with(|c| {
            c.pre_token_cap = bytes;
        })
    }

    /// Sets how tokens are found in response bodies.
    pub fn with_dialect(self, dialect: Dialect) -> Self {
        self.with(|c| {
            c.dialect = dialect;
        })
    }

    /// Replaces the default eligibility predicate (`POST`, and not
    /// [`RequestFacts::stream`](tailguard_core::RequestFacts::stream)` == Some(false)`). The
    /// opt-out header, the priority switch and the rollout still apply.
    pub fn with_predicate<F>(self, f: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.with(|c| {
            c.predicate = Some(Arc::new(f));
        })
    }

    /// Sets the opt-out header (`None`: no opt-out).
    pub fn with_opt_out_header(self, header: Option<HeaderName>) -> Self {
        self.with(|c| {
            c.opt_out = header;
        })
    }

    /// Sets the header that carries the attempt index (`None`: no header; the
    /// [`Attempt`](tailguard_core::attempt::Attempt) extension is always set).
    pub fn with_attempt_header(self, header: Option<HeaderName>) -> Self {
        self.with(|c| {
            c.attempt_header = header;
        })
    }

    /// Sets a response header that tells the client what the hedge did, from the
    /// [`HedgeOutcome`](tailguard_core::HedgeOutcome) every response through the layer carries
    /// ([`HedgeOutcome::header_value`](tailguard_core::HedgeOutcome::header_value):
    /// `attempts=2; winner=1`, `winner=none` when every attempt failed). Default `None`: the
    /// outcome stays in the extensions, where the recorder reads it.
    ///
    /// ```
    /// use http::HeaderName;
    /// use tailguard_hedge::FirstTokenHedgeLayer;
    ///
    /// let layer = FirstTokenHedgeLayer::new()
    ///     .with_outcome_header(Some(HeaderName::from_static("x-tailguard-hedge")));
    /// # let _ = layer;
    /// ```
    pub fn with_outcome_header(self, header: Option<HeaderName>) -> Self {
        self.with(|c| {
            c.outcome_header = header;
        })
    }

    /// Hedges only requests whose [`Priority`] is one of `priorities` (requests without a
    /// `Priority` are then not hedged). A [`ClassPolicy`](tailguard_core::ClassPolicy) with
    /// `hedge` set overrides this either way.
    pub fn with_priorities(self, priorities: impl IntoIterator<Item = Priority>) -> Self {
        self.with(|c| {
            c.priorities = Some(priorities.into_iter().collect());
        })
    }

    /// Hedges only this fraction of eligible requests (`0.0..=1.0`), spread evenly (a
    /// low-discrepancy sequence, not a coin toss, so 10% means every tenth request on average
    /// over any short run).
    pub fn with_rollout(self, fraction: f64) -> Self {
        self.with(|c| {
            c.rollout = if fraction.is_nan() {
                0.0
            } else {
                fraction.clamp(0.0, 1.0)
            };
        })
    }
}

impl<M> fmt::Debug for FirstTokenHedgeLayer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FirstTokenHedgeLayer")
            .field("config", &self.config)
            .field("mode", &std::any::type_name::<M>())
            .finish()
    }
}

impl<S, M> FirstTokenHedge<S, M> {
    /// Wraps `inner` with the configuration of `layer`, sharing its state (the same as
    /// `layer.layer(inner)`).
    pub fn new(inner: S, layer: &FirstTokenHedgeLayer<M>) -> Self {
        layer.layer(inner)
    }
}

impl<S, M> Layer<S> for FirstTokenHedgeLayer<M> {
    type Service = FirstTokenHedge<S, M>;

    fn layer(&self, inner: S) -> Self::Service {
        FirstTokenHedge::from_shared(inner, self.shared())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_layer_value_is_one_state() {
        let layer = FirstTokenHedgeLayer::new();
        let (a, b) = (layer.layer(()), layer.clone().layer(()));
        assert!(
            Arc::ptr_eq(&a.shared, &b.shared),
            "every layer() call and clone share it"
        );
        let changed = layer.with_max_attempts(3).layer(());
        assert!(
            !Arc::ptr_eq(&a.shared, &changed.shared),
            "a with_* call starts a new one"
        );
        let errors = FirstTokenHedgeLayer::new().with_error_mode();
        assert!(errors.config.as_errors);
    }
}
