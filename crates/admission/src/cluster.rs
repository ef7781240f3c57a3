//! Cluster mode: a capacity shared by several gates through a [`LeaseBackend`]; see [`Cluster`].

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tailguard_core::{BoxError, OverloadReason, Priority};
use tokio::sync::Notify;
use tokio::task::AbortHandle;
use tokio::time::Instant;

/// The future a [`LeaseBackend`] call returns.
pub type BackendFuture<T> = Pin<Box<dyn Future<Output = Result<T, BackendError>> + Send>>;

/// A failed backend call (the store is unreachable, or answered with an error).
#[derive(Debug)]
pub struct BackendError(BoxError);

impl BackendError {
    /// Wraps the backend's own error.
    pub fn new(e: impl Into<BoxError>) -> Self {
        BackendError(e.into())
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cluster admission backend: {}", self.0)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.0)
    }
}

/// What a lease is taken for: `units` of the pool's `pool_capacity` and of the class's
/// `class_capacity`, held for `ttl` unless renewed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSpec {
    /// The pool (the upstream the capacity belongs to).
    pub pool: Arc<str>,
    /// The request's class name ([`Priority::name`]).
    pub class: Arc<str>,
    /// The units the request holds.
    pub units: u32,
    /// The cluster-wide capacity of the pool, all classes together.
    pub pool_capacity: u32,
    /// The cluster-wide capacity of the class (the pool's when not configured).
    pub class_capacity: u32,
    /// How long the lease lives without renewal.
    pub ttl: Duration,
}

/// A lease's identity in the backend.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct LeaseId(pub String);

/// A store of cluster-wide admission leases: a counting semaphore per pool and class whose
/// holds expire.
pub trait LeaseBackend: fmt::Debug + Send + Sync + 'static {
    /// Atomically drops expired leases, counts the units held in the pool and the class, and
    /// takes a lease if `spec.units` fit both: `Some` with its id, `None` when full.
    fn try_acquire(&self, spec: &LeaseSpec) -> BackendFuture<Option<LeaseId>>;
    /// Extends a lease by `spec.ttl` from now; `false` if it had already expired (and is gone).
    fn renew(&self, spec: &LeaseSpec, id: &LeaseId) -> BackendFuture<bool>;
    /// Gives a lease back.
    fn release(&self, spec: &LeaseSpec, id: &LeaseId) -> BackendFuture<()>;
}

/// What a gate does while its cluster backend is unreachable.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FailMode {
    /// Admit on the local limits alone (the default): an outage of the store costs the
    /// cluster-wide bound, not the service.
    #[default]
    Open,
    /// Refuse with 503 `cluster_unavailable` (and a `Retry-After`).
    Closed,
}

impl FailMode {
    fn as_str(self) -> &'static str {
        match self {
            FailMode::Open => "open",
            FailMode::Closed => "closed",
        }
    }
}

/// Default lease TTL: 10 s, the longest a killed gateway's capacity stays lost.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10);
/// Default timeout of one backend call: 50 ms.
pub const DEFAULT_BACKEND_TIMEOUT: Duration = Duration::from_millis(50);
/// Default poll interval of a waiter while the cluster is full: 20 ms.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(20);

/// The cluster-mode configuration of a gate
/// ([`BoundedAdmissionLayer::with_cluster`](crate::BoundedAdmissionLayer::with_cluster)).
///
/// Cluster mode: a capacity shared by several gates (one per gateway process) through a
/// [`LeaseBackend`], on top of each gate's local limits.
///
/// A request first passes its gate's local checks (capacity, queue, deadline, CoDel,
/// priorities: unchanged). Once admitted locally it takes a *lease* from the backend: one unit
/// of a cluster-wide counting semaphore per pool (and, optionally, per class), with an expiry.
/// The lease is renewed while the response body streams (every third of its TTL) and released
/// when the body ends or is dropped. A gateway that dies without releasing leaks its leases for
/// at most one TTL: the backend drops expired leases before counting.
///
/// **Waiting stays local.** When the cluster is full, the request keeps its local permit and
/// waits, until its queue deadline (503 `queue_timeout` after it). Only one request per gate
/// asks the backend at a time, in the order the local gate admitted them (its priority order);
/// it retries when a lease of this gate is released, and otherwise every
/// [poll interval](Cluster::with_poll_interval), because a lease freed by another gateway, or
/// expired after a crash, sends no message. So priority order holds within a gateway but is
/// approximate across gateways: each gateway's next waiter races the others' for a freed
/// lease, whatever its class, and a gateway that polls sooner wins. A cluster-wide priority
/// queue would need a coordination protocol of its own; the local order plus the race bounds
/// the inversion to one waiter per gateway.
///
/// **Failure.** Every backend call is bounded by [`Cluster::with_timeout`]. When a call fails
/// or times out the gate falls back to its local limits ([`FailMode::Open`], the default) or
/// refuses with 503 `cluster_unavailable` and a `Retry-After` ([`FailMode::Closed`]). Either
/// way a warning is logged when the backend goes down (and an info line when it is back), and
/// `tailguard_admission_cluster_errors_total` (label `mode` = `open`|`closed`) counts the
/// requests concerned. No request waits on the backend longer than its timeout per call.
#[derive(Clone)]
pub struct Cluster {
    backend: Arc<dyn LeaseBackend>,
    pool: Arc<str>,
    capacity: u32,
    classes: Vec<(Priority, u32)>,
    ttl: Duration,
    timeout: Duration,
    poll: Duration,
    fail: FailMode,
}

impl fmt::Debug for Cluster {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cluster")
            .field("backend", &self.backend)
            .field("pool", &self.pool)
            .field("capacity", &self.capacity)
            .field("classes", &self.classes)
            .field("ttl", &self.ttl)
            .field("timeout", &self.timeout)
            .field("poll", &self.poll)
            .field("fail", &self.fail)
            .finish()
    }
}

impl Cluster {
    /// `capacity` units (at least 1) of `pool`, shared by every gate using `backend`. Defaults:
    /// lease TTL [`DEFAULT_LEASE_TTL`], call timeout [`DEFAULT_BACKEND_TIMEOUT`], poll interval
    /// [`DEFAULT_POLL_INTERVAL`], [`FailMode::Open`], no per-class capacities.
    pub fn new(backend: Arc<dyn LeaseBackend>, pool: &str, capacity: u32) -> Self {
        Cluster {
            backend,
            pool: pool.into(),
            capacity: capacity.max(1),
            classes: Vec::new(),
            ttl: DEFAULT_LEASE_TTL,
            timeout: DEFAULT_BACKEND_TIMEOUT,
            poll: DEFAULT_POLL_INTERVAL,
            fail: FailMode::Open,
        }
    }

    /// Limits `priority` to `capacity` units cluster-wide, within the pool's.
    pub fn with_class_capacity(mut self, priority: Priority, capacity: u32) -> Self {
        self.classes.retain(|(p, _)| p.level() != priority.level());
        self.classes.push((priority, capacity.max(1)));
        self
    }

    /// Sets the lease TTL (at least 1 s; leases are renewed every third of it).
    pub fn with_lease_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl.max(Duration::from_secs(1));
        self
    }

    /// Sets the timeout of each backend call (at least 1 ms).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }

    /// Sets how often a waiter asks again while the cluster is full (at least 1 ms).
    pub fn with_poll_interval(mut self, poll: Duration) -> Self {
        self.poll = poll.max(Duration::from_millis(1));
        self
    }

    /// Sets what happens while the backend is unreachable.
    pub fn with_fail_mode(mut self, fail: FailMode) -> Self {
        self.fail = fail;
        self
    }

    /// The cluster-wide capacity of the pool.
    pub fn capacity(&self) -> u32 {
        self.capacity
    }
}

/// A gate's cluster state: its configuration, the wake-up of its waiter and the turn.
#[derive(Debug)]
pub(crate) struct ClusterGate {
    cfg: Cluster,
    /// Woken when a lease of this gate is released.
    freed: Notify,
    /// One request of this gate asks the backend at a time (FIFO: the local admission order).
    turn: tokio::sync::Mutex<()>,
    /// Whether the last call failed (to log transitions only).
    down: AtomicBool,
}

/// The result of asking the cluster: a lease (`None`: failed open), or a refusal.
pub(crate) type LeaseOutcome = Result<Option<Lease>, OverloadReason>;

/// The lease step of a locally admitted request.
pub(crate) type LeaseFuture = Pin<Box<dyn Future<Output = LeaseOutcome> + Send>>;

impl ClusterGate {
    pub(crate) fn new(cfg: Cluster) -> Arc<Self> {
        Arc::new(ClusterGate {
            cfg,
            freed: Notify::new(),
            turn: tokio::sync::Mutex::new(()),
            down: AtomicBool::new(false),
        })
    }

    fn spec(&self, class: &Priority, units: u32) -> LeaseSpec {
        let class_capacity = self
            .cfg
            .classes
            .iter()
            .find(|(p, _)| p.level() == class.level())
            .map_or(self.cfg.capacity, |c| c.1);
        LeaseSpec {
            pool: self.cfg.pool.clone(),
            class: class.name().into(),
            units: units.min(self.cfg.capacity),
            pool_capacity: self.cfg.capacity,
            class_capacity,
            ttl: self.cfg.ttl,
        }
    }

    /// Takes a lease for `units` of `class`, waiting while the cluster is full until
    /// `deadline` (then `QueueTimeout`).
    pub(crate) fn lease(
        self: &Arc<Self>,
        class: &Priority,
        units: u32,
        deadline: Instant,
    ) -> LeaseFuture {
        let gate = self.clone();
        let spec = self.spec(class, units);
        Box::pin(async move {
            let deadline = deadline.max(Instant::now() + gate.cfg.timeout);
            let work = gate.clone().acquire(spec);
            tokio::time::timeout_at(deadline, work)
                .await
                .unwrap_or(Err(OverloadReason::QueueTimeout))
        })
    }

    async fn acquire(self: Arc<Self>, spec: LeaseSpec) -> LeaseOutcome {
        let _turn = self.turn.lock().await;
        loop {
            let freed = self.freed.notified();
            let call = self.cfg.backend.try_acquire(&spec);
            match tokio::time::timeout(self.cfg.timeout, call).await {
                Ok(Ok(Some(id))) => {
                    self.up();
                    return Ok(Some(Lease::new(self.clone(), spec, id)));
                }
                Ok(Ok(None)) => self.up(),
                Ok(Err(e)) => return self.failed(&e),
                Err(_) => return self.failed(&"timed out"),
            }
            // Woken by a release here, or asks again after the poll interval.
            let _ = tokio::time::timeout(self.cfg.poll, freed).await;
        }
    }

    fn up(&self) {
        if self.down.swap(false, Ordering::Relaxed) {
            tracing::info!(pool = %self.cfg.pool, "tailguard-admission: cluster backend back");
        }
    }

    fn failed(&self, e: &dyn fmt::Display) -> LeaseOutcome {
        let mode = self.cfg.fail.as_str();
        if !self.down.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                pool = %self.cfg.pool,
                fail = mode,
                "tailguard-admission: cluster backend unreachable ({e}); failing {mode}"
            );
        }
        metrics::counter!("tailguard_admission_cluster_errors_total", "mode" => mode).increment(1);
        match self.cfg.fail {
            FailMode::Open => Ok(None),
            FailMode::Closed => Err(OverloadReason::ClusterUnavailable),
        }
    }
}

/// A cluster lease held by an admitted request: renewed while held, released when dropped.
#[derive(Debug)]
pub(crate) struct Lease {
    gate: Arc<ClusterGate>,
    spec: LeaseSpec,
    id: LeaseId,
    renewal: Option<AbortHandle>,
}

impl Lease {
    fn new(gate: Arc<ClusterGate>, spec: LeaseSpec, id: LeaseId) -> Self {
        let renewal = tokio::runtime::Handle::try_current().ok().map(|rt| {
            let (g, s, i) = (gate.clone(), spec.clone(), id.clone());
            rt.spawn(renew(g, s, i)).abort_handle()
        });
        Lease {
            gate,
            spec,
            id,
            renewal,
        }
    }
}

/// Renews a lease every third of its TTL, until aborted or the lease is found gone.
async fn renew(gate: Arc<ClusterGate>, spec: LeaseSpec, id: LeaseId) {
    loop {
        tokio::time::sleep(spec.ttl / 3).await;
        let call = gate.cfg.backend.renew(&spec, &id);
        match tokio::time::timeout(gate.cfg.timeout, call).await {
            Ok(Ok(true)) => gate.up(),
            Ok(Ok(false)) => {
                tracing::warn!(pool = %spec.pool, "tailguard-admission: cluster lease expired while held");
                return;
            }
            // Tried again at the next period; the lease outlives two failed renewals.
            Ok(Err(e)) => drop(gate.failed(&e)),
            Err(_) => drop(gate.failed(&"timed out")),
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(r) = self.renewal.take() {
            r.abort();
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            // No runtime to release on: the lease expires after its TTL.
            return;
        };
        let (gate, spec, id) = (self.gate.clone(), self.spec.clone(), self.id.clone());
        rt.spawn(async move {
            let call = gate.cfg.backend.release(&spec, &id);
            // A release that fails or times out leaves the lease to expire.
            let _ = tokio::time::timeout(gate.cfg.timeout, call).await;
            gate.freed.notify_waiters();
        });
    }
}
