//! What a request holds on a gate: its [`Permit`] once admitted, and the [`WaitGuard`] of its
//! queue entry while it waits.

use std::fmt;
use std::sync::Arc;

use tailguard_core::OverloadReason;
use tokio::time::Instant;

use super::{Rejection, Shared};
use crate::cluster::{Lease, LeaseFuture};
use crate::controller::TtftClock;
use crate::fair::{Fair, Served};

/// Capacity held by one admitted request; releases it when dropped.
pub(crate) struct Permit {
    shared: Arc<Shared>,
    class: usize,
    units: u32,
    admitted: Instant,
    /// The cluster lease held with it, in cluster mode (released after the local units).
    lease: Option<Lease>,
    /// Runs from the grant to the first token, with an adaptive limit.
    ttft: TtftClock,
    /// Its tenant and charge, under fair queueing.
    fair: Option<Fair>,
    /// What the request was served, for the correction of its charge.
    served: Served,
}

impl Permit {
    /// A permit for `units` in `class` of `shared`, admitted at `admitted` (charged to a
    /// tenant under fair queueing).
    pub(super) fn new(
        shared: &Arc<Shared>,
        class: usize,
        units: u32,
        fair: Option<Fair>,
        admitted: Instant,
    ) -> Self {
        Permit {
            shared: shared.clone(),
            class,
            units,
            admitted,
            fair,
            served: Served::Expected,
            lease: None,
            // In cluster mode the clock starts with the lease.
            ttft: TtftClock::new(
                shared.cfg.adaptive.is_some() && shared.cluster.is_none(),
                admitted,
            ),
        }
    }

    pub(crate) fn units(&self) -> u32 {
        self.units
    }

    /// Holds `lease` with this permit, until it is dropped. The TTFT clock starts now: the
    /// lease wait (and a failed lease step) is the gateway's, not the upstream's.
    pub(crate) fn with_lease(mut self, lease: Option<Lease>) -> Self {
        self.lease = lease;
        self.ttft = TtftClock::new(self.shared.cfg.adaptive.is_some(), Instant::now());
        self
    }

    /// Whether the gate wants this request's time to first token (an adaptive limit, no token
    /// seen yet).
    pub(crate) fn wants_ttft(&self) -> bool {
        self.ttft.running()
    }

    /// The first token arrived: gives the gate its TTFT sample.
    pub(crate) fn first_token(&mut self) {
        if let Some(s) = self.ttft.take(false) {
            self.shared
                .locked(|st, deferred| self.shared.observe(st, Some(s), deferred));
        }
    }

    /// The response gives no TTFT sample (a 2xx answer that is not a stream).
    pub(crate) fn no_ttft(&mut self) {
        self.ttft.stop();
    }

    /// Whether the gate wants the request's output tokens (fair queueing corrects its tenant's
    /// charge with them).
    pub(crate) fn wants_output(&self) -> bool {
        self.fair.is_some()
    }

    /// Records what the request was served; its tenant's charge is corrected with it when the
    /// permit is released (by default the charge at admission stands).
    pub(crate) fn served(&mut self, served: Served) {
        self.served = served;
    }

    /// The cluster lease step of this permit, in cluster mode: waits for a lease until
    /// `deadline`.
    pub(crate) fn cluster_lease(&self, deadline: Instant) -> Option<LeaseFuture> {
        let cluster = self.shared.cluster.as_ref()?;
        let class = self.shared.lock().queue.classes[self.class]
            .priority
            .clone();
        Some(cluster.lease(&class, self.units, deadline))
    }

    /// The refusal of this permit's request after a failed lease step.
    pub(crate) fn refusal(&self, reason: OverloadReason) -> Rejection {
        let st = self.shared.lock();
        let retry_after = self
            .shared
            .retry_after(&st, self.class, Instant::now(), self.units);
        st.queue.classes[self.class].metrics.rejected(reason);
        Rejection {
            reason,
            retry_after,
            units: self.units,
        }
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Permit")
            .field("class", &self.class)
            .field("units", &self.units)
            .finish()
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        // Ended before its first token: a censored sample.
        let sample = self.ttft.take(true);
        let fair = self
            .fair
            .map(|f| (f.tenant, f.charge.correction(self.served)));
        self.shared
            .release(self.class, self.units, self.admitted, sample, fair);
    }
}

/// Removes the waiter from the queue when dropped while still armed (the caller went away).
pub(crate) struct WaitGuard {
    shared: Arc<Shared>,
    class: usize,
    /// The lane of the entry (its tenant's slot).
    tenant: usize,
    seq: u64,
    armed: bool,
}

impl WaitGuard {
    /// The guard of the queue entry `seq` of `tenant` in `class` of `shared`, armed.
    pub(super) fn new(shared: Arc<Shared>, class: usize, tenant: usize, seq: u64) -> Self {
        WaitGuard {
            shared,
            class,
            tenant,
            seq,
            armed: true,
        }
    }

    /// The outcome was received: nothing to remove.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Removes the entry because its deadline passed. `Some` with the rejection when the entry
    /// was still queued; `None` when the gate already decided (the outcome is in the channel).
    pub(crate) fn expire(&mut self) -> Option<Rejection> {
        let removed = self
            .shared
            .remove_waiter(self.class, self.tenant, self.seq, true);
        if removed.is_some() {
            self.armed = false;
        }
        removed
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if self.armed {
            self.shared
                .remove_waiter(self.class, self.tenant, self.seq, false);
        }
    }
}
