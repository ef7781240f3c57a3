//! What a [`ReplicaSet`](crate::ReplicaSet) knows about each replica: attempts waiting for a
//! first token, a peak-EWMA of recent times to first token, slots held, and ejection state;
//! and its score, the expected wait of one more attempt.
//!
//! Why not tower's `load::PeakEwma`: it measures a request until its response future resolves
//! (the response head), which a streaming LLM server sends at once; the time that matters is
//! the time to the first token, which only the hedge sees. The decay rule is tower's (an
//! estimate decays towards zero with time, a sample above it replaces it).

use std::time::Duration;

use tokio::time::Instant;

use crate::eject::Ejector;

/// Added to every estimate, so that with no samples yet the number of waiting attempts
/// decides (as tower's default RTT does).
const PRIOR_SECS: f64 = 0.001;

/// The longest pause between probes of a replica is this many decay periods (see
/// [`Replica::probed`]).
const MAX_PROBE_BACKOFF: u32 = 4;

/// One replica's state.
#[derive(Debug)]
pub(crate) struct Replica {
    /// Attempts sent and not yet settled (token, failure, cancellation): id and send time.
    pub(crate) waiting: Vec<(u64, Instant)>,
    /// The peak-EWMA estimate of the time to first token, in seconds, as of `at`.
    estimate: f64,
    at: Instant,
    /// The estimate is a censored wait (an attempt cut short at it, or a failure after it):
    /// the replica takes at least that long, how much longer nobody saw.
    lower_bound: bool,
    /// A sample came (a first token, or a wait cut short): before it, the estimate is a
    /// guess (see [`guess`](Replica::guess)).
    news: bool,
    /// Attempts holding a slot (from the call until their body ends or is dropped).
    pub(crate) active: u32,
    /// The id of the newest attempt placed on it, and when.
    pub(crate) newest: (u64, Instant),
    /// Until when it gets one attempt at a time: it ended a stream when a newer one arrived.
    pub(crate) one_at_a_time: Option<Instant>,
    /// Interruptions seen since it last streamed two attempts at once: each doubles the next
    /// hold.
    pub(crate) interruptions: u32,
    /// Attempts past their first token that still hold their slot.
    pub(crate) streaming: u32,
    /// When it last streamed two attempts at once: it serves more than one at a time.
    pub(crate) concurrent_at: Option<Instant>,
    /// A moving average of how long an attempt holds a slot here (placement to the end of its
    /// body), in seconds; zero before the first.
    hold: f64,
    /// Probes placed here on a lower bound since its last first token, and when the next may
    /// go (see [`probed`](Replica::probed)).
    probes: u32,
    probe_after: Option<Instant>,
    pub(crate) eject: Ejector,
}

impl Replica {
    pub(crate) fn new(now: Instant) -> Self {
        Replica {
            waiting: Vec::new(),
            estimate: 0.0,
            at: now,
            lower_bound: false,
            news: false,
            active: 0,
            newest: (0, now),
            one_at_a_time: None,
            interruptions: 0,
            streaming: 0,
            concurrent_at: None,
            hold: 0.0,
            probes: 0,
            probe_after: None,
            eject: Ejector::default(),
        }
    }

    /// How many attempts it takes at once: `configured` slots, one while it gets one at a
    /// time; `None`: no limit.
    pub(crate) fn capacity(&self, configured: Option<u32>, now: Instant) -> Option<u32> {
        let alone = self.one_at_a_time.is_some_and(|until| now < until);
        if alone { Some(1) } else { configured }
    }

    /// Whether one more attempt placed here now could end a stream of the set's: one streams
    /// here, and the replica was not seen streaming two at once within `hold` (the
    /// interruption hold; zero: not learned). As far as the set knows it is a single-slot
    /// server, which ends the running stream for a newer request (llama-cpp-python's default)
    /// or queues the newer one behind it. A backup waits for that stream to end instead (issue
    /// 29's interrupt runs: the first request of every run was cut off after its first token
    /// by the second's backup, placed beside it while the second's primary waited on the busy
    /// replica). A primary is held back only while another replica in selection has room and
    /// may not cut one: otherwise it goes beside the stream, which is how the set sees two
    /// streams at once.
    pub(crate) fn may_cut_a_stream(&self, now: Instant, hold: Duration) -> bool {
        !hold.is_zero() && self.streaming > 0 && !self.seen_concurrent(now, hold)
    }

    /// Whether it was seen streaming two attempts at once within the last `hold`: it serves
    /// several at a time.
    pub(crate) fn seen_concurrent(&self, now: Instant, hold: Duration) -> bool {
        (self.concurrent_at).is_some_and(|t| now.saturating_duration_since(t) < hold)
    }

    /// Whether `ahead` attempts and one more fit now.
    pub(crate) fn has_room(&self, configured: Option<u32>, now: Instant, ahead: usize) -> bool {
        self.capacity(configured, now)
            .is_none_or(|n| u64::from(self.active) + (ahead as u64) < u64::from(n))
    }

    /// The expected wait for a slot here, when it has none free, behind `ahead` attempts
    /// waiting for it, and then for a first token: each in turn holds a slot for the average
    /// hold (the one running now counted whole: the estimate errs long, towards a replica with
    /// room). `None` before the first hold was seen.
    pub(crate) fn wait_for_slot(
        &self,
        configured: Option<u32>,
        now: Instant,
        prior: &Prior,
        ahead: usize,
    ) -> Option<f64> {
        let slots = f64::from(self.capacity(configured, now)?.max(1));
        (self.hold > 0.0).then(|| self.behind(self.hold, slots, ahead, now, prior))
    }

    /// [`wait_for_slot`](Self::wait_for_slot) on a replica taken for a single-slot one while
    /// a stream of the set's runs there (see [`may_cut_a_stream`](Self::may_cut_a_stream)):
    /// before the first hold was seen, the newest attempt placed here is taken to hold its
    /// slot as long again as it has so far.
    pub(crate) fn wait_for_stream(&self, now: Instant, prior: &Prior, ahead: usize) -> f64 {
        let ran = now.saturating_duration_since(self.newest.1).as_secs_f64();
        let hold = if self.hold > 0.0 { self.hold } else { ran };
        self.behind(hold, 1.0, ahead, now, prior)
    }

    /// Behind `ahead` attempts, each holding one of `slots` for `hold` seconds, then a first
    /// token.
    fn behind(&self, hold: f64, slots: f64, ahead: usize, now: Instant, prior: &Prior) -> f64 {
        hold * (ahead + 1) as f64 / slots + self.guess(now, prior) + PRIOR_SECS
    }

    /// An attempt released its slot after `secs`.
    pub(crate) fn held(&mut self, secs: f64) {
        self.hold = if self.hold == 0.0 {
            secs
        } else {
            // A plain moving average: the hold only ranks a full replica against one with
            // room, and a few streams' worth of memory is enough for that.
            self.hold + (secs - self.hold) * 0.2
        };
    }

    /// The estimate decayed to `now`, in seconds.
    pub(crate) fn estimate(&self, now: Instant, decay: Duration) -> f64 {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.estimate * (-elapsed / decay.as_secs_f64().max(1e-9)).exp()
    }

    /// The estimate decayed to `now`. Before any news of the replica: zero while no attempt
    /// waits there (worth a try: a new replica gets its first attempt at once), then, while
    /// that first attempt is unanswered, what the set assumes of a replica it knows nothing of
    /// ([`Prior`]), so that no more follow it before its news.
    pub(crate) fn guess(&self, now: Instant, prior: &Prior) -> f64 {
        if self.news {
            self.estimate(now, prior.decay)
        } else if self.waiting.is_empty() {
            0.0
        } else {
            prior.secs
        }
    }

    /// The expected wait of one more attempt: the estimate (or the [`guess`](Self::guess)),
    /// raised to the longest wait of an attempt still waiting (a censored sample: it takes at
    /// least that long), times the attempts that would then be waiting.
    pub(crate) fn score(&self, now: Instant, prior: &Prior) -> f64 {
        self.expected(self.guess(now, prior), now)
    }

    /// The expected wait of one more attempt as of the last news of the replica: the score
    /// without the decay since. What a full replica's expected wait is weighed against: a
    /// slow replica's estimate that has only decayed since says nothing new about it, and the
    /// hedge's backups probe it (a fresh sample renews the estimate at once).
    pub(crate) fn last_known(&self, now: Instant, prior: &Prior) -> f64 {
        let known = if self.news {
            self.estimate
        } else {
            self.guess(now, prior)
        };
        self.expected(known, now)
    }

    /// Whether the set has news of the replica (a sample came).
    pub(crate) fn has_news(&self) -> bool {
        self.news
    }

    fn expected(&self, estimate: f64, now: Instant) -> f64 {
        let longest = self
            .waiting
            .iter()
            .map(|(_, t)| now.saturating_duration_since(*t).as_secs_f64())
            .fold(0.0, f64::max);
        (estimate.max(longest) + PRIOR_SECS) * (self.waiting.len() + 1) as f64
    }

    /// A time to first token (or, `censored`, a wait of at least that long).
    pub(crate) fn sample(&mut self, secs: f64, censored: bool, now: Instant, decay: Duration) {
        if !censored {
            // A first token: its estimate is news again, not a bound (see `probed`).
            self.unpause();
        }
        let current = self.estimate(now, decay);
        let next = if secs >= current {
            // Peak: a slower sample (or a longer censored wait) replaces the estimate.
            self.lower_bound = censored;
            secs
        } else if censored {
            // A lower bound below the estimate says nothing new.
            current
        } else {
            self.lower_bound = false;
            let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
            let w = (-elapsed / decay.as_secs_f64().max(1e-9)).exp();
            current * w + secs * (1.0 - w)
        };
        self.estimate = next;
        self.at = now;
        self.news = true;
    }

    /// Whether the estimate is only a lower bound: its peak was a wait cut short (a backup won,
    /// the client left) or a failure, and no first token came since.
    pub(crate) fn lower_bound(&self) -> bool {
        self.lower_bound
    }

    /// The least a backup placed here now would wait for a first token, in seconds, when the
    /// set is sure the replica stays slow: its estimate is a lower bound, and the probe pause
    /// that lasts is at least the second in a row (two probes on the bound, a decay period or
    /// more apart, no first token since; see [`probed`](Self::probed)). The bound as it was
    /// seen, not decayed. One wait cut short may be a moment's blocking (the mock's scenario
    /// B: a replica blocked for 800 ms, where backups are what find it free again; holding
    /// them from the first pause on took B's p99 TTFT from 114 to 240 ms); a replica whose
    /// probes keep being cut short is kept busy (issue 29's real bench, the mock's D). The
    /// hedge holds a backup that would go here until the attempt it backs up has waited as
    /// long (see `Ticket::backup_wait`). `None` otherwise.
    pub(crate) fn known_slow(&self, now: Instant) -> Option<f64> {
        let sure = self.lower_bound && !self.may_probe(now) && self.probes >= 2;
        sure.then_some(self.estimate)
    }

    /// Whether a primary may be placed here as a probe on its lower bound now (see
    /// [`probed`](Self::probed)).
    pub(crate) fn may_probe(&self, now: Instant) -> bool {
        self.probe_after.is_none_or(|after| now >= after)
    }

    /// A probe was placed here while its estimate is a lower bound (its last news a wait cut
    /// short): the next such probe may go one decay period later, then two, then four
    /// ([`MAX_PROBE_BACKOFF`]), until a first token comes. Without it a replica kept busy by
    /// traffic the set cannot see was probed every time its estimate decayed below the other
    /// choice's, every 3 s in issue 29's real bench, each probe cut short by its backup: each
    /// cost its request a hedge delay and an extra attempt (8 of 50, where the hedge budget
    /// allows 10%). The pause holds also while the other choice is loaded past the bound as
    /// last known: such a primary was issue 29's next largest source of extra attempts (the
    /// bound is where a wait was cut, not what the replica takes). Backups, which go to the
    /// best replica not tried, still sample it meanwhile, and their first token there ends the
    /// pause. The cost, in the mock's scenario B (a replica blocked for 800 ms, then free):
    /// p99 TTFT 99 -> 114 ms; in scenario D (a replica kept busy): 176 -> 140 ms.
    ///
    /// A failure ends the pause ([`unpause`](Self::unpause)): whether a failing replica stays
    /// in selection is the ejector's call, which needs its failures to come as they come.
    pub(crate) fn probed(&mut self, now: Instant, decay: Duration) {
        let periods = 1u32 << self.probes.min(MAX_PROBE_BACKOFF.ilog2());
        self.probe_after = now.checked_add(decay.saturating_mul(periods));
        self.probes = self.probes.saturating_add(1);
    }

    /// Probes may go at once again (see [`probed`](Self::probed)).
    pub(crate) fn unpause(&mut self) {
        (self.probes, self.probe_after) = (0, None);
    }
}

/// What a set assumes of a replica it has no news of while an attempt waits there: the median
/// estimate of the replicas it has news of (zero while it has none), as if it were like the
/// others. Before, its estimate stayed zero: it looked faster than any replica that had
/// answered, and took primary after primary while the first still waited there (issue 29's
/// interrupt runs: the second and third requests of a fresh gateway both went to the replica
/// busy with traffic the set cannot see, one 3 s to a first token).
#[derive(Debug)]
pub(crate) struct Prior {
    secs: f64,
    decay: Duration,
}

impl Prior {
    /// The prior of `replicas` at `now`.
    pub(crate) fn of(replicas: &[Replica], now: Instant, decay: Duration) -> Self {
        let mut known: Vec<f64> = (replicas.iter())
            .filter(|r| r.news)
            .map(|r| r.estimate(now, decay))
            .collect();
        known.sort_by(f64::total_cmp);
        let secs = known.get(known.len() / 2).copied().unwrap_or(0.0);
        Prior { secs, decay }
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
        let prior = Prior::of(&[], now, decay);
        let idle = r.score(now, &prior);
        r.waiting.push((0, now));
        let one = r.score(now, &prior);
        assert!(one > idle);
        // The longest wait counts as a lower bound of the estimate.
        let later = now + Duration::from_secs(3);
        assert!(r.score(later, &prior) >= 2.0 * 3.0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_with_no_news_is_taken_to_be_like_the_others() {
        let decay = Duration::from_secs(10);
        let now = Instant::now();
        let mut set: Vec<Replica> = (0..4).map(|_| Replica::new(now)).collect();
        for (r, secs) in set.iter_mut().zip([0.2, 0.4, 3.0]) {
            r.sample(secs, false, now, decay);
        }
        let prior = Prior::of(&set, now, decay);
        assert!((set[0].guess(now, &prior) - 0.2).abs() < 1e-9);
        // Nothing waits on the new one: worth a try.
        assert_eq!(set[3].guess(now, &prior), 0.0);
        // Its first attempt unanswered: like the others (their median) until news, and a
        // second attempt there looks twice that long.
        set[3].waiting.push((0, now));
        assert!((set[3].guess(now, &prior) - 0.4).abs() < 1e-9);
        assert!((set[3].last_known(now, &prior) - 2.0 * (0.4 + PRIOR_SECS)).abs() < 1e-9);
        assert!(set[3].score(now, &prior) > set[1].score(now, &prior));
    }
}
