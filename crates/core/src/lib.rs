//! # tailguard-core
//!
//! The shared vocabulary of tailguard, the tower middleware that guards the tail latency of LLM
//! streaming calls. Every tailguard layer acts on *tokens* — the first content-bearing event of a
//! streamed response and the gaps between events — rather than on response headers, and this
//! crate is how they find them:
//!
//! * [`scan`]: incremental scanners for SSE, gRPC and NDJSON bodies that find event boundaries
//!   frame by frame without copying the stream;
//! * [`classify`]: classification of each event into token / meta / keepalive / done / error,
//!   with presets for OpenAI, Anthropic, gRPC and NDJSON, and [`StreamTracker`] that drives both
//!   per response;
//! * the extension types layers exchange ([`Priority`], [`ClassPolicy`], [`RequestFacts`],
//!   [`AdmissionOutcome`], [`HedgeOutcome`], [`EndReason`], [`EndReport`]), each at the crate
//!   root;
//! * [`deadline`]: the time left of a request ([`Deadlines`]), the client's own deadline
//!   ([`ClientDeadline`]: `grpc-timeout` or an HTTP header) and the budget sent on upstream;
//! * what admission and the hedge did ([`AdmissionOutcome`], [`HedgeOutcome`] with the cost of
//!   its losing attempts);
//! * [`attempt`]: the attempt protocol, by which a layer that sends several attempts of a
//!   request (the hedge) tells whatever placed each attempt (a balancer, `tailguard-route`'s
//!   `ReplicaSet`) of its first token, failure or cancellation ([`attempt::Attempt`],
//!   [`attempt::AttemptClaim`], [`attempt::Settle`]);
//! * [`error`]: concrete, downcastable error types;
//! * [`render`]: one place that turns an error into an HTTP response, an in-band event or gRPC
//!   trailers;
//! * [`Respond`] and [`Fail`]: the two modes of a layer that can refuse or end a request
//!   itself, and [`Mode`], what they decide (the service's error type, what the caller gets);
//! * [`replay`]: request bodies buffered once so they can be sent twice;
//! * [`facts`]: [`RequestFacts`] read from OpenAI and Anthropic request JSON, and
//!   [`RequestFactsLayer`], which reads them once per request and hands the buffered body on.
//!
//! ```
//! use bytes::Bytes;
//! use http::HeaderMap;
//! use tailguard_core::{Dialect, StreamTracker};
//!
//! let mut headers = HeaderMap::new();
//! headers.insert("content-type", "text/event-stream".parse().unwrap());
//! let mut tracker = StreamTracker::new(&Dialect::Auto, &headers);
//!
//! // A role-only first chunk is not a token...
//! let role = Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n");
//! assert!(!tracker.observe(&role).first_token);
//! // ...the first content delta is, even when it arrives split across frames.
//! let part1 = Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"cont");
//! let part2 = Bytes::from_static(b"ent\":\"Hi\"}}]}\n\n");
//! assert!(!tracker.observe(&part1).first_token);
//! assert_eq!(tracker.pending_bytes(), part1.len());
//! assert!(tracker.observe(&part2).first_token);
//! assert!(tracker.observe(&Bytes::from_static(b"data: [DONE]\n\n")).done);
//! ```

mod answer;
pub mod attempt;
mod bad_gateway;
pub mod classify;
pub mod deadline;
pub mod error;
mod ext;
pub mod facts;
pub mod headers;
mod macros;
mod mode;
mod outcome;
pub mod progress;
pub mod render;
pub mod replay;
pub mod scan;
mod tenant;
pub mod tracker;

pub use answer::AnswerBody;
pub use bad_gateway::{BadGateway, BadGatewayFuture, BadGatewayLayer};
pub use classify::{Class, Classify, Dialect, Framing, Wire};
pub use deadline::{ClientDeadline, Deadlines};
pub use error::{
    BoxError, OverloadReason, Overloaded, Phase, ScanError, TimeoutError, UpstreamError,
};
pub use ext::{
    ClassPolicy, EndReason, EndReport, Priority, RequestFacts, Upstream, UpstreamFailure,
};
pub use facts::{FactsError, RequestFactsLayer, RequestFactsService};
pub use mode::{Fail, Mode, Respond};
pub use outcome::{
    AdmissionOutcome, BreakReason, HedgeOutcome, LoserRun, ResumeOutcome, Resumption,
};
pub use render::{ErrorInfo, GrpcCode, RenderError};
pub use replay::{DEFAULT_REPLAY_CAP, ReplayBody};
pub use tenant::Tenant;
pub use tracker::{Observation, StreamTracker, Usage};
