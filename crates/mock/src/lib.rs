//! tailguard-mock: a scriptable mock LLM upstream and an open-loop load generator.
//!
//! [`MockServer`] is one replica on `127.0.0.1` (HTTP/1.1 and HTTP/2 on one port) that speaks
//! OpenAI chat/completions SSE, OpenAI Responses API SSE, Anthropic messages SSE, Ollama-style
//! NDJSON and a gRPC
//! server-streaming `Generate` service, and misbehaves on command: a [`Script`] sets the delay before headers, the time to
//! first token (fixed or drawn from a seeded [`Latency`] distribution), the number of tokens
//! and the gaps between them, stalls, keepalive comments, error statuses with `Retry-After`,
//! connection resets (FIN or RST), in-band error events, broken streams (half an event, an
//! endless line, garbage data lines, no terminal event, a
//! llama.cpp-style interrupt) and head-of-line blocking
//! (single-slot mode). A request can carry its own script in the [`SCRIPT_HEADER`] header.
//! [`ReplicaOptions`] add what real servers do across requests: a response head that waits for
//! the slot, llama.cpp-style interrupts, uvicorn's idle keep-alive close, cancelled
//! requests that still cost their prefill, and batching with K slots (changeable mid-run). [`Stats`] count requests,
//! completions and client cancellations and log every request, so tests can assert "the losing
//! hedge attempt was cancelled upstream".
//!
//! Everything timing-related runs on tokio's clock, so a client and the mock in one
//! `#[tokio::test(start_paused = true)]` runtime see exact, reproducible timings over loopback.
//!
//! ```
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use tailguard_mock::{MockServer, Outcome, SCRIPT_HEADER, Script};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! // A replica whose first token takes 200ms, then 3 tokens 10ms apart.
//! let server = MockServer::start(
//!     Script::new().ttft(Duration::from_millis(200)).tokens(3).gap(Duration::from_millis(10)),
//! )
//! .await?;
//!
//! let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
//! let request = |script: &'static str| {
//!     http::Request::post(format!("{}/v1/chat/completions", server.url()))
//!         .header(SCRIPT_HEADER, script) // per-request override of the replica's script
//!         .body(Full::new(Bytes::from_static(br#"{"stream":true,"messages":[]}"#)))
//! };
//!
//! // A well-behaved stream: role-only chunk, 3 content chunks, finish chunk, [DONE].
//! let body = client.request(request("")?).await?.into_body().collect().await?.to_bytes();
//! let text = String::from_utf8(body.to_vec())?;
//! assert_eq!(text.matches("\"content\"").count(), 3);
//! assert!(text.ends_with("data: [DONE]\n\n"));
//!
//! // A stream that stalls forever after one token: the client gives up and drops it.
//! let res = client.request(request("stall_after=1")?).await?;
//! let mut body = res.into_body();
//! body.frame().await; // role-only chunk
//! body.frame().await; // the one token
//! drop(body);
//! server.wait_idle().await; // until the mock has seen the disconnect
//!
//! let stats = server.stats();
//! assert_eq!((stats.requests, stats.completed, stats.cancelled), (2, 1, 1));
//! assert_eq!(stats.log[1].outcome, Outcome::Cancelled);
//! let ttft = stats.log[0].first_token.unwrap() - stats.log[0].started;
//! assert!(ttft >= Duration::from_millis(200)); // exact on a paused clock (tokio `test-util`)
//! server.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! # Continuation requests
//!
//! The mock's answer is deterministic: token *i* is word *i* of a 12-word cycle (`"Hello"`,
//! `" there"`, `","`, ... `"\n"`). A request that carries the start of that answer gets the
//! rest of it, so a test can check that an answer resumed on another replica (mid-stream
//! resume) equals the uninterrupted one byte for byte. The *offset* `k` (tokens already
//! generated) is read from the request:
//!
//! * `POST /v1/chat/completions`: the last message has role `assistant` (a prefill;
//!   `"continue_final_message": true, "add_generation_prompt": false`, as vLLM and SGLang
//!   take them, are accepted and optional; an explicit `"continue_final_message": false` asks
//!   for a new turn and makes an ordinary request). Its content (a string, or text parts
//!   concatenated) must be exactly the text of the first `k` tokens (`k` may be 0).
//! * `POST /v1/messages`: the last message has role `assistant`; its content (a string, or the
//!   `text` of its blocks of type `text`, concatenated) must be exactly the text of the first
//!   `k` tokens. (The mock does not refuse trailing whitespace as Anthropic does: the prefix
//!   of 12 tokens ends with `"\n"`.)
//! * `POST /v1/completions`: `k` is the largest `k >= 1`, up to the script's token count, such
//!   that the prompt (a string, or an array of one string) ends with the text of the first `k`
//!   tokens; if there is none, `k = 0` and the request is an ordinary one. The mock cannot
//!   tell where the user's prompt ends, so a prompt that itself ends with the mock's words
//!   (`"Say Hello"`) is read as a continuation.
//! * The Responses API, Ollama and gRPC routes never continue.
//!
//! A chat or Anthropic prefill that is not the text of a whole number of the mock's tokens
//! (other words, or a cut inside a token) gets a `400` in the API's error shape
//! (`invalid_request_error`) with the message
//! `mock: assistant prefill is not a prefix of the mock's answer`, so a test notices.
//!
//! A continuation after `k` tokens sends tokens `k`, `k + 1`, ...: **the script's
//! [`tokens`](Script::tokens) count the whole answer, prefix included, and the request's
//! `max_tokens` the tokens of this response** (as the real APIs count them), so it sends
//! `min(tokens - k, max_tokens)` tokens (none if `k >= tokens`). A request that uninterrupted
//! gets `N = min(tokens, max_tokens)` tokens, resumed after `k < N` tokens with `max_tokens`
//! lowered by `k` (if it was given), gets exactly tokens `k..N`: `N - k` tokens, and the same
//! finish reason (`"length"` / `max_tokens` when `max_tokens` cut the script's answer short).
//! Usage reports the `N - k` tokens of this response as completion (output) tokens and the
//! prompt tokens as for any request (the words of all messages, the prefill included). The
//! other knobs count the tokens of this response: `reset_after=5` on a continuation breaks
//! the connection after 5 tokens sent, whatever `k` is; likewise `stall_after`,
//! `error_after`, `half_event`, `interrupt_after`, `junk_*` and an interrupt's count.
//!
//! [`Stats::continuations`] counts the continuation requests a replica served (whatever their
//! outcome; not the refused ones), and [`RequestRecord::continued_from`] is a request's `k`,
//! so a test can assert that a resumed attempt reached a replica as a continuation.
//!
//! # Pieces
//!
//! * [`MockServer`]: the replica (routes, script selection, [`stats`](MockServer::stats),
//!   [`wait_idle`](MockServer::wait_idle)).
//! * [`Script`] and [`Latency`]: what a request does, in code or in the header syntax of
//!   [`Script::apply`].
//! * [`ReplicaOptions`]: replica-wide behaviours of real servers.
//! * [`Stats`], [`RequestRecord`], [`Outcome`]: what the replica saw.
//! * [`grpc`]: the `Generate` service's messages and a tonic client.
//! * [`load`]: the open-loop load generator; [`sse`]: its minimal SSE reader.
//! * The `tailguard-mock` binary: `serve` (N replicas from the command line), `load`, `bench`.

mod body;
mod continuation;
mod faults;
pub mod grpc;
mod handle;
mod latency;
pub mod load;
mod options;
mod producer;
mod responses;
mod rng;
mod script;
mod server;
mod slots;
pub mod sse;
mod stats;
mod syntax;
mod wire;

pub use body::{MockBody, MockReset};
pub use handle::{ATTEMPT_HEADER, ATTEMPT_SCRIPT_HEADER_PREFIX, MAX_REQUEST_BODY, SCRIPT_HEADER};
pub use latency::{Latency, MAX_LATENCY};
pub use options::{ReplicaOptions, UVICORN_KEEP_ALIVE};
pub use rng::SplitMix64;
pub use script::{DEFAULT_LINE_BYTES, DEFAULT_SEED, DEFAULT_TOKENS, Garbage, Script};
pub use server::MockServer;
pub use stats::{Outcome, RequestRecord, Stats};
pub use syntax::{ParseError, parse_duration};

/// The README's snippets, compiled where users copy them.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
mod readme {}
