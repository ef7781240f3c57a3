//! The line of attempts waiting in a [`ReplicaSet`](crate::ReplicaSet) for a slot: the oldest
//! request goes first.
//!
//! When a slot frees, every waiter is woken and places itself again; a waiter may take a slot
//! only when no older waiter that would take that replica is still in line. So the slot goes
//! to the oldest request that wants it, whatever order the runtime polls the waiters in (tokio
//! runs the most recently woken task first), and an attempt that has waited longest is not
//! overtaken by newer ones, its own request's backups included: they take the request's age
//! ([`Attempt::since`](tailguard_core::attempt::Attempt::since)).

use std::sync::Arc;
use std::task::Waker;

use tokio::time::Instant;

use crate::health::Health;

/// A waiter's place in line: the age of its request, then the order it joined in.
pub(crate) type Key = (Instant, u64);

#[derive(Debug)]
struct Entry {
    key: Key,
    waker: Waker,
    /// The replicas it would take a slot on.
    wants: Vec<usize>,
}

/// The attempts waiting for a slot.
#[derive(Debug, Default)]
pub(crate) struct Line {
    entries: Vec<Entry>,
    joined: u64,
}

impl Line {
    /// Puts the waiter at `key` in line (or updates its waker and wants), and returns its
    /// key (a first join gets one).
    pub(crate) fn wait(
        &mut self,
        key: Option<Key>,
        since: Instant,
        waker: &Waker,
        wants: Vec<usize>,
    ) -> Key {
        if let Some(k) = key
            && let Some(e) = self.entries.iter_mut().find(|e| e.key == k)
        {
            if !e.waker.will_wake(waker) {
                e.waker = waker.clone();
            }
            e.wants = wants;
            return k;
        }
        let key = key.unwrap_or_else(|| {
            self.joined += 1;
            (since, self.joined)
        });
        self.entries.push(Entry {
            key,
            waker: waker.clone(),
            wants,
        });
        key
    }

    /// How many waiters older than `key` (every waiter, for a caller not in line yet) would
    /// take a slot on `replica`.
    pub(crate) fn ahead(&self, key: Option<Key>, since: Instant, replica: usize) -> usize {
        let mine = key.unwrap_or((since, u64::MAX));
        self.entries
            .iter()
            .filter(|e| e.key < mine && e.wants.contains(&replica))
            .count()
    }

    /// Takes the waiter at `key` out of line; the others' wakers, to wake once the lock is
    /// released: the slots it was ahead for may be theirs now.
    pub(crate) fn leave(&mut self, key: Key) -> Vec<Waker> {
        let before = self.entries.len();
        self.entries.retain(|e| e.key != key);
        if self.entries.len() == before {
            return Vec::new();
        }
        self.wakers()
    }

    /// Every waiter's waker (a slot freed: each places itself again).
    pub(crate) fn wakers(&self) -> Vec<Waker> {
        self.entries.iter().map(|e| e.waker.clone()).collect()
    }
}

/// An attempt's place in line, held by its response future: leaving when it is placed, or
/// when the future is dropped while waiting (a lost race, a client gone), so that a waiter
/// never holds up the line after it stopped waiting.
#[derive(Debug)]
pub(crate) struct Spot {
    health: Arc<Health>,
    /// When the request started: its attempt's [`since`](tailguard_core::attempt::Attempt::since),
    /// or when the set was called, for a request sent around the hedge.
    pub(crate) since: Instant,
    pub(crate) key: Option<Key>,
    /// Until when it waits for a replica it prefers while another has room.
    pub(crate) patience: Option<Instant>,
}

impl Spot {
    pub(crate) fn new(health: Arc<Health>, since: Instant) -> Self {
        Spot {
            health,
            since,
            key: None,
            patience: None,
        }
    }

    /// Leaves the line, if in it.
    pub(crate) fn leave(&mut self) {
        if let Some(key) = self.key.take() {
            let wakers = self.health.board().line.leave(key);
            for w in wakers {
                w.wake();
            }
        }
    }
}

impl Drop for Spot {
    fn drop(&mut self) {
        self.leave();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Waker;

    #[tokio::test(start_paused = true)]
    async fn older_requests_are_ahead_and_leaving_frees_the_place() {
        let mut line = Line::default();
        let t0 = Instant::now();
        let t1 = t0 + std::time::Duration::from_secs(1);
        let w = Waker::noop();
        // A younger request joins first; an older one (a backup of an earlier request) after.
        let young = line.wait(None, t1, w, vec![0, 1]);
        let old = line.wait(None, t0, w, vec![1]);
        assert_eq!(line.ahead(Some(young), t1, 1), 1);
        assert_eq!(line.ahead(Some(young), t1, 0), 0);
        assert_eq!(line.ahead(Some(old), t0, 1), 0);
        // A newcomer is behind everyone who wants the replica.
        assert_eq!(line.ahead(None, t1, 1), 2);
        // Updating keeps the place; leaving frees it and hands out the others' wakers.
        assert_eq!(line.wait(Some(old), t0, w, vec![0]), old);
        assert_eq!(line.ahead(Some(young), t1, 1), 0);
        assert_eq!(line.leave(old).len(), 1);
        assert!(line.leave(old).is_empty());
        assert_eq!(line.ahead(None, t1, 0), 1);
    }
}
