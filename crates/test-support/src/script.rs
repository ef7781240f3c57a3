//! [`ScriptBody`]: a response body that plays a script on tokio's clock.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;
use tokio::time::{Instant, Sleep};

/// One step of a script.
#[derive(Clone, Debug)]
pub enum Step {
    /// The next step is due this much later.
    Wait(Duration),
    /// A data frame.
    Data(Bytes),
    /// A trailers frame.
    Trailers(HeaderMap),
    /// A body error (`io::ErrorKind::ConnectionReset`), as when the upstream resets.
    Error,
    /// Nothing more, ever: an upstream that holds the body open (never yields, never ends).
    Pending,
}

/// A data step with these bytes.
pub fn data(bytes: impl AsRef<[u8]>) -> Step {
    Step::Data(Bytes::copy_from_slice(bytes.as_ref()))
}

/// A wait of `n` milliseconds.
pub fn wait_ms(n: u64) -> Step {
    Step::Wait(Duration::from_millis(n))
}

/// Where a test feeds the steps of a [`ScriptBody::fed`] body; the body ends when it is dropped.
pub type Feed = mpsc::UnboundedSender<Step>;

type Hook = Box<dyn FnOnce(bool) + Send + Sync>;

/// A body that plays a script of [`Step`]s.
///
/// The schedule starts when the body is first polled: each `Wait` moves the time the next
/// step is due, and a frame whose time has come is ready at once (an upstream that keeps
/// producing while the client is not reading). Waits are tokio sleeps in the polling task, so
/// on a paused clock a frame due at the same instant as a timer is ready when the body is
/// polled. A step sent on a [`Feed`] is due when it arrives.
///
/// `is_end_stream` is true once nothing more can come: no step left, no wait pending, no feed.
/// Hooks ([`on_drop`](Self::on_drop), [`probed`](Self::probed)) run when the body is dropped and
/// learn whether the script had played to its end (a body dropped before is a cancellation).
pub struct ScriptBody {
    steps: VecDeque<Step>,
    feed: Option<mpsc::UnboundedReceiver<Step>>,
    due: Option<Instant>,
    sleep: Option<Pin<Box<Sleep>>>,
    hint: Option<u64>,
    ended: bool,
    hooks: Vec<Hook>,
}

impl ScriptBody {
    /// A body playing `steps`.
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        ScriptBody {
            steps: steps.into_iter().collect(),
            feed: None,
            due: None,
            sleep: None,
            hint: None,
            ended: false,
            hooks: Vec::new(),
        }
    }

    /// A body playing what the test sends on the returned [`Feed`], until the feed is dropped.
    pub fn fed() -> (Self, Feed) {
        let (tx, rx) = mpsc::unbounded_channel();
        let mut body = ScriptBody::new([]);
        body.feed = Some(rx);
        (body, tx)
    }

    /// Reports an exact size hint of `n` bytes (counted down as data goes out).
    pub fn with_exact_hint(mut self, n: u64) -> Self {
        self.hint = Some(n);
        self
    }

    /// Runs `hook` when the body is dropped, with whether the script had played to its end.
    pub fn on_drop(mut self, hook: impl FnOnce(bool) + Send + Sync + 'static) -> Self {
        self.hooks.push(Box::new(hook));
        self
    }

    /// This body with a [`Probe`] that sees it dropped.
    pub fn probed(self) -> (Self, Probe) {
        let probe = Probe::default();
        let p = probe.clone();
        let body = self.on_drop(move |ended| {
            p.ended.store(ended, Ordering::SeqCst);
            p.dropped.store(true, Ordering::SeqCst);
        });
        (body, probe)
    }

    /// The next step: scripted, else fed; `None` at the end.
    fn next_step(&mut self, cx: &mut Context<'_>) -> Poll<Option<Step>> {
        if let Some(step) = self.steps.pop_front() {
            return Poll::Ready(Some(step));
        }
        let Some(feed) = self.feed.as_mut() else {
            return Poll::Ready(None);
        };
        let step = ready!(feed.poll_recv(cx));
        match step {
            Some(_) => self.due = Some(Instant::now()),
            None => self.feed = None,
        }
        Poll::Ready(step)
    }
}

impl Body for ScriptBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let this = self.get_mut();
        this.due.get_or_insert_with(Instant::now);
        loop {
            if let Some(s) = this.sleep.as_mut() {
                ready!(s.as_mut().poll(cx));
                this.sleep = None;
            }
            let Some(step) = ready!(this.next_step(cx)) else {
                this.ended = true;
                return Poll::Ready(None);
            };
            match step {
                Step::Wait(d) => {
                    let due = this.due.get_or_insert_with(Instant::now);
                    *due += d;
                    this.sleep = Some(Box::pin(tokio::time::sleep_until(*due)));
                }
                Step::Data(b) => {
                    if let Some(h) = this.hint.as_mut() {
                        *h = h.saturating_sub(b.len() as u64);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                Step::Trailers(t) => return Poll::Ready(Some(Ok(Frame::trailers(t)))),
                Step::Pending => {
                    this.steps.push_front(Step::Pending);
                    return Poll::Pending;
                }
                Step::Error => {
                    return Poll::Ready(Some(Err(io::Error::new(
                        io::ErrorKind::ConnectionReset,
                        "scripted upstream reset",
                    ))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.ended || (self.steps.is_empty() && self.sleep.is_none() && self.feed.is_none())
    }

    fn size_hint(&self) -> SizeHint {
        self.hint.map(SizeHint::with_exact).unwrap_or_default()
    }
}

impl Drop for ScriptBody {
    fn drop(&mut self) {
        for hook in self.hooks.drain(..) {
            hook(self.ended);
        }
    }
}

impl fmt::Debug for ScriptBody {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptBody")
            .field("steps", &self.steps.len())
            .field("fed", &self.feed.is_some())
            .field("ended", &self.ended)
            .finish()
    }
}

/// What a test learns about a dropped [`ScriptBody`] (see [`ScriptBody::probed`]).
#[derive(Clone, Debug, Default)]
pub struct Probe {
    /// Set when the body is dropped: whether its script had played to its end.
    pub ended: Arc<AtomicBool>,
    /// Set when the body is dropped.
    pub dropped: Arc<AtomicBool>,
}

impl Probe {
    /// Dropped before the script ended: the upstream saw a cancellation.
    pub fn cancelled(&self) -> bool {
        self.dropped.load(Ordering::SeqCst) && !self.ended.load(Ordering::SeqCst)
    }
}

/// The error of a scripted upstream's `call` (connection refused).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportError;

impl fmt::Display for TransportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("connection refused (scripted)")
    }
}

impl std::error::Error for TransportError {}
