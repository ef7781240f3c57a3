//! `ReplicaSet`: an explicit set of replicas the hedge spreads its attempts over.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use http::{Request, Response};
use tokio::time::Instant;
use tower_service::Service;

use crate::attempt::{Attempt, ReplicaId};
use crate::eject::Ejection;
use crate::score::{Board, Health, Ticket};
use crate::slots::ResponseFuture;

/// How a [`ReplicaSet`] chooses the replica of a primary attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Routing {
    /// Power of two choices over each replica's expected wait for a first token (the
    /// default): the attempts on it still waiting for one, and a peak-EWMA of its recent
    /// times to first token, in which an attempt still waiting, or cancelled before its
    /// token, counts at least as long as it waited. Ejected replicas are left out.
    #[default]
    LeastWait,
    /// Round robin, blind to load and ejection (the behaviour before load-aware routing).
    RoundRobin,
}

/// A set of replica services; each attempt of a hedged request goes to a replica no earlier
/// attempt of the same request went to.
///
/// Put it under [`FirstTokenHedge`](crate::FirstTokenHedge) (or use
/// [`FirstTokenHedgeLayer::layer_replicas`](crate::FirstTokenHedgeLayer::layer_replicas)).
///
/// * **Primary**: by default ([`Routing::LeastWait`]) the better of two replicas by expected
///   wait for a first token, which the hedge reports to the set through the request's
///   [`Attempt`]; replicas ejected for repeated failures or slowness (see [`Ejection`]) are
///   left out. With [`Routing::RoundRobin`], the next replica in turn.
/// * **Backup**: the best-scored replica the request's [`Attempt`] has not recorded (an
///   ejected one only when no other is left); when all were tried, the primary's rule again.
/// * **Slots** ([`with_slots`](Self::with_slots)): an attempt is placed only on a replica with
///   a free slot, and holds it until its response body ends or is dropped. While no suitable
///   replica has one, the attempt waits in the set (in the gateway, not in an upstream's own
///   queue) and is placed when a slot frees; a backup waits for a slot on a replica not yet
///   tried, and is dropped unsent if the race is decided first.
///
/// The chosen replica's index is recorded as its [`ReplicaId`]. A request without an
/// `Attempt` (sent around the hedge) is routed the same way and holds a slot, but feeds no
/// score: nothing reports its first token.
///
/// Why not tower's `balance::p2c`: it needs every endpoint ready before a pick and knows
/// nothing of which replicas a request already tried, and its `load` measures responses to
/// their head, which streaming servers send at once.
///
/// Readiness: `poll_ready` is always ready; each call readies a clone of the chosen replica
/// inside the response future (tower's `Oneshot`). A slow or saturated replica must not
/// block the set, since getting away from such a replica is the point of a hedge. Replica
/// services are therefore `Clone` (a hyper client, a tonic `Channel` and a tower `Buffer` all
/// are, cheaply).
pub struct ReplicaSet<S> {
    replicas: Arc<[S]>,
    config: Config,
    health: Arc<Health>,
    next: Arc<AtomicUsize>,
}

#[derive(Clone, Debug)]
struct Config {
    routing: Routing,
    slots: Option<u32>,
}

impl<S> ReplicaSet<S> {
    /// A set of `replicas` (at least one), with the defaults: [`Routing::LeastWait`], a
    /// decay of **10 s** for the first-token estimate (tower's and linkerd's peak-EWMA
    /// default: a replica that recovered gets traffic back within seconds), [`Ejection::new`],
    /// no slot limit.
    ///
    /// # Panics
    ///
    /// When `replicas` is empty: a set with nothing to route to is a configuration error.
    pub fn new(replicas: impl IntoIterator<Item = S>) -> Self {
        let replicas: Arc<[S]> = replicas.into_iter().collect();
        assert!(
            !replicas.is_empty(),
            "ReplicaSet needs at least one replica"
        );
        let health = Health::new(replicas.len(), Duration::from_secs(10), Ejection::new());
        ReplicaSet {
            replicas,
            config: Config {
                routing: Routing::LeastWait,
                slots: None,
            },
            health: Arc::new(health),
            next: Arc::default(),
        }
    }

    /// A set routed [`Routing::RoundRobin`], with no ejection.
    pub fn round_robin(replicas: impl IntoIterator<Item = S>) -> Self {
        Self::new(replicas)
            .with_routing(Routing::RoundRobin)
            .with_ejection(Ejection::disabled())
    }

    /// Sets how primaries are routed.
    pub fn with_routing(mut self, routing: Routing) -> Self {
        self.config.routing = routing;
        self
    }

    /// Sets the most concurrent attempts per replica (`None`: no limit; `Some(0)` counts as
    /// `1`). For example `Some(1)` for a single-slot llama.cpp server.
    pub fn with_slots(mut self, slots: Option<u32>) -> Self {
        self.config.slots = slots.map(|n| n.max(1));
        self
    }

    /// Sets the outlier ejection rules (state gathered so far is reset).
    pub fn with_ejection(self, ejection: Ejection) -> Self {
        let decay = self.health.decay;
        self.with_health(decay, ejection)
    }

    /// Sets the decay time constant of the first-token estimate (state gathered so far is
    /// reset).
    pub fn with_decay(self, decay: Duration) -> Self {
        let ejection = self.health.ejection.clone();
        self.with_health(decay, ejection)
    }

    fn with_health(mut self, decay: Duration, ejection: Ejection) -> Self {
        self.health = Arc::new(Health::new(self.replicas.len(), decay, ejection));
        self
    }

    /// The number of replicas.
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Always `false`: a set holds at least one replica.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The sum of the slots, when they are limited: the most attempts in flight at once, and
    /// a natural admission capacity in front of the hedge.
    pub fn total_slots(&self) -> Option<u64> {
        self.config
            .slots
            .map(|n| u64::from(n) * self.replicas.len() as u64)
    }

    pub(crate) fn replica(&self, i: usize) -> S
    where
        S: Clone,
    {
        self.replicas[i].clone()
    }

    /// Places the request's attempt: a replica and its ticket, or `None` (with `waker` parked)
    /// while no suitable replica has a free slot.
    pub(crate) fn place<B>(
        &self,
        req: &Request<B>,
        waker: Option<&Waker>,
    ) -> Option<(usize, Arc<Ticket>)> {
        let attempt = req.extensions().get::<Attempt>();
        let mut board = self.health.board();
        let Some(i) = self.pick(&mut board, attempt) else {
            if let Some(w) = waker {
                Health::park(&mut board, w);
            }
            return None;
        };
        let ticket = Arc::new(self.health.start(&mut board, i, attempt.is_some()));
        drop(board);
        if let Some(a) = attempt {
            a.record(ReplicaId(i as u64));
            a.bind(ticket.clone());
        }
        Some((i, ticket))
    }

    /// The replica for an attempt, among those with a free slot.
    fn pick(&self, board: &mut Board, attempt: Option<&Attempt>) -> Option<usize> {
        let now = Instant::now();
        let free: Vec<usize> = (0..self.replicas.len())
            .filter(|&i| {
                self.config
                    .slots
                    .is_none_or(|n| board.replicas[i].active < n)
            })
            .collect();
        let tried = attempt.map(Attempt::tried).unwrap_or_default();
        let untried = tried.len() < self.replicas.len();
        if attempt.is_some_and(Attempt::is_backup) && untried {
            let decay = self.health.decay;
            let mut key = |i: &usize| {
                let r = &mut board.replicas[*i];
                (r.eject.is_ejected(now), r.score(now, decay))
            };
            let mut best: Option<(usize, (bool, f64))> = None;
            for i in free
                .iter()
                .copied()
                .filter(|i| !tried.contains(&ReplicaId(*i as u64)))
            {
                let k = key(&i);
                if best.is_none_or(|(_, b)| (k.0, k.1) < (b.0, b.1)) {
                    best = Some((i, k));
                }
            }
            return best.map(|(i, _)| i);
        }
        self.primary(board, &free, now)
    }

    /// The primary's replica among `free`: power of two choices, or round robin.
    fn primary(&self, board: &mut Board, free: &[usize], now: Instant) -> Option<usize> {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        if self.config.routing == Routing::RoundRobin {
            let n = self.replicas.len();
            return (0..n).map(|k| (seq + k) % n).find(|i| free.contains(i));
        }
        let healthy: Vec<usize> = free
            .iter()
            .copied()
            .filter(|&i| !board.replicas[i].eject.is_ejected(now))
            .collect();
        // Every free replica ejected (the healthy ones are full): wait for a healthy slot.
        let n = healthy.len();
        if n <= 1 {
            return healthy.first().copied();
        }
        // Two distinct candidates from a Weyl sequence: evenly spread, no generator needed.
        let h = (seq as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let a = (h >> 32) as usize % n;
        let b = (a + 1 + (h as u32 as usize) % (n - 1)) % n;
        let (a, b) = (healthy[a], healthy[b]);
        let decay = self.health.decay;
        let (sa, sb) = (
            board.replicas[a].score(now, decay),
            board.replicas[b].score(now, decay),
        );
        Some(if sb < sa { b } else { a })
    }
}

impl<S> Clone for ReplicaSet<S> {
    fn clone(&self) -> Self {
        ReplicaSet {
            replicas: self.replicas.clone(),
            config: self.config.clone(),
            health: self.health.clone(),
            next: self.next.clone(),
        }
    }
}

impl<S> fmt::Debug for ReplicaSet<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicaSet")
            .field("replicas", &self.replicas.len())
            .field("routing", &self.config.routing)
            .field("slots", &self.config.slots)
            .field("decay", &self.health.decay)
            .field("ejection", &self.health.ejection)
            .finish()
    }
}

impl<S, B, RB> Service<Request<B>> for ReplicaSet<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
{
    type Response = Response<crate::slots::ReplicaBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        ResponseFuture::new(self.clone(), req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn place(set: &ReplicaSet<()>, attempt: &Attempt) -> Option<usize> {
        let mut req = Request::new(());
        req.extensions_mut().insert(attempt.clone());
        set.place(&req, None).map(|(i, _)| i)
    }

    #[tokio::test(start_paused = true)]
    async fn backups_avoid_tried_replicas() {
        for set in [
            ReplicaSet::new([(), (), ()]),
            ReplicaSet::round_robin([(), (), ()]),
        ] {
            let primary = Attempt::primary();
            let mut all: Vec<usize> = (0..3)
                .filter_map(|k| place(&set, &primary.with_number(k)))
                .collect();
            all.sort_unstable();
            assert_eq!(all, vec![0, 1, 2]);
            // Everything tried: the primary's rule again, still in range.
            assert!(place(&set, &primary.with_number(3)).is_some_and(|i| i < 3));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn slots_bound_placements() {
        let set = ReplicaSet::new([(), ()]).with_slots(Some(1));
        assert_eq!(set.total_slots(), Some(2));
        let a = Attempt::primary();
        let first = place(&set, &a).map(|i| (i, ()));
        assert!(first.is_some());
        // The backup takes the other replica's slot; a third attempt of anyone waits.
        assert!(place(&set, &a.with_number(1)).is_some());
        assert_eq!(place(&set, &Attempt::primary()), None);
    }
}
