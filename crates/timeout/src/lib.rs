//! # tailguard-timeout
//!
//! `SseIdleTimeout`: first-token, idle and total timeouts for streamed LLM responses, which
//! keepalives cannot fool.
//!
//! ```
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use tailguard_timeout::SseIdleTimeoutLayer;
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tailguard_timeout::error::BoxError> {
//! let upstream = tower::service_fn(|_req: Request<()>| async {
//!     let sse = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n";
//!     let res = Response::builder()
//!         .header("content-type", "text/event-stream")
//!         .body(Full::new(Bytes::from_static(sse.as_bytes())))?;
//!     Ok::<_, http::Error>(res)
//! });
//!
//! let svc = ServiceBuilder::new()
//!     .layer(
//!         SseIdleTimeoutLayer::new()
//!             .with_head_timeout(Duration::from_secs(10))
//!             .with_first_token_timeout(Duration::from_secs(20))
//!             .with_idle_timeout(Duration::from_secs(5))
//!             .with_total_timeout(Duration::from_secs(300)),
//!     )
//!     .service(upstream);
//!
//! let res = svc.oneshot(Request::new(())).await?;
//! let body = res.into_body().collect().await?.to_bytes();
//! assert!(body.ends_with(b"data: [DONE]\n\n"));
//! # Ok(())
//! # }
//! ```
//!
//! ## Why not tower-http's timeouts
//!
//! `TimeoutLayer` stops at response headers, which a streaming LLM server sends at once.
//! `ResponseBodyTimeoutLayer` restarts on every frame, so an upstream that sends `: keepalive`
//! comments (TGI and axum every 15 s, OpenRouter's processing comments) while generation is
//! stalled never times out, and nothing says which phase failed. This layer acts on *events*,
//! classified by [`tailguard_core`]: tokens, meta events (a role-only first chunk), keepalives
//! (`:` comments, `event: ping`), the end, and in-band errors.
//!
//! ## The five timers
//!
//! All optional, all independent; set the layer's defaults with the `with_*` methods, per
//! [`Priority`](tailguard_core::Priority) with
//! [`with_priority_timeouts`](SseIdleTimeoutLayer::with_priority_timeouts), per request with a
//! [`Timeouts`] value in the request extensions or (opt-in) a header carrying milliseconds.
//!
//! * **head**: from `call` until response headers.
//! * **first token**: from `call` (or from the headers, see [`FirstTokenClock`]) until the first
//!   *token* event. Role-only chunks, usage chunks and keepalives do not count.
//! * **idle**: after the first token, the longest allowed gap between *progress* events (any
//!   event that is not a keepalive). Keepalives do not reset it unless
//!   [`with_keepalive_resets_idle`](SseIdleTimeoutLayer::with_keepalive_resets_idle) says so.
//!   The progress clock: it catches a stalled generation behind `: ping` comments.
//! * **liveness**: from the headers, the longest allowed gap in which *no bytes at all* arrive;
//!   any bytes reset it (comments, pings, empty events, part of an event). The liveness clock:
//!   a short limit catches a silent connection quickly while a slow generation that still sends
//!   keepalives gets the longer idle limit. Its end reason is `liveness_timeout` and its
//!   in-band message begins `liveness timeout`, distinct from the idle timer's.
//! * **total**: from `call` until the end of the body.
//!
//! ## The client's deadline
//!
//! A client that says how long an answer is still worth waiting for — `grpc-timeout` on a gRPC
//! request, a header (default `x-request-timeout`: seconds, `2.5`, or a duration, `1500ms`) on
//! the others; see [`ClientDeadline`](tailguard_core::ClientDeadline) and
//! [`with_client_deadline`](SseIdleTimeoutLayer::with_client_deadline) — tightens the request's
//! total deadline. It is read once, by the first layer that looks (admission, when it is
//! outside this one, so the time queued counts), and can only shorten the configured limits:
//! the first-token and total timers are the minimum of their own limit and the time left. A
//! client's deadline that passes is a total timeout (end reason `deadline`). The budget left is
//! written into the outgoing request (`grpc-timeout` by default; the HTTP header when
//! propagation is on), and the hedge rewrites it for every attempt it sends.
//!
//! The request's effective first-token and total deadlines go to the inner service as a
//! [`Deadlines`](tailguard_core::Deadlines) in the request extensions (tightening one already
//! there), so a layer inside this one (the hedge) never plans past them; see
//! [`SseIdleTimeoutLayer`].
//!
//! ## What happens on expiry
//!
//! Before headers (head, or first token / total when they start at `call`): in response mode
//! (the default) an HTTP 504 with an OpenAI-shaped JSON error (a trailers-only `grpc-status: 4`
//! response for gRPC requests); in error mode
//! ([`with_error_mode`](SseIdleTimeoutLayer::with_error_mode)) a
//! [`TimeoutError`](error::TimeoutError).
//!
//! After headers: per [`OnExpiry`] (default: per dialect), a terminal in-band error event then a
//! clean end, gRPC trailers `grpc-status: 4`, or a body error. Bytes of an event the client has
//! not fully received are held back until the event is complete, so an in-band error never lands
//! in the middle of an event; events that complete within one frame (what LLM servers send) pass
//! through without being held or copied.
//!
//! In every case the inner future or body is dropped at once, which cancels the upstream
//! request, and the [`EndReason`](tailguard_core::EndReason) is reported to an
//! [`EndReport`](tailguard_core::EndReport) in the request extensions before the final frame.
//! After the stream said it ended (`data: [DONE]`, `message_stop`, an in-band error of the
//! upstream's own), an expiry ends the body quietly instead: the client already has the whole
//! answer.
//!
//! ## When the upstream fails
//!
//! The client always gets a clean ending in its dialect, and the end reason says what happened.
//! Once a streamed response's headers are out, an upstream failure ends the stream the way an
//! expiry does (per [`OnExpiry`], the bytes of an unfinished event dropped), with an
//! `upstream_error` event whose `code` is the end reason's label:
//!
//! * **A body error** (a reset, a broken connection), before or after the first token: the
//!   client is at an event boundary (it only ever holds whole events), so it gets the in-band
//!   error event (then `[DONE]` for OpenAI), or gRPC trailers `grpc-status: 14`
//!   (`UNAVAILABLE`), and a clean end instead of a transport error; end reason
//!   `UpstreamError(Transport)`. A body the layer does not watch (not a stream, no timer)
//!   passes the error through.
//! * **A stream cut short**: the body ends (a clean end, or trailers) without the dialect's
//!   terminal event (for gRPC, a status after whole messages); the half event it may end in is
//!   never forwarded; end reason `UpstreamError(Truncated)`. On by default for the dialects
//!   whose servers always send one; see
//!   [`with_require_terminal_event`](SseIdleTimeoutLayer::with_require_terminal_event).
//! * **A stream ended without a finish reason**: the terminal event (`[DONE]`, Anthropic's
//!   `message_stop`) came, but no event before it said why the answer ended (OpenAI
//!   `finish_reason`, Anthropic `stop_reason`): an interrupting server (llama.cpp's default)
//!   ends the running stream that way when a newer request takes its slot, and an SDK would
//!   return the cut answer as whole. The terminal event is not forwarded (what its frame held
//!   before it is); end reason `UpstreamError(Truncated)`, with a message that says the finish
//!   reason was missing. Part of the same check (on for OpenAI and Anthropic streams); the
//!   Responses API and gRPC, whose endings say it otherwise, are not affected.
//! * **An event over the scanner's cap** (1 MiB by default; say a line that never ends): the
//!   stream cannot be followed, so it ends there, the oversized event dropped; end reason
//!   `UpstreamError(Protocol)` (gRPC: `grpc-status: 13`).
//! * **Junk** (an event its dialect cannot carry, see
//!   [`Class::Malformed`](tailguard_core::Class::Malformed): for OpenAI and Anthropic SSE, data
//!   that is not a JSON object and not `[DONE]`, such as `data: this is not json`, `data: {{{{`
//!   or a chunk cut short), before or after the first token: a client SDK would fail to decode
//!   it (Python's `JSONDecodeError`), so it is never passed on. The frame that carried it is
//!   dropped whole and the stream ends there with the in-band error (code
//!   `upstream_error_protocol`); end reason `UpstreamError(Protocol)`. After the first token
//!   the check costs a look at each event's first bytes and last byte (no copy, no parse), so
//!   it catches text, braces that open no member and objects cut short, not an object broken
//!   only in its middle; before it, the event is parsed. Behind a
//!   [`FirstTokenHedge`](https://docs.rs/tailguard-hedge), junk before the first token fails
//!   the attempt over instead, and never reaches this layer. This layer is the one that ends a
//!   stream for junk after its first token: without it, the hedge passes a committed stream on
//!   as it comes (the recorder still reports `UpstreamError(Protocol)`).
//!
//! A response that is not a stream (`application/json`, say) is not affected.
//!
//! ## On shutdown
//!
//! With [`with_shutdown`](SseIdleTimeoutLayer::with_shutdown), a server's graceful stop ends the
//! streams still running when its grace period is over the same way: after the last whole
//! event, an in-band error the client may retry (code `shutdown`), end reason `Deadline`.
//!
//! ## Timing, precisely
//!
//! * **Frames first.** Each poll first polls the inner future or body. A frame (or the
//!   response headers) that is ready is always delivered, even if a deadline has passed; the
//!   timers act when the body has to *wait* (the inner side has nothing ready). So at the same
//!   instant a ready frame wins over its timer, and a gap exactly equal to a limit does not
//!   fire: a timer fires iff the gap *exceeds* its limit. So that an upstream that always has a
//!   frame ready (a flood of keepalives) cannot hold a timer off, the deadlines are also checked
//!   after every 32 frames delivered in a row without waiting.
//! * **A client that does not read.** The body runs no task of its own: timers are checked only
//!   when the client polls it. The first-token and total deadlines are fixed instants (from
//!   `call`, or from the headers for [`FirstTokenClock::FromHeaders`]), so time the client
//!   spends not reading counts toward them; frames the upstream produced in the meantime are
//!   still delivered first, so a token that was already there is never lost to a slow reader.
//!   The idle gap runs from the first moment after a progress event at which the client asked
//!   for more and the upstream had nothing ready, until the next progress event: time the client
//!   spends between frames never counts against it.
//! * **Per frame.** A frame never resets a timer: progress records a later deadline, and each
//!   timer's sleep, armed when the body first waits on it, is re-armed when it fires before a
//!   deadline that progress has moved. In the steady state a frame allocates nothing.
//!
//! ## Composition
//!
//! The response body is [`SseIdleTimeoutBody<B>`], whose data type is the inner body's
//! (`B::Data: From<Bytes>`, which every hyper, axum and tonic body has), so the layer goes on a
//! tonic `Channel`, a hyper client or an axum `Router` as it is. In response mode the service's
//! error type is the inner service's; in error mode it is [`BoxError`](error::BoxError). The
//! body's error type is [`BoxError`](error::BoxError). Where it goes in a stack:
//! [the recommended order](../tailguard/index.html#the-recommended-order), in the `tailguard`
//! facade.

mod body;
mod ending;
pub mod error;
pub mod future;
mod held;
mod layer;
mod service;
mod shutdown;
mod timers;

pub use body::SseIdleTimeoutBody;
pub use layer::{FirstTokenClock, OnExpiry, SseIdleTimeoutLayer, Timeouts};
pub use service::SseIdleTimeout;
pub use tailguard_core::{Fail, Respond};
