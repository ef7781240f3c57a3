//! Replica-wide behaviours: what a real inference server does across requests and
//! connections, beyond one request's [`Script`](crate::Script).

use std::time::Duration;

/// uvicorn's default `timeout_keep_alive` (5 s), which the Python servers (llama-cpp-python,
/// vLLM's OpenAI server) run behind.
pub const UVICORN_KEEP_ALIVE: Duration = Duration::from_secs(5);

/// How a replica behaves as a whole. A builder: start from [`ReplicaOptions::new`] (every
/// behaviour off: requests independent, connections open as long as the client keeps them)
/// and chain; give it to [`MockServer::start_with`](crate::MockServer::start_with).
///
/// The replica's one generation slot (first come, first served) is taken by requests whose
/// script has [`single_slot`](crate::Script::single_slot): they get their head at once and
/// their first token only when the slot frees, so short requests queue behind a long prompt.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaOptions {
    pub(crate) head_after_slot: bool,
    pub(crate) interrupt: bool,
    pub(crate) keep_alive_timeout: Option<Duration>,
    pub(crate) prefill_cancelled: bool,
}

impl ReplicaOptions {
    /// Every behaviour off.
    pub fn new() -> Self {
        Self::default()
    }

    /// llama-cpp-python's server as it runs by default: one slot whose response head waits
    /// for it, newer requests interrupting the running stream, uvicorn's 5 s idle keep-alive
    /// close, and cancelled requests still prefilled.
    pub fn llama_cpp_python() -> Self {
        Self::new()
            .head_after_slot(true)
            .interrupt(true)
            .keep_alive_timeout(Some(UVICORN_KEEP_ALIVE))
            .prefill_cancelled(true)
    }

    /// Every generation request takes the replica's one slot (whatever its script's
    /// `single_slot`) and its response head is sent only once it holds it, as
    /// llama-cpp-python's server does: a client waiting for the slot sees no headers at all.
    pub fn head_after_slot(mut self, on: bool) -> Self {
        self.head_after_slot = on;
        self
    }

    /// llama.cpp-style interrupts (llama-cpp-python's default `interrupt_requests`): when a
    /// newer generation request arrives, a running stream ends at its next token: it sends
    /// its terminal event (a bare `data: [DONE]`; gRPC: none) and breaks the connection
    /// (HTTP/1.1: closed without the terminating zero-length chunk; HTTP/2: stream reset).
    /// Recorded as [`Outcome::Interrupted`](crate::Outcome::Interrupted).
    pub fn interrupt(mut self, on: bool) -> Self {
        self.interrupt = on;
        self
    }

    /// Close an idle HTTP/1.1 connection after this long, as uvicorn does
    /// ([`UVICORN_KEEP_ALIVE`] by default there): the clock starts at accept and at the end of
    /// each response, and a request head must arrive in full before it runs out. `None`:
    /// connections stay open as long as the client keeps them.
    pub fn keep_alive_timeout(mut self, idle: Option<Duration>) -> Self {
        self.keep_alive_timeout = idle;
        self
    }

    /// A streamed request whose client goes away before its first token is noticed only when
    /// that token is due: it still waits for the slot and its TTFT (the prefill), holds the
    /// slot meanwhile and stays in flight, and is counted in
    /// [`Stats::served_late`](crate::Stats::served_late) (and `cancelled`). Once streaming, a
    /// cancel stops generation at once (as without this option).
    pub fn prefill_cancelled(mut self, on: bool) -> Self {
        self.prefill_cancelled = on;
        self
    }
}

impl std::fmt::Display for ReplicaOptions {
    /// `head_after_slot=false,interrupt=true,keep_alive_timeout=5s,prefill_cancelled=false`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "head_after_slot={},interrupt={},keep_alive_timeout=",
            self.head_after_slot, self.interrupt
        )?;
        match self.keep_alive_timeout {
            Some(d) => write!(f, "{}", crate::syntax::DurationFmt(d))?,
            None => f.write_str("none")?,
        }
        write!(f, ",prefill_cancelled={}", self.prefill_cancelled)
    }
}
