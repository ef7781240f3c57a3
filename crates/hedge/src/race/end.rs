//! How a race ends for its attempts: losers cancelled (their waits censored TTFT samples when
//! another attempt won), the outcome stamped on the response, or, when the client goes away
//! mid-race, reported to the outer end report.

use http::{Request, Response};
use http_body::Body;
use tailguard_core::{HedgeOutcome, ReplayBody};
use tokio::time::Instant;
use tower_service::Service;

use super::{Phase, Race};

impl<S, B, RB> Drop for Race<S, B, RB>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    B: Body,
    RB: Body,
{
    fn drop(&mut self) {
        // The client went away (or a layer outside timed the request out) during the race:
        // every attempt in flight is cancelled, dropped with this struct. Nobody won, so their
        // waits are no TTFT samples (see `AdaptiveDelay`). No response will carry the outcome:
        // it goes to the outer end report.
        if !matches!(self.phase, Phase::Racing) {
            return;
        }
        self.cancel_all(Instant::now(), false);
        if let Some(outer) = &self.outer_report {
            outer.report_hedge(self.outcome(None));
        }
    }
}

impl<S, B, RB> Race<S, B, RB>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    B: Body,
    RB: Body,
{
    /// Drops every attempt still in flight; `censor` when another attempt just produced the
    /// first token, so that how long each had waited is a censored TTFT sample.
    pub(super) fn cancel_all(&mut self, now: Instant, censor: bool) {
        for attempt in self.attempts.drain(..) {
            self.costs.ended(attempt.index, attempt.sent_at, now);
            let waited = now.saturating_duration_since(attempt.sent_at);
            if let Some(e) = self.estimator.as_ref().filter(|_| censor) {
                e.record(waited, true, now);
            }
            tracing::debug!(
                attempt = attempt.index,
                waited_ms = waited.as_millis() as u64,
                "tailguard-hedge: attempt cancelled"
            );
        }
        self.timer.stop();
        self.pending_send = None;
    }

    /// Puts `outcome` into the response: its extensions, and the outcome header if one is
    /// configured.
    pub(super) fn stamp<T>(&self, res: &mut Response<T>, outcome: HedgeOutcome) {
        if let Some(name) = &self.shared.config.outcome_header {
            res.headers_mut()
                .insert(name.clone(), outcome.header_value());
        }
        res.extensions_mut().insert(outcome);
    }

    /// What the hedge did: `winner` is `None` when no attempt won (then every attempt is a
    /// loser).
    pub(super) fn outcome(&self, winner: Option<u8>) -> HedgeOutcome {
        let outcome = match winner {
            Some(w) => HedgeOutcome::new(self.sent, w, self.delay),
            None => HedgeOutcome::all_failed(self.sent, self.delay),
        }
        .with_budget_exhausted(self.budget_exhausted)
        .with_deadline_skipped(self.deadline_skipped);
        let bytes = self.body.as_ref().and_then(ReplayBody::replay_len);
        self.costs.outcome(outcome, winner, bytes)
    }
}
