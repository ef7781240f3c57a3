//! What admission and the hedge did with a request, inserted into response extensions for an
//! outer layer (the recorder) to read.

use std::time::Duration;

use crate::error::OverloadReason;

/// What admission did with a request; inserted into response extensions by `BoundedAdmission`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct AdmissionOutcome {
    /// Time spent waiting in the admission queue (zero when admitted at once).
    pub queue_wait: Duration,
    /// Capacity units the request held.
    pub units: u32,
    /// `Some` when the request was rejected, with the reason.
    pub rejected: Option<OverloadReason>,
}

impl AdmissionOutcome {
    /// An admitted request that waited `queue_wait` and holds `units`.
    pub fn admitted(queue_wait: Duration, units: u32) -> Self {
        AdmissionOutcome {
            queue_wait,
            units,
            rejected: None,
        }
    }

    /// A rejected request that waited `queue_wait` before the rejection.
    pub fn rejected(queue_wait: Duration, units: u32, reason: OverloadReason) -> Self {
        AdmissionOutcome {
            queue_wait,
            units,
            rejected: Some(reason),
        }
    }
}

/// What the hedge did with a request, and what its losing attempts cost; inserted into response
/// extensions by `FirstTokenHedge`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct HedgeOutcome {
    /// Attempts sent, the primary included (1 when no hedge was sent).
    pub attempts: u8,
    /// Index of the attempt whose answer reached the client (0 = the primary); `None` when
    /// every attempt failed (the client got the most informative failure, which is no win).
    pub winner: Option<u8>,
    /// The hedge delay in force for this request (`None` when the request was not eligible or
    /// the adaptive estimate had too few samples).
    pub delay: Option<Duration>,
    /// Whether a hedge was wanted but refused by the budget.
    pub budget_exhausted: bool,
    /// Whether a backup was wanted but not sent because the request's deadline left less time
    /// than the expected time to first token: a backup that could not have won.
    pub deadline_skipped: bool,
    /// Every attempt other than the winner, in the order they were sent, with how long it ran
    /// before it was cancelled (or failed).
    pub losers: Vec<LoserRun>,
    /// Request body bytes sent on the losing attempts: the prefill the hedge paid for.
    pub wasted_prompt_bytes: u64,
    /// Prompt tokens sent on the losing attempts, when [`RequestFacts::prompt_tokens`](crate::RequestFacts::prompt_tokens) was known.
    pub wasted_prompt_tokens: Option<u64>,
}

/// One losing attempt of a hedged request: its index and how long it ran.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct LoserRun {
    /// The attempt's index (0 = the primary).
    pub attempt: u8,
    /// From when it was sent until it was cancelled or failed.
    pub ran: Duration,
}

impl LoserRun {
    /// Attempt `attempt`, which ran for `ran`.
    pub fn new(attempt: u8, ran: Duration) -> Self {
        LoserRun { attempt, ran }
    }
}

impl HedgeOutcome {
    /// An outcome with `attempts` sent, `winner` committed and the `delay` used, no loser
    /// recorded.
    pub fn new(attempts: u8, winner: u8, delay: Option<Duration>) -> Self {
        HedgeOutcome {
            attempts,
            winner: Some(winner),
            delay,
            budget_exhausted: false,
            deadline_skipped: false,
            losers: Vec::new(),
            wasted_prompt_bytes: 0,
            wasted_prompt_tokens: None,
        }
    }

    /// The outcome as a response header value: `attempts=2; winner=1`, or
    /// `attempts=2; winner=none` when every attempt failed.
    ///
    /// ```
    /// use tailguard_core::HedgeOutcome;
    ///
    /// assert_eq!(HedgeOutcome::new(2, 1, None).header_value(), "attempts=2; winner=1");
    /// assert_eq!(HedgeOutcome::all_failed(2, None).header_value(), "attempts=2; winner=none");
    /// ```
    pub fn header_value(&self) -> http::HeaderValue {
        let text = match self.winner {
            Some(w) => format!("attempts={}; winner={w}", self.attempts),
            None => format!("attempts={}; winner=none", self.attempts),
        };
        http::HeaderValue::try_from(text).expect("digits, letters and punctuation")
    }

    /// An outcome with `attempts` sent, every one failed, and the `delay` used.
    pub fn all_failed(attempts: u8, delay: Option<Duration>) -> Self {
        HedgeOutcome {
            winner: None,
            ..HedgeOutcome::new(attempts, 0, delay)
        }
    }

    /// Marks that a hedge was wanted but the budget refused it.
    pub fn with_budget_exhausted(mut self, exhausted: bool) -> Self {
        self.budget_exhausted = exhausted;
        self
    }

    /// Marks that a backup was skipped because it could not have won before the deadline.
    pub fn with_deadline_skipped(mut self, skipped: bool) -> Self {
        self.deadline_skipped = skipped;
        self
    }

    /// Sets the losing attempts and the prompt each was sent (`prompt_bytes` of body, and
    /// `prompt_tokens` when known): the wasted totals are those times the number of losers.
    pub fn with_losers(
        mut self,
        losers: Vec<LoserRun>,
        prompt_bytes: u64,
        prompt_tokens: Option<u64>,
    ) -> Self {
        let n = losers.len() as u64;
        self.wasted_prompt_bytes = prompt_bytes.saturating_mul(n);
        self.wasted_prompt_tokens = prompt_tokens.map(|t| t.saturating_mul(n));
        self.losers = losers;
        self
    }

    /// How long the losing attempts ran in all.
    pub fn loser_time(&self) -> Duration {
        self.losers.iter().map(|l| l.ran).sum()
    }
}
