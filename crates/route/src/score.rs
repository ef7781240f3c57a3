//! What a [`ReplicaSet`](crate::ReplicaSet) knows about each replica: attempts waiting for a
//! first token, a peak-EWMA of recent times to first token, slots held, and ejection state.
//!
//! Why not tower's `load::PeakEwma`: it measures a request until its response future resolves
//! (the response head), which a streaming LLM server sends at once; the time that matters is
//! the time to the first token, which only the hedge sees. The decay rule is tower's (an
//! estimate decays towards zero with time, a sample above it replaces it).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::Waker;
use std::time::Duration;

use tokio::time::Instant;

use crate::eject::{Ejection, Ejector};

/// Added to every estimate, so that with no samples yet the number of waiting attempts
/// decides (as tower's default RTT does).
const PRIOR_SECS: f64 = 0.001;

/// One replica's state.
#[derive(Debug)]
pub(crate) struct Replica {
    /// Attempts sent and not yet settled (token, failure, cancellation): id and send time.
    waiting: Vec<(u64, Instant)>,
    /// The peak-EWMA estimate of the time to first token, in seconds, as of `at`.
    estimate: f64,
    at: Instant,
    /// Attempts holding a slot (from the call until their body ends or is dropped).
    pub(crate) active: u32,
    pub(crate) eject: Ejector,
}

impl Replica {
    fn new(now: Instant) -> Self {
        Replica {
            waiting: Vec::new(),
            estimate: 0.0,
            at: now,
            active: 0,
            eject: Ejector::default(),
        }
    }

    /// The estimate decayed to `now`, in seconds.
    pub(crate) fn estimate(&self, now: Instant, decay: Duration) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.estimate * (-elapsed / decay.as_secs_f64().max(1e-9)).exp()
    }

    /// The expected wait of one more attempt: the estimate, raised to the longest wait of an
    /// attempt still waiting (a censored sample: it takes at least that long), times the
    /// attempts that would then be waiting.
    pub(crate) fn score(&self, now: Instant, decay: Duration) -> f64 {
        let longest = self
            .waiting
            .iter()
            .map(|(_, t)| now.saturating_duration_since(*t).as_secs_f64())
            .fold(0.0, f64::max);
        let expected = self.estimate(now, decay).max(longest) + PRIOR_SECS;
        expected * (self.waiting.len() + 1) as f64
    }

    /// A time to first token (or, `censored`, a wait of at least that long).
    fn sample(&mut self, secs: f64, censored: bool, now: Instant, decay: Duration) {
        let current = self.estimate(now, decay);
        let next = if secs >= current {
            // Peak: a slower sample (or a longer censored wait) replaces the estimate.
            secs
        } else if censored {
            // A lower bound below the estimate says nothing new.
            current
        } else {
            let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
            let w = (-elapsed / decay.as_secs_f64().max(1e-9)).exp();
            current * w + secs * (1.0 - w)
        };
        self.estimate = next;
        self.at = now;
    }
}

/// How an attempt ended, as far as its replica's score is concerned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Settle {
    /// Its first token arrived: a sample.
    Token,
    /// It failed before its first token.
    Failed,
    /// The hedge committed to it without a token (an answer about the request): no sample.
    Answered,
    /// Dropped while still waiting (a loser, or the client went away): a censored sample.
    Cancelled,
    /// Its stream ended with nobody settling it (sent around the hedge): no sample.
    Ended,
}

/// The state of a whole set, under one lock (picks compare every replica anyway).
#[derive(Debug)]
pub(crate) struct Board {
    pub(crate) replicas: Vec<Replica>,
    next_id: u64,
    /// Calls waiting for a free slot.
    waiters: Vec<Waker>,
}

/// The shared state of a [`ReplicaSet`](crate::ReplicaSet).
#[derive(Debug)]
pub(crate) struct Health {
    board: Mutex<Board>,
    pub(crate) decay: Duration,
    pub(crate) ejection: Ejection,
}

impl Health {
    pub(crate) fn new(n: usize, decay: Duration, ejection: Ejection) -> Self {
        let now = Instant::now();
        Health {
            board: Mutex::new(Board {
                replicas: (0..n).map(|_| Replica::new(now)).collect(),
                next_id: 0,
                waiters: Vec::new(),
            }),
            decay,
            ejection,
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
        if waiting {
            r.waiting.push((id, now));
        }
        Ticket {
            health: self.clone(),
            replica,
            id,
            sent_at: now,
        }
    }

    /// Parks `waker` until a slot is released.
    pub(crate) fn park(board: &mut Board, waker: &Waker) {
        if !board.waiters.iter().any(|w| w.will_wake(waker)) {
            board.waiters.push(waker.clone());
        }
    }
}

/// One attempt's claim on a replica: settled once by the hedge (or by the set itself), its
/// slot released once when the last handle of the attempt goes.
#[derive(Debug)]
pub(crate) struct Ticket {
    health: Arc<Health>,
    replica: usize,
    id: u64,
    sent_at: Instant,
}

impl Ticket {
    /// Settles the attempt, if it still waits: feeds the score and the ejection state.
    pub(crate) fn settle(&self, how: Settle) {
        let now = Instant::now();
        let h = &self.health;
        let mut board = h.board();
        let r = &mut board.replicas[self.replica];
        let Some(pos) = r.waiting.iter().position(|(id, _)| *id == self.id) else {
            return;
        };
        r.waiting.swap_remove(pos);
        let waited = now.saturating_duration_since(self.sent_at).as_secs_f64();
        match how {
            Settle::Token => {
                r.sample(waited, false, now, h.decay);
                r.eject.succeeded();
            }
            Settle::Cancelled => r.sample(waited, true, now, h.decay),
            Settle::Failed => r.eject.failed(),
            Settle::Answered | Settle::Ended => {}
        }
        if matches!(how, Settle::Token | Settle::Cancelled | Settle::Failed) {
            crate::eject::review(&mut board.replicas, self.replica, h, now);
        }
    }

    /// Releases the slot (the attempt's body ended or was dropped).
    ///
    /// Called once, by the attempt's guard.
    pub(crate) fn release(&self) {
        let waiters = {
            let mut board = self.health.board();
            let r = &mut board.replicas[self.replica];
            r.active = r.active.saturating_sub(1);
            std::mem::take(&mut board.waiters)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn peak_ewma_rises_at_once_and_decays_with_time() {
        let decay = Duration::from_secs(10);
        let mut r = Replica::new(Instant::now());
        let now = Instant::now();
        r.sample(2.0, false, now, decay);
        assert!((r.estimate(now, decay) - 2.0).abs() < 1e-9);
        // A lower censored wait says nothing; a lower sample pulls the estimate down a little.
        r.sample(0.5, true, now, decay);
        assert!((r.estimate(now, decay) - 2.0).abs() < 1e-9);
        let later = now + Duration::from_secs(10);
        assert!((r.estimate(later, decay) - 2.0 / std::f64::consts::E).abs() < 1e-6);
        r.sample(0.1, false, later, decay);
        let e = r.estimate(later, decay);
        assert!(e > 0.1 && e < 2.0 / std::f64::consts::E, "{e}");
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_attempts_raise_the_score() {
        let decay = Duration::from_secs(10);
        let mut r = Replica::new(Instant::now());
        let now = Instant::now();
        let idle = r.score(now, decay);
        r.waiting.push((0, now));
        let one = r.score(now, decay);
        assert!(one > idle);
        // The longest wait counts as a lower bound of the estimate.
        let later = now + Duration::from_secs(3);
        assert!(r.score(later, decay) >= 2.0 * 3.0);
    }
}
