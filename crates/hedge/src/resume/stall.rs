//! When a stream has stalled: no token for its stall limit, which follows the stream's own
//! pace (ten times its mean gap between tokens, at least [`FLOOR`]) up to the layer's limit.

use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use tokio::time::{Instant, Sleep, sleep_until};

/// The shortest stall limit: tokens tens of ms apart, a decoding server's pace, are not
/// stalled a quarter of a second later (a batch step, a scheduler's prefill of another request
/// pauses a stream that long).
pub(crate) const FLOOR: Duration = Duration::from_millis(250);

/// A stall limit is this many times the stream's mean gap between tokens.
const GAPS: u32 = 10;

/// Gaps a mean is taken over before it counts (until then: the layer's limit).
const MIN_GAPS: u64 = 4;

/// One stream's stall watch (over resumes: the client's one stream).
pub(crate) struct Stall {
    /// The layer's limit; `None`: no stall is watched for.
    most: Option<Duration>,
    /// The client's first token, and how many it has had.
    first: Option<Instant>,
    tokens: u64,
    /// When the client last got a token (or a continuation was answered).
    last: Instant,
    /// Fires at the limit (re-armed lazily from `last`); `None` while not watching.
    timer: Option<Pin<Box<Sleep>>>,
}

impl Stall {
    pub(crate) fn new(most: Option<Duration>) -> Self {
        Stall {
            most,
            first: None,
            tokens: 0,
            last: Instant::now(),
            timer: None,
        }
    }

    /// This stream's limit now: ten mean gaps (at least [`FLOOR`]), at most the layer's.
    fn limit(&self) -> Option<Duration> {
        let most = self.most?;
        let paced = match self.first {
            Some(first) if self.tokens > MIN_GAPS => {
                let gaps = u32::try_from(self.tokens - 1).unwrap_or(u32::MAX);
                (self.last.saturating_duration_since(first) / gaps * GAPS).max(FLOOR)
            }
            _ => most,
        };
        Some(paced.min(most))
    }

    /// The client has `tokens` tokens now; a new one restarts the count, and the watch if it
    /// was off.
    pub(crate) fn tokens(&mut self, tokens: u64) {
        if tokens <= self.tokens {
            return;
        }
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.tokens = tokens;
        self.last = now;
        self.watch();
    }

    /// A continuation was answered: it has the limit for its first token.
    pub(crate) fn restart(&mut self) {
        self.last = Instant::now();
        self.watch();
    }

    /// Arms the timer for the limit from `last`, or moves it earlier (the limit shrank as the
    /// stream showed its pace); a later deadline is left to the lazy re-arm in [`poll`](Self::poll).
    fn watch(&mut self) {
        let Some(limit) = self.limit() else {
            return;
        };
        let due = self.last + limit;
        match &mut self.timer {
            None => self.timer = Some(Box::pin(sleep_until(due))),
            Some(timer) if due < timer.deadline() => timer.as_mut().reset(due),
            Some(_) => {}
        }
    }

    /// Whether the stream has stalled (then the watch is off until the next token); else the
    /// task is woken at the limit.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(limit) = self.limit() else {
            return false;
        };
        loop {
            let Some(timer) = self.timer.as_mut() else {
                return false;
            };
            if timer.as_mut().poll(cx).is_pending() {
                return false;
            }
            let due = self.last + limit;
            if due <= Instant::now() {
                self.timer = None;
                return true;
            }
            timer.as_mut().reset(due);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_limit_follows_the_streams_pace_within_the_floor_and_the_layers_limit() {
        let mut s = Stall::new(Some(Duration::from_secs(5)));
        assert_eq!(s.limit(), Some(Duration::from_secs(5)), "no pace yet");
        for n in 1..=6 {
            s.tokens(n);
            tokio::time::advance(Duration::from_millis(40)).await;
        }
        // Five gaps of 40 ms (the last token 40 ms ago does not count): 400 ms.
        assert_eq!(s.limit(), Some(Duration::from_millis(400)));
        let mut fast = Stall::new(Some(Duration::from_secs(5)));
        for n in 1..=6 {
            fast.tokens(n);
            tokio::time::advance(Duration::from_millis(2)).await;
        }
        assert_eq!(fast.limit(), Some(FLOOR));
        let mut capped = Stall::new(Some(Duration::from_millis(300)));
        for n in 1..=6 {
            capped.tokens(n);
            tokio::time::advance(Duration::from_millis(100)).await;
        }
        assert_eq!(capped.limit(), Some(Duration::from_millis(300)));
        assert_eq!(Stall::new(None).limit(), None);
    }
}
