//! Fair-share counters shared by several gates: each gate's virtual token counters
//! ([`crate::fair`]) also count the service its tenants received at the other gates.
//!
//! Waiting stays local, as in cluster mode: a gate orders its own waiters. What is shared is
//! the service: every [period](SharedFairness::with_period) a background task makes one
//! exchange with the [`FairShareBackend`]: it adds the weighted service this gate charged each
//! tenant since the last exchange to the tenant's cluster-wide total, and reads back the totals
//! of the tenants this gate knows (those with requests waiting or in flight). A tenant's counter
//! then grows by what the other gates served it since the previous exchange, so a tenant that
//! floods two gateways ranks behind a tenant that uses one, on both. The queue never waits on
//! the backend: the counters are at most one period behind.
//!
//! Service a tenant received before this gate knew it is not charged (a newcomer starts at the
//! gate's floor, as without sharing), and a failed exchange (each bounded by its timeout) costs
//! only the sharing: the gate orders by its own counters until the next exchange succeeds,
//! starting every tenant over. Fair queueing never refuses or holds back a request, so there is
//! no fail-closed mode; a warning is logged when the backend goes down and
//! `tailguard_admission_fair_share_errors_total` counts failed exchanges.

use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::cluster::BackendFuture;
use crate::gate::Shared;

/// One exchange with the shared counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServiceReport {
    /// Weighted service charged by this gate since its last exchange, by tenant key (see
    /// [`tenant_key`]): to be added to the tenants' totals. A correction can be negative.
    pub served: Vec<(String, f64)>,
    /// The tenants whose totals are wanted, after `served` is added.
    pub wanted: Vec<String>,
}

/// The key of a tenant in the shared counters: `t:` and its id, or `anonymous` for requests
/// without a [`Tenant`](tailguard_core::Tenant).
pub fn tenant_key(id: Option<&str>) -> String {
    id.map_or_else(|| "anonymous".to_owned(), |id| format!("t:{id}"))
}

/// A store of tenants' cluster-wide service totals.
pub trait FairShareBackend: fmt::Debug + Send + Sync + 'static {
    /// Atomically adds each of `report.served` to its tenant's total (a tenant without one
    /// starts at 0), then returns the total of each of `report.wanted`, in order (0 for a
    /// tenant without one).
    fn exchange(&self, report: ServiceReport) -> BackendFuture<Vec<f64>>;
}

/// Sharing of a gate's fair-share counters through a [`FairShareBackend`]
/// ([`BoundedAdmissionLayer::with_shared_fairness`](crate::BoundedAdmissionLayer::with_shared_fairness)).
#[derive(Clone, Debug)]
pub struct SharedFairness {
    pub(crate) backend: Arc<dyn FairShareBackend>,
    pub(crate) period: Duration,
    pub(crate) timeout: Duration,
}

impl SharedFairness {
    /// Shares the counters through `backend`. Defaults: one exchange every 100 ms, each
    /// bounded by 50 ms.
    pub fn new(backend: Arc<dyn FairShareBackend>) -> Self {
        SharedFairness {
            backend,
            period: Duration::from_millis(100),
            timeout: Duration::from_millis(50),
        }
    }

    /// Sets the exchange period (at least 10 ms).
    pub fn with_period(mut self, period: Duration) -> Self {
        self.period = period.max(Duration::from_millis(10));
        self
    }

    /// Sets the timeout of one exchange (at least 1 ms).
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout.max(Duration::from_millis(1));
        self
    }
}

/// Exchanges every period while the gate lives.
pub(crate) async fn run(gate: Weak<Shared>, cfg: SharedFairness) {
    let mut down = false;
    while exchange(&gate, &cfg, &mut down).await {
        tokio::time::sleep(cfg.period).await;
    }
}

/// One exchange (none when the gate served nothing and knows no tenant); `false` once the
/// gate is gone. The gate is not held across the call, so a dropped layer ends the task.
async fn exchange(gate: &Weak<Shared>, cfg: &SharedFairness, down: &mut bool) -> bool {
    let Some(g) = gate.upgrade() else {
        return false;
    };
    let (pushed, wanted) = g.take_service_report();
    drop(g);
    if pushed.is_empty() && wanted.is_empty() {
        return true;
    }
    let report = ServiceReport {
        served: pushed
            .iter()
            .map(|(k, v)| (tenant_key(k.as_deref()), *v))
            .collect(),
        wanted: wanted.iter().map(|k| tenant_key(k.as_deref())).collect(),
    };
    let call = cfg.backend.exchange(report);
    let res = match tokio::time::timeout(cfg.timeout, call).await {
        Ok(Ok(totals)) if totals.len() == wanted.len() => Ok(totals),
        Ok(Ok(totals)) => Err(format!(
            "{} totals for {} tenants",
            totals.len(),
            wanted.len()
        )),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("timed out".to_owned()),
    };
    let Some(g) = gate.upgrade() else {
        return false;
    };
    match &res {
        Ok(totals) => {
            if std::mem::replace(down, false) {
                tracing::info!("tailguard-admission: fair-share backend back");
            }
            g.apply_service_totals(&pushed, Some((&wanted, totals)));
        }
        Err(e) => {
            // The service is not reported again: a timed-out exchange may have been applied,
            // and counting it twice would hold the tenant back for nothing.
            if !std::mem::replace(down, true) {
                tracing::warn!(
                    "tailguard-admission: fair-share backend unreachable ({e}); \
                     ordering by this gate's counters alone"
                );
            }
            metrics::counter!("tailguard_admission_fair_share_errors_total").increment(1);
            g.apply_service_totals(&pushed, None);
        }
    }
    true
}
