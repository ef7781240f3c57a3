//! [`BoundedAdmissionLayer`]: the configuration of one admission gate.

use std::fmt;
use std::marker::PhantomData;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use http::StatusCode;
use tailguard_core::{ClientDeadline, Fail, Priority, Respond};
use tower_layer::Layer;

use crate::adaptive::AdaptiveLimit;
use crate::cluster::Cluster;
use crate::cost::Cost;
use crate::fair::Fairness;
use crate::fair_share::SharedFairness;
use crate::gate::Shared;
use crate::queue::Aging;
use crate::service::BoundedAdmission;

/// Default wait-queue deadline: 2 s.
///
/// A person waiting for the first token of a chat answer gains little from a longer wait in the
/// gateway; a fast 503 with `Retry-After` lets the client retry elsewhere instead.
pub const DEFAULT_QUEUE_TIMEOUT: Duration = Duration::from_secs(2);
/// Default CoDel interval: 100 ms, the value from the CoDel paper and Facebook's adaptation.
pub const DEFAULT_CODEL_INTERVAL: Duration = Duration::from_millis(100);
/// Default CoDel target: 5 ms, the value from the CoDel paper and Facebook's adaptation.
pub const DEFAULT_CODEL_TARGET: Duration = Duration::from_millis(5);
/// Default aging period: 500 ms.
///
/// Every period spent waiting raises a waiter's effective level by 10, so a `batch` waiter
/// (level 10) goes ahead of a fresh `interactive` one (level 30) after 1 s of waiting.
pub const DEFAULT_AGING: Duration = Duration::from_millis(500);
/// Default cap on one request's cost: a quarter of the capacity, so one huge prompt can neither
/// monopolise the gate nor wait forever for it to empty.
pub const DEFAULT_MAX_REQUEST_SHARE: f64 = 0.25;

/// CoDel-style queue-deadline shrinking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Codel {
    /// The queue is *standing* once it has not been empty for this long.
    pub interval: Duration,
    /// The wait allowed to a request that arrives at a standing queue.
    pub target: Duration,
}

impl Default for Codel {
    fn default() -> Self {
        Codel {
            interval: DEFAULT_CODEL_INTERVAL,
            target: DEFAULT_CODEL_TARGET,
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) capacity: u32,
    pub(crate) queue_len: usize,
    pub(crate) queue_timeout: Duration,
    pub(crate) codel: Option<Codel>,
    pub(crate) lifo: bool,
    pub(crate) aging: Option<Aging>,
    pub(crate) max_request_share: f64,
    pub(crate) full_status: StatusCode,
    pub(crate) default_priority: Priority,
    pub(crate) reserved: Vec<(Priority, f64)>,
    pub(crate) cost: Cost,
    pub(crate) outcome: bool,
    pub(crate) cluster: Option<Cluster>,
    pub(crate) client_deadline: ClientDeadline,
    pub(crate) adaptive: Option<AdaptiveLimit>,
    /// Fair queueing across tenants is on.
    pub(crate) tenant_fairness: bool,
    pub(crate) fairness: Fairness,
    /// Fair-share counters shared with other gates.
    pub(crate) shared_fairness: Option<SharedFairness>,
}

impl Config {
    /// The most units one request holds under a limit of `limit` units.
    pub(crate) fn max_units(&self, limit: u32) -> u32 {
        let cap = (self.max_request_share * f64::from(limit)).floor() as u32;
        cap.clamp(1, limit.max(1))
    }

    /// The units a reserved `share` comes to under a limit of `limit` units.
    pub(crate) fn reserved_units(&self, share: f64, limit: u32) -> u32 {
        (share.clamp(0.0, 1.0) * f64::from(limit)).floor() as u32
    }
}

/// Bounds the work in flight and the wait queue in front of it, holding each request's permit
/// until its response body ends.
///
/// One layer value is one gate: every service it produces, and every clone of the layer, shares
/// the same capacity and queue. Each `with_*` call starts a new gate with the changed
/// configuration. See the [crate docs](crate) for the semantics.
pub struct BoundedAdmissionLayer<M = Respond> {
    cfg: Config,
    gate: Arc<OnceLock<Arc<Shared>>>,
    _flavour: PhantomData<fn() -> M>,
}

impl<M> Clone for BoundedAdmissionLayer<M> {
    fn clone(&self) -> Self {
        BoundedAdmissionLayer {
            cfg: self.cfg.clone(),
            gate: self.gate.clone(),
            _flavour: PhantomData,
        }
    }
}

impl<M> fmt::Debug for BoundedAdmissionLayer<M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BoundedAdmissionLayer")
            .field("config", &self.cfg)
            .field("mode", &std::any::type_name::<M>())
            .finish()
    }
}

impl BoundedAdmissionLayer<Respond> {
    /// A gate of `capacity` units (at least 1).
    ///
    /// Defaults: cost 1 unit per request ([`Cost::unit`]); a wait queue of `capacity` requests
    /// (a waiter then needs about one round of completions); queue deadline
    /// [`DEFAULT_QUEUE_TIMEOUT`]; CoDel off (a permit is held for a whole stream, seconds, so a
    /// queue that stands for CoDel's 100 ms is ordinary at moderate load, and its 5 ms target
    /// would refuse requests that the next stream's end admits: turn it on with
    /// [`with_codel`](Self::with_codel) where holds are short); FIFO (adaptive LIFO off, since
    /// it trades fairness for latency and should be a conscious choice); aging
    /// [`DEFAULT_AGING`]; one request holds at most [`DEFAULT_MAX_REQUEST_SHARE`] of the
    /// capacity; a full queue answers 429 (the client sent more than we take now); requests
    /// without a [`Priority`] count as [`Priority::standard`]; no reserved shares; responses carry
    /// an `AdmissionOutcome`; fair queueing across tenants on (it only reorders waiters within a
    /// class, and with one tenant, or none, the order is FIFO as without it), with token weights
    /// [`DEFAULT_INPUT_TOKEN_WEIGHT`](crate::DEFAULT_INPUT_TOKEN_WEIGHT) and
    /// [`DEFAULT_OUTPUT_TOKEN_WEIGHT`](crate::DEFAULT_OUTPUT_TOKEN_WEIGHT) and
    /// [`DEFAULT_EXPECTED_OUTPUT_TOKENS`](crate::DEFAULT_EXPECTED_OUTPUT_TOKENS).
    pub fn new(capacity: u32) -> Self {
        let capacity = capacity.max(1);
        BoundedAdmissionLayer {
            cfg: Config {
                capacity,
                queue_len: capacity as usize,
                queue_timeout: DEFAULT_QUEUE_TIMEOUT,
                codel: None,
                lifo: false,
                aging: Aging::new(DEFAULT_AGING),
                max_request_share: DEFAULT_MAX_REQUEST_SHARE,
                full_status: StatusCode::TOO_MANY_REQUESTS,
                default_priority: Priority::standard(),
                reserved: Vec::new(),
                cost: Cost::unit(),
                outcome: true,
                cluster: None,
                client_deadline: ClientDeadline::new(),
                adaptive: None,
                tenant_fairness: true,
                fairness: Fairness::default(),
                shared_fairness: None,
            },
            gate: Arc::default(),
            _flavour: PhantomData,
        }
    }

    /// Switches to error mode ([`Fail`]): refusals are `Err(Overloaded)` and the service's error
    /// type is [`BoxError`](tailguard_core::BoxError).
    pub fn with_error_mode(self) -> BoundedAdmissionLayer<Fail> {
        BoundedAdmissionLayer {
            cfg: self.cfg,
            gate: Arc::default(),
            _flavour: PhantomData,
        }
    }
}

impl<M> BoundedAdmissionLayer<M> {
    fn with(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(&mut self.cfg);
        self.gate = Arc::default();
        self
    }

    /// Sets the number of requests that may wait (0: no queue, refuse when full).
    pub fn with_queue_len(self, len: usize) -> Self {
        self.with(|c| c.queue_len = len)
    }

    /// Sets the queue deadline: the longest a request waits for capacity before a 503.
    ///
    /// The deadline bounds the wait; it plays no part in the `Retry-After` of a refusal, which
    /// comes from the observed hold times (see the [crate docs](crate#retry-after)).
    pub fn with_queue_timeout(self, timeout: Duration) -> Self {
        self.with(|c| c.queue_timeout = timeout)
    }

    /// Sets how the client's own deadline is read (default [`ClientDeadline::new`]:
    /// `grpc-timeout`, and `x-request-timeout` on HTTP). A request whose [`Deadlines`] leave
    /// less time than it is expected to wait in the queue is refused at once with 503
    /// (`deadline_too_short`) and a `Retry-After`, and no request waits in the queue past the
    /// time its deadlines leave. See [Deadlines](crate#deadlines).
    ///
    /// [`Deadlines`]: tailguard_core::Deadlines
    pub fn with_client_deadline(self, client_deadline: ClientDeadline) -> Self {
        self.with(|c| c.client_deadline = client_deadline)
    }

    /// Sets (`Some`) or disables (`None`) CoDel deadline shrinking: a request arriving at a
    /// queue that has not been empty for `interval` may wait only `target`.
    pub fn with_codel(self, codel: Option<Codel>) -> Self {
        self.with(|c| c.codel = codel)
    }

    /// Serves the newest waiter of a class first while the queue is standing (needs CoDel).
    pub fn with_adaptive_lifo(self, lifo: bool) -> Self {
        self.with(|c| c.lifo = lifo)
    }

    /// Sets (`Some`) or disables (`None`, or a zero period) aging: each `period` of waiting
    /// raises a waiter's effective level by 10.
    pub fn with_aging(self, period: Option<Duration>) -> Self {
        self.with(|c| c.aging = period.and_then(Aging::new))
    }

    /// Sets the cost function.
    pub fn with_cost(self, cost: Cost) -> Self {
        self.with(|c| c.cost = cost)
    }

    /// Caps one request's cost at this share of the capacity (`0.0..=1.0`, at least 1 unit).
    pub fn with_max_request_share(self, share: f64) -> Self {
        self.with(|c| c.max_request_share = share.clamp(0.0, 1.0))
    }

    /// Sets the status of a refusal because the queue is full (or the request was evicted):
    /// 429 by default; 503 is the usual alternative. Either way it carries a `Retry-After` from
    /// the observed hold times (see the [crate docs](crate#retry-after)).
    pub fn with_queue_full_status(self, status: StatusCode) -> Self {
        self.with(|c| c.full_status = status)
    }

    /// Sets the class of requests that carry no [`Priority`] extension.
    pub fn with_default_priority(self, priority: Priority) -> Self {
        self.with(|c| c.default_priority = priority)
    }

    /// Reserves `share` of the capacity for `priority` under contention. A
    /// [`ClassPolicy::reserved_share`](tailguard_core::ClassPolicy) in the request extensions
    /// takes precedence.
    ///
    /// A refusal of a class with a reserved share gets its own `Retry-After`: its waiters drain
    /// through its reserved units at its own hold time; while it has waiters, its share is not
    /// counted as capacity for the classes above it (see the [crate docs](crate#retry-after)).
    pub fn with_reserved_share(self, priority: Priority, share: f64) -> Self {
        self.with(|c| {
            c.reserved.retain(|(p, _)| p.level() != priority.level());
            c.reserved.push((priority, share.clamp(0.0, 1.0)));
        })
    }

    /// Whether an admitted response carries an
    /// [`AdmissionOutcome`](tailguard_core::AdmissionOutcome) extension (default: yes, the
    /// recorder reads the queue wait from it); turn it off when nothing reads it. Refusals
    /// always carry it.
    pub fn with_response_outcome(self, on: bool) -> Self {
        self.with(|c| c.outcome = on)
    }

    /// Turns cluster mode on: on top of this gate's local limits, every admitted request takes
    /// a lease of the cluster-wide capacity from `cluster`'s backend, held (and renewed) until
    /// its body ends. See [`Cluster`] for the semantics and the failure modes. Without
    /// it (the default) the gate is local and makes no backend call.
    pub fn with_cluster(self, cluster: Cluster) -> Self {
        self.with(|c| c.cluster = Some(cluster))
    }

    /// Turns the adaptive limit on (`Some`) or off (`None`, the default: the gate admits up to
    /// its capacity). With it, the capacity is the ceiling and the gate admits up to a limit
    /// that follows the upstream's time to first token (see [`AdaptiveLimit`]); reserved
    /// shares, the cap on one request's cost and `Retry-After` are reckoned against the current
    /// limit. In cluster mode it moves the local limit only; the cluster-wide capacity stays
    /// as configured.
    pub fn with_adaptive_limit(self, adaptive: Option<AdaptiveLimit>) -> Self {
        self.with(|c| c.adaptive = adaptive)
    }

    /// Turns fair queueing across tenants on (the default) or off. On, the waiters of a class
    /// are served by tenant ([`Tenant`](tailguard_core::Tenant) in the request extensions;
    /// requests without one are one anonymous tenant): the tenant that has received the least
    /// weighted service in tokens goes next (see [Fair queueing](crate#fair-queueing)). Off, a
    /// class is served oldest first, whoever the tenants. Either way nothing is refused or held
    /// back that the other would admit: only the order of waiters changes.
    pub fn with_tenant_fairness(self, on: bool) -> Self {
        self.with(|c| c.tenant_fairness = on)
    }

    /// Shares the fair-share counters with the other gates using `shared`'s backend (cluster
    /// mode's companion: [`crate::Cluster`] shares the capacity, this the order of tenants
    /// within it). Each gate still orders its own waiters; a tenant's counter also counts the
    /// service the other gates gave it, at most one exchange period behind. See
    /// [`SharedFairness`]. Without fair queueing it does nothing.
    pub fn with_shared_fairness(self, shared: SharedFairness) -> Self {
        self.with(|c| c.shared_fairness = Some(shared))
    }

    /// Sets the weights of a prompt (input) token and of an output token in a tenant's service
    /// (defaults [`DEFAULT_INPUT_TOKEN_WEIGHT`](crate::DEFAULT_INPUT_TOKEN_WEIGHT) = 1,
    /// [`DEFAULT_OUTPUT_TOKEN_WEIGHT`](crate::DEFAULT_OUTPUT_TOKEN_WEIGHT) = 2). A weight that
    /// is negative or not finite keeps its default.
    pub fn with_tenant_token_weights(self, input: f64, output: f64) -> Self {
        let ok = |w: f64, default: f64| {
            if w.is_finite() && w >= 0.0 {
                w
            } else {
                default
            }
        };
        self.with(|c| {
            c.fairness.input_weight = ok(input, crate::DEFAULT_INPUT_TOKEN_WEIGHT);
            c.fairness.output_weight = ok(output, crate::DEFAULT_OUTPUT_TOKEN_WEIGHT);
        })
    }

    /// Sets the output a request is charged for at admission, before its real output is known:
    /// its `max_tokens` ([`RequestFacts`](tailguard_core::RequestFacts)) capped at `tokens`, or
    /// `tokens` when it carries none (default
    /// [`DEFAULT_EXPECTED_OUTPUT_TOKENS`](crate::DEFAULT_EXPECTED_OUTPUT_TOKENS) = 256).
    pub fn with_expected_output_tokens(self, tokens: u32) -> Self {
        self.with(|c| c.fairness.expected_output = tokens)
    }

    /// The configured capacity in units (the ceiling of an adaptive limit).
    pub fn capacity(&self) -> u32 {
        self.cfg.capacity
    }

    fn shared(&self) -> Arc<Shared> {
        self.gate
            .get_or_init(|| Shared::new(self.cfg.clone()))
            .clone()
    }

    /// A handle to observe this layer's gate.
    pub fn handle(&self) -> AdmissionHandle {
        AdmissionHandle {
            shared: self.shared(),
        }
    }
}

impl<S, M> Layer<S> for BoundedAdmissionLayer<M> {
    type Service = BoundedAdmission<S, M>;

    fn layer(&self, inner: S) -> Self::Service {
        BoundedAdmission::from_shared(inner, self.shared())
    }
}

/// Observes a gate: what is in flight and what waits.
#[derive(Clone)]
pub struct AdmissionHandle {
    pub(crate) shared: Arc<Shared>,
}

impl fmt::Debug for AdmissionHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.shared.fmt(f)
    }
}

impl AdmissionHandle {
    /// The configured capacity in units (the ceiling of an adaptive limit).
    pub fn capacity(&self) -> u32 {
        self.shared.config().capacity
    }

    /// The units the gate admits up to now: the capacity, or the current adaptive limit.
    pub fn limit(&self) -> u32 {
        self.shared.snapshot().limit
    }

    /// The adaptive limit's estimate of the upstream's no-load time to first token (`None`
    /// without an adaptive limit, or before it was measured).
    pub fn baseline_ttft(&self) -> Option<Duration> {
        self.shared.snapshot().baseline
    }

    /// Requests holding a permit (admitted, body not yet ended).
    pub fn in_flight(&self) -> usize {
        self.shared.snapshot().in_flight
    }

    /// Units held by requests in flight.
    pub fn in_flight_units(&self) -> u32 {
        self.shared.snapshot().in_use
    }

    /// Requests waiting in the queue.
    pub fn queued(&self) -> usize {
        self.shared.snapshot().queued
    }

    /// Requests of class `priority` in flight.
    pub fn in_flight_of(&self, priority: &Priority) -> usize {
        self.class(priority).map_or(0, |c| c.1)
    }

    /// Requests of class `priority` waiting.
    pub fn queued_of(&self, priority: &Priority) -> usize {
        self.class(priority).map_or(0, |c| c.2)
    }

    /// Units held by requests of class `priority`.
    pub fn in_flight_units_of(&self, priority: &Priority) -> u32 {
        self.class(priority).map_or(0, |c| c.3)
    }

    /// Under fair queueing, the weighted service the gate counts for the tenant of id `tenant`
    /// (`None`: requests without a [`Tenant`](tailguard_core::Tenant)), in tokens over the
    /// tenant's weight: its virtual counter. `None` when the gate keeps no counter for it (fair
    /// queueing off, or nothing of the tenant waiting or in flight).
    pub fn tenant_service(&self, tenant: Option<&str>) -> Option<f64> {
        self.shared.tenant_counter(tenant)
    }

    /// Tenants the gate keeps a counter for: those with requests waiting or in flight.
    pub fn tenants(&self) -> usize {
        self.shared.tenants_known()
    }

    fn class(&self, priority: &Priority) -> Option<(Priority, usize, usize, u32)> {
        self.shared
            .snapshot()
            .classes
            .into_iter()
            .find(|c| c.0 == *priority)
    }
}
