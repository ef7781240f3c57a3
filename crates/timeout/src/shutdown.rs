//! The shutdown signal of [`SseIdleTimeoutLayer::with_shutdown`](crate::SseIdleTimeoutLayer::with_shutdown),
//! as one response body watches it.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Waker};

use tokio::sync::watch;

type Fired = Pin<Box<dyn Future<Output = ()> + Send>>;

/// One body's view of the shutdown signal: cheap to poll on every wait.
pub(crate) struct Shutdown {
    /// Whether the channel changed since it was last looked at (an atomic load).
    state: watch::Receiver<bool>,
    /// Resolves once the signal is `true`; made on the first wait.
    fired: Option<Fired>,
    /// The waker `fired` was last polled with: polling it again with the same one would only
    /// take the channel's lock again (one channel is shared by every stream).
    registered: Option<Waker>,
}

impl std::fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shutdown")
            .field("now", &*self.state.borrow())
            .finish_non_exhaustive()
    }
}

impl Shutdown {
    pub(crate) fn new(signal: &watch::Receiver<bool>) -> Self {
        Shutdown {
            state: signal.clone(),
            fired: None,
            registered: None,
        }
    }

    /// Whether the signal is `true` now, without registering for a wake-up.
    pub(crate) fn now(&self) -> bool {
        *self.state.borrow()
    }

    /// Whether the signal is `true`; when not, the task is woken once it turns `true`.
    pub(crate) fn poll_fired(&mut self, cx: &mut Context<'_>) -> bool {
        // A closed channel (every sender gone, perhaps right after sending `true`) is looked at
        // too.
        let changed = self.state.has_changed().unwrap_or(true);
        let fresh = self
            .registered
            .as_ref()
            .is_some_and(|w| w.will_wake(cx.waker()));
        if !changed && fresh {
            return false;
        }
        if changed {
            self.state.borrow_and_update();
        }
        let fired = self.fired.get_or_insert_with(|| {
            let mut rx = self.state.clone();
            Box::pin(async move {
                if rx.wait_for(|on| *on).await.is_err() {
                    // The sender is gone without a shutdown: never fire.
                    std::future::pending::<()>().await;
                }
            })
        });
        self.registered = Some(cx.waker().clone());
        fired.as_mut().poll(cx).is_ready()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Poll;

    #[tokio::test]
    async fn fires_once_the_signal_turns_true_and_wakes_the_waiting_task() {
        let (tx, rx) = watch::channel(false);
        let mut s = Shutdown::new(&rx);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(!s.poll_fired(&mut cx));
        assert!(!s.poll_fired(&mut cx), "the same waker: no re-registration");
        let waiter = tokio::spawn(async move {
            std::future::poll_fn(|cx| match s.poll_fired(cx) {
                true => Poll::Ready(s.now()),
                false => Poll::Pending,
            })
            .await
        });
        tokio::task::yield_now().await;
        tx.send(true).unwrap();
        assert!(waiter.await.unwrap());
    }

    #[tokio::test]
    async fn a_signal_sent_just_before_its_sender_dropped_still_fires() {
        let (tx, rx) = watch::channel(false);
        let mut s = Shutdown::new(&rx);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(!s.poll_fired(&mut cx));
        tx.send(true).unwrap();
        drop(tx);
        assert!(s.poll_fired(&mut cx));
    }

    #[tokio::test]
    async fn a_dropped_sender_never_fires() {
        let (tx, rx) = watch::channel(false);
        let mut s = Shutdown::new(&rx);
        drop(tx);
        let mut cx = Context::from_waker(Waker::noop());
        assert!(!s.poll_fired(&mut cx));
        assert!(!s.now());
    }
}
