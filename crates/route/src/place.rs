//! Placing one attempt: the replica it goes to (power of two choices or round robin for a
//! primary, the best untried replica for a backup, among those with a free slot), and its
//! claim on that replica, bound to the request's [`Attempt`].

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Waker;
use std::time::Duration;

use http::Request;
use tailguard_core::Upstream;
use tailguard_core::attempt::{Attempt, ReplicaId};
use tokio::time::Instant;

use crate::config::{Config, Routing};
use crate::health::{Board, Health, Ticket};
use crate::line::Spot;
use crate::score::Prior;
#[cfg(doc)]
use crate::score::Replica;

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

    /// Places the request's attempt: a replica and its ticket, or `None` while it waits for a
    /// slot (in line, when `waker` is given; see [`Line`](crate::line::Line)).
    pub(crate) fn place<B>(
        &self,
        req: &Request<B>,
        spot: &mut Spot,
        waker: Option<&Waker>,
    ) -> Option<(usize, Arc<Ticket>)> {
        let attempt = req.extensions().get::<Attempt>();
        let mut board = self.health.board();
        let (placed, probe) = match self.pick(&mut board, attempt, spot) {
            Pick::Place(i) => (i, false),
            Pick::Probe(i, alternative) => {
                let alternative = alternative.and_then(|s| Duration::try_from_secs_f64(s).ok());
                match (attempt, alternative) {
                    (Some(a), Some(d)) => a.mark_probe_against(d),
                    (Some(a), None) => a.mark_probe(),
                    (None, _) => {}
                }
                // A probe on a lower bound pauses the next.
                if board.replicas[i].lower_bound() {
                    board.replicas[i].probed(Instant::now(), self.health.decay);
                }
                (i, true)
            }
            Pick::Wait(wants) => {
                if let Some(w) = waker {
                    spot.key = Some(board.line.wait(spot.key, spot.since, w, wants));
                }
                return None;
            }
            Pick::Prefer(i, secs) => {
                if let Some(w) = waker {
                    spot.key = Some(board.line.wait(spot.key, spot.since, w, vec![i]));
                }
                let patience = Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX);
                spot.patience
                    .get_or_insert_with(|| Instant::now() + patience);
                return None;
            }
        };
        let ticket = Arc::new(self.health.start(&mut board, placed, attempt.is_some()));
        drop(board);
        tracing::debug!(
            replica = placed,
            probe,
            backup = attempt.is_some_and(Attempt::is_backup),
            since_s = spot.since.elapsed().as_secs_f64(),
            "tailguard-route: attempt placed"
        );
        spot.leave();
        if let Some(a) = attempt {
            a.record(ReplicaId(placed as u64));
            a.bind(ticket.clone());
        }
        Some((placed, ticket))
    }

    /// The replica for an attempt, among those with a free slot that no older waiter in line
    /// is due; or the replicas it waits for.
    fn pick(&self, board: &mut Board, attempt: Option<&Attempt>, spot: &Spot) -> Pick {
        let now = Instant::now();
        let n = self.replicas.len();
        let ejected: Vec<bool> = (board.replicas.iter_mut())
            .map(|r| r.eject.is_ejected(now))
            .collect();
        let board = &*board;
        let prior = Prior::of(&board.replicas, now, self.health.decay);
        let slots = self.config.slots;
        let ahead = |i: usize| board.line.ahead(spot.key, spot.since, i);
        let tried = attempt.map(Attempt::tried).unwrap_or_default();
        let backup = attempt.is_some_and(Attempt::is_backup) && tried.len() < n;
        let hold = self.health.interruption_hold;
        let fits = |i: usize| board.replicas[i].has_room(slots, now, ahead(i));
        let cuts = |i: usize| board.replicas[i].may_cut_a_stream(now, hold);
        // A replica that may cut a stream is taken for a single-slot one: by a backup always
        // (it waits for the stream to end), by a primary while another replica in selection
        // has room and may not cut one. A primary then waits for the stream to end when that
        // is expected to be sooner than the one with room (as for any full replica, below);
        // issue 29's interrupt runs lost a run's first streams to primaries placed beside them
        // before the set had seen the replica interrupt, and later ones to a primary placed
        // beside a stream because another already waited for it. Only with no such replica
        // does a primary go beside the stream: that is how the set learns that a replica
        // serves several at once (or, interrupted, that it serves one). Until then a batching
        // server's primaries go to the replicas with room, or wait no longer than those are
        // expected to take: slower placements at worst, never a stream cut.
        let spare = (0..n).any(|i| !ejected[i] && fits(i) && !cuts(i));
        let alone = |i: usize| cuts(i) && (backup || spare);
        let room = |i: usize| fits(i) && !alone(i);
        if !backup && self.config.routing == Routing::RoundRobin {
            let seq = self.next.fetch_add(1, Ordering::Relaxed);
            return (0..n)
                .map(|k| seq.wrapping_add(k) % n)
                .find(|&i| room(i))
                .map_or_else(|| Pick::Wait((0..n).collect()), Pick::Place);
        }
        let (candidates, chosen, probe) = if backup {
            // A backup: the best replica with room not tried yet (an ejected one last)...
            let untried: Vec<usize> = (0..n)
                .filter(|i| !tried.contains(&ReplicaId(*i as u64)))
                .collect();
            let key = |i: usize| (ejected[i], board.replicas[i].score(now, &prior));
            let best = untried
                .iter()
                .copied()
                .filter(|&i| room(i))
                .min_by(|&a, &b| {
                    let (ka, kb) = (key(a), key(b));
                    ka.0.cmp(&kb.0).then(ka.1.total_cmp(&kb.1))
                });
            (untried, best, None)
        } else {
            // A primary: of the replicas in selection, the better of two with room...
            let healthy: Vec<usize> = (0..n).filter(|&i| !ejected[i]).collect();
            let free: Vec<usize> = healthy.iter().copied().filter(|&i| room(i)).collect();
            match self.two_choices(board, &free, now, &prior) {
                Some((c, probe)) => (healthy, Some(c), probe),
                None => (healthy, None, None),
            }
        };
        // ...unless a full one is expected to give a first token sooner, slot wait included,
        // than the chosen one as last known (a single-slot replica that answers in 0.3 s beats
        // one with room that took 4 s: its estimate decays with time, but only a new sample,
        // say a backup's, says it recovered):
        // then the attempt waits for it, for at most as long as the free one is expected to
        // take (its patience: it never ends up much later than it would have there; the hedge
        // may send a backup meanwhile), and takes a replica with room after that.
        let full = candidates
            .iter()
            .copied()
            .filter(|&i| !ejected[i] && !room(i))
            .filter_map(|i| {
                let r = &board.replicas[i];
                if alone(i) {
                    return Some((i, r.wait_for_stream(now, &prior, ahead(i))));
                }
                r.wait_for_slot(slots, now, &prior, ahead(i))
                    .map(|w| (i, w))
            });
        let sooner = full.min_by(|a, b| a.1.total_cmp(&b.1));
        let patient = spot.patience.is_none_or(|until| now < until);
        let last_known = |c: usize| board.replicas[c].last_known(now, &prior);
        match (chosen, sooner) {
            (Some(c), Some((i, wait))) if patient && wait < last_known(c) => {
                Pick::Prefer(i, last_known(c))
            }
            (Some(c), _) if probe.is_some() => Pick::Probe(c, probe.flatten()),
            (Some(c), _) => Pick::Place(c),
            // Every candidate is full: wait for the first slot of any of them.
            (None, _) => Pick::Wait(candidates),
        }
    }

    /// Power of two choices among `free`, by score; and whether the choice is a probe, a
    /// placement that rests on no news of how long the chosen one takes: it won only because
    /// its estimate decayed (what was last known of it would have lost to the other choice),
    /// or its estimate is only a lower bound (an attempt there was cut short, or failed, and
    /// no first token came since), or the set has no news of it at all and no attempt waits
    /// there yet (the first to go there; those that follow it before its news are no probes,
    /// so a burst on a fresh set is not backed up past the hedge budget). A replica placed on
    /// learns at once (a token, a failure, or the wait a backup cut short). A probe carries
    /// the other choice's expected wait when the set has news of that one (see
    /// [`Attempt::mark_probe_against`]). A replica probed while its estimate is a lower bound
    /// takes its next primary on that bound only after a growing pause ([`Replica::probed`]),
    /// whether the bound beats the other choice by decay or because the other is loaded past
    /// it: until then the other choice goes, unless it too would be a probe that must wait.
    /// (The only replica with room always takes the attempt.)
    fn two_choices(
        &self,
        board: &Board,
        free: &[usize],
        now: Instant,
        prior: &Prior,
    ) -> Option<(usize, Probe)> {
        let n = free.len();
        if n <= 1 {
            // The only one with room: a probe when there is another to back it up on.
            let probe = |i: usize| self.replicas.len() > 1 && board.replicas[i].lower_bound();
            return free.first().map(|&i| (i, probe(i).then_some(None)));
        }
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        // Two distinct candidates from a Weyl sequence: evenly spread, no generator needed.
        let h = (seq as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let a = (h >> 32) as usize % n;
        let b = (a + 1 + (h as u32 as usize) % (n - 1)) % n;
        let (a, b) = (free[a], free[b]);
        let (sa, sb) = (
            board.replicas[a].score(now, prior),
            board.replicas[b].score(now, prior),
        );
        // Whether placing on `c` is a probe, and one that must wait (see `Replica::probed`).
        let kind = |c: usize, other_score: f64| {
            let r = &board.replicas[c];
            let first = !r.has_news() && r.waiting.is_empty();
            let decayed = r.last_known(now, prior) > other_score;
            let stale = r.lower_bound() || decayed;
            (first || stale, r.lower_bound() && !r.may_probe(now))
        };
        let mut pair = if sb < sa {
            [(b, sb), (a, sa)]
        } else {
            [(a, sa), (b, sb)]
        };
        // The better score, unless it would be a probe its replica may not take yet and the
        // other would not.
        if kind(pair[0].0, pair[1].1).1 && !kind(pair[1].0, pair[0].1).1 {
            pair.swap(0, 1);
        }
        let [(chosen, _), (other, other_score)] = pair;
        let probe = kind(chosen, other_score).0;
        let alternative = board.replicas[other].has_news().then_some(other_score);
        Some((chosen, probe.then_some(alternative)))
    }
}

/// Whether a placement is a probe (`Some`), and then the other choice's expected wait, in
/// seconds, when the set has news of it.
type Probe = Option<Option<f64>>;

/// Where an attempt goes.
enum Pick {
    /// To this replica, now.
    Place(usize),
    /// To this replica, now, as a probe (see [`Attempt::mark_probe`]), with the other
    /// choice's expected wait in seconds, if known.
    Probe(usize, Option<f64>),
    /// Nowhere yet: it waits for a slot on one of these.
    Wait(Vec<usize>),
    /// It waits for a slot on this replica although another has room, for at most this many
    /// seconds (what the one with room is expected to take).
    Prefer(usize, f64),
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
