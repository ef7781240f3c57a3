//! The shared state of one admission gate: capacity accounting, the wait queue, dispatch.
//!
//! The units in use, a "queue not empty" flag and a count of released units share one atomic
//! word; everything else (the queue, the classes) lives behind one `std::sync::Mutex` with short
//! critical sections.
//!
//! In a gate with the unit cost function, a request of the default class is admitted and
//! released without the lock: one compare-and-swap on the word when it arrives (refused while
//! the queue flag is set or the gate is full, then it takes the locked path), one `fetch_add`
//! when its body ends (the lock only if the flag is set, to admit waiters). The default class is
//! then *implicit*: its units in use are the word's minus those of every other class, which
//! change only under the lock, so a reader holding the lock computes them exactly. Everything
//! else (other classes, a reserved share in the request, cost functions, queueing) takes the
//! lock, and changes the word under it. The flag is set and cleared only under the lock, and a
//! release that sees it takes the lock and dispatches, so no waiter is left behind by a
//! concurrent release.
//!
//! Waiters are woken through a `tokio::sync::oneshot` whose value is sent *while the lock is
//! held*, so a waiter that does not find its own entry in the queue knows the outcome is already
//! in its channel (no lost wakeups). A [`Permit`] is never dropped under the lock: a send that
//! fails hands the value back, and it is dropped after the lock is released.

use std::cmp::Reverse;
use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
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

/// The gate word: units in use (bits 0..32).
const IN_USE: u64 = 0xFFFF_FFFF;
/// The gate word: the queue is not empty (set and cleared under the lock only).
const QUEUED: u64 = 1 << 32;
/// The gate word: released units, wrapping (bits 33..64).
const RELEASED_SHIFT: u32 = 33;
/// Mask of the released-units count once shifted down.
const RELEASED_MASK: u64 = (1 << (64 - RELEASED_SHIFT)) - 1;
/// A bit of the released-units count that flips every 2^29 units: a release that flips it folds
/// the drain estimate, so the wrapping count never laps between two folds.
const RELEASED_FOLD: u64 = 1 << 62;
/// `Permit::class` of the implicit (default) class.
const IMPLICIT: u32 = u32::MAX;

fn in_use_of(w: u64) -> u32 {
    (w & IN_USE) as u32
}

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
        if self.class == IMPLICIT {
            self.shared.release_implicit(self.units);
        } else {
            self.shared.release(self.class as usize, self.units);
        }
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
    /// When it was queued, in nanoseconds since the gate was created (cheap arithmetic for the
    /// ordering in `dispatch`).
    at: u64,
    tx: oneshot::Sender<Grant>,
}

#[derive(Clone)]
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
    /// Units and requests in flight (always 0 for the implicit class, whose counts are derived
    /// from the gate word: see [`Shared::implicit_in_use`]).
    in_use: u32,
    in_flight: usize,
    reserved: u32,
    waiters: VecDeque<Waiter>,
    metrics: ClassMetrics,
}

/// Exponentially decayed count of released units, for the drain-rate estimate.
///
/// An uncontended release only adds to the released count in the gate word (no clock read);
/// the units released since the last fold are folded in, spread evenly over the time since
/// then, whenever the gate has the time anyway (a contended release, a queued arrival, a
/// refusal).
struct Drain {
    decayed: f64,
    /// The gate word's released count at the last fold.
    seen: u64,
    last: Instant,
}

impl Drain {
    /// Folds in the units released since the last fold; `word` is the gate word now.
    fn fold(&mut self, now: Instant, word: u64) {
        let released = word >> RELEASED_SHIFT;
        let pending = released.wrapping_sub(self.seen) & RELEASED_MASK;
        self.seen = released;
        let tau = DRAIN_WINDOW.as_secs_f64();
        let dt = now.saturating_duration_since(self.last).as_secs_f64();
        let k = (-dt / tau).exp();
        let pending = pending as f64;
        // The exact decayed sum of `pending` units released at a uniform rate over `dt`.
        let spread = if dt > 1e-9 {
            pending * tau / dt * (1.0 - k)
        } else {
            pending
        };
        self.decayed = self.decayed * k + spread;
        self.last = now;
    }

    /// Units per second, bias-corrected for a gate younger than the window.
    fn rate(&mut self, now: Instant, word: u64, created: Instant) -> Option<f64> {
        self.fold(now, word);
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
    /// Units and requests in flight of the explicit classes (all but the implicit one).
    explicit_in_use: u32,
    explicit_in_flight: usize,
    queued: usize,
    queued_units: u64,
    /// When the queue last went from empty to non-empty (`None` while empty).
    nonempty_since: Option<Instant>,
    next_seq: u64,
    classes: Vec<Class>,
    drain: Drain,
}

/// The implicit class, once its first request created it.
struct Implicit {
    index: usize,
    metrics: ClassMetrics,
}

/// One gate: configuration, the gate word and the locked state.
pub(crate) struct Shared {
    cfg: Config,
    max_units: u32,
    created: Instant,
    /// Units in use, the queue flag and the released count (see the module docs).
    word: AtomicU64,
    /// The level of the implicit class: the default class when the cost function is the unit.
    implicit_level: Option<u8>,
    implicit: OnceLock<Implicit>,
    state: Mutex<State>,
}

impl fmt::Debug for Shared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.snapshot();
        f.debug_struct("Gate")
            .field("capacity", &self.cfg.capacity)
            .field("in_use", &s.in_use)
            .field("in_flight", &s.in_flight)
            .field("queued", &s.queued)
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
            implicit_level: cfg.cost.is_unit().then(|| cfg.default_priority.level()),
            cfg,
            created: now,
            word: AtomicU64::new(0),
            implicit: OnceLock::new(),
            state: Mutex::new(State {
                explicit_in_use: 0,
                explicit_in_flight: 0,
                queued: 0,
                queued_units: 0,
                nonempty_since: None,
                next_seq: 0,
                classes: Vec::new(),
                drain: Drain {
                    decayed: 0.0,
                    seen: 0,
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

    /// Takes `units` if they fit, whatever the queue flag says (the caller decided that the
    /// request may go ahead of the queue, or there is none).
    fn try_take(&self, units: u32) -> bool {
        let mut w = self.word.load(Ordering::Relaxed);
        loop {
            if u64::from(in_use_of(w)) + u64::from(units) > u64::from(self.cfg.capacity) {
                return false;
            }
            match self.word.compare_exchange_weak(
                w,
                w + u64::from(units),
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => w = now,
            }
        }
    }

    /// Gives back `units`, counting them as released; the word before.
    #[inline]
    fn give_back(&self, units: u32) -> u64 {
        let u = u64::from(units);
        self.word
            .fetch_add((u << RELEASED_SHIFT).wrapping_sub(u), Ordering::AcqRel)
    }

    /// Units in use of the implicit class, computed under the lock.
    fn implicit_in_use(&self, st: &State) -> u32 {
        in_use_of(self.word.load(Ordering::Acquire)).saturating_sub(st.explicit_in_use)
    }

    fn is_implicit(&self, i: usize) -> bool {
        self.implicit.get().is_some_and(|c| c.index == i)
    }

    /// Decides on an arriving request.
    #[inline]
    pub(crate) fn acquire(
        self: &Arc<Self>,
        priority: Option<&Priority>,
        share: Option<f64>,
        units: u32,
    ) -> Acquire {
        if share.is_none()
            && let Some(level) = self.implicit_level
            && priority.is_none_or(|p| p.level() == level)
            && let Some(c) = self.implicit.get()
        {
            // The lock-free path: the default class of a unit-cost gate, nobody queued.
            let mut w = self.word.load(Ordering::Relaxed);
            while w & QUEUED == 0
                && u64::from(in_use_of(w)) + u64::from(units) <= u64::from(self.cfg.capacity)
            {
                match self.word.compare_exchange_weak(
                    w,
                    w + u64::from(units),
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        c.metrics.in_flight.increment(1.0);
                        c.metrics.admitted_immediate.increment(1);
                        c.metrics.queue_wait.record(0.0);
                        return Acquire::Admitted(Permit {
                            shared: self.clone(),
                            class: IMPLICIT,
                            units,
                        });
                    }
                    Err(now) => w = now,
                }
            }
        }
        self.acquire_locked(priority, share, units)
    }

    /// The arrival takes the lock: another class, a reserved share, a cost function, the
    /// gate full or requests queued.
    #[inline(never)]
    fn acquire_locked(
        self: &Arc<Self>,
        priority: Option<&Priority>,
        share: Option<f64>,
        units: u32,
    ) -> Acquire {
        let mut st = self.lock();
        let class = self.class_index(&mut st, priority, share);
        if st.queued == 0 && self.try_take(units) {
            let permit_class = self.admitted(&mut st, class, units);
            let c = &st.classes[class];
            c.metrics.admitted_immediate.increment(1);
            c.metrics.queue_wait.record(0.0);
            drop(st);
            return Acquire::Admitted(Permit {
                shared: self.clone(),
                class: permit_class,
                units,
            });
        }
        self.acquire_slow(st, class, units)
    }

    /// Bookkeeping of an admission under the lock (the units are taken); the permit's class.
    fn admitted(&self, st: &mut State, class: usize, units: u32) -> u32 {
        let implicit = self.is_implicit(class);
        if !implicit {
            st.explicit_in_use += units;
            st.explicit_in_flight += 1;
        }
        let c = &mut st.classes[class];
        if !implicit {
            c.in_use += units;
            c.in_flight += 1;
        }
        c.metrics.in_flight.increment(1.0);
        if implicit { IMPLICIT } else { class as u32 }
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
                // Set before `dispatch` reads the units in use: a release that did not see the
                // flag is counted in that read, one that sees it takes the lock and dispatches.
                self.word.fetch_or(QUEUED, Ordering::AcqRel);
            }
            let seq = st.next_seq;
            st.next_seq += 1;
            let (tx, rx) = oneshot::channel();
            st.queued += 1;
            st.queued_units += u64::from(units);
            let at = self.nanos(now);
            let c = &mut st.classes[class];
            c.waiters.push_back(Waiter { seq, units, at, tx });
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
        let metrics = ClassMetrics::new(p.name());
        let index = st.classes.len();
        if self.implicit_level == Some(p.level()) {
            // Created under the lock, once: the lock-free path opens from here on.
            let _ = self.implicit.set(Implicit {
                index,
                metrics: metrics.clone(),
            });
        }
        st.classes.push(Class {
            priority: p.clone(),
            in_use: 0,
            in_flight: 0,
            reserved: self.cfg.reserved_units(configured.unwrap_or(0.0)),
            waiters: VecDeque::new(),
            metrics,
        });
        index
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
            self.word.fetch_and(!QUEUED, Ordering::AcqRel);
        }
        st.classes[class].metrics.queued.decrement(1.0);
    }

    fn retry_after(&self, st: &mut State, now: Instant, units: u32) -> Duration {
        let backlog = st.queued_units as f64 + f64::from(units);
        let word = self.word.load(Ordering::Acquire);
        let est = match st.drain.rate(now, word, self.created) {
            Some(rate) => Duration::try_from_secs_f64(backlog / rate).unwrap_or(MAX_RETRY_AFTER),
            None => self.cfg.queue_timeout,
        };
        est.min(MAX_RETRY_AFTER)
    }

    /// `t` in nanoseconds since the gate was created.
    fn nanos(&self, t: Instant) -> u64 {
        u64::try_from(t.saturating_duration_since(self.created).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Effective level of a waiter for ordering: the class level, raised with age (the wait in
    /// nanoseconds).
    fn effective(&self, level: u8, waited: u64) -> u128 {
        match self.cfg.aging {
            Some(a) => u128::from(level) * a.as_nanos() + AGING_STEP * u128::from(waited),
            None => u128::from(level),
        }
    }

    fn aged(&self, waited: u64) -> bool {
        self.cfg
            .aging
            .is_some_and(|a| u128::from(waited) >= a.as_nanos())
    }

    /// Admits waiters in order while the best one fits.
    fn dispatch(self: &Arc<Self>, st: &mut State, now: Instant, deferred: &mut Deferred) {
        let implicit = self.implicit.get().map(|c| c.index);
        let now_ns = self.nanos(now);
        while st.queued > 0 {
            let lifo = self.cfg.lifo && self.standing(st, now);
            let implicit_in_use = match implicit {
                Some(_) => self.implicit_in_use(st),
                None => 0,
            };
            let mut best: Option<(usize, bool, OrderKey)> = None;
            for (i, c) in st.classes.iter().enumerate() {
                let Some(front) = c.waiters.front() else {
                    continue;
                };
                let back = lifo && !self.aged(now_ns.saturating_sub(front.at));
                let w = if back {
                    c.waiters.back().expect("non-empty")
                } else {
                    front
                };
                let in_use = if implicit == Some(i) {
                    implicit_in_use
                } else {
                    c.in_use
                };
                let key = (
                    in_use < c.reserved,
                    self.effective(c.priority.level(), now_ns.saturating_sub(w.at)),
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
            if !self.try_take(units) {
                break;
            }
            let c = &mut st.classes[i];
            let w = if back {
                c.waiters.pop_back()
            } else {
                c.waiters.pop_front()
            }
            .expect("non-empty");
            c.metrics.admitted_queued.increment(1);
            // Exact: both instants are whole nanoseconds past the gate's creation.
            let waited = Duration::from_nanos(now_ns.saturating_sub(w.at));
            c.metrics.queue_wait.record(waited.as_secs_f64());
            let permit_class = self.admitted(st, i, units);
            self.unqueue(st, i, units);
            let permit = Permit {
                shared: self.clone(),
                class: permit_class,
                units,
            };
            if let Err(g) = w.tx.send(Ok((permit, waited))) {
                deferred.push(g);
            }
        }
    }

    /// Release of a permit of the implicit class: no lock unless requests wait.
    #[inline]
    fn release_implicit(self: &Arc<Self>, units: u32) {
        if let Some(c) = self.implicit.get() {
            c.metrics.in_flight.decrement(1.0);
        }
        let before = self.give_back(units);
        let after = before
            .wrapping_add((u64::from(units) << RELEASED_SHIFT).wrapping_sub(u64::from(units)));
        if before & QUEUED != 0 || (before ^ after) & RELEASED_FOLD != 0 {
            self.release_slow(self.lock());
        }
    }

    /// Release of a permit of an explicit class (under the lock).
    #[inline(never)]
    fn release(self: &Arc<Self>, class: usize, units: u32) {
        let mut st = self.lock();
        st.explicit_in_use -= units;
        st.explicit_in_flight -= 1;
        let c = &mut st.classes[class];
        c.in_use -= units;
        c.in_flight -= 1;
        c.metrics.in_flight.decrement(1.0);
        let before = self.give_back(units);
        if before & QUEUED != 0 {
            self.release_slow(st);
        }
    }

    /// Capacity came free while requests wait (or the released count needs folding): fold the
    /// drain estimate, admit waiters.
    #[inline(never)]
    fn release_slow(self: &Arc<Self>, st: MutexGuard<'_, State>) {
        let mut deferred = Deferred::new();
        {
            let mut st = st;
            let now = Instant::now();
            st.drain.fold(now, self.word.load(Ordering::Acquire));
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
        let in_use = in_use_of(self.word.load(Ordering::Acquire));
        // The implicit class has the unit cost: one unit per request.
        let implicit = in_use.saturating_sub(st.explicit_in_use);
        Snapshot {
            in_use,
            in_flight: st.explicit_in_flight + implicit as usize,
            queued: st.queued,
            classes: st
                .classes
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let (in_flight, in_use) = if self.is_implicit(i) {
                        (implicit as usize, implicit)
                    } else {
                        (c.in_flight, c.in_use)
                    };
                    (c.priority.clone(), in_flight, c.waiters.len(), in_use)
                })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{BoundedAdmissionLayer, Cost};

    /// What one gate answered, comparable across gates.
    #[derive(Debug, PartialEq)]
    enum Seen {
        Admitted,
        Queued,
        Rejected(OverloadReason, Duration),
        Granted(Duration),
        Expired(Option<Duration>),
        Pending,
    }

    type View = (u32, usize, usize, Vec<(u8, usize, usize, u32)>);

    fn view(g: &Shared) -> View {
        let s = g.snapshot();
        let classes = s
            .classes
            .iter()
            .map(|(p, f, q, u)| (p.level(), *f, *q, *u))
            .collect();
        (s.in_use, s.in_flight, s.queued, classes)
    }

    /// The default class of a unit-cost gate is admitted and released without the lock once
    /// its first request created it; other classes and a reserved share take the lock.
    #[tokio::test(start_paused = true)]
    async fn the_default_class_needs_no_lock() {
        let g = BoundedAdmissionLayer::new(2).handle().shared;
        let first = g.acquire(None, None, 1);
        assert!(matches!(first, Acquire::Admitted(ref p) if p.class == IMPLICIT));
        let (tx, rx) = std::sync::mpsc::channel();
        let g2 = g.clone();
        let _st = g.lock();
        // Admission and release while another thread holds the lock: a lock would block.
        std::thread::spawn(move || {
            let a = g2.acquire(Some(&Priority::standard()), None, 1);
            let admitted = matches!(a, Acquire::Admitted(_));
            drop(a);
            tx.send(admitted).unwrap();
        });
        let done = rx.recv_timeout(std::time::Duration::from_secs(10));
        drop(_st);
        assert_eq!(done, Ok(true));
        drop(first);
        let s = g.snapshot();
        assert_eq!((s.in_use, s.in_flight, s.queued), (0, 0, 0));
    }

    /// Real threads racing the lock-free path against queueing, other classes and releases:
    /// capacity is never exceeded, every waiter is admitted (no wakeup lost between a release
    /// that did not see the queue flag and an arrival that set it), and the gate ends empty.
    #[test]
    fn threads_racing_the_lock_free_path_lose_no_waiter() {
        use std::sync::atomic::AtomicUsize;
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
                        let permit = match g.acquire(p, None, 1) {
                            Acquire::Admitted(permit) => permit,
                            Acquire::Queued(mut q) => {
                                queued.fetch_add(1, Ordering::Relaxed);
                                let mut spins = 0u64;
                                let grant = loop {
                                    match q.rx.try_recv() {
                                        Ok(grant) => break grant,
                                        Err(_) => {
                                            spins += 1;
                                            assert!(
                                                spins < 20_000_000,
                                                "a waiter was never admitted"
                                            );
                                            std::thread::yield_now();
                                        }
                                    }
                                };
                                q.guard.disarm();
                                grant.expect("nobody is evicted or expired").0
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
                            // Idle a little: the queue drains and the lock-free path opens.
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
        eprintln!(
            "{} of 20000 requests queued",
            queued.load(Ordering::Relaxed)
        );
        let s = g.snapshot();
        assert_eq!((s.in_use, s.in_flight, s.queued), (0, 0, 0));
        assert!(s.classes.iter().all(|c| (c.1, c.2, c.3) == (0, 0, 0)));
    }

    /// The lock-free path of the default class must behave exactly like the locked path with
    /// the same (implicit) accounting, and like a gate where every class is counted under the
    /// lock: the same answers, grants, refusals with the same `Retry-After`, the same snapshots
    /// after every step of a random mix of arrivals, releases, expiries and cancellations.
    #[tokio::test(start_paused = true)]
    async fn lock_free_path_matches_the_locked_paths() {
        let base = || {
            BoundedAdmissionLayer::new(4)
                .with_queue_len(3)
                .with_queue_timeout(Duration::from_secs(60))
        };
        // 0: lock-free for the default class. 1: the same requests forced through the lock (a
        // reserved share of 0 in the request, which is the configured one). 2: no implicit
        // class (a cost function, which also weighs 1 unit).
        let gates = [
            base().handle().shared,
            base().handle().shared,
            base().with_cost(Cost::from_fn(|_| 1)).handle().shared,
        ];
        assert!(gates[2].implicit_level.is_none());
        let standard = Priority::standard();
        let batch = Priority::batch();
        let mut held: [Vec<Permit>; 3] = Default::default();
        let mut kinds = [0usize; 9];
        let mut queued: [Vec<Queued>; 3] = Default::default();
        let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
        let mut next = |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        for step in 0..20_000 {
            let op = next(12);
            let pick = next(1 << 16) as usize;
            let mut seen = Vec::new();
            for (i, g) in gates.iter().enumerate() {
                let s = match op {
                    0..=4 => {
                        let (p, share) = match op {
                            0 | 1 => (None, None),
                            2 => (Some(&standard), None),
                            3 => (Some(&batch), None),
                            _ => (Some(&standard), (i == 1).then_some(0.0)),
                        };
                        let share = if i == 1 && p != Some(&batch) {
                            Some(0.0)
                        } else {
                            share
                        };
                        match g.acquire(p, share, 1) {
                            Acquire::Admitted(permit) => {
                                held[i].push(permit);
                                Seen::Admitted
                            }
                            Acquire::Queued(q) => {
                                queued[i].push(q);
                                Seen::Queued
                            }
                            Acquire::Rejected(r) => Seen::Rejected(r.reason, r.retry_after),
                        }
                    }
                    5..=7 if !held[i].is_empty() => {
                        let k = pick % held[i].len();
                        drop(held[i].swap_remove(k));
                        Seen::Pending
                    }
                    8 if !queued[i].is_empty() => {
                        let k = pick % queued[i].len();
                        let mut q = queued[i].remove(k);
                        let r = q.guard.expire();
                        if r.is_none() {
                            // Granted meanwhile: the permit (if any) goes back.
                            q.guard.disarm();
                        }
                        Seen::Expired(r.map(|r| r.retry_after))
                    }
                    9 if !queued[i].is_empty() => {
                        let k = pick % queued[i].len();
                        drop(queued[i].remove(k));
                        Seen::Pending
                    }
                    10 => {
                        if i == 0 {
                            tokio::time::advance(Duration::from_millis(pick as u64 % 700)).await;
                        }
                        Seen::Pending
                    }
                    _ => {
                        // Collect the grants the gate sent.
                        let mut got = Vec::new();
                        let mut k = 0;
                        while k < queued[i].len() {
                            match queued[i][k].rx.try_recv() {
                                Ok(g) => {
                                    let mut q = queued[i].remove(k);
                                    q.guard.disarm();
                                    match g {
                                        Ok((permit, waited)) => {
                                            held[i].push(permit);
                                            got.push(Seen::Granted(waited));
                                        }
                                        Err(r) => got.push(Seen::Rejected(r.reason, r.retry_after)),
                                    }
                                }
                                Err(_) => k += 1,
                            }
                        }
                        seen.push(Seen::Pending);
                        seen.extend(got);
                        continue;
                    }
                };
                seen.push(s);
            }
            let per_gate = seen.len() / 3;
            for s in &seen[..per_gate] {
                let k = match s {
                    Seen::Admitted => 0,
                    Seen::Queued => 1,
                    Seen::Rejected(OverloadReason::QueueFull, _) => 2,
                    Seen::Rejected(OverloadReason::Evicted, _) => 3,
                    Seen::Rejected(..) => 4,
                    Seen::Granted(_) => 5,
                    Seen::Expired(Some(_)) => 6,
                    Seen::Expired(None) => 7,
                    Seen::Pending => 8,
                };
                kinds[k] += 1;
            }
            for i in 1..3 {
                assert_eq!(
                    seen[..per_gate],
                    seen[i * per_gate..(i + 1) * per_gate],
                    "answers differ at step {step} (op {op}), gate {i}"
                );
            }
            let v = view(&gates[0]);
            assert_eq!(
                v,
                view(&gates[1]),
                "snapshots differ at step {step} (gate 1)"
            );
            assert_eq!(
                v,
                view(&gates[2]),
                "snapshots differ at step {step} (gate 2)"
            );
        }
        // Every kind of answer happened (evictions and grants racing expiry aside).
        for k in [0, 1, 2, 3, 5, 6] {
            assert!(
                kinds[k] > 50,
                "answer kind {k} seen {} times: {kinds:?}",
                kinds[k]
            );
        }
        for i in 0..3 {
            held[i].clear();
            queued[i].clear();
            let v = view(&gates[i]);
            assert_eq!((v.0, v.1, v.2), (0, 0, 0), "gate {i} is empty at the end");
        }
    }
}
