//! Support code shared by tailguard's integration tests (a dev-dependency only).
//!
//! * [`ScriptBody`]: the one scripted response body: data frames, waits on tokio's clock,
//!   trailers, errors, a feed the test writes to, and hooks that see how it was dropped.
//! * [`collect`] and its views ([`frames`], [`read_all`], [`drain`]): a body read to its end.
//! * The SSE pieces of an OpenAI stream ([`ROLE`], [`token`], [`DONE`], ...), gRPC messages and
//!   the captured real streams of `testdata/fixtures` ([`fixture`]).
//! * Request builders ([`chat`], [`post`]), [`ms`], [`settle`], [`paused_runtime`], a
//!   [`TransportError`] and a [`Recorded`] list for sinks; with feature `client` a hyper
//!   [`client`], with feature `metrics` [`snapshot`]s of metrics-util's debugging recorder.
//!
//! It depends on no tailguard crate, so that every tailguard crate, core included, can use it.
//!
//! ```
//! use tailguard_test_support::{DONE, ROLE, ScriptBody, collect, data, ms, paused_runtime, wait_ms};
//!
//! paused_runtime().block_on(async {
//!     let start = tokio::time::Instant::now();
//!     let body = ScriptBody::new([data(ROLE), wait_ms(30), data(DONE)]);
//!     let seen = collect(body, start).await;
//!     assert_eq!(seen.data[1].0, ms(30));
//!     assert_eq!(seen.text(), format!("{ROLE}{DONE}"));
//! });
//! ```

#[cfg(feature = "client")]
mod client;
mod collect;
mod fixtures;
#[cfg(feature = "metrics")]
mod metrics;
mod request;
mod script;
mod wire;

use std::sync::{Arc, Mutex};
use std::time::Duration;

#[cfg(feature = "client")]
pub use client::{HttpClient, client, client_of};
pub use collect::{Collected, collect, concat, drain, frames, read_all};
pub use fixtures::{FIXTURES, fixture};
#[cfg(feature = "metrics")]
pub use metrics::{Series, Value, assert_secs, has, metric, snapshot};
pub use request::{CHAT, MESSAGES, chat, content_type, post};
pub use script::{Feed, Probe, ScriptBody, Step, TransportError, data, wait_ms};
pub use wire::{
    DONE, END, FINISH, IN_BAND_ERROR, KEEPALIVE, ROLE, TOKEN, TWO_TOKENS, USAGE, at_event_boundary,
    error_json, grpc_message, token,
};

/// The error type of boxed errors (the same as `tailguard_core::BoxError`).
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// `n` seconds.
pub fn secs(n: u64) -> Duration {
    Duration::from_secs(n)
}

/// Lets spawned tasks run without moving the paused clock.
pub async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// A current-thread runtime with time enabled and the clock paused, for tests that are not
/// `#[tokio::test]`s (property tests, `harness = false` binaries, thread-local recorders).
pub fn paused_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a current-thread runtime")
}

/// A shared list that a sink (a closure handed to a layer) pushes to and the test reads.
#[derive(Debug)]
pub struct Recorded<T>(Arc<Mutex<Vec<T>>>);

impl<T> Default for Recorded<T> {
    fn default() -> Self {
        Recorded(Arc::default())
    }
}

impl<T> Clone for Recorded<T> {
    fn clone(&self) -> Self {
        Recorded(self.0.clone())
    }
}

impl<T: Clone> Recorded<T> {
    /// Appends `item`.
    pub fn push(&self, item: T) {
        self.0.lock().unwrap().push(item);
    }

    /// Everything recorded so far, in order.
    pub fn all(&self) -> Vec<T> {
        self.0.lock().unwrap().clone()
    }

    /// How many items were recorded.
    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// Whether nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The only item; panics unless exactly one was recorded.
    pub fn one(&self) -> T {
        let all = self.all();
        assert_eq!(all.len(), 1, "expected exactly one, got {}", all.len());
        all.into_iter().next().unwrap()
    }
}

/// Says that `test` cannot run, and why (a service it needs is missing). Under CI (`CI` set to
/// anything but empty, `0` or `false`) it panics with the reason, so a CI run never goes green
/// with the test untested; elsewhere it prints `SKIPPED test: why` to stderr and the caller
/// returns early.
///
/// ```no_run
/// let Some(url) = std::env::var_os("TAILGUARD_REDIS_URL") else {
///     tailguard_test_support::cannot_run("my_test", "TAILGUARD_REDIS_URL is unset");
///     return;
/// };
/// # let _ = url;
/// ```
pub fn cannot_run(test: &str, why: &str) {
    let ci = std::env::var("CI").is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false"));
    if ci {
        panic!("{test} cannot run under CI: {why}");
    }
    eprintln!("SKIPPED {test}: {why}");
}
