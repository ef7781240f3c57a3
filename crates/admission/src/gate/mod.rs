//! The shared state of one admission gate: capacity accounting and the admission decisions,
//! over the wait queue ([`crate::queue`]) and the hold times behind `Retry-After`
//! ([`crate::drain`]).
//!
//! All of it lives behind one `std::sync::Mutex` with short critical sections. Waiters are
//! woken through a `tokio::sync::oneshot` whose value is sent *while the lock is held*, so a
//! waiter that does not find its own entry in the queue knows the outcome is already in its
//! channel (no lost wakeups). A [`Permit`] is never dropped under the lock (its release takes
//! the lock): a send that fails hands the value back, and it is dropped after the lock is
//! released.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tailguard_core::{OverloadReason, Priority};
use tokio::sync::oneshot;
use tokio::time::Instant;

mod permit;

pub(crate) use permit::{Permit, WaitGuard};

use crate::cluster::ClusterGate;
use crate::controller::{Controller, Sample};
use crate::drain::{self, Holds};
use crate::fair::{Demand, Fair, TenantKey, Tenants};
use crate::fair_share;
use crate::lanes::NO_TENANT;
use crate::layer::Config;
use crate::queue::Queue;

/// What a waiter receives: admission (a permit) or a rejection.
/// The permit comes with the time the waiter spent queued, measured by the gate.
pub(crate) type Grant = Result<(Permit, Duration), Rejection>;

/// A refusal decided by the gate.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rejection {
    pub(crate) reason: OverloadReason,
    pub(crate) retry_after: Duration,
    /// The units the request would have held: its cost capped at the share of the current
    /// limit one request may take (what its `AdmissionOutcome` reports).
    pub(crate) units: u32,
}

/// The outcome of [`Shared::acquire`].
pub(crate) enum Acquire {
    /// Admitted at once.
    Admitted(Permit),
    /// Queued; the outcome arrives on `rx`.
    Queued(Queued),
    /// Refused at once.
    Rejected(Rejection),
}

/// A queue entry's handle, held by the waiting future.
pub(crate) struct Queued {
    pub(crate) rx: oneshot::Receiver<Grant>,
    pub(crate) guard: WaitGuard,
    pub(crate) deadline: Instant,
    pub(crate) enqueued: Instant,
}

/// Everything behind the gate's lock.
struct State {
    /// The capacity admitted up to now: the configured capacity, or the adaptive limit.
    limit: u32,
    adaptive: Option<Controller>,
    /// Units and requests in flight, all classes together.
    in_use: u32,
    in_flight: usize,
    queue: Queue,
    /// The hold times of all classes' permits together.
    holds: Holds,
}

impl State {
    /// Counts an admission of `units` in `class` at `now`, charged to its tenant under fair
    /// queueing, after waiting `waited` (`None`: admitted at once).
    fn admit(
        &mut self,
        class: usize,
        units: u32,
        fair: Option<Fair>,
        waited: Option<Duration>,
        now: Instant,
    ) {
        if let Some(f) = fair {
            self.queue.tenants.admit(f.tenant, &f.charge, units, waited);
        }
        self.in_use += units;
        self.in_flight += 1;
        self.holds.admit(now, units);
        let c = &mut self.queue.classes[class];
        c.in_use += units;
        c.in_flight += 1;
        c.holds.admit(now, units);
        c.metrics.in_flight.increment(1.0);
        if let Some(a) = &mut self.adaptive {
            a.note_in_use(self.in_use);
        }
    }

    /// Counts the release at `now` of an admission of `units` in `class` made at `admitted`;
    /// under fair queueing its tenant's charge is corrected by `fair`'s second member.
    fn release(
        &mut self,
        class: usize,
        units: u32,
        admitted: Instant,
        now: Instant,
        fair: Option<(usize, f64)>,
    ) {
        if let Some((tenant, correction)) = fair {
            self.queue.tenants.release(tenant, correction, units);
        }
        self.in_use -= units;
        self.in_flight -= 1;
        self.holds.release(now, admitted, units);
        let c = &mut self.queue.classes[class];
        c.in_use -= units;
        c.in_flight -= 1;
        c.holds.release(now, admitted, units);
        c.metrics.in_flight.decrement(1.0);
    }
}

/// Failed sends whose values must be dropped after the lock is released.
type Deferred = Vec<Grant>;

/// One gate: configuration and the locked state.
pub(crate) struct Shared {
    cfg: Config,
    state: Mutex<State>,
    cluster: Option<Arc<ClusterGate>>,
    /// Whether the exchange of shared fair-share counters runs (or needs no start).
    sharing: AtomicBool,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.snapshot();
        f.debug_struct("Gate")
            .field("capacity", &self.cfg.capacity)
            .field("limit", &s.limit)
            .field("in_use", &s.in_use)
            .field("in_flight", &s.in_flight)
            .field("queued", &s.queued)
            .finish()
    }
}

impl Shared {
    pub(crate) fn new(cfg: Config) -> Arc<Self> {
        let now = Instant::now();
        let adaptive = cfg.adaptive.clone();
        let adaptive = adaptive.map(|a| Controller::new(a, cfg.capacity, now));
        let state = State {
            limit: adaptive.as_ref().map_or(cfg.capacity, Controller::limit),
            adaptive,
            in_use: 0,
            in_flight: 0,
            queue: Queue::new(match cfg.shared_fairness {
                Some(_) => Tenants::shared(),
                None => Tenants::default(),
            }),
            holds: Holds::new(now),
        };
        Arc::new(Shared {
            cluster: cfg.cluster.clone().map(ClusterGate::new),
            sharing: AtomicBool::new(cfg.shared_fairness.is_none()),
            cfg,
            state: Mutex::new(state),
        })
    }

    /// Starts the exchange of shared fair-share counters, once, from inside a runtime.
    fn start_sharing(self: &Arc<Self>) {
        if self.sharing.load(Ordering::Relaxed) || self.sharing.swap(true, Ordering::AcqRel) {
            return;
        }
        let Some(cfg) = self.cfg.shared_fairness.clone() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn(fair_share::run(Arc::downgrade(self), cfg))),
            Err(_) => self.sharing.store(false, Ordering::Release),
        }
    }

    /// For an exchange of shared counters: the service charged since the last one, and the
    /// tenants whose totals are wanted.
    pub(crate) fn take_service_report(&self) -> (HashMap<TenantKey, f64>, Vec<TenantKey>) {
        self.lock().queue.tenants.take_report()
    }

    /// Applies an exchange's answer (`None`: it failed).
    pub(crate) fn apply_service_totals(
        &self,
        pushed: &HashMap<TenantKey, f64>,
        answer: Option<(&[TenantKey], &[f64])>,
    ) {
        self.lock().queue.tenants.apply_totals(pushed, answer);
    }

    pub(crate) fn config(&self) -> &Config {
        &self.cfg
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `f` under the lock; the grants it could not deliver are dropped once the lock is
    /// released.
    fn locked<T>(&self, f: impl FnOnce(&mut State, &mut Deferred) -> T) -> T {
        let mut deferred = Deferred::new();
        let out = f(&mut self.lock(), &mut deferred);
        drop(deferred);
        out
    }

    /// The number of units a request of raw cost `cost` holds (at most the share of the
    /// configured capacity; [`acquire`](Self::acquire) caps it at the share of the limit).
    pub(crate) fn units_for(&self, cost: u32) -> u32 {
        cost.clamp(1, self.cfg.max_units(self.cfg.capacity))
    }

    /// Whether `units` fit now. An empty gate takes any request, so that one admitted under a
    /// higher adaptive limit is never stranded by a lower one.
    fn fits(&self, st: &State, units: u32) -> bool {
        units <= st.limit.saturating_sub(st.in_use) || st.in_use == 0
    }

    /// Feeds a TTFT sample (`None`: an arrival, which only times a probe out) to the adaptive
    /// limit; a rise admits the waiters it makes room for, a fall revokes nothing.
    fn observe(self: &Arc<Self>, st: &mut State, sample: Option<Sample>, deferred: &mut Deferred) {
        let Some(a) = &mut st.adaptive else {
            return;
        };
        let now = Instant::now();
        a.observe(sample, now);
        let (before, limit) = (st.limit, a.limit());
        if limit != before {
            st.limit = limit;
            st.queue.rescale(&self.cfg, limit);
        }
        if limit > before {
            self.dispatch(st, now, deferred);
        }
    }

    /// Decides on an arriving request of class `priority` (the default class when `None`)
    /// carrying an optional reserved `share` for its class, with `left` until its deadline, and
    /// under fair queueing its tenant's `demand`.
    pub(crate) fn acquire(
        self: &Arc<Self>,
        priority: Option<&Priority>,
        share: Option<f64>,
        units: u32,
        left: Option<Duration>,
        demand: Option<Demand>,
    ) -> Acquire {
        if demand.is_some() {
            self.start_sharing();
        }
        self.locked(|st, deferred| {
            // An arrival ends a probe that ran out of time.
            self.observe(st, None, deferred);
            let now = Instant::now();
            let priority = priority.unwrap_or(&self.cfg.default_priority);
            let class = st.queue.class(priority, share, &self.cfg, st.limit, now);
            let units = units.min(self.cfg.max_units(st.limit));
            let fair = demand.map(|d| Fair {
                tenant: st.queue.tenants.slot(d.tenant.as_ref()),
                charge: d.charge,
            });
            if st.queue.len() == 0 && self.fits(st, units) {
                st.admit(class, units, fair, None, now);
                let m = &st.queue.classes[class].metrics;
                m.admitted_immediate.increment(1);
                m.queue_wait.record(0.0);
                return Acquire::Admitted(Permit::new(self, class, units, fair, now));
            }
            let refused = if self.cfg.queue_len == 0 {
                Some(OverloadReason::QueueFull)
            } else {
                left.filter(|&l| l.is_zero() || self.expected_wait(st, class, now, units) > l)
                    .map(|_| OverloadReason::DeadlineTooShort)
            };
            if let Some(reason) = refused {
                if let Some(f) = fair {
                    st.queue.tenants.forget_if_idle(f.tenant);
                }
                return Acquire::Rejected(self.refuse(st, class, reason, now, units));
            }
            self.enqueue(st, class, units, fair, now, left, deferred)
        })
    }

    /// Queues an arrival that does not fit at once, waiting at most `left` (its deadline); when
    /// that overfills the queue, evicts the newest waiter of a lower class or refuses the
    /// arrival.
    #[allow(clippy::too_many_arguments)]
    fn enqueue(
        self: &Arc<Self>,
        st: &mut State,
        class: usize,
        units: u32,
        fair: Option<Fair>,
        now: Instant,
        left: Option<Duration>,
        deferred: &mut Deferred,
    ) -> Acquire {
        let allowed = st.queue.allowed_wait(class, now, &self.cfg);
        let deadline = now + left.map_or(allowed, |l| l.min(allowed));
        let (seq, rx) = st.queue.push(class, units, fair, now);
        // The arrival is queued first so that it competes in order: if it is admitted at once
        // (it outranks every waiter and fits), nobody is evicted.
        self.dispatch(st, now, deferred);
        if st.queue.len() > self.cfg.queue_len {
            let level = st.queue.classes[class].priority.level();
            let Some(victim) = st.queue.victim_below(level) else {
                // Nobody to evict: the arrival (the newest of its class) goes again.
                let arrival = st.queue.take_newest(class);
                debug_assert_eq!(arrival.map(|w| w.seq), Some(seq));
                let r = self.refuse(st, class, OverloadReason::QueueFull, now, units);
                return Acquire::Rejected(r);
            };
            if let Some(w) = st.queue.take_newest(victim) {
                let r = self.refuse(st, victim, OverloadReason::Evicted, now, w.units);
                if let Err(g) = w.tx.send(Err(r)) {
                    deferred.push(g);
                }
            }
            // The evicted waiter may have been the one blocking the line.
            self.dispatch(st, now, deferred);
        }
        Acquire::Queued(Queued {
            rx,
            guard: WaitGuard::new(
                self.clone(),
                class,
                fair.map_or(NO_TENANT, |f| f.tenant),
                seq,
            ),
            deadline,
            enqueued: now,
        })
    }

    /// A refusal of a request of `units` in `class` (counted in its metrics), with its
    /// `Retry-After`.
    fn refuse(
        &self,
        st: &State,
        class: usize,
        reason: OverloadReason,
        now: Instant,
        units: u32,
    ) -> Rejection {
        st.queue.classes[class].metrics.rejected(reason);
        Rejection {
            reason,
            retry_after: self.retry_after(st, class, now, units),
            units,
        }
    }

    /// The `Retry-After` of a refused request of `units` in `class`: its expected wait in
    /// whole seconds.
    fn retry_after(&self, st: &State, class: usize, now: Instant, units: u32) -> Duration {
        drain::whole_seconds(self.expected_wait(st, class, now, units).as_secs_f64())
    }

    /// How long a request of `units` in `class` arriving now can expect to wait
    /// ([`drain::expected_wait`]).
    fn expected_wait(&self, st: &State, class: usize, now: Instant, units: u32) -> Duration {
        drain::expected_wait(&st.queue, &st.holds, st.limit, class, units, now)
    }

    /// Admits waiters in the queue's order while the next one fits.
    fn dispatch(self: &Arc<Self>, st: &mut State, now: Instant, deferred: &mut Deferred) {
        while let Some(pick) = st.queue.next(now, &self.cfg) {
            if !self.fits(st, pick.units) {
                break;
            }
            let w = st.queue.take(pick);
            let waited = now.saturating_duration_since(w.enqueued);
            let m = &st.queue.classes[pick.class].metrics;
            m.admitted_queued.increment(1);
            m.queue_wait.record(waited.as_secs_f64());
            st.admit(pick.class, w.units, w.fair, Some(waited), now);
            let permit = Permit::new(self, pick.class, w.units, w.fair, now);
            if let Err(g) = w.tx.send(Ok((permit, waited))) {
                deferred.push(g);
            }
        }
    }

    /// Gives back a permit's units (with its censored TTFT `sample`, if any, and under fair
    /// queueing its tenant's correction) and admits the waiters they make room for.
    fn release(
        self: &Arc<Self>,
        class: usize,
        units: u32,
        admitted: Instant,
        sample: Option<Sample>,
        fair: Option<(usize, f64)>,
    ) {
        self.locked(|st, deferred| {
            let now = Instant::now();
            st.release(class, units, admitted, now, fair);
            if sample.is_some() {
                self.observe(st, sample, deferred);
            }
            self.dispatch(st, now, deferred);
        });
    }

    /// Removes a waiter of `tenant` by sequence number; `Some` if it was still queued.
    fn remove_waiter(
        self: &Arc<Self>,
        class: usize,
        tenant: usize,
        seq: u64,
        timed_out: bool,
    ) -> Option<Rejection> {
        self.locked(|st, deferred| {
            let w = st.queue.remove(class, tenant, seq)?;
            let reason = OverloadReason::QueueTimeout;
            if timed_out {
                st.queue.classes[class].metrics.rejected(reason);
            }
            let now = Instant::now();
            let retry_after = self.retry_after(st, class, now, w.units);
            // The removed waiter may have blocked the head of the line.
            self.dispatch(st, now, deferred);
            Some(Rejection {
                reason,
                retry_after,
                units: w.units,
            })
        })
    }

    /// The virtual counter of tenant `id` (`None`: the anonymous tenant), if the gate knows it.
    pub(crate) fn tenant_counter(&self, id: Option<&str>) -> Option<f64> {
        self.lock().queue.tenants.counter_of(id)
    }

    /// Tenants the gate keeps a counter for.
    pub(crate) fn tenants_known(&self) -> usize {
        self.lock().queue.tenants.known()
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let st = self.lock();
        Snapshot {
            limit: st.limit,
            baseline: st.adaptive.as_ref().and_then(Controller::baseline),
            in_use: st.in_use,
            in_flight: st.in_flight,
            queued: st.queue.len(),
            classes: st
                .queue
                .classes
                .iter()
                .map(|c| (c.priority.clone(), c.in_flight, c.waiters.len(), c.in_use))
                .collect(),
        }
    }
}

/// A consistent view of a gate at one moment.
pub(crate) struct Snapshot {
    pub(crate) limit: u32,
    pub(crate) baseline: Option<Duration>,
    pub(crate) in_use: u32,
    pub(crate) in_flight: usize,
    pub(crate) queued: usize,
    /// Per class: priority, requests in flight, requests queued, units in use.
    pub(crate) classes: Vec<(Priority, usize, usize, u32)>,
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;
    use crate::BoundedAdmissionLayer;

    /// Waits for a queued request's outcome on a plain thread, failing if it never comes.
    fn wait_for(mut q: Queued) -> Grant {
        let mut spins = 0u64;
        loop {
            match q.rx.try_recv() {
                Ok(grant) => {
                    q.guard.disarm();
                    return grant;
                }
                Err(_) => {
                    spins += 1;
                    assert!(spins < 20_000_000, "a waiter was never admitted");
                    std::thread::yield_now();
                }
            }
        }
    }

    /// Real threads racing admissions of two classes, queueing and releases through the lock:
    /// capacity is never exceeded, every waiter is admitted (no wakeup lost between a release
    /// and an arrival that queues), and the gate ends empty.
    #[test]
    fn threads_racing_admission_and_release_lose_no_waiter() {
        const CAPACITY: usize = 3;
        let g = BoundedAdmissionLayer::new(CAPACITY as u32)
            .with_queue_len(1_000)
            .with_codel(None)
            .handle()
            .shared;
        let held = Arc::new(AtomicUsize::new(0));
        let queued = Arc::new(AtomicUsize::new(0));
        let batch = Priority::batch();
        let threads: Vec<_> = (0..4)
            .map(|t| {
                let (g, held, queued, batch) =
                    (g.clone(), held.clone(), queued.clone(), batch.clone());
                std::thread::spawn(move || {
                    for i in 0..5_000 {
                        let p = (i % 7 == t).then_some(&batch);
                        let permit = match g.acquire(p, None, 1, None, None) {
                            Acquire::Admitted(permit) => permit,
                            Acquire::Queued(q) => {
                                queued.fetch_add(1, Ordering::Relaxed);
                                wait_for(q).expect("nobody is evicted or expired").0
                            }
                            Acquire::Rejected(r) => panic!("refused: {r:?}"),
                        };
                        let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(now <= CAPACITY, "{now} permits held at once");
                        if (i / 64) % 2 == 0 {
                            // Busy: hold the permit a little, the queue builds up.
                            std::thread::yield_now();
                        }
                        held.fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                        if (i / 64) % 2 == 1 {
                            // Idle a little: the queue drains, arrivals are admitted at once.
                            std::thread::yield_now();
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        let queued = queued.load(Ordering::Relaxed);
        eprintln!("{queued} of 20000 requests queued");
        let s = g.snapshot();
        assert_eq!((s.in_use, s.in_flight, s.queued), (0, 0, 0));
        assert!(s.classes.iter().all(|c| (c.1, c.2, c.3) == (0, 0, 0)));
    }
}
