//! `FirstTokenHedgeLayer`: the configuration of the hedge.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use http::{HeaderName, Method, StatusCode};
use tailguard_core::{DEFAULT_REPLAY_CAP, Dialect, Priority, RequestFacts};
use tower_layer::Layer;

use crate::attempt::ATTEMPT_HEADER;
use crate::budget::HedgeBudget;
use crate::delay::HedgeDelay;
use crate::replicas::ReplicaSet;
use crate::service::FirstTokenHedge;

/// The header a client sets (to any value) to opt its request out of hedging.
pub const OPT_OUT_HEADER: &str = "x-tailguard-no-hedge";

/// The most attempts one request may use.
pub const MAX_ATTEMPTS: u8 = 5;

type Predicate = dyn Fn(&Parts) -> bool + Send + Sync;

/// Hedges LLM streaming calls on the first token: see [`FirstTokenHedge`].
///
/// A `Clone + Debug` configuration value. Each service the layer builds (each call to
/// [`Layer::layer`]) gets its own TTFT estimate, budget and rollout counter; clones of that
/// service share them.
#[derive(Clone)]
pub struct FirstTokenHedgeLayer {
    pub(crate) max_attempts: u8,
    pub(crate) delay: HedgeDelay,
    pub(crate) budget: HedgeBudget,
    pub(crate) failover_budget: HedgeBudget,
    pub(crate) retryable: Arc<[StatusCode]>,
    pub(crate) retryable_grpc: Arc<[u16]>,
    pub(crate) replay_cap: usize,
    pub(crate) pre_token_cap: usize,
    pub(crate) dialect: Dialect,
    pub(crate) predicate: Option<Arc<Predicate>>,
    pub(crate) opt_out: Option<HeaderName>,
    pub(crate) attempt_header: Option<HeaderName>,
    pub(crate) priorities: Option<Arc<[Priority]>>,
    pub(crate) rollout: f64,
    pub(crate) failures_as_errors: bool,
}

impl Default for FirstTokenHedgeLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl FirstTokenHedgeLayer {
    /// A layer with the defaults:
    ///
    /// * **2 attempts** (one backup): a second replica removes most of the tail; each further
    ///   attempt adds load for a smaller gain;
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
    /// * replay cap [`DEFAULT_REPLAY_CAP`] (4 MiB): larger request bodies are sent once, unhedged;
    /// * pre-token cap **256 KiB**: frames an attempt sends before its first token are held for
    ///   replay up to this size; an attempt that sends more without a token is committed as the
    ///   winner (the race fails open rather than buffer without bound);
    /// * dialect [`Dialect::Auto`] (OpenAI / Anthropic SSE, gRPC, NDJSON by `content-type`);
    /// * eligibility: `POST` requests whose response is expected to stream, i.e. every `POST`
    ///   except one whose [`RequestFacts::stream`] says `false` (see
    ///   [`with_predicate`](Self::with_predicate)); not opted out with [`OPT_OUT_HEADER`];
    ///   every priority (see [`with_priorities`](Self::with_priorities)); rollout 100%;
    /// * attempt header [`ATTEMPT_HEADER`](crate::ATTEMPT_HEADER) set on every attempt;
    /// * when every attempt fails, the most informative failure is answered as it is (an
    ///   upstream's error status or in-band error, replayed; the inner error, returned), and a
    ///   `2xx` stream that failed before its first token with a rendered `502`, see
    ///   [`FirstTokenHedge`]: a proxy passes the upstream's own status and `Retry-After` on,
    ///   and a client never gets a `200` that carries no answer (see
    ///   [`with_failures_as_errors`](Self::with_failures_as_errors)).
    pub fn new() -> Self {
        FirstTokenHedgeLayer {
            max_attempts: 2,
            delay: HedgeDelay::default(),
            budget: HedgeBudget::default(),
            failover_budget: HedgeBudget::failover(),
            retryable: Arc::new([
                StatusCode::TOO_MANY_REQUESTS,
                StatusCode::INTERNAL_SERVER_ERROR,
                StatusCode::BAD_GATEWAY,
                StatusCode::SERVICE_UNAVAILABLE,
                StatusCode::GATEWAY_TIMEOUT,
            ]),
            retryable_grpc: Arc::new([8, 13, 14]),
            replay_cap: DEFAULT_REPLAY_CAP,
            pre_token_cap: 256 << 10,
            dialect: Dialect::Auto,
            predicate: None,
            opt_out: Some(HeaderName::from_static(OPT_OUT_HEADER)),
            attempt_header: Some(HeaderName::from_static(ATTEMPT_HEADER)),
            priorities: None,
            rollout: 1.0,
            failures_as_errors: false,
        }
    }

    /// Sets the most attempts per request, the primary included (clamped to `1..=5`; `1`
    /// disables hedging: every request passes straight through).
    pub fn with_max_attempts(mut self, n: u8) -> Self {
        self.max_attempts = n.clamp(1, MAX_ATTEMPTS);
        self
    }

    /// Sets the hedge delay (a [`HedgeDelay`], an [`AdaptiveDelay`](crate::AdaptiveDelay) or a
    /// `Duration` for a fixed delay).
    pub fn with_delay(mut self, delay: impl Into<HedgeDelay>) -> Self {
        self.delay = delay.into();
        self
    }

    /// Sets the budget of delay-triggered hedges.
    pub fn with_budget(mut self, budget: HedgeBudget) -> Self {
        self.budget = budget;
        self
    }

    /// Sets the budget of failovers: attempts sent at once because an earlier attempt failed
    /// before its first token (transport error, retryable status, in-band error, a stream that
    /// ended with no token).
    pub fn with_failover_budget(mut self, budget: HedgeBudget) -> Self {
        self.failover_budget = budget;
        self
    }

    /// Sets the HTTP statuses that count as a failed attempt (a backup is sent at once).
    pub fn with_retryable_statuses(
        mut self,
        statuses: impl IntoIterator<Item = StatusCode>,
    ) -> Self {
        self.retryable = statuses.into_iter().collect();
        self
    }

    /// Sets the gRPC status codes that count as a failed attempt.
    pub fn with_retryable_grpc_codes(mut self, codes: impl IntoIterator<Item = u16>) -> Self {
        self.retryable_grpc = codes.into_iter().collect();
        self
    }

    /// Sets the most request-body bytes buffered for replay.
    pub fn with_replay_cap(mut self, bytes: usize) -> Self {
        self.replay_cap = bytes;
        self
    }

    /// Sets the most response bytes held per attempt before its first token.
    pub fn with_pre_token_cap(mut self, bytes: usize) -> Self {
        self.pre_token_cap = bytes;
        self
    }

    /// Sets how tokens are found in response bodies.
    pub fn with_dialect(mut self, dialect: Dialect) -> Self {
        self.dialect = dialect;
        self
    }

    /// Replaces the default eligibility predicate (`POST`, and not
    /// [`RequestFacts::stream`]` == Some(false)`). The opt-out header, the priority switch
    /// and the rollout still apply.
    pub fn with_predicate<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> bool + Send + Sync + 'static,
    {
        self.predicate = Some(Arc::new(f));
        self
    }

    /// Sets the opt-out header (`None`: no opt-out).
    pub fn with_opt_out_header(mut self, header: Option<HeaderName>) -> Self {
        self.opt_out = header;
        self
    }

    /// Sets the header that carries the attempt index (`None`: no header; the
    /// [`Attempt`](crate::Attempt) extension is always set).
    pub fn with_attempt_header(mut self, header: Option<HeaderName>) -> Self {
        self.attempt_header = header;
        self
    }

    /// Hedges only requests whose [`Priority`] is one of `priorities` (requests without a
    /// `Priority` are then not hedged). A [`ClassPolicy`](tailguard_core::ClassPolicy) with
    /// `hedge` set overrides this either way.
    pub fn with_priorities(mut self, priorities: impl IntoIterator<Item = Priority>) -> Self {
        self.priorities = Some(priorities.into_iter().collect());
        self
    }

    /// Hedges only this fraction of eligible requests (`0.0..=1.0`), spread evenly (a
    /// low-discrepancy sequence, not a coin toss, so 10% means every tenth request on average
    /// over any short run).
    pub fn with_rollout(mut self, fraction: f64) -> Self {
        self.rollout = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// Builds the hedge over an explicit set of replicas with [`ReplicaSet::new`]'s defaults
    /// (load-aware primaries, backups to the best untried replica, outlier ejection). For
    /// other settings build the set yourself and [`layer`](Layer::layer) it, e.g.
    /// `layer.layer(ReplicaSet::round_robin(replicas))`.
    pub fn layer_replicas<S>(
        &self,
        replicas: impl IntoIterator<Item = S>,
    ) -> FirstTokenHedge<ReplicaSet<S>> {
        FirstTokenHedge::new(ReplicaSet::new(replicas), self.clone())
    }

    /// When every attempt fails, resolve to an
    /// [`UpstreamError`](tailguard_core::UpstreamError) (its kind that of the most
    /// informative failure) instead of answering with that failure (replayed, rendered as a
    /// `502`, or the inner error). For stacks that render errors in one place.
    pub fn with_failures_as_errors(mut self, on: bool) -> Self {
        self.failures_as_errors = on;
        self
    }

    /// Whether the default predicate accepts the request.
    pub(crate) fn default_predicate(parts: &Parts) -> bool {
        parts.method == Method::POST
            && parts
                .extensions
                .get::<RequestFacts>()
                .is_none_or(|f| f.stream != Some(false))
    }
}

impl fmt::Debug for FirstTokenHedgeLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FirstTokenHedgeLayer")
            .field("max_attempts", &self.max_attempts)
            .field("delay", &self.delay)
            .field("budget", &self.budget)
            .field("failover_budget", &self.failover_budget)
            .field("retryable", &self.retryable)
            .field("retryable_grpc", &self.retryable_grpc)
            .field("replay_cap", &self.replay_cap)
            .field("pre_token_cap", &self.pre_token_cap)
            .field("dialect", &self.dialect)
            .field("predicate", &self.predicate.as_ref().map(|_| ".."))
            .field("opt_out", &self.opt_out)
            .field("attempt_header", &self.attempt_header)
            .field("priorities", &self.priorities)
            .field("rollout", &self.rollout)
            .field("failures_as_errors", &self.failures_as_errors)
            .finish()
    }
}

impl<S> Layer<S> for FirstTokenHedgeLayer {
    type Service = FirstTokenHedge<S>;

    fn layer(&self, inner: S) -> Self::Service {
        FirstTokenHedge::new(inner, self.clone())
    }
}
