//! The shared state of a [`ReplicaSet`](crate::ReplicaSet) under one lock, and each attempt's
//! claim on its replica ([`Ticket`]), which the attempt protocol of `tailguard-core` settles:
//! a first token is a sample of the replica's score, a failure counts towards its ejection.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tailguard_core::attempt::{AttemptClaim, ReplicaId, Settle};
use tokio::time::Instant;

use crate::eject::Ejection;
use crate::line::Line;
use crate::score::Replica;

/// How soon after the set sent a replica a newer attempt a stream that ends there counts as
/// interrupted by it: an interrupting server ends the running stream at its next token, well
/// within this; a later end is something else.
const INTERRUPTION_WINDOW: Duration = Duration::from_secs(2);

/// The most times an interruption hold doubles: 64 holds, about an hour at the default 60 s.
const MAX_HOLD_DOUBLINGS: u32 = 6;

/// The state of a whole set, under one lock (picks compare every replica anyway).
#[derive(Debug)]
pub(crate) struct Board {
    pub(crate) replicas: Vec<Replica>,
    next_id: u64,
    /// Attempts waiting for a slot.
    pub(crate) line: Line,
}

/// The shared state of a [`ReplicaSet`](crate::ReplicaSet).
#[derive(Debug)]
pub(crate) struct Health {
    board: Mutex<Board>,
    pub(crate) decay: Duration,
    pub(crate) ejection: Ejection,
    /// How long the slots a replica showed by interrupting a stream hold (zero: not learned).
    pub(crate) interruption_hold: Duration,
}

impl Health {
    pub(crate) fn new(
        n: usize,
        decay: Duration,
        ejection: Ejection,
        interruption_hold: Duration,
    ) -> Self {
        let now = Instant::now();
        Health {
            board: Mutex::new(Board {
                replicas: (0..n).map(|_| Replica::new(now)).collect(),
                next_id: 0,
                line: Line::default(),
            }),
            decay,
            ejection,
            interruption_hold,
        }
    }

    pub(crate) fn board(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes a slot on `replica`; `waiting`: the attempt waits for a first token the hedge
    /// will report.
    pub(crate) fn start(
        self: &Arc<Self>,
        board: &mut Board,
        replica: usize,
        waiting: bool,
    ) -> Ticket {
        let id = board.next_id;
        board.next_id += 1;
        let now = Instant::now();
        let r = &mut board.replicas[replica];
        r.active += 1;
        r.newest = (id, now);
        if waiting {
            r.waiting.push((id, now));
        }
        Ticket {
            health: self.clone(),
            replica,
            id,
            sent_at: now,
            released: AtomicBool::new(false),
            streamed: AtomicBool::new(false),
            interrupted: AtomicBool::new(false),
        }
    }
}

/// One attempt's claim on a replica: settled once by the hedge through the attempt protocol
/// (or by the set itself), its slot released once when the last handle of the attempt goes.
#[derive(Debug)]
pub(crate) struct Ticket {
    health: Arc<Health>,
    replica: usize,
    id: u64,
    sent_at: Instant,
    released: AtomicBool,
    /// The attempt got its first token (it counts in its replica's `streaming`).
    streamed: AtomicBool,
    /// The replica ended the attempt, before its first token, for a newer one (see
    /// [`interruption`](Ticket::interruption)): no try of it.
    interrupted: AtomicBool,
}

impl AttemptClaim for Ticket {
    /// Settles the attempt, if it still waits: feeds the score and the ejection state.
    fn settle(&self, how: Settle) {
        let now = Instant::now();
        let h = &self.health;
        let mut board = h.board();
        let r = &mut board.replicas[self.replica];
        let Some(pos) = r.waiting.iter().position(|(id, _)| *id == self.id) else {
            return;
        };
        r.waiting.swap_remove(pos);
        let waited = now.saturating_duration_since(self.sent_at).as_secs_f64();
        // An interruption is no news of the replica's speed or health (see `interruption`).
        let interrupted = how == Settle::Empty && self.interruption(r, now);
        self.interrupted.store(interrupted, Ordering::Release);
        match how {
            _ if interrupted => {}
            Settle::Token => {
                r.sample(waited, false, now, h.decay);
                r.eject.succeeded();
                if !self.released.load(Ordering::Acquire) {
                    self.streamed.store(true, Ordering::Release);
                    r.streaming += 1;
                    if r.streaming >= 2 {
                        // Two streams at once: whatever ends one of them, it is no
                        // single-slot server making room for a newer request.
                        r.concurrent_at = Some(now);
                        r.one_at_a_time = None;
                        r.interruptions = 0;
                    }
                }
            }
            Settle::Cancelled => r.sample(waited, true, now, h.decay),
            Settle::Failed | Settle::Empty => {
                // No token after `waited`: for the next attempt the first token takes at
                // least that long (a quick failure says nothing of time; a server interrupted
                // seconds in by traffic the set cannot see looks as slow as it is).
                r.sample(waited, true, now, h.decay);
                r.unpause();
                r.eject.failed();
            }
            // `Answered`, `Ended`, and any kind a later core adds: no sample.
            _ => {}
        }
        if !interrupted
            && matches!(
                how,
                Settle::Token | Settle::Cancelled | Settle::Failed | Settle::Empty
            )
        {
            review(&mut board.replicas, self.replica, h, now);
        }
        drop(board);
        if matches!(how, Settle::Failed | Settle::Empty) {
            // The attempt is over: the replica answered it (a status, an error, a bare
            // `[DONE]`) or broke it off. Its body may live on as the hedge's kept failure,
            // never read to its end; holding the slot until then kept a single-slot replica
            // from the line for seconds (issue 29's interrupt runs).
            self.release();
        }
    }

    /// The stream, past its first token, was cut short (or, said by the attempt's body, broke
    /// off in a transport error): perhaps an interruption (see
    /// [`interruption`](Ticket::interruption)). Without this a replica whose every stream of
    /// ours got its first token before a newer one interrupted it never showed its one slot,
    /// and each newer attempt placed beside a stream broke it (issue 29's interrupt runs).
    fn cut_short(&self) {
        let now = Instant::now();
        let mut board = self.health.board();
        self.interruption(&mut board.replicas[self.replica], now);
    }

    /// An attempt the replica interrupted for a newer one is no try of it: the request's next
    /// attempt may wait for its slot rather than go to a replica it knows to be slower (issue
    /// 29's interrupt runs: the failover took the only replica not tried, the one busy with
    /// traffic the set cannot see, and waited seconds there).
    fn counts_as_tried(&self) -> bool {
        !self.interrupted.load(Ordering::Acquire)
    }

    /// The least a backup would wait when every replica not `tried` is known to be slow
    /// ([`Replica::known_slow`]: waits cut short, probes on that bound since, no first token):
    /// the hedge then holds the backup until the attempt it backs up has waited that long. Issue
    /// 29's real bench: requests queued on the one free single-slot replica in a burst were
    /// backed up past the adaptive delay on the other, kept busy by traffic the set cannot
    /// see, where each waited seconds and lost (5 of a run's 8 extra attempts).
    fn backup_wait(&self, tried: &[ReplicaId]) -> Option<Duration> {
        let now = Instant::now();
        let board = self.health.board();
        let untried = (0..board.replicas.len()).filter(|&i| !tried.contains(&ReplicaId(i as u64)));
        let mut least: Option<f64> = None;
        for i in untried {
            let secs = board.replicas[i].known_slow(now)?;
            least = Some(least.map_or(secs, |l| l.min(secs)));
        }
        least.and_then(|s| Duration::try_from_secs_f64(s).ok())
    }
}

impl Ticket {
    /// Reads the end of this attempt's stream (without a token, broken off by a transport
    /// error, or cut short after its first token) as an interruption, if the set sent replica
    /// `r` a newer attempt within the last [`INTERRUPTION_WINDOW`] that still holds its slot: a
    /// single-slot server (llama-cpp-python's default) ends the running stream when a newer
    /// request arrives, before or after its first token. The replica then showed it serves one
    /// attempt at a time, and is given one at a time for the hold (renewed by each
    /// interruption): placing more would only interrupt another stream, while waiting in the
    /// set for its slot costs nothing it could have served. An interruption is not a failure
    /// of the replica.
    ///
    /// An end with no newer attempt just before it (an empty answer, a reset, an interruption
    /// by traffic the set does not see) says nothing of slots, nor does one on a replica seen
    /// streaming two attempts at once within the hold (it serves several at a time; under load
    /// a newer attempt is always just placed when one of its streams breaks).
    fn interruption(&self, r: &mut Replica, now: Instant) -> bool {
        let hold = self.health.interruption_hold;
        let mine = u32::from(!self.released.load(Ordering::Acquire));
        let (newest, at) = r.newest;
        let recent = now.saturating_duration_since(at) <= INTERRUPTION_WINDOW;
        // A replica seen streaming two attempts at once within the hold serves several at
        // a time: under load, some newer attempt is always just placed when a stream breaks.
        let concurrent = r.seen_concurrent(now, hold);
        if hold.is_zero() || concurrent || newest <= self.id || !recent || r.active <= mine {
            return false;
        }
        // Each interruption since the replica last streamed two at once doubles the hold (up to
        // 64 times), as Envoy lengthens an ejection: a server that interrupts again once its
        // hold is over is an interrupting server, and each relearning costs a client its
        // stream. A hold of the configured length still lets a replica misread once recover.
        let hold = hold.saturating_mul(1 << r.interruptions.min(MAX_HOLD_DOUBLINGS));
        r.interruptions = r.interruptions.saturating_add(1);
        r.one_at_a_time = Some(now + hold);
        metrics::counter!("tailguard_route_interruptions_total",
            "replica" => self.replica.to_string())
        .increment(1);
        tracing::info!(
            replica = self.replica,
            hold_s = hold.as_secs_f64(),
            "tailguard-route: replica ended a stream for a newer attempt; placing one at a time"
        );
        true
    }

    /// Releases the slot (the attempt's body ended or was dropped).
    ///
    /// Called by the attempt's guard, and when the attempt failed; the first call counts.
    pub(crate) fn release(&self) {
        if self.released.swap(true, Ordering::AcqRel) {
            return;
        }
        let held = self.sent_at.elapsed().as_secs_f64();
        let waiters = {
            let mut board = self.health.board();
            let r = &mut board.replicas[self.replica];
            r.active = r.active.saturating_sub(1);
            if self.streamed.load(Ordering::Acquire) {
                r.streaming = r.streaming.saturating_sub(1);
            }
            r.held(held);
            board.line.wakers()
        };
        for w in waiters {
            w.wake();
        }
    }
}

impl Drop for Ticket {
    /// Nobody settled the attempt (its request went around the hedge, or over its replay cap):
    /// no sample.
    fn drop(&mut self) {
        self.settle(Settle::Ended);
    }
}

/// Decides, after news about replica `i`, whether it is ejected now.
fn review(replicas: &mut [Replica], i: usize, health: &Health, now: Instant) {
    let cfg = &health.ejection;
    if !cfg.enabled || replicas[i].eject.is_ejected(now) {
        return;
    }
    let others_in = (0..replicas.len())
        .filter(|&j| j != i && !replicas[j].eject.is_ejected(now))
        .count();
    // The panic threshold: at least half of the set stays in selection after this ejection.
    if others_in == 0 || others_in * 2 < replicas.len() {
        return;
    }
    let reason = if cfg.consecutive_failures > 0
        && replicas[i].eject.consecutive >= cfg.consecutive_failures
    {
        "failures"
    } else if is_slow(replicas, i, health, now) {
        "slow"
    } else {
        return;
    };
    let period = replicas[i].eject.eject(cfg, now);
    metrics::counter!("tailguard_hedge_ejections_total",
        "replica" => i.to_string(), "reason" => reason)
    .increment(1);
    tracing::warn!(
        replica = i,
        reason,
        period_s = period.as_secs_f64(),
        "tailguard-hedge: replica ejected from primary selection"
    );
}

fn is_slow(replicas: &mut [Replica], i: usize, health: &Health, now: Instant) -> bool {
    if !health.ejection.slow_factor.is_finite() {
        return false;
    }
    let mine = replicas[i].estimate(now, health.decay);
    if mine < health.ejection.slow_min.as_secs_f64() {
        return false;
    }
    let mut others = Vec::with_capacity(replicas.len());
    for (j, r) in replicas.iter_mut().enumerate() {
        if j != i && !r.eject.is_ejected(now) {
            others.push(r.estimate(now, health.decay));
        }
    }
    others.sort_by(f64::total_cmp);
    let Some(median) = others.get(others.len() / 2) else {
        return false;
    };
    mine > health.ejection.slow_factor * median
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Replicas whose first tokens took `secs` (one sample each), `failing` of them with five
    /// failures in a row, reviewed in order; which ended up ejected.
    fn ejected_after(secs: &[f64], failing: usize, ejection: Ejection) -> Vec<bool> {
        let now = Instant::now();
        let decay = Duration::from_secs(10);
        let health = Health::new(secs.len(), decay, ejection, Duration::ZERO);
        let mut board = health.board();
        for (r, s) in board.replicas.iter_mut().zip(secs) {
            r.sample(*s, false, now, decay);
        }
        for i in 0..failing {
            for _ in 0..5 {
                board.replicas[i].eject.failed();
            }
        }
        for i in 0..secs.len() {
            review(&mut board.replicas, i, &health, now);
        }
        board
            .replicas
            .iter_mut()
            .map(|r| r.eject.is_ejected(now))
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn slowness_alone_never_ejects_by_default() {
        let got = ejected_after(&[0.1, 0.1, 30.0], 0, Ejection::new());
        assert_eq!(got, [false, false, false]);
        // Opted in: the slow one goes.
        let opted = Ejection::new().with_slow_factor(5.0);
        assert_eq!(
            ejected_after(&[0.1, 0.1, 30.0], 0, opted),
            [false, false, true]
        );
    }

    #[tokio::test(start_paused = true)]
    async fn ejection_keeps_at_least_half_of_the_set_in_selection() {
        let secs = [0.1; 4];
        // Four failing: two are ejected, two stay.
        assert_eq!(
            ejected_after(&secs, 4, Ejection::new()),
            [true, true, false, false]
        );
        // Three replicas, all failing: one.
        assert_eq!(
            ejected_after(&secs[..3], 3, Ejection::new()),
            [true, false, false]
        );
        // Two: one; one: never.
        assert_eq!(ejected_after(&secs[..2], 2, Ejection::new()), [true, false]);
        assert_eq!(ejected_after(&secs[..1], 1, Ejection::new()), [false]);
    }
}
