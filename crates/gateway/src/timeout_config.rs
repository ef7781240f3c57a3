//! The `[timeout]` section: `SseIdleTimeout`'s timers and the client's deadline.

use std::time::Duration;

use http::HeaderName;
use tailguard::core::ClientDeadline;

use super::args::Args;
use super::config::{Config, ConfigError, err};
use super::file::{FileConfig, Timer};
use super::resolve::pick;

/// `SseIdleTimeout` settings (`None`: the timer is off) and how a client's own deadline is read.
#[derive(Clone, Debug)]
pub struct TimeoutConfig {
    /// Until response headers.
    pub head: Option<Duration>,
    /// Until the first token.
    pub first_token: Option<Duration>,
    /// Between progress events after the first token.
    pub idle: Option<Duration>,
    /// Between any bytes (keepalives count) after the headers.
    pub liveness: Option<Duration>,
    /// The whole request.
    pub total: Option<Duration>,
    /// The HTTP header a client's deadline is read from (`None`: only `grpc-timeout`).
    pub deadline_header: Option<HeaderName>,
    /// Whether that header is sent on upstream with the budget left.
    pub propagate_deadline: bool,
}

impl Default for TimeoutConfig {
    /// Head **30 s**, the first-token limit: the hedge holds the response head until a first
    /// token, and some servers send headers only when a slot frees, so a shorter head limit
    /// would end requests that are merely queued; first token **30 s** (long prompts take time
    /// to prefill); idle **15 s** (a decoding server sends tokens every few tens of ms, so 15 s
    /// of silence is a stall, not a slow token); liveness **off** (the right limit sits above
    /// the upstream's own keepalive interval, which the gateway cannot know); total **600 s**
    /// (long generations); the client's deadline read from `x-request-timeout` (it can only
    /// shorten its own request) and not sent on (upstreams do not know the header).
    fn default() -> Self {
        TimeoutConfig {
            head: Some(Duration::from_secs(30)),
            first_token: Some(Duration::from_secs(30)),
            idle: Some(Duration::from_secs(15)),
            liveness: None,
            total: Some(Duration::from_secs(600)),
            deadline_header: Some(tailguard::core::deadline::REQUEST_TIMEOUT),
            propagate_deadline: false,
        }
    }
}

impl TimeoutConfig {
    /// How the layers read, and send on, a client's deadline.
    pub fn client_deadline(&self) -> ClientDeadline {
        let cd = ClientDeadline::new().with_propagation(self.propagate_deadline);
        match &self.deadline_header {
            Some(name) => cd.with_header(name.clone()),
            None => cd.without_header(),
        }
    }
}

impl Config {
    pub(super) fn resolve_timeout(
        &mut self,
        file: &FileConfig,
        args: &Args,
    ) -> Result<(), ConfigError> {
        let t = &mut self.timeout;
        let f = &file.timeout;
        t.head = pick(args.timeout_head, f.head, Timer(t.head)).0;
        t.first_token = pick(
            args.timeout_first_token,
            f.first_token,
            Timer(t.first_token),
        )
        .0;
        t.idle = pick(args.timeout_idle, f.idle, Timer(t.idle)).0;
        t.liveness = pick(args.timeout_liveness, f.liveness, Timer(t.liveness)).0;
        t.total = pick(args.timeout_total, f.total, Timer(t.total)).0;
        for (key, v) in [
            ("timeout.head (--timeout-head)", t.head),
            ("timeout.first_token (--timeout-first-token)", t.first_token),
            ("timeout.idle (--timeout-idle)", t.idle),
            ("timeout.liveness (--timeout-liveness)", t.liveness),
            ("timeout.total (--timeout-total)", t.total),
        ] {
            if v == Some(Duration::ZERO) {
                return err(format!("{key} must be longer than 0 (or `off`)"));
            }
        }
        let header = args.deadline_header.as_ref().or(f.deadline_header.as_ref());
        t.deadline_header = match header.map(|h| h.trim()) {
            None => t.deadline_header.take(),
            Some("off") => None,
            Some(name) => match HeaderName::try_from(name) {
                Ok(name) => Some(name),
                Err(_) => {
                    return err(format!(
                        "timeout.deadline_header (--deadline-header) `{name}` is not a header name (or `off`)"
                    ));
                }
            },
        };
        t.propagate_deadline = match args.propagate_deadline.as_deref() {
            None => f.propagate_deadline.unwrap_or(t.propagate_deadline),
            Some("on") => true,
            Some("off") => false,
            Some(other) => {
                return err(format!(
                    "timeout.propagate_deadline (--propagate-deadline) must be `on` or `off`, not `{other}`"
                ));
            }
        };
        Ok(())
    }
}
