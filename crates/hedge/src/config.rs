//! The configuration of a hedge: what [`FirstTokenHedgeLayer`](crate::FirstTokenHedgeLayer)
//! builds, and what the race, its attempts and their verdicts read.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;
use http::{HeaderName, Method, StatusCode};
use tailguard_core::attempt::ATTEMPT_HEADER;
use tailguard_core::{DEFAULT_REPLAY_CAP, Dialect, GrpcCode, Priority, RequestFacts};

use crate::budget::HedgeBudget;
use crate::delay::HedgeDelay;

/// The header a client sets (to any value) to opt its request out of hedging.
pub const OPT_OUT_HEADER: &str = "x-tailguard-no-hedge";

/// The most attempts one request may use.
pub const MAX_ATTEMPTS: u8 = 5;

type Predicate = dyn Fn(&Parts) -> bool + Send + Sync;

/// The configuration of a hedge.
#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) max_attempts: u8,
    /// Attempts beyond `max_attempts` that streams ending without a token may send.
    pub(crate) empty_retries: u8,
    pub(crate) delay: HedgeDelay,
    pub(crate) budget: HedgeBudget,
    pub(crate) failover_budget: HedgeBudget,
    pub(crate) retryable: Arc<[StatusCode]>,
    pub(crate) retryable_grpc: Arc<[GrpcCode]>,
    pub(crate) replay_cap: usize,
    pub(crate) pre_token_cap: usize,
    pub(crate) dialect: Dialect,
    pub(crate) predicate: Option<Arc<Predicate>>,
    pub(crate) opt_out: Option<HeaderName>,
    pub(crate) attempt_header: Option<HeaderName>,
    /// Where the response tells the client what the hedge did (none by default).
    pub(crate) outcome_header: Option<HeaderName>,
    pub(crate) priorities: Option<Arc<[Priority]>>,
    pub(crate) rollout: f64,
    /// Error mode: every attempt failing is an `Err` (set with the `Fail` type).
    pub(crate) as_errors: bool,
}

impl Default for Config {
    /// The defaults [`FirstTokenHedgeLayer::new`](crate::FirstTokenHedgeLayer::new) documents,
    /// each with its reason.
    fn default() -> Self {
        Config {
            max_attempts: 2,
            empty_retries: 2,
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
            retryable_grpc: Arc::new([
                GrpcCode::ResourceExhausted,
                GrpcCode::Internal,
                GrpcCode::Unavailable,
            ]),
            replay_cap: DEFAULT_REPLAY_CAP,
            pre_token_cap: 256 << 10,
            dialect: Dialect::Auto,
            predicate: None,
            opt_out: Some(HeaderName::from_static(OPT_OUT_HEADER)),
            attempt_header: Some(HeaderName::from_static(ATTEMPT_HEADER)),
            outcome_header: None,
            priorities: None,
            rollout: 1.0,
            as_errors: false,
        }
    }
}

impl Config {
    /// How many attempts a race may send after `empties` attempts ended without a token (an
    /// interrupting server's bare `[DONE]`): `max_attempts`, plus one for each such attempt,
    /// as many as the empty retries allow, and never over [`MAX_ATTEMPTS`]. The delay's
    /// backups count the race's empties: an attempt ended empty no longer races, and without
    /// this its failover was the race's last attempt, and one placed on a replica busy with
    /// traffic nobody sees waited with no backup (issue 29's real bench: 5.7 s, then ended
    /// empty too). A failover after an empty stream may use every empty retry.
    pub(crate) fn attempt_cap(&self, empties: u8) -> u8 {
        let extra = empties.min(self.empty_retries);
        self.max_attempts.saturating_add(extra).min(MAX_ATTEMPTS)
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

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Config")
            .field("max_attempts", &self.max_attempts)
            .field("empty_retries", &self.empty_retries)
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
            .field("outcome_header", &self.outcome_header)
            .field("priorities", &self.priorities)
            .field("rollout", &self.rollout)
            .field("as_errors", &self.as_errors)
            .finish()
    }
}
