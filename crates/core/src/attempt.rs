//! What each attempt of a hedged request tells the services below it.

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::score::{Settle, Ticket};

/// The header `FirstTokenHedge` sets on every attempt it sends: the attempt index, `0` for the
/// primary, `1` for the first backup, and so on.
pub const ATTEMPT_HEADER: &str = "x-tailguard-attempt";

/// Identifies one replica (an upstream endpoint) for the purpose of "not tried yet".
///
/// A routing layer chooses what the number means: an index into its endpoint list, a hash of
/// the endpoint address, a key from service discovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(pub u64);

/// Which attempt of a hedged request this is, and which replicas earlier attempts went to.
///
/// `FirstTokenHedge` inserts an `Attempt` into the request extensions of every attempt it sends
/// (the primary included). A routing layer below it (a balancer, [`ReplicaSet`]) reads it to
/// send a backup to a replica that has not been tried, and [`record`](Attempt::record)s the
/// replica it picked so that later attempts of the same request can avoid it. All attempts of
/// one request share the record.
///
/// [`ReplicaSet`]: crate::ReplicaSet
#[derive(Clone)]
pub struct Attempt {
    number: u8,
    tried: Arc<Mutex<Record>>,
}

/// What the attempts of one request share.
#[derive(Default)]
struct Record {
    tried: Vec<ReplicaId>,
    /// A [`ReplicaSet`](crate::ReplicaSet)'s claim per attempt number, settled by the hedge.
    tickets: Vec<(u8, Arc<Ticket>)>,
}

impl Attempt {
    /// The primary attempt of a new request, with nothing tried yet.
    pub fn primary() -> Self {
        Attempt {
            number: 0,
            tried: Arc::default(),
        }
    }

    /// The next attempt of the same request, sharing the record of replicas tried.
    pub(crate) fn with_number(&self, number: u8) -> Self {
        Attempt {
            number,
            tried: self.tried.clone(),
        }
    }

    /// The attempt index: `0` for the primary, `1` for the first backup, and so on.
    pub fn number(&self) -> u8 {
        self.number
    }

    /// Whether this attempt is a backup (not the primary).
    pub fn is_backup(&self) -> bool {
        self.number > 0
    }

    fn lock(&self) -> MutexGuard<'_, Record> {
        self.tried.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that this attempt went to `replica`.
    pub fn record(&self, replica: ReplicaId) {
        let mut r = self.lock();
        if !r.tried.contains(&replica) {
            r.tried.push(replica);
        }
    }

    /// Whether an attempt of this request already went to `replica`.
    pub fn was_tried(&self, replica: ReplicaId) -> bool {
        self.lock().tried.contains(&replica)
    }

    /// The replicas attempts of this request went to, in the order they were recorded.
    pub fn tried(&self) -> Vec<ReplicaId> {
        self.lock().tried.clone()
    }

    /// Binds this attempt to a replica set's claim, for [`settle`](Self::settle).
    pub(crate) fn bind(&self, ticket: Arc<Ticket>) {
        self.lock().tickets.push((self.number, ticket));
    }

    /// Tells the replica set how attempt `number` ended before (or at) its first token.
    pub(crate) fn settle(&self, number: u8, how: Settle) {
        let ticket = {
            let mut r = self.lock();
            let pos = r.tickets.iter().position(|(n, _)| *n == number);
            pos.map(|p| r.tickets.swap_remove(p).1)
        };
        if let Some(t) = ticket {
            t.settle(how);
        }
    }
}

impl fmt::Debug for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempt")
            .field("number", &self.number)
            .field("tried", &self.tried())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attempts_share_the_tried_record() {
        let primary = Attempt::primary();
        assert!(!primary.is_backup());
        primary.record(ReplicaId(3));
        let backup = primary.with_number(1);
        assert!(backup.is_backup());
        assert!(backup.was_tried(ReplicaId(3)));
        backup.record(ReplicaId(1));
        backup.record(ReplicaId(1));
        assert_eq!(primary.tried(), vec![ReplicaId(3), ReplicaId(1)]);
    }
}
