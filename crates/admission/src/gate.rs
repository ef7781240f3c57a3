//! The shared state of one admission gate: capacity accounting, the wait queue, dispatch.
//!
//! Everything lives behind one `std::sync::Mutex` with short critical sections. Waiters are
//! woken through a `tokio::sync::oneshot` whose value is sent *while the lock is held*, so a
//! waiter that does not find its own entry in the queue knows the outcome is already in its
//! channel (no lost wakeups). A [`Permit`] is never dropped under the lock: a send that fails
//! hands the value back, and it is dropped after the lock is released.

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use metrics::{Counter, Gauge, Histogram};
use tailguard_core::{OverloadReason, Priority};
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::layer::Config;

/// Time constant of the drain-rate estimate behind `Retry-After`.
const DRAIN_WINDOW: Duration = Duration::from_secs(5);
/// Upper bound of an estimated `Retry-After`.
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);
/// Effective-level gain per aging period: one step of the standard class set.
const AGING_STEP: u128 = 10;

/// What a waiter receives: admission (a permit) or a rejection.
/// The permit comes with the time the waiter spent queued, measured by the gate.
pub(crate) type Grant = Result<(Permit, Duration), Rejection>;

/// A refusal decided by the gate.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rejection {
    pub(crate) reason: OverloadReason,
    pub(crate) retry_after: Duration,
}

/// Capacity held by one admitted request; releases it when dropped.
pub(crate) struct Permit {
    shared: Arc<Shared>,
    class: u32,
    units: u32,
}

impl Permit {
    pub(crate) fn units(&self) -> u32 {
        self.units
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
    #[inline]
    fn drop(&mut self) {
        self.shared.release(self.class as usize, self.units);
    }
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

/// Removes the waiter from the queue when dropped while still armed (the caller went away).
pub(crate) struct WaitGuard {
    shared: Arc<Shared>,
    class: usize,
    seq: u64,
    armed: bool,
}

impl WaitGuard {
    /// The outcome was received: nothing to remove.
    pub(crate) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Removes the entry because its deadline passed. `Some` with the rejection when the entry
    /// was still queued; `None` when the gate already decided (the outcome is in the channel).
    pub(crate) fn expire(&mut self) -> Option<Rejection> {
        let removed = self.shared.remove_waiter(self.class, self.seq, true);
        if removed.is_some() {
            self.armed = false;
        }
        removed
    }
}

impl Drop for WaitGuard {
    fn drop(&mut self) {
        if self.armed {
            self.shared.remove_waiter(self.class, self.seq, false);
        }
    }
}

struct Waiter {
    seq: u64,
    units: u32,
    enqueued: Instant,
    tx: oneshot::Sender<Grant>,
}

struct ClassMetrics {
    in_flight: Gauge,
    queued: Gauge,
    admitted_immediate: Counter,
    admitted_queued: Counter,
    rejected: [Counter; 4],
    queue_wait: Histogram,
}

impl ClassMetrics {
    fn new(name: &str) -> Self {
        let p = name.to_owned();
        let rejected = |reason: OverloadReason| {
            metrics::counter!(
                "tailguard_admission_rejected_total",
                "priority" => p.clone(),
                "reason" => reason.as_str()
            )
        };
        ClassMetrics {
            in_flight: metrics::gauge!("tailguard_admission_in_flight", "priority" => p.clone()),
            queued: metrics::gauge!("tailguard_admission_queued", "priority" => p.clone()),
            admitted_immediate: metrics::counter!(
                "tailguard_admission_admitted_total",
                "priority" => p.clone(),
                "path" => "immediate"
            ),
            admitted_queued: metrics::counter!(
                "tailguard_admission_admitted_total",
                "priority" => p.clone(),
                "path" => "queued"
            ),
            rejected: [
                rejected(OverloadReason::QueueFull),
                rejected(OverloadReason::QueueTimeout),
                rejected(OverloadReason::Evicted),
                rejected(OverloadReason::TooCostly),
            ],
            queue_wait: metrics::histogram!(
                "tailguard_admission_queue_wait_seconds",
                "priority" => p.clone()
            ),
        }
    }

    fn rejected(&self, reason: OverloadReason) -> &Counter {
        match reason {
            OverloadReason::QueueFull => &self.rejected[0],
            OverloadReason::QueueTimeout => &self.rejected[1],
            OverloadReason::Evicted => &self.rejected[2],
            _ => &self.rejected[3],
        }
    }
}

struct Class {
    priority: Priority,
    in_use: u32,
    in_flight: usize,
    reserved: u32,
    waiters: VecDeque<Waiter>,
    metrics: ClassMetrics,
}

/// Exponentially decayed count of released units, for the drain-rate estimate.
///
/// An uncontended release only adds to `pending` (no clock read); the pending units are folded
/// in, spread evenly over the time since the last fold, whenever the gate has the time anyway
/// (a contended release, a queued arrival, a refusal).
struct Drain {
    decayed: f64,
    pending: u64,
    last: Instant,
}

impl Drain {
    fn fold(&mut self, now: Instant) {
        let tau = DRAIN_WINDOW.as_secs_f64();
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        let k = (-dt / tau).exp();
        let pending = self.pending as f64;
        // The exact decayed sum of `pending` units released at a uniform rate over `dt`.
        let spread = if dt > 1e-9 {
            pending * tau / dt * (1.0 - k)
        } else {
            pending
        };
        self.decayed = self.decayed * k + spread;
        self.pending = 0;
        self.last = now;
    }

    /// Units per second, bias-corrected for a gate younger than the window.
    fn rate(&mut self, now: Instant, created: Instant) -> Option<f64> {
        self.fold(now);
        if self.decayed <= 0.0 {
            return None;
        }
        let tau = DRAIN_WINDOW.as_secs_f64();
        let age = now
            .saturating_duration_since(created)
            .as_secs_f64()
            .max(0.001);
        let rate = self.decayed / (tau * (1.0 - (-age / tau).exp()));
        (rate.is_finite() && rate > 0.0).then_some(rate)
    }
}

struct State {
    in_use: u32,
    in_flight: usize,
    queued: usize,
    queued_units: u64,
    /// When the queue last went from empty to non-empty (`None` while empty).
    nonempty_since: Option<Instant>,
    next_seq: u64,
    classes: Vec<Class>,
    drain: Drain,
}

/// One gate: configuration plus the locked state.
pub(crate) struct Shared {
    cfg: Config,
    max_units: u32,
    created: Instant,
    state: Mutex<State>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let st = self.lock();
        f.debug_struct("Gate")
            .field("capacity", &self.cfg.capacity)
            .field("in_use", &st.in_use)
            .field("in_flight", &st.in_flight)
            .field("queued", &st.queued)
            .finish()
    }
}

/// Order of queue candidates, greatest first: below its reserved share, effective level, age.
type OrderKey = (bool, u128, Reverse<u64>);

/// Failed sends whose values must be dropped after the lock is released.
type Deferred = Vec<Grant>;

impl Shared {
    pub(crate) fn new(cfg: Config) -> Arc<Self> {
        let now = Instant::now();
        Arc::new(Shared {
            max_units: cfg.max_units(),
            cfg,
            created: now,
            state: Mutex::new(State {
                in_use: 0,
                in_flight: 0,
                queued: 0,
                queued_units: 0,
                nonempty_since: None,
                next_seq: 0,
                classes: Vec::new(),
                drain: Drain {
                    decayed: 0.0,
                    pending: 0,
                    last: now,
                },
            }),
        })
    }

    pub(crate) fn config(&self) -> &Config {
        &self.cfg
    }

    #[inline]
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The number of units a request of raw cost `cost` holds.
    #[inline]
    pub(crate) fn units_for(&self, cost: u32) -> u32 {
        cost.clamp(1, self.max_units)
    }

    /// Decides on an arriving request.
    #[inline]
    pub(crate) fn acquire(
        self: &Arc<Self>,
        priority: Option<&Priority>,
        share: Option<f64>,
        units: u32,
    ) -> Acquire {
        let mut st = self.lock();
        let class = self.class_index(&mut st, priority, share);
        if st.queued == 0 && st.in_use + units <= self.cfg.capacity {
            st.in_use += units;
            st.in_flight += 1;
            let c = &mut st.classes[class];
            c.in_use += units;
            c.in_flight += 1;
            c.metrics.in_flight.increment(1.0);
            c.metrics.admitted_immediate.increment(1);
            c.metrics.queue_wait.record(0.0);
            drop(st);
            return Acquire::Admitted(Permit {
                shared: self.clone(),
                class: class as u32,
                units,
            });
        }
        self.acquire_slow(st, class, units)
    }

    /// The arrival does not fit at once: queue it (or refuse it).
    #[inline(never)]
    fn acquire_slow(
        self: &Arc<Self>,
        st: MutexGuard<'_, State>,
        class: usize,
        units: u32,
    ) -> Acquire {
        let mut deferred = Deferred::new();
        let out = {
            // Declared after `deferred`, so the lock is released before `deferred` is dropped.
            let mut st = st;
            let now = Instant::now();
            if self.cfg.queue_len == 0 {
                return Acquire::Rejected(self.refuse_full(&mut st, class, now, units));
            }
            let allowed = if self.standing(&st, now) {
                self.cfg.codel.map_or(self.cfg.queue_timeout, |c| {
                    c.target.min(self.cfg.queue_timeout)
                })
            } else {
                self.cfg.queue_timeout
            };
            if st.queued == 0 {
                st.nonempty_since = Some(now);
            }
            let seq = st.next_seq;
            st.next_seq += 1;
            let (tx, rx) = oneshot::channel();
            st.queued += 1;
            st.queued_units += u64::from(units);
            let c = &mut st.classes[class];
            c.waiters.push_back(Waiter {
                seq,
                units,
                enqueued: now,
                tx,
            });
            c.metrics.queued.increment(1.0);
            // The arrival is queued first so that it competes in order: if it is admitted at
            // once (it outranks every waiter and fits), nobody is evicted.
            self.dispatch(&mut st, now, &mut deferred);
            if st.queued > self.cfg.queue_len {
                let level = st.classes[class].priority.level();
                let victim = st
                    .classes
                    .iter()
                    .enumerate()
                    .filter(|(_, c)| !c.waiters.is_empty() && c.priority.level() < level)
                    .min_by_key(|(_, c)| c.priority.level())
                    .map(|(i, _)| i);
                match victim {
                    Some(v) => {
                        let w = st.classes[v].waiters.pop_back().expect("non-empty class");
                        self.unqueue(&mut st, v, w.units);
                        let retry_after = self.retry_after(&mut st, now, w.units);
                        st.classes[v]
                            .metrics
                            .rejected(OverloadReason::Evicted)
                            .increment(1);
                        let r = Rejection {
                            reason: OverloadReason::Evicted,
                            retry_after,
                        };
                        if let Err(g) = w.tx.send(Err(r)) {
                            deferred.push(g);
                        }
                        // The evicted waiter may have been the one blocking the line.
                        self.dispatch(&mut st, now, &mut deferred);
                    }
                    None => {
                        // Nobody to evict: the arrival (the youngest of its class) goes again.
                        let w = st.classes[class].waiters.pop_back().expect("the arrival");
                        debug_assert_eq!(w.seq, seq);
                        self.unqueue(&mut st, class, w.units);
                        return Acquire::Rejected(self.refuse_full(&mut st, class, now, units));
                    }
                }
            }
            Acquire::Queued(Queued {
                rx,
                guard: WaitGuard {
                    shared: self.clone(),
                    class,
                    seq,
                    armed: true,
                },
                deadline: now + allowed,
                enqueued: now,
            })
        };
        drop(deferred);
        out
    }

    fn refuse_full(&self, st: &mut State, class: usize, now: Instant, units: u32) -> Rejection {
        st.classes[class]
            .metrics
            .rejected(OverloadReason::QueueFull)
            .increment(1);
        Rejection {
            reason: OverloadReason::QueueFull,
            retry_after: self.retry_after(st, now, units),
        }
    }

    #[inline]
    fn class_index(
        &self,
        st: &mut State,
        priority: Option<&Priority>,
        share: Option<f64>,
    ) -> usize {
        let p = priority.unwrap_or(&self.cfg.default_priority);
        let i = match st
            .classes
            .iter()
            .position(|c| c.priority.level() == p.level())
        {
            Some(i) => i,
            None => self.new_class(st, p),
        };
        if let Some(s) = share {
            st.classes[i].reserved = self.cfg.reserved_units(s);
        }
        i
    }

    /// The first request of a class: its state and metric handles.
    #[cold]
    #[inline(never)]
    fn new_class(&self, st: &mut State, p: &Priority) -> usize {
        let configured = self
            .cfg
            .reserved
            .iter()
            .find(|(q, _)| q.level() == p.level())
            .map(|(_, s)| *s);
        st.classes.push(Class {
            priority: p.clone(),
            in_use: 0,
            in_flight: 0,
            reserved: self.cfg.reserved_units(configured.unwrap_or(0.0)),
            waiters: VecDeque::new(),
            metrics: ClassMetrics::new(p.name()),
        });
        st.classes.len() - 1
    }

    fn standing(&self, st: &State, now: Instant) -> bool {
        match (self.cfg.codel, st.nonempty_since) {
            (Some(c), Some(since)) => now.saturating_duration_since(since) >= c.interval,
            _ => false,
        }
    }

    /// Bookkeeping after a waiter left the queue (admitted or not).
    fn unqueue(&self, st: &mut State, class: usize, units: u32) {
        st.queued -= 1;
        st.queued_units -= u64::from(units);
        if st.queued == 0 {
            st.nonempty_since = None;
        }
        st.classes[class].metrics.queued.decrement(1.0);
    }

    fn retry_after(&self, st: &mut State, now: Instant, units: u32) -> Duration {
        let backlog = st.queued_units as f64 + f64::from(units);
        let est = match st.drain.rate(now, self.created) {
            Some(rate) => Duration::try_from_secs_f64(backlog / rate).unwrap_or(MAX_RETRY_AFTER),
            None => self.cfg.queue_timeout,
        };
        est.min(MAX_RETRY_AFTER)
    }

    /// Effective level of a waiter for ordering: the class level, raised with age.
    fn effective(&self, level: u8, waited: Duration) -> u128 {
        match self.cfg.aging {
            Some(a) => u128::from(level) * a.as_nanos() + AGING_STEP * waited.as_nanos(),
            None => u128::from(level),
        }
    }

    fn aged(&self, waited: Duration) -> bool {
        self.cfg.aging.is_some_and(|a| waited >= a)
    }

    /// Admits waiters in order while the best one fits.
    fn dispatch(self: &Arc<Self>, st: &mut State, now: Instant, deferred: &mut Deferred) {
        while st.queued > 0 {
            let lifo = self.cfg.lifo && self.standing(st, now);
            let mut best: Option<(usize, bool, OrderKey)> = None;
            for (i, c) in st.classes.iter().enumerate() {
                let Some(front) = c.waiters.front() else {
                    continue;
                };
                let back = lifo && !self.aged(now.saturating_duration_since(front.enqueued));
                let w = if back {
                    c.waiters.back().expect("non-empty")
                } else {
                    front
                };
                let key = (
                    c.in_use < c.reserved,
                    self.effective(
                        c.priority.level(),
                        now.saturating_duration_since(w.enqueued),
                    ),
                    Reverse(w.seq),
                );
                if best.as_ref().is_none_or(|(_, _, k)| key > *k) {
                    best = Some((i, back, key));
                }
            }
            let Some((i, back, _)) = best else {
                break;
            };
            let c = &st.classes[i];
            let units = if back {
                c.waiters.back()
            } else {
                c.waiters.front()
            }
            .expect("non-empty")
            .units;
            if st.in_use + units > self.cfg.capacity {
                break;
            }
            let c = &mut st.classes[i];
            let w = if back {
                c.waiters.pop_back()
            } else {
                c.waiters.pop_front()
            }
            .expect("non-empty");
            c.in_use += units;
            c.in_flight += 1;
            c.metrics.in_flight.increment(1.0);
            c.metrics.admitted_queued.increment(1);
            let waited = now.saturating_duration_since(w.enqueued);
            c.metrics.queue_wait.record(waited.as_secs_f64());
            st.in_use += units;
            st.in_flight += 1;
            self.unqueue(st, i, units);
            let permit = Permit {
                shared: self.clone(),
                class: i as u32,
                units,
            };
            if let Err(g) = w.tx.send(Ok((permit, waited))) {
                deferred.push(g);
            }
        }
    }

    #[inline]
    fn release(self: &Arc<Self>, class: usize, units: u32) {
        let mut st = self.lock();
        st.in_use -= units;
        st.in_flight -= 1;
        let c = &mut st.classes[class];
        c.in_use -= units;
        c.in_flight -= 1;
        c.metrics.in_flight.decrement(1.0);
        st.drain.pending += u64::from(units);
        if st.queued > 0 {
            self.release_slow(st);
        }
    }

    /// Capacity came free while requests wait: admit them.
    #[inline(never)]
    fn release_slow(self: &Arc<Self>, st: MutexGuard<'_, State>) {
        let mut deferred = Deferred::new();
        {
            let mut st = st;
            let now = Instant::now();
            st.drain.fold(now);
            self.dispatch(&mut st, now, &mut deferred);
        }
        drop(deferred);
    }

    /// Removes a waiter by sequence number; `Some` if it was still queued.
    fn remove_waiter(
        self: &Arc<Self>,
        class: usize,
        seq: u64,
        timed_out: bool,
    ) -> Option<Rejection> {
        let mut deferred = Deferred::new();
        let out = {
            let mut st = self.lock();
            let c = &mut st.classes[class];
            let pos = c.waiters.binary_search_by_key(&seq, |w| w.seq).ok()?;
            let w = c.waiters.remove(pos).expect("found");
            if timed_out {
                c.metrics
                    .rejected(OverloadReason::QueueTimeout)
                    .increment(1);
            }
            self.unqueue(&mut st, class, w.units);
            let now = Instant::now();
            let retry_after = self.retry_after(&mut st, now, w.units);
            // The removed waiter may have blocked the head of the line.
            self.dispatch(&mut st, now, &mut deferred);
            Rejection {
                reason: OverloadReason::QueueTimeout,
                retry_after,
            }
        };
        drop(deferred);
        Some(out)
    }

    pub(crate) fn snapshot(&self) -> Snapshot {
        let st = self.lock();
        Snapshot {
            in_use: st.in_use,
            in_flight: st.in_flight,
            queued: st.queued,
            classes: st
                .classes
                .iter()
                .map(|c| (c.priority.clone(), c.in_flight, c.waiters.len(), c.in_use))
                .collect(),
        }
    }
}

/// A consistent view of a gate at one moment.
pub(crate) struct Snapshot {
    pub(crate) in_use: u32,
    pub(crate) in_flight: usize,
    pub(crate) queued: usize,
    pub(crate) classes: Vec<(Priority, usize, usize, u32)>,
}
