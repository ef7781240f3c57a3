//! The attempt protocol: what a layer that sends several attempts of one request (the hedge)
//! tells whatever places each attempt on a replica (a balancer, `tailguard-route`'s
//! `ReplicaSet`, a user's own placer), and how each attempt ended before its first token.
//!
//! The sender inserts an [`Attempt`] into every attempt's request extensions (and sets
//! [`ATTEMPT_HEADER`]). A placer below reads it to avoid the replicas earlier attempts of the
//! same request went to, [`record`](Attempt::record)s the replica it picked, and may
//! [`bind`](Attempt::bind) an [`AttemptClaim`] of its own to the attempt. The sender, which
//! reads each attempt's response up to its first token, [`settle`](Attempt::settle)s the
//! attempt once it knows how it went ([`Settle`]): its first token arrived, it failed before
//! one, or it was answered without one. The claim hears of it, and so the placer learns each
//! replica's time to first token, which a placer sees nothing of on its own (a streaming
//! server sends its response head at once). Before it backs an attempt up after a delay, the
//! sender asks how long a backup would wait at the least ([`Attempt::backup_wait`]), which a
//! placer that knows every other replica to be slow answers.
//!
//! ```
//! use std::sync::{Arc, Mutex};
//! use tailguard_core::attempt::{Attempt, AttemptClaim, ReplicaId, Settle};
//!
//! /// A placer's claim: here it only keeps what it was told.
//! #[derive(Debug, Default)]
//! struct Heard(Mutex<Vec<Settle>>);
//!
//! impl AttemptClaim for Heard {
//!     fn settle(&self, how: Settle) {
//!         self.0.lock().unwrap().push(how);
//!     }
//! }
//!
//! // The sender: the primary attempt of a new request.
//! let primary = Attempt::primary();
//! // The placer: the attempt goes to replica 3, and it listens for how it ends.
//! let heard = Arc::new(Heard::default());
//! primary.record(ReplicaId(3));
//! primary.bind(heard.clone());
//! // The sender: a backup of the same request shares the record of replicas tried.
//! let backup = primary.next(1);
//! assert!(backup.was_tried(ReplicaId(3)));
//! // The sender: the primary's first token arrived.
//! primary.settle(Settle::Token);
//! assert_eq!(*heard.0.lock().unwrap(), [Settle::Token]);
//! ```

use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

/// The header the hedge sets on every attempt it sends: the attempt index, `0` for the primary,
/// `1` for the first backup, and so on.
pub const ATTEMPT_HEADER: &str = "x-tailguard-attempt";

/// Identifies one replica (an upstream endpoint) for the purpose of "not tried yet".
///
/// A placer chooses what the number means: an index into its endpoint list, a hash of the
/// endpoint address, a key from service discovery.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(pub u64);

/// How an attempt ended, as far as the replica it was placed on is concerned.
///
/// The sender settles an attempt with [`Token`](Settle::Token), [`Failed`](Settle::Failed),
/// [`Empty`](Settle::Empty) or [`Answered`](Settle::Answered); a placer settles its own claims with
/// [`Failed`](Settle::Failed) (the replica's service returned an error),
/// [`Cancelled`](Settle::Cancelled) (the attempt was dropped while it still waited) and
/// [`Ended`](Settle::Ended) (nobody settled it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Settle {
    /// Its first token arrived: a time-to-first-token sample.
    Token,
    /// It failed before its first token (transport error, retryable status, in-band error,
    /// junk).
    Failed,
    /// The sender committed to it without a token (an answer about the request itself, such as
    /// a `400`): no sample.
    Answered,
    /// Dropped while it still waited for its first token (a losing attempt, or the client went
    /// away): a censored sample, the token takes at least that long.
    Cancelled,
    /// Its stream ended with nobody settling it (the request went around the sender): no
    /// sample.
    Ended,
    /// Its stream ended cleanly without a token: an empty answer, or a single-slot server that
    /// ends the running stream when a newer request arrives (llama.cpp's bare `[DONE]`). A
    /// placer may read it as a failure, or, when it sent the replica a newer attempt meanwhile,
    /// as the replica's word on how many attempts it serves at once.
    Empty,
}

/// A placer's claim on one attempt: told how the attempt ended before (or at) its first token.
///
/// A placer binds a claim to an attempt with [`Attempt::bind`]; the sender settles it with
/// [`Attempt::settle`]. A claim may be told more than once (by the sender, and by the placer
/// itself when the attempt's body is dropped): the first word is the one that counts, and a
/// claim should ignore the others.
pub trait AttemptClaim: Send + Sync {
    /// Tells the claim how the attempt ended.
    fn settle(&self, how: Settle);

    /// Tells the claim that the attempt's stream, past its first token, ended without saying
    /// how its answer ended (a terminal event with no finish reason, see
    /// [`Attempt::cut_short`]): a single-slot server may have made room for a newer request.
    /// Nothing by default.
    fn cut_short(&self) {}

    /// Whether the attempt counts as a try of its replica, asked once the sender settled it
    /// (see [`Attempt::settle`]): `false` when the replica ended it for a reason of its own,
    /// not for being slow or broken (a single-slot server ended it for a newer request), so
    /// that a later attempt of the same request may go there again. `true` by default.
    fn counts_as_tried(&self) -> bool {
        true
    }

    /// How long a backup of the request would wait for its first token at the least, as far
    /// as the placer knows, wherever it would place the backup now (the replicas `tried`
    /// excluded): `Some` only when every replica a backup could go to is known to take at
    /// least that long. A sender holds the backup until the attempt it would back up has
    /// waited as long (see [`Attempt::backup_wait`]). `None` by default: no such knowledge.
    fn backup_wait(&self, tried: &[ReplicaId]) -> Option<Duration> {
        let _ = tried;
        None
    }
}

/// Which attempt of a request this is, and which replicas earlier attempts went to.
///
/// `FirstTokenHedge` inserts an `Attempt` into the request extensions of every attempt it sends
/// (the primary included). A placer below it (a balancer, `tailguard-route`'s `ReplicaSet`)
/// reads it to send a backup to a replica that has not been tried, and
/// [`record`](Attempt::record)s the replica it picked so that later attempts of the same
/// request can avoid it. All attempts of one request share the record. See the
/// [module docs](self) for the whole protocol.
#[derive(Clone)]
pub struct Attempt {
    number: u8,
    since: Instant,
    shared: Arc<Mutex<Record>>,
}

/// What the attempts of one request share.
#[derive(Default)]
struct Record {
    /// The replicas tried, each with the number of the attempt that went there.
    tried: Vec<(u8, ReplicaId)>,
    /// The placer sent the primary on a stale estimate (see [`Attempt::mark_probe`]).
    probe: bool,
    /// The attempt the placer marked a probe against an alternative, and how soon it expected
    /// a first token there (see [`Attempt::mark_probe_against`]).
    alternative: Option<(u8, Duration)>,
    /// The claims bound to each attempt number, and whether the sender settled each; kept
    /// after the settle for [`Attempt::cut_short`].
    claims: Vec<(u8, Arc<dyn AttemptClaim>, bool)>,
}

impl Attempt {
    /// The primary attempt of a new request, with nothing tried yet.
    pub fn primary() -> Self {
        Attempt {
            number: 0,
            since: Instant::now(),
            shared: Arc::default(),
        }
    }

    /// Attempt `number` of the same request, sharing the record of replicas tried and the
    /// claims bound so far.
    pub fn next(&self, number: u8) -> Self {
        Attempt {
            number,
            since: self.since,
            shared: self.shared.clone(),
        }
    }

    /// When the request's primary attempt was made (every attempt of the request shares it):
    /// the request's place in a line, so that a placer that holds attempts for a slot can
    /// serve the oldest request first, its backups included.
    pub fn since(&self) -> Instant {
        self.since
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
        self.shared.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that this attempt went to `replica`.
    pub fn record(&self, replica: ReplicaId) {
        let mut r = self.lock();
        if !r.tried.iter().any(|(_, t)| *t == replica) {
            r.tried.push((self.number, replica));
        }
    }

    /// Whether an attempt of this request already went to `replica` (and counts as a try of
    /// it, see [`AttemptClaim::counts_as_tried`]).
    pub fn was_tried(&self, replica: ReplicaId) -> bool {
        self.lock().tried.iter().any(|(_, t)| *t == replica)
    }

    /// The replicas attempts of this request went to, in the order they were recorded.
    pub fn tried(&self) -> Vec<ReplicaId> {
        self.lock().tried.iter().map(|(_, t)| *t).collect()
    }

    /// Marks the request a probe: the placer sent its primary to a replica chosen on an
    /// estimate that only decayed with time since the replica was last seen slow (what it
    /// last knew would have sent the attempt elsewhere). That is how a placer learns that a
    /// replica recovered, and the risk of it is the placer's, not the request's: a hedge backs
    /// a probe up at its delay even when its budget is spent.
    pub fn mark_probe(&self) {
        self.lock().probe = true;
    }

    /// Whether the request is a probe (see [`mark_probe`](Self::mark_probe)).
    pub fn is_probe(&self) -> bool {
        self.lock().probe
    }

    /// Marks the request a probe, as [`mark_probe`](Self::mark_probe) does, and says how soon
    /// the placer expected a first token on the replica it would otherwise have chosen, on
    /// what it knows of that one. A sender may back the probe up once it has waited well past
    /// that without a token: the probed replica is then no faster than the alternative, which
    /// is what the placer wanted to learn, and the request need not pay for the lesson.
    pub fn mark_probe_against(&self, alternative: Duration) {
        let mut r = self.lock();
        r.probe = true;
        r.alternative = Some((self.number, alternative));
    }

    /// How soon the placer expected a first token elsewhere when it marked this attempt a
    /// probe (see [`mark_probe_against`](Self::mark_probe_against)); `None` for any other
    /// attempt of the request.
    pub fn probe_alternative(&self) -> Option<Duration> {
        let r = self.lock();
        r.alternative
            .filter(|(n, _)| *n == self.number)
            .map(|(_, d)| d)
    }

    /// Binds a placer's `claim` to this attempt, to be told how it ends (see
    /// [`settle`](Self::settle)).
    pub fn bind(&self, claim: Arc<dyn AttemptClaim>) {
        self.lock().claims.push((self.number, claim, false));
    }

    /// Tells the claim bound to this attempt how it ended (the earliest bound, when several
    /// were); nothing when none is bound, or it was settled already. When the claim then says
    /// the attempt does not count as a try of its replica
    /// ([`AttemptClaim::counts_as_tried`]), the record forgets the replica this attempt went
    /// to.
    ///
    /// Called by the sender, once it knows: at the first token, at a failure before it, or
    /// when it commits to the attempt without one.
    pub fn settle(&self, how: Settle) {
        let claim = {
            let mut r = self.lock();
            let unsettled = r
                .claims
                .iter_mut()
                .find(|(n, _, settled)| *n == self.number && !*settled);
            unsettled.map(|(_, c, settled)| {
                *settled = true;
                c.clone()
            })
        };
        // Told outside the lock: a claim may take locks of its own.
        if let Some(c) = claim {
            c.settle(how);
            if !c.counts_as_tried() {
                self.lock().tried.retain(|(n, _)| *n != self.number);
            }
        }
    }

    /// How long a backup of this request would wait for its first token at the least, in the
    /// view of the placer whose claim was bound first ([`AttemptClaim::backup_wait`], asked
    /// with the replicas tried so far); `None` when no claim is bound or it does not know.
    ///
    /// A sender that backs attempts up after a delay holds a backup until the attempt it backs
    /// up has waited that long: a backup that cannot answer before the attempt already waited
    /// as long as it would is no better bet than the attempt, and only adds load (issue 29: a
    /// request queued on the one free replica was backed up on the other, kept busy by traffic
    /// nobody sees, where the backup waited seconds and lost). A failover (the attempt failed)
    /// does not ask: it replaces an attempt, it backs none up.
    pub fn backup_wait(&self) -> Option<Duration> {
        let (claim, tried) = {
            let r = self.lock();
            let claim = r.claims.first().map(|(_, c, _)| c.clone());
            (claim, r.tried.iter().map(|(_, t)| *t).collect::<Vec<_>>())
        };
        // Asked outside the lock: a claim may take locks of its own.
        claim.and_then(|c| c.backup_wait(&tried))
    }

    /// Tells the claim bound to this attempt (the earliest bound) that its stream, past its
    /// first token, was cut short: it ended with a terminal event and no finish reason (see
    /// `StreamProgress::cut_short`). Called by the sender once the stream it committed to
    /// ended; a placer may read it as the replica's word on how many attempts it serves at
    /// once, as it reads [`Settle::Empty`].
    pub fn cut_short(&self) {
        let claim = {
            let r = self.lock();
            let bound = r.claims.iter().find(|(n, _, _)| *n == self.number);
            bound.map(|(_, c, _)| c.clone())
        };
        if let Some(c) = claim {
            c.cut_short();
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
        let backup = primary.next(1);
        assert!(backup.is_backup());
        assert!(backup.was_tried(ReplicaId(3)));
        backup.record(ReplicaId(1));
        backup.record(ReplicaId(1));
        assert_eq!(primary.tried(), vec![ReplicaId(3), ReplicaId(1)]);
    }

    /// A claim whose replica ended its attempt for a reason of its own.
    struct Interrupted;

    impl AttemptClaim for Interrupted {
        fn settle(&self, _how: Settle) {}
        fn counts_as_tried(&self) -> bool {
            false
        }
    }

    #[test]
    fn an_attempt_that_does_not_count_as_a_try_is_forgotten_at_its_settle() {
        let primary = Attempt::primary();
        primary.record(ReplicaId(3));
        primary.bind(Arc::new(Interrupted));
        let backup = primary.next(1);
        backup.record(ReplicaId(1));
        assert!(backup.was_tried(ReplicaId(3)));
        primary.settle(Settle::Empty);
        // The primary's replica may take the request again; the backup's is still tried.
        assert_eq!(backup.tried(), vec![ReplicaId(1)]);
        let third = primary.next(2);
        third.record(ReplicaId(3));
        assert_eq!(primary.tried(), vec![ReplicaId(1), ReplicaId(3)]);
    }

    /// A placer's claim that knows every other replica takes at least 2 s.
    struct Busy;

    impl AttemptClaim for Busy {
        fn settle(&self, _how: Settle) {}
        fn backup_wait(&self, tried: &[ReplicaId]) -> Option<Duration> {
            (tried == [ReplicaId(0)]).then_some(Duration::from_secs(2))
        }
    }

    #[test]
    fn a_backup_wait_is_the_first_claims_word_on_the_replicas_not_tried() {
        let primary = Attempt::primary();
        assert_eq!(primary.backup_wait(), None);
        primary.record(ReplicaId(0));
        primary.bind(Arc::new(Busy));
        assert_eq!(primary.next(1).backup_wait(), Some(Duration::from_secs(2)));
        // The claim is asked with every replica tried so far.
        primary.next(1).record(ReplicaId(1));
        assert_eq!(primary.backup_wait(), None);
    }

    #[test]
    fn a_probe_alternative_belongs_to_the_attempt_marked() {
        let primary = Attempt::primary();
        primary.mark_probe_against(Duration::from_millis(150));
        assert!(primary.is_probe());
        assert_eq!(
            primary.probe_alternative(),
            Some(Duration::from_millis(150))
        );
        // A later attempt of the request (a backup, a resumed stream's continuation) is not
        // the one the placer weighed.
        assert_eq!(primary.next(1).probe_alternative(), None);
    }
}
