//! The wait queue of a gate and its disciplines: per-class order, reserved shares, aging,
//! adaptive LIFO, CoDel deadlines, eviction, and fair queueing across tenants within a class.
//!
//! The queue only orders and bookkeeps; the gate decides whether the chosen waiter fits and
//! admits it. The queue is served head-of-line: the gate asks for the next waiter in order and
//! stops when that one does not fit, so large requests are not starved by small ones.
//!
//! Classes are ranked by their head waiter (the oldest, or the newest under adaptive LIFO)
//! exactly as without fair queueing; fair queueing only chooses which of the winning class's
//! waiters goes: the head of the lane ([`crate::lanes`]) of the tenant with the least virtual
//! counter ([`crate::fair`]).

use std::cmp::Reverse;
use std::time::Duration;

use tailguard_core::Priority;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::drain::Holds;
use crate::fair::{Fair, Tenants};
use crate::gate::Grant;
use crate::lanes::{Lane, Lanes, NO_TENANT};
use crate::layer::Config;
use crate::metrics::ClassMetrics;

/// Aging: waiting raises a waiter's rank, so lower classes cannot starve.
///
/// Each `period` waited adds [`Aging::STEP`] (10) to the waiter's effective level, growing
/// continuously with the wait (half a period, half a step). The step assumes priority levels
/// spaced 10 apart, as the standard set is (`sheddable` 0, `batch` 10, `standard` 20,
/// `interactive` 30, `critical` 40): one period then lifts a waiter by one class, so a `batch`
/// waiter ties a fresh `interactive` one after two periods and, being older, goes first. With
/// levels spaced otherwise the gain is still 10 levels per period: a waiter overtakes a class
/// `d` levels above it after `d / 10` periods (a tenth of a period for classes one level apart).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Aging {
    period: Duration,
}

impl Aging {
    /// Effective-level gain per period.
    const STEP: u128 = 10;

    /// Aging with `period`; `None` (no aging) for a zero period.
    pub(crate) fn new(period: Duration) -> Option<Self> {
        (!period.is_zero()).then_some(Aging { period })
    }

    /// The effective level of a waiter of `level` that has waited `waited`, scaled by the period
    /// in nanoseconds (integers, so equal ranks compare equal and fall to age).
    fn effective(self, level: u8, waited: Duration) -> u128 {
        u128::from(level) * self.period.as_nanos() + Self::STEP * waited.as_nanos()
    }

    /// Whether a waiter has waited at least one period.
    fn aged(self, waited: Duration) -> bool {
        waited >= self.period
    }
}

/// One queued request.
pub(crate) struct Waiter {
    /// Arrival order across the whole gate.
    pub(crate) seq: u64,
    pub(crate) units: u32,
    pub(crate) enqueued: Instant,
    pub(crate) tx: oneshot::Sender<Grant>,
    /// Its tenant and charge, under fair queueing.
    pub(crate) fair: Option<Fair>,
}

impl Waiter {
    /// Its tenant's slot ([`NO_TENANT`] without fair queueing).
    pub(crate) fn tenant(&self) -> usize {
        self.fair.map_or(NO_TENANT, |f| f.tenant)
    }
}

/// One priority class: what it holds and for how long, what it reserves, who of it waits.
pub(crate) struct Class {
    pub(crate) priority: Priority,
    pub(crate) in_use: u32,
    pub(crate) in_flight: usize,
    /// The hold times of the class's permits.
    pub(crate) holds: Holds,
    /// Units reserved for the class under contention: `share` of the gate's limit.
    pub(crate) reserved: u32,
    share: f64,
    /// By tenant, each lane oldest first.
    pub(crate) waiters: Lanes,
    /// Units waiting in the class.
    pub(crate) queued_units: u64,
    /// When the class's waiters last went from none to some (`None` while it has none).
    nonempty_since: Option<Instant>,
    pub(crate) metrics: ClassMetrics,
}

/// The queue's choice of the next waiter to admit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Pick {
    pub(crate) class: usize,
    /// The lane (tenant) of the class.
    lane: usize,
    /// The newest waiter of the lane (adaptive LIFO) instead of the oldest.
    newest: bool,
    pub(crate) units: u32,
}

/// Order of candidates, greatest first: below its reserved share, effective level, age.
type OrderKey = (bool, u128, Reverse<u64>);

/// The classes of a gate and the waiters across them.
pub(crate) struct Queue {
    pub(crate) classes: Vec<Class>,
    /// The virtual token counters (untouched without fair queueing).
    pub(crate) tenants: Tenants,
    len: usize,
    next_seq: u64,
}

impl Queue {
    pub(crate) fn new(tenants: Tenants) -> Self {
        Queue {
            classes: Vec::new(),
            tenants,
            len: 0,
            next_seq: 0,
        }
    }

    /// Requests waiting.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The index of the class of `priority`, created on first sight (at `now`). A reserved
    /// `share` carried by the request replaces the class's reservation.
    pub(crate) fn class(
        &mut self,
        priority: &Priority,
        share: Option<f64>,
        cfg: &Config,
        limit: u32,
        now: Instant,
    ) -> usize {
        let level = priority.level();
        let i = match self
            .classes
            .iter()
            .position(|c| c.priority.level() == level)
        {
            Some(i) => i,
            None => {
                let configured = cfg.reserved.iter().find(|(p, _)| p.level() == level);
                let share = configured.map_or(0.0, |(_, s)| *s);
                self.classes.push(Class {
                    priority: priority.clone(),
                    in_use: 0,
                    in_flight: 0,
                    holds: Holds::new(now),
                    reserved: cfg.reserved_units(share, limit),
                    share,
                    waiters: Lanes::default(),
                    queued_units: 0,
                    nonempty_since: None,
                    metrics: ClassMetrics::new(priority.name()),
                });
                self.classes.len() - 1
            }
        };
        if let Some(s) = share {
            self.classes[i].share = s;
            self.classes[i].reserved = cfg.reserved_units(s, limit);
        }
        i
    }

    /// Recomputes the reserved units of every class for a new `limit`.
    pub(crate) fn rescale(&mut self, cfg: &Config, limit: u32) {
        for c in &mut self.classes {
            c.reserved = cfg.reserved_units(c.share, limit);
        }
    }

    /// CoDel, as seen by a request of priority `level`: whether some class it does not
    /// overtake (its own, or a higher one) has had waiters for the CoDel interval. A standing
    /// queue of lower classes is not the arrival's: it goes ahead of them (issue 30: under a
    /// standing `standard` queue, `interactive` arrivals were held to the 5 ms target and
    /// refused).
    fn standing(&self, level: u8, now: Instant, cfg: &Config) -> bool {
        let Some(codel) = cfg.codel else {
            return false;
        };
        self.classes.iter().any(|c| {
            c.priority.level() >= level
                && c.nonempty_since
                    .is_some_and(|since| now.saturating_duration_since(since) >= codel.interval)
        })
    }

    /// The wait allowed to a request of `class` arriving now: the queue deadline, or the CoDel
    /// target under a queue standing ahead of it.
    pub(crate) fn allowed_wait(&self, class: usize, now: Instant, cfg: &Config) -> Duration {
        let level = self.classes[class].priority.level();
        match cfg.codel {
            Some(c) if self.standing(level, now, cfg) => c.target.min(cfg.queue_timeout),
            _ => cfg.queue_timeout,
        }
    }

    /// Queues a request of `units` in `class` (of a tenant, under fair queueing: lifted if it
    /// had no waiter); its sequence number and the receiving end of its outcome.
    pub(crate) fn push(
        &mut self,
        class: usize,
        units: u32,
        fair: Option<Fair>,
        now: Instant,
    ) -> (u64, oneshot::Receiver<Grant>) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.len += 1;
        if let Some(f) = fair {
            self.tenants.enqueue(f.tenant);
        }
        let (tx, rx) = oneshot::channel();
        let c = &mut self.classes[class];
        if c.waiters.is_empty() {
            c.nonempty_since = Some(now);
        }
        c.queued_units += u64::from(units);
        c.waiters.push(Waiter {
            seq,
            units,
            enqueued: now,
            tx,
            fair,
        });
        c.metrics.queued.increment(1.0);
        (seq, rx)
    }

    /// Bookkeeping after a waiter of `class` left the queue, to be admitted or not (then its
    /// tenant is forgotten if it has nothing else waiting or in flight).
    fn left(&mut self, class: usize, w: Waiter, admitted: bool) -> Waiter {
        self.len -= 1;
        let c = &mut self.classes[class];
        if c.waiters.is_empty() {
            c.nonempty_since = None;
        }
        c.queued_units -= u64::from(w.units);
        c.metrics.queued.decrement(1.0);
        if let Some(f) = w.fair {
            self.tenants.dequeue(f.tenant, self.len == 0);
            if !admitted {
                self.tenants.forget_if_idle(f.tenant);
            }
        }
        w
    }

    /// The next waiter in order. Each class offers its oldest waiter (its newest under adaptive
    /// LIFO while the queue stands ahead of it, unless the oldest has aged a full period); among
    /// those, a class below its reserved share goes first, then the highest effective level,
    /// then the oldest arrival. Of the chosen class goes the head (oldest, or newest under
    /// LIFO) of the lane of its [fairest tenant](Self::fairest).
    pub(crate) fn next(&self, now: Instant, cfg: &Config) -> Option<Pick> {
        let mut best: Option<(usize, bool, OrderKey)> = None;
        for (i, c) in self.classes.iter().enumerate() {
            let Some(oldest) = c.waiters.oldest() else {
                continue;
            };
            let waited = |w: &Waiter| now.saturating_duration_since(w.enqueued);
            let level = c.priority.level();
            let lifo = cfg.lifo && self.standing(level, now, cfg);
            let newest = lifo && !cfg.aging.is_some_and(|a| a.aged(waited(oldest)));
            let w = if newest {
                c.waiters.newest()
            } else {
                Some(oldest)
            }
            .expect("non-empty");
            let effective = cfg
                .aging
                .map_or(u128::from(level), |a| a.effective(level, waited(w)));
            let key = (c.in_use < c.reserved, effective, Reverse(w.seq));
            if best.as_ref().is_none_or(|(_, _, k)| key > *k) {
                best = Some((i, newest, key));
            }
        }
        let (class, newest, _) = best?;
        let lanes = self.classes[class].waiters.lanes();
        let lane = self.fairest(lanes);
        let l = &lanes[lane];
        let w = if newest { l.newest() } else { l.oldest() };
        Some(Pick {
            class,
            lane,
            newest,
            units: w.units,
        })
    }

    /// The lane of a class whose tenant goes next: the least virtual counter, then the fewest
    /// units in flight per weight, then the oldest waiter. Without fair queueing there is one
    /// lane.
    fn fairest(&self, lanes: &[Lane]) -> usize {
        if lanes.len() == 1 {
            return 0;
        }
        let key = |l: &Lane| (self.tenants.rank(l.tenant), l.oldest().seq);
        let order = |a: &Lane, b: &Lane| {
            let ((ca, ua), sa) = key(a);
            let ((cb, ub), sb) = key(b);
            ca.total_cmp(&cb).then(ua.total_cmp(&ub)).then(sa.cmp(&sb))
        };
        (0..lanes.len())
            .min_by(|&a, &b| order(&lanes[a], &lanes[b]))
            .unwrap_or(0)
    }

    /// Takes the waiter `pick` chose out of the queue, to be admitted.
    pub(crate) fn take(&mut self, pick: Pick) -> Waiter {
        let w = self.classes[pick.class].waiters.pop(pick.lane, pick.newest);
        self.left(pick.class, w, true)
    }

    /// Takes the newest waiter of `class` out of the queue, refused.
    pub(crate) fn take_newest(&mut self, class: usize) -> Option<Waiter> {
        let w = self.classes[class].waiters.pop_newest()?;
        Some(self.left(class, w, false))
    }

    /// Takes the waiter `seq` of `tenant` in `class` out of the queue, refused; `None` if it is
    /// not queued.
    pub(crate) fn remove(&mut self, class: usize, tenant: usize, seq: u64) -> Option<Waiter> {
        let w = self.classes[class].waiters.remove(tenant, seq)?;
        Some(self.left(class, w, false))
    }

    /// Eviction: the lowest class below `level` that has waiters (its newest waiter is the one
    /// to evict).
    pub(crate) fn victim_below(&self, level: u8) -> Option<usize> {
        self.classes
            .iter()
            .enumerate()
            .filter(|(_, c)| !c.waiters.is_empty() && c.priority.level() < level)
            .min_by_key(|(_, c)| c.priority.level())
            .map(|(i, _)| i)
    }
}
