//! What admission, the hedge and resume did with a request, for an outer layer (the recorder)
//! to read: in the response extensions, or (resumes, which happen while the body streams)
//! through the request's [`EndReport`](crate::EndReport).

use std::fmt;
use std::time::Duration;

use crate::error::OverloadReason;
use crate::ext::Upstream;

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

/// Why a stream broke after its first token (what a resume answers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum BreakReason {
    /// The body failed: a reset, a transport error.
    Transport,
    /// The body ended with neither a finish reason nor a terminal event (or half an event).
    Truncated,
    /// The stream carried an in-band error event.
    ErrorEvent,
    /// A terminal event (`data: [DONE]`, `message_stop`) came before any finish reason, as
    /// llama.cpp ends a generation a newer request interrupted.
    DoneWithoutFinish,
    /// No token for the resume layer's stall limit (keepalives do not count).
    Stall,
}

impl BreakReason {
    /// A bounded label: `transport`, `truncated`, `error_event`, `done_without_finish`,
    /// `stall`.
    pub fn as_str(self) -> &'static str {
        match self {
            BreakReason::Transport => "transport",
            BreakReason::Truncated => "truncated",
            BreakReason::ErrorEvent => "error_event",
            BreakReason::DoneWithoutFinish => "done_without_finish",
            BreakReason::Stall => "stall",
        }
    }
}

/// What came of a break: the stream resumed, its continuation got no stream, the client left
/// while it was on its way, the stream was finished at its output limit, or none was sent
/// (why, as a bounded label: `budget`, `max_resumes`, `tool_call`, or why the request is not
/// resumable).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ResumeOutcome {
    /// A continuation's stream goes on where the broken one stopped.
    Resumed,
    /// A continuation was sent and got no `2xx` stream.
    Failed,
    /// The client went away while a continuation was on its way (the continuation is
    /// cancelled with it).
    Cancelled,
    /// A stalled stream went on (a token, or its end) before its continuation's first token:
    /// the continuation was dropped.
    Recovered,
    /// No continuation was needed: the client had all the output tokens the request allows,
    /// and the stream was ended with its finish reason (`length`; Anthropic `max_tokens`), as
    /// the server would have ended it.
    FinishedAtLimit,
    /// No continuation was sent, for this reason.
    NotSent(&'static str),
}

impl ResumeOutcome {
    /// A bounded label: `resumed`, `failed`, `cancelled`, `recovered`, `finished_at_limit`, or
    /// the reason none was sent.
    pub fn as_str(self) -> &'static str {
        match self {
            ResumeOutcome::Resumed => "resumed",
            ResumeOutcome::Failed => "failed",
            ResumeOutcome::Cancelled => "cancelled",
            ResumeOutcome::Recovered => "recovered",
            ResumeOutcome::FinishedAtLimit => "finished_at_limit",
            ResumeOutcome::NotSent(why) => why,
        }
    }
}

/// One break of a stream after its first token and what came of it, as the resume layer of
/// `tailguard-hedge` reports it through the request's [`EndReport`](crate::EndReport).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Resumption {
    /// Why the stream broke.
    pub reason: BreakReason,
    /// What came of it.
    pub outcome: ResumeOutcome,
    /// The upstream whose stream broke, when its response said ([`Upstream`]).
    pub from: Option<Upstream>,
    /// The upstream whose stream went on, when the stream resumed and its response said.
    pub to: Option<Upstream>,
}

impl Resumption {
    /// A break and its outcome.
    pub fn new(
        reason: BreakReason,
        outcome: ResumeOutcome,
        from: Option<Upstream>,
        to: Option<Upstream>,
    ) -> Self {
        Resumption {
            reason,
            outcome,
            from,
            to,
        }
    }
}

/// `replica-0>replica-1:transport` (resumed), `replica-0>-:stall:budget` (not resumed: the
/// outcome follows the reason); `?` for an upstream no response named.
impl fmt::Display for Resumption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let from = self.from.as_ref().map_or("?", Upstream::as_str);
        let to = match (self.outcome, &self.to) {
            (ResumeOutcome::Resumed, Some(u)) => u.as_str(),
            (ResumeOutcome::Resumed, None) => "?",
            _ => "-",
        };
        write!(f, "{from}>{to}:{}", self.reason.as_str())?;
        if self.outcome != ResumeOutcome::Resumed {
            write!(f, ":{}", self.outcome.as_str())?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The labels the hedge's docs and the README list, written out here.
    #[test]
    fn break_and_outcome_labels() {
        use BreakReason::*;
        let labels =
            [Transport, Truncated, ErrorEvent, DoneWithoutFinish, Stall].map(BreakReason::as_str);
        assert_eq!(
            labels,
            [
                "transport",
                "truncated",
                "error_event",
                "done_without_finish",
                "stall"
            ]
        );
        let outcomes = [
            ResumeOutcome::Resumed,
            ResumeOutcome::Failed,
            ResumeOutcome::NotSent("budget"),
        ];
        assert_eq!(
            outcomes.map(ResumeOutcome::as_str),
            ["resumed", "failed", "budget"]
        );
    }

    #[test]
    fn a_resumption_reads_from_to_why() {
        let r = |outcome, to: Option<&str>| {
            Resumption::new(
                BreakReason::Stall,
                outcome,
                Some(Upstream::new("replica-0")),
                to.map(Upstream::new),
            )
            .to_string()
        };
        assert_eq!(
            r(ResumeOutcome::Resumed, Some("replica-1")),
            "replica-0>replica-1:stall"
        );
        assert_eq!(r(ResumeOutcome::Resumed, None), "replica-0>?:stall");
        assert_eq!(
            r(ResumeOutcome::NotSent("budget"), None),
            "replica-0>-:stall:budget"
        );
        assert_eq!(r(ResumeOutcome::Failed, None), "replica-0>-:stall:failed");
    }
}
