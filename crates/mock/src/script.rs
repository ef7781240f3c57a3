//! Scripts: what one replica (or one request) does. The header syntax is in `syntax.rs`, the
//! latency distributions in `latency.rs`.

use std::time::Duration;

use http::StatusCode;

use crate::latency::Latency;

/// How the connection is broken on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) enum Reset {
    /// Not at all.
    #[default]
    None,
    /// Before the response head: HTTP/1.1 closes the connection, HTTP/2 resets the stream.
    BeforeHeaders,
    /// After this many tokens: the body fails once the bytes before are flushed, so HTTP/1.1
    /// closes the connection mid-body (no terminating zero-length chunk) and HTTP/2 resets the
    /// stream.
    AfterTokens(u32),
}

/// A stream cut short in the middle of an event, on purpose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Cut {
    /// The first half of the next event's bytes.
    HalfEvent,
    /// The start of a data line and then `line_bytes` bytes without a line end.
    EndlessLine,
}

/// What replaces every token event in a garbage stream ([`Script::garbage`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Garbage {
    /// A data line that is not JSON (`data: <<garbage 3>> {"choices":[`).
    NotJson,
    /// A data line that is not UTF-8 (bytes `ff fe c3 28`).
    BadUtf8,
}

/// Default of [`Script::line_bytes`]: 2 MiB, twice the 1 MiB event cap of tailguard-core's
/// scanner and of the load generator's reader, so an endless line overruns both.
pub const DEFAULT_LINE_BYTES: u64 = 2 << 20;

/// What one request (or every request of a replica) does. A builder: start from
/// [`Script::new`] and chain.
///
/// The timeline of a streaming response is: `head_delay` → response head (200 OK) → (with
/// `early_meta`, the default) the role-only chunk / `message_start` → wait for the single slot
/// (in single-slot mode) → `ttft` → token 1 → `gap` → token 2 → … → finish chunk → usage chunk
/// (if asked) → `data: [DONE]`. Keepalive comments are sent every `keepalive_every` from the
/// head on, during every wait (TTFT, gaps, stalls). A stall after token *N* inserts a pause (or
/// an endless one) after that token; an error event after token *N* ends the stream there with
/// an in-band error; a reset after token *N* breaks the connection there; half an event or an
/// endless line after token *N* ends the body there (cleanly, or with the reset at the same
/// *N*).
///
/// A non-streamed request (no `"stream": true`) waits out the same timeline (slot, TTFT, gaps,
/// stalls) and then sends the whole JSON body at once; an in-band error becomes an HTTP 500,
/// a reset after *N* tokens breaks the connection before the head, and no keepalives are sent.
/// The stream faults ([`half_event_after`](Self::half_event_after),
/// [`endless_line_after`](Self::endless_line_after), [`garbage`](Self::garbage),
/// [`no_done`](Self::no_done), [`interrupt_after`](Self::interrupt_after),
/// [`junk_before`](Self::junk_before),
/// [`junk_after`](Self::junk_after)) apply to streamed responses only;
/// [`json_reply`](Self::json_reply) answers a streamed request as a non-streamed one.
///
/// Also parsed from (and printed to) a compact header syntax, see [`Script::apply`].
#[derive(Clone, Debug, PartialEq)]
pub struct Script {
    pub(crate) head_delay: Duration,
    pub(crate) ttft: Latency,
    pub(crate) tokens: u32,
    pub(crate) gap: Latency,
    pub(crate) prefill_per_token: Duration,
    pub(crate) stall_after: Option<(u32, Option<Duration>)>,
    pub(crate) keepalive_every: Option<Duration>,
    pub(crate) status: Option<StatusCode>,
    pub(crate) status_fraction: f64,
    pub(crate) retry_after: Option<Duration>,
    pub(crate) reset: Reset,
    pub(crate) error_event_after: Option<u32>,
    pub(crate) single_slot: bool,
    pub(crate) seed: u64,
    pub(crate) early_meta: bool,
    pub(crate) tool_calls: bool,
    pub(crate) rst: bool,
    pub(crate) cut: Option<(u32, Cut)>,
    pub(crate) line_bytes: u64,
    pub(crate) garbage: Option<Garbage>,
    pub(crate) no_done: bool,
    pub(crate) interrupt_after: Option<u32>,
    pub(crate) junk_before: u32,
    pub(crate) junk_after: u32,
    pub(crate) json_reply: bool,
}

impl Default for Script {
    fn default() -> Self {
        Script::new()
    }
}

/// Default number of tokens: 8, enough to have gaps to measure and short enough to read in a
/// failing test's output.
pub const DEFAULT_TOKENS: u32 = 8;

/// Default seed of the latency distributions.
pub const DEFAULT_SEED: u64 = 0x7a11_6a4d;

impl Script {
    /// A well-behaved upstream: no delays, [`DEFAULT_TOKENS`] tokens back to back, no errors,
    /// role-only chunk right after the head, seed [`DEFAULT_SEED`].
    pub fn new() -> Self {
        Script {
            head_delay: Duration::ZERO,
            ttft: Latency::default(),
            tokens: DEFAULT_TOKENS,
            gap: Latency::default(),
            prefill_per_token: Duration::ZERO,
            stall_after: None,
            keepalive_every: None,
            status: None,
            status_fraction: 1.0,
            retry_after: None,
            reset: Reset::None,
            error_event_after: None,
            single_slot: false,
            seed: DEFAULT_SEED,
            early_meta: true,
            tool_calls: false,
            rst: false,
            cut: None,
            line_bytes: DEFAULT_LINE_BYTES,
            garbage: None,
            no_done: false,
            interrupt_after: None,
            junk_before: 0,
            junk_after: 0,
            json_reply: false,
        }
    }

    /// Delay before the response head is sent (default 0).
    pub fn head_delay(mut self, d: Duration) -> Self {
        self.head_delay = d;
        self
    }

    /// Time from the response head to the first token (default 0). In single-slot mode the
    /// wait for the slot comes on top.
    pub fn ttft(mut self, l: impl Into<Latency>) -> Self {
        self.ttft = l.into();
        self
    }

    /// Number of tokens (content chunks) to send (default [`DEFAULT_TOKENS`]), capped by the
    /// request's `max_tokens`. For a continuation request after `k` tokens this is the length
    /// of the whole answer, so it sends `min(n - k, max_tokens)` (see the crate docs,
    /// "Continuation requests").
    pub fn tokens(mut self, n: u32) -> Self {
        self.tokens = n;
        self
    }

    /// Time between two tokens (default 0), drawn afresh for every gap when it is a
    /// distribution.
    pub fn gap(mut self, l: impl Into<Latency>) -> Self {
        self.gap = l.into();
        self
    }

    /// Prefill time per prompt token (default 0), added to the TTFT: a request's first token
    /// comes `ttft + prefill_per_token × prompt tokens` after it starts generating (after its
    /// slot, when it takes one). Prompt tokens are the whitespace-separated words of the
    /// request's `messages`/`prompt`/`input` (gRPC: of its prompt).
    pub fn prefill_per_token(mut self, d: Duration) -> Self {
        self.prefill_per_token = d;
        self
    }

    /// After token `n` (0 = before the first token, right after the TTFT wait), pause for
    /// `pause`, or forever with `None` (keepalives, if any, go on).
    pub fn stall_after(mut self, n: u32, pause: Option<Duration>) -> Self {
        self.stall_after = Some((n, pause));
        self
    }

    /// Send an SSE keepalive every `every` from the response head on (OpenAI: `: keepalive`
    /// comment; Anthropic: `event: ping`). Off by default. Zero turns it off.
    pub fn keepalive_every(mut self, every: Duration) -> Self {
        self.keepalive_every = (!every.is_zero()).then_some(every);
        self
    }

    /// Answer with this HTTP status (after `head_delay`) and an error body in the route's
    /// dialect instead of a completion. gRPC maps it to a trailers-only `grpc-status`.
    pub fn status(mut self, status: StatusCode) -> Self {
        self.status = Some(status);
        self
    }

    /// Only this fraction of requests (drawn with the seed) get [`status`](Self::status); the
    /// rest are served normally (default 1.0).
    pub fn status_fraction(mut self, f: f64) -> Self {
        self.status_fraction = f;
        self
    }

    /// Send `Retry-After` (whole seconds, rounded up) with an error status.
    pub fn retry_after(mut self, d: Duration) -> Self {
        self.retry_after = Some(d);
        self
    }

    /// Break the connection before the response head (after `head_delay`).
    pub fn reset_before_headers(mut self) -> Self {
        self.reset = Reset::BeforeHeaders;
        self
    }

    /// Break the connection after `n` tokens (0: right after the role-only chunk, before any
    /// content), once the bytes before are flushed: HTTP/1.1 closes the connection without the
    /// terminating zero-length chunk, HTTP/2 resets the stream.
    pub fn reset_after_tokens(mut self, n: u32) -> Self {
        self.reset = Reset::AfterTokens(n);
        self
    }

    /// Scripted resets abort an HTTP/1.1 connection with a TCP RST (zero linger), so the
    /// client reads "connection reset by peer", instead of closing it with a FIN. HTTP/2 resets
    /// the stream either way. Off by default.
    pub fn rst(mut self, on: bool) -> Self {
        self.rst = on;
        self
    }

    /// After `n` tokens, send the first half of the next event's bytes (token `n + 1`, or the
    /// first event after the last token) and end the body there: cleanly (the terminating
    /// zero-length chunk, HTTP/2 `END_STREAM`), or, with
    /// [`reset_after_tokens(n)`](Self::reset_after_tokens) too, by breaking the connection
    /// (HTTP/1.1: a FIN without the terminating chunk).
    pub fn half_event_after(mut self, n: u32) -> Self {
        self.cut = Some((n, Cut::HalfEvent));
        self
    }

    /// After `n` tokens, start a data line (`data: `; NDJSON: nothing; gRPC: a message header
    /// announcing 4 GiB) and send [`line_bytes`](Self::line_bytes) bytes without a line end,
    /// then end the body as [`half_event_after`](Self::half_event_after) does.
    pub fn endless_line_after(mut self, n: u32) -> Self {
        self.cut = Some((n, Cut::EndlessLine));
        self
    }

    /// How many bytes an endless line has (default [`DEFAULT_LINE_BYTES`]): a bound, so a test
    /// of a client that never gives up still ends.
    pub fn line_bytes(mut self, n: u64) -> Self {
        self.line_bytes = n;
        self
    }

    /// Replace every token event by a garbage data line (Anthropic keeps the
    /// `event: content_block_delta` line; NDJSON has no `data: `; gRPC sends a message that is
    /// not protobuf). Garbage is not counted as tokens in [`RequestRecord`](crate::RequestRecord).
    pub fn garbage(mut self, kind: Garbage) -> Self {
        self.garbage = Some(kind);
        self
    }

    /// End the body cleanly without the stream's terminal event: no `data: [DONE]` (OpenAI),
    /// no `message_stop` (Anthropic), no `"done": true` line (Ollama), no trailers (gRPC);
    /// everything before it as usual. Off by default.
    pub fn no_done(mut self, on: bool) -> Self {
        self.no_done = on;
        self
    }

    /// After `n` tokens, end the stream as an interrupted llama.cpp stream ends (what
    /// [`ReplicaOptions::interrupt`](crate::ReplicaOptions::interrupt) does when a newer request
    /// arrives, here on command): the stream's terminal event with no finish reason before it
    /// (OpenAI: a bare `data: [DONE]`; Anthropic: `message_stop`; Ollama: the `done: true`
    /// line; gRPC: none), then the connection breaks as with
    /// [`reset_after_tokens`](Self::reset_after_tokens) (HTTP/1.1: a FIN without the
    /// terminating chunk). Recorded as [`Outcome::Interrupted`](crate::Outcome::Interrupted).
    /// Off by default.
    pub fn interrupt_after(mut self, n: u32) -> Self {
        self.interrupt_after = Some(n);
        self
    }

    /// Send `n` junk data lines right before the first token (after the TTFT wait), then the
    /// tokens as usual: `data: this is not json at all` and `data: {{{{`, in turn (Anthropic
    /// with an `event: content_block_delta` line; NDJSON without `data: `; gRPC: none), what a
    /// broken upstream or proxy sends and a client SDK fails to decode (`JSONDecodeError`).
    /// Junk is not counted as tokens. 0 (none) by default.
    pub fn junk_before(mut self, n: u32) -> Self {
        self.junk_before = n;
        self
    }

    /// Send `n` junk data lines (as [`junk_before`](Self::junk_before)) after the first token:
    /// where the second token would go (after its gap, so the first token is a frame of its
    /// own), then the rest as usual; with one token, before the stream's end. With no tokens,
    /// no junk of either kind. 0 (none) by default.
    pub fn junk_after(mut self, n: u32) -> Self {
        self.junk_after = n;
        self
    }

    /// Answer a request that asked to stream as if it had not: after the same timeline, one
    /// `200` with `content-type: application/json` and the whole completion in the route's
    /// dialect (as a server that ignores `stream: true` does; a client's stream reads nothing
    /// from it). gRPC: no effect. Off by default.
    pub fn json_reply(mut self, on: bool) -> Self {
        self.json_reply = on;
        self
    }

    /// End the stream after `n` tokens with an in-band error event (OpenAI
    /// `data: {"error":..}` then `data: [DONE]`; Anthropic `event: error`; gRPC trailers with
    /// `grpc-status` 13).
    pub fn error_event_after(mut self, n: u32) -> Self {
        self.error_event_after = Some(n);
        self
    }

    /// Single-slot mode: requests with this set take the replica's one generation slot (after
    /// the response head, before the TTFT wait; first come, first served) and hold it until
    /// their body ends or is dropped, so concurrent requests queue behind each other
    /// (head-of-line blocking, as in a busy inference server: short requests wait behind a long
    /// prompt). Off by default. See also
    /// [`ReplicaOptions::head_after_slot`](crate::ReplicaOptions::head_after_slot).
    pub fn single_slot(mut self, on: bool) -> Self {
        self.single_slot = on;
        self
    }

    /// Seed of the latency draws (default [`DEFAULT_SEED`]). Request *k* of a replica draws
    /// from a generator seeded with a mix of `seed` and *k*.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// Whether the meta events that precede the first token (OpenAI role-only chunk, Anthropic
    /// `message_start`/`content_block_start`/`ping`) are sent right after the head (`true`, the
    /// default: the case that fools a layer watching for "the first frame") or right before the
    /// first token.
    pub fn early_meta(mut self, on: bool) -> Self {
        self.early_meta = on;
        self
    }

    /// OpenAI chat: stream `tool_calls` argument deltas instead of text content (as in the
    /// `llmock-openai-tool-call-stream.sse` fixture). Off by default.
    pub fn tool_calls(mut self, on: bool) -> Self {
        self.tool_calls = on;
        self
    }

    /// The number of tokens.
    pub fn token_count(&self) -> u32 {
        self.tokens
    }
}
