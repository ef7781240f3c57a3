//! What a race's losing attempts cost: how long each ran, and the prompt each was sent.

use http::request::Parts;
use tailguard_core::{HedgeOutcome, LoserRun, RequestFacts};
use tokio::time::Instant;

/// The ledger of one race: every attempt that ended without winning, in the order they ended.
#[derive(Debug)]
pub(crate) struct Costs {
    ended: Vec<LoserRun>,
    prompt_tokens: Option<u64>,
}

impl Costs {
    /// The ledger of a request with head `parts` (its [`RequestFacts`] may know its prompt
    /// tokens).
    pub(crate) fn new(parts: &Parts) -> Self {
        Costs {
            ended: Vec::new(),
            prompt_tokens: parts
                .extensions
                .get::<RequestFacts>()
                .and_then(|f| f.prompt_tokens),
        }
    }

    /// Attempt `attempt`, sent at `sent_at`, was cancelled or failed at `now`.
    pub(crate) fn ended(&mut self, attempt: u8, sent_at: Instant, now: Instant) {
        let ran = now.saturating_duration_since(sent_at);
        self.ended.push(LoserRun::new(attempt, ran));
    }

    /// `outcome` with the losers (every attempt ended other than `winner`, in the order they
    /// were sent; every attempt when none won) and the prompt each was sent: `prompt_bytes` of
    /// body.
    pub(crate) fn outcome(
        &self,
        outcome: HedgeOutcome,
        winner: Option<u8>,
        prompt_bytes: Option<usize>,
    ) -> HedgeOutcome {
        let mut losers: Vec<LoserRun> = self
            .ended
            .iter()
            .copied()
            .filter(|l| Some(l.attempt) != winner)
            .collect();
        losers.sort_by_key(|l| l.attempt);
        let bytes = prompt_bytes.map_or(0, |b| b as u64);
        outcome.with_losers(losers, bytes, self.prompt_tokens)
    }
}
