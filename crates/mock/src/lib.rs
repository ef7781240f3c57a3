//! tailguard-mock: a scriptable mock LLM upstream and an open-loop load generator.
//!
//! [`MockServer`] is one replica on `127.0.0.1` (HTTP/1.1 and HTTP/2 on one port) that speaks
//! OpenAI chat/completions SSE, Anthropic messages SSE and a gRPC server-streaming `Generate`
//! service, and misbehaves on command: a [`Script`] sets the delay before headers, the time to
//! first token (fixed or drawn from a seeded [`Latency`] distribution), the number of tokens
//! and the gaps between them, stalls, keepalive comments, error statuses with `Retry-After`,
//! connection resets, in-band error events, and head-of-line blocking (single-slot mode). A
//! request can carry its own script in the [`SCRIPT_HEADER`] header. [`Stats`] count requests,
//! completions and client cancellations and log every request, so tests can assert "the losing
//! hedge attempt was cancelled upstream".
//!
//! Everything timing-related runs on tokio's clock, so a client and the mock in one
//! `#[tokio::test(start_paused = true)]` runtime see exact, reproducible timings over loopback.
//!
//! ```
//! use std::time::Duration;
//! use tailguard_mock::{MockServer, Script};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let server = MockServer::start(
//!     Script::new().ttft(Duration::from_millis(20)).tokens(3).gap(Duration::from_millis(5)),
//! )
//! .await?;
//! println!("OpenAI-compatible upstream at {}/v1/chat/completions", server.url());
//! assert_eq!(server.stats().requests, 0);
//! server.shutdown().await;
//! # Ok(())
//! # }
//! ```

mod body;
pub mod grpc;
pub mod load;
mod rng;
mod script;
mod server;
pub mod sse;
mod stats;
mod wire;

pub use body::{MockBody, MockReset};
pub use rng::SplitMix64;
pub use script::{
    DEFAULT_SEED, DEFAULT_TOKENS, Latency, MAX_LATENCY, ParseError, Script, parse_duration,
};
pub use server::{
    ATTEMPT_HEADER, ATTEMPT_SCRIPT_HEADER_PREFIX, MAX_REQUEST_BODY, MockServer, SCRIPT_HEADER,
};
pub use stats::{Outcome, RequestRecord, Stats};
