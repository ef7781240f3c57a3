//! Placing one attempt: the replica it goes to (power of two choices or round robin for a
//! primary, the best untried replica for a backup, among those with a free slot), and its
//! claim on that replica, bound to the request's [`Attempt`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Waker;

use http::Request;
use tailguard_core::Upstream;
use tailguard_core::attempt::{Attempt, ReplicaId};
use tokio::time::Instant;

use crate::config::{Config, Routing};
use crate::health::{Board, Health, Ticket};

/// The replicas of a set, and what it knows about them: what a set and each of its response
/// futures share.
pub(crate) struct Placer<S> {
    pub(crate) replicas: Arc<[S]>,
    /// Each replica's `upstream` label, inserted into its responses.
    pub(crate) names: Arc<[Upstream]>,
    pub(crate) config: Config,
    pub(crate) health: Arc<Health>,
    next: Arc<AtomicUsize>,
}

impl<S> Placer<S> {
    pub(crate) fn new(replicas: Arc<[S]>, config: Config, health: Health) -> Self {
        let names = (0..replicas.len())
            .map(|i| Upstream::new(format!("replica-{i}")))
            .collect();
        Placer {
            replicas,
            names,
            config,
            health: Arc::new(health),
            next: Arc::default(),
        }
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
            .filter(|&i| board.replicas[i].has_room(self.config.slots, now))
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

impl<S> Clone for Placer<S> {
    fn clone(&self) -> Self {
        Placer {
            replicas: self.replicas.clone(),
            names: self.names.clone(),
            config: self.config.clone(),
            health: self.health.clone(),
            next: self.next.clone(),
        }
    }
}

impl<S> fmt::Debug for Placer<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Placer")
            .field("replicas", &self.replicas.len())
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}
