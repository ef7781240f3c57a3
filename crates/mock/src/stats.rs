//! What a replica saw: counters and a per-request log.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// How a request ended, as the mock saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Outcome {
    /// Still being served.
    InFlight,
    /// The whole response (body to its end) was handed to the connection.
    Completed,
    /// The client went away first: it dropped the response body, reset the stream or closed
    /// the connection before the end (also before the head was sent).
    Cancelled,
    /// Answered with this error status (scripted).
    Status(u16),
    /// The connection was broken on purpose before the head.
    ResetBeforeHeaders,
    /// The connection was broken on purpose after this many tokens.
    ResetAfterTokens(u32),
    /// The stream ended with an in-band error event after this many tokens.
    ErrorEvent(u32),
    /// The request was not understood (unknown route, bad JSON, bad script header): 4xx.
    BadRequest(u16),
    /// The stream was interrupted after this many tokens because a newer request arrived
    /// ([`ReplicaOptions::interrupt`](crate::ReplicaOptions::interrupt)), or on command
    /// ([`Script::interrupt_after`](crate::Script::interrupt_after)).
    Interrupted(u32),
    /// The body ended cleanly but cut short on purpose after this many tokens: half an event,
    /// an endless line, or no terminal event.
    Truncated(u32),
}

/// One request as the mock saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct RequestRecord {
    /// Arrival order on this replica, from 0.
    pub index: u64,
    /// Request path.
    pub path: String,
    /// Value of the `x-tailguard-attempt` header, if any (lossy UTF-8).
    pub attempt: Option<String>,
    /// The request's headers.
    pub headers: http::HeaderMap,
    /// The request body, once read (empty for routes that do not read it, and for bodies over
    /// [`MAX_REQUEST_BODY`](crate::MAX_REQUEST_BODY)).
    pub body: bytes::Bytes,
    /// When the request arrived.
    pub started: Instant,
    /// When the response head was handed to hyper.
    pub headers_sent: Option<Instant>,
    /// When the first token was produced.
    pub first_token: Option<Instant>,
    /// When the request ended (body end, drop, error); `None` while in flight.
    pub ended: Option<Instant>,
    /// Tokens produced.
    pub tokens_sent: u32,
    /// The client went away before the first token, yet the replica still spent the slot and
    /// the prefill on it ([`ReplicaOptions::prefill_cancelled`](crate::ReplicaOptions::prefill_cancelled)).
    pub served_late: bool,
    /// A continuation request's offset: how many tokens of the answer it carried (an
    /// assistant prefill, or a completions prompt ending with the mock's words) and did not
    /// get again; `None` for an ordinary request. See the crate docs, "Continuation requests".
    pub continued_from: Option<u32>,
    /// How it ended.
    pub outcome: Outcome,
}

impl RequestRecord {
    /// Arrival to the response head.
    pub fn time_to_headers(&self) -> Option<Duration> {
        Some(self.headers_sent? - self.started)
    }

    /// Arrival to the first token.
    pub fn ttft(&self) -> Option<Duration> {
        Some(self.first_token? - self.started)
    }

    /// Arrival to the end.
    pub fn total(&self) -> Option<Duration> {
        Some(self.ended? - self.started)
    }
}

/// A snapshot of a replica's counters and log.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Stats {
    /// Requests received (all routes).
    pub requests: u64,
    /// Responses served to their end ([`Outcome::Completed`]).
    pub completed: u64,
    /// Requests the client abandoned before the end ([`Outcome::Cancelled`]).
    pub cancelled: u64,
    /// Scripted error statuses sent.
    pub status_errors: u64,
    /// Scripted connection resets (before or after the head).
    pub resets: u64,
    /// Streams ended with a scripted in-band error event.
    pub error_events: u64,
    /// Streams interrupted by a newer request or on command ([`Outcome::Interrupted`]).
    pub interrupted: u64,
    /// Streams cut short with a clean end ([`Outcome::Truncated`]).
    pub truncated: u64,
    /// Requests cancelled before their first token that the replica still worked on
    /// ([`RequestRecord::served_late`]); they are counted in `cancelled` too.
    pub served_late: u64,
    /// Continuation requests served: requests that carried the start of the answer and got
    /// the rest of it ([`RequestRecord::continued_from`]), whatever their outcome.
    pub continuations: u64,
    /// Requests being served now (from arrival until the body ends or is dropped, or, for a
    /// request served late, until the replica stops working on it).
    pub in_flight: u64,
    /// The most requests ever in flight at once.
    pub peak_concurrent: u64,
    /// Every request, in arrival order. It grows with every request (a few hundred bytes plus
    /// the request's headers and body each); a long-running replica can clear it with
    /// [`MockServer::reset_stats`](crate::MockServer::reset_stats).
    pub log: Vec<RequestRecord>,
}

impl Stats {
    /// The records whose attempt header had this value.
    pub fn by_attempt<'a>(&'a self, attempt: &'a str) -> impl Iterator<Item = &'a RequestRecord> {
        self.log
            .iter()
            .filter(move |r| r.attempt.as_deref() == Some(attempt))
    }
}

#[derive(Debug, Default)]
struct State {
    stats: Stats,
    /// Index of the next request (never reset, so indices stay unique).
    next_index: u64,
    /// Index of `stats.log[0]`.
    log_base: u64,
}

impl State {
    fn record(&mut self, index: u64) -> Option<&mut RequestRecord> {
        let i = usize::try_from(index.checked_sub(self.log_base)?).ok()?;
        self.stats.log.get_mut(i)
    }
}

#[derive(Debug)]
pub(crate) struct Shared {
    stats: Mutex<State>,
    in_flight: watch::Sender<u64>,
    requests: watch::Sender<u64>,
}

impl Shared {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Shared {
            stats: Mutex::new(State::default()),
            in_flight: watch::Sender::new(0),
            requests: watch::Sender::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock cannot leave the counters half-updated in a way that
        // matters to a test; keep serving.
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn snapshot(&self) -> Stats {
        self.lock().stats.clone()
    }

    pub(crate) fn reset(&self) {
        let mut st = self.lock();
        st.log_base = st.next_index;
        let in_flight = st.stats.in_flight;
        st.stats = Stats {
            in_flight,
            peak_concurrent: in_flight,
            ..Stats::default()
        };
        drop(st);
        self.requests.send_replace(0);
    }

    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.in_flight.subscribe()
    }

    pub(crate) fn subscribe_requests(&self) -> watch::Receiver<u64> {
        self.requests.subscribe()
    }

    /// Registers a new request; the guard ends it.
    pub(crate) fn begin(
        self: &Arc<Self>,
        path: &str,
        attempt: Option<String>,
        headers: http::HeaderMap,
    ) -> RequestGuard {
        let mut st = self.lock();
        let index = st.next_index;
        st.next_index += 1;
        let s = &mut st.stats;
        s.requests += 1;
        s.in_flight += 1;
        s.peak_concurrent = s.peak_concurrent.max(s.in_flight);
        let n = s.in_flight;
        let requests = s.requests;
        s.log.push(RequestRecord {
            index,
            path: path.to_owned(),
            attempt,
            headers,
            body: bytes::Bytes::new(),
            started: Instant::now(),
            headers_sent: None,
            first_token: None,
            ended: None,
            tokens_sent: 0,
            served_late: false,
            continued_from: None,
            outcome: Outcome::InFlight,
        });
        drop(st);
        self.in_flight.send_replace(n);
        self.requests.send_replace(requests);
        RequestGuard {
            shared: self.clone(),
            index,
            done: false,
            in_flight: Some(InFlight {
                shared: self.clone(),
            }),
        }
    }
}

/// One request counted in [`Stats::in_flight`] until dropped.
#[derive(Debug)]
pub(crate) struct InFlight {
    shared: Arc<Shared>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut st = self.shared.lock();
        let s = &mut st.stats;
        s.in_flight = s.in_flight.saturating_sub(1);
        let n = s.in_flight;
        drop(st);
        self.shared.in_flight.send_replace(n);
    }
}

/// Ends one request's record exactly once: explicitly with [`RequestGuard::finish`], or on drop
/// as [`Outcome::Cancelled`]; and counts it in flight until then, unless its [`InFlight`] was
/// taken to outlive it.
#[derive(Debug)]
pub(crate) struct RequestGuard {
    shared: Arc<Shared>,
    index: u64,
    done: bool,
    in_flight: Option<InFlight>,
}

/// Marks progress of one request (held by its producer task).
#[derive(Debug, Clone)]
pub(crate) struct Recorder {
    shared: Arc<Shared>,
    index: u64,
}

impl Recorder {
    fn with_record(&self, f: impl FnOnce(&mut RequestRecord)) {
        // The log can be cleared by `MockServer::reset_stats`; then the record is gone.
        if let Some(r) = self.shared.lock().record(self.index) {
            f(r);
        }
    }

    pub(crate) fn token(&self) {
        self.with_record(|r| {
            if r.first_token.is_none() {
                r.first_token = Some(Instant::now());
            }
            r.tokens_sent += 1;
        });
    }

    pub(crate) fn served_late(&self) {
        self.shared.lock().stats.served_late += 1;
        self.with_record(|r| r.served_late = true);
    }
}

impl RequestGuard {
    pub(crate) fn set_body(&self, body: &bytes::Bytes) {
        self.recorder().with_record(|r| r.body = body.clone());
    }

    /// Marks the request as a continuation after `offset` tokens.
    pub(crate) fn continuation(&self, offset: u32) {
        self.shared.lock().stats.continuations += 1;
        self.recorder()
            .with_record(|r| r.continued_from = Some(offset));
    }

    pub(crate) fn index(&self) -> u64 {
        self.index
    }

    pub(crate) fn recorder(&self) -> Recorder {
        Recorder {
            shared: self.shared.clone(),
            index: self.index,
        }
    }

    pub(crate) fn headers_sent(&self) {
        self.recorder()
            .with_record(|r| r.headers_sent = Some(Instant::now()));
    }

    pub(crate) fn finish(&mut self, outcome: Outcome) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        let mut st = self.shared.lock();
        let s = &mut st.stats;
        match outcome {
            Outcome::Completed => s.completed += 1,
            Outcome::Cancelled => s.cancelled += 1,
            Outcome::Status(_) => s.status_errors += 1,
            Outcome::ResetBeforeHeaders | Outcome::ResetAfterTokens(_) => s.resets += 1,
            Outcome::ErrorEvent(_) => s.error_events += 1,
            Outcome::Interrupted(_) => s.interrupted += 1,
            Outcome::Truncated(_) => s.truncated += 1,
            Outcome::BadRequest(_) | Outcome::InFlight => {}
        }
        if let Some(r) = st.record(self.index) {
            r.ended = Some(Instant::now());
            r.outcome = outcome;
        }
        drop(st);
        // No longer in flight, unless the count was taken to outlive the record's end.
        drop(self.in_flight.take());
    }

    /// Takes the in-flight count out of the guard, to be dropped when the replica stops
    /// working on the request.
    pub(crate) fn take_in_flight(&mut self) -> Option<InFlight> {
        self.in_flight.take()
    }
}

impl Drop for RequestGuard {
    fn drop(&mut self) {
        self.finish(Outcome::Cancelled);
    }
}
