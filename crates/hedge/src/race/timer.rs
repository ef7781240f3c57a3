//! The race's hedge timer: when the next delay-triggered attempt is due, armed lazily.

use std::future::Future;
use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// A deadline that does not come (about 30 years).
const FAR_FUTURE: Duration = Duration::from_secs(86_400 * 365 * 30);

#[derive(Debug, Default)]
pub(super) struct HedgeTimer {
    /// When the next delay-triggered attempt is due.
    at: Option<Instant>,
    /// The delay that set `at` (within the deadlines).
    armed: Duration,
    /// The sleep, made the first time the race goes to sleep with an attempt due.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl HedgeTimer {
    /// The next attempt is due `delay` after `now`; `None`: no delay-triggered attempt.
    pub(super) fn arm(&mut self, now: Instant, delay: Option<Duration>) {
        self.at = delay.map(|d| {
            self.armed = d;
            // A delay too large to add is as good as none.
            now.checked_add(d).unwrap_or_else(|| now + FAR_FUTURE)
        });
    }

    /// Due again after twice the last interval (a refused backup is asked for again; few
    /// asks); a zero delay is not asked again.
    pub(super) fn again(&mut self, now: Instant) {
        if !self.armed.is_zero() {
            self.armed = self.armed.saturating_mul(2);
            self.at = now.checked_add(self.armed);
        }
    }

    /// Due at `due` (after a wait of `wait`) instead, when that is sooner.
    pub(super) fn sooner(&mut self, due: Option<(Instant, Duration)>) {
        if let (Some(at), Some((due, wait))) = (self.at, due)
            && due < at
        {
            (self.at, self.armed) = (Some(due), wait);
        }
    }

    /// Due at `due` (after a wait of `wait`) instead, sooner or later.
    pub(super) fn until(&mut self, due: Instant, wait: Duration) {
        (self.at, self.armed) = (Some(due), wait);
    }

    /// The interval that set the due time.
    pub(super) fn armed(&self) -> Duration {
        self.armed
    }

    /// Nothing is due any more.
    pub(super) fn stop(&mut self) {
        self.sleep = None;
        self.at = None;
    }

    /// Polls the sleep (made, or reset, for the due time); `true` once it passed, and then
    /// nothing is due until armed again.
    pub(super) fn poll(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(at) = self.at else {
            return false;
        };
        let sleep = match &mut self.sleep {
            Some(s) => {
                if s.deadline() != at {
                    s.as_mut().reset(at);
                }
                s
            }
            None => self.sleep.insert(Box::pin(tokio::time::sleep_until(at))),
        };
        let fired = sleep.as_mut().poll(cx).is_ready();
        if fired {
            self.at = None;
        }
        fired
    }
}
