//! # tailguard-hedge
//!
//! `FirstTokenHedge`: a tower layer that hedges LLM streaming calls on the first *token*, not
//! on response headers.
//!
//! ```
//! use std::time::Duration;
//!
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use tailguard_core::{HedgeOutcome, ReplayBody};
//! use tailguard_hedge::FirstTokenHedgeLayer;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tailguard_core::BoxError> {
//! // The upstream: anything that takes `Request<ReplayBody<B>>` (here a closure; in a
//! // gateway a hyper client, in a gRPC client a tonic `Channel` behind a `map_request`).
//! let upstream = service_fn(|_req: Request<ReplayBody<Full<Bytes>>>| async {
//!     let sse = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
//!                data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n\
//!                data: [DONE]\n\n";
//!     let res = Response::builder()
//!         .header("content-type", "text/event-stream")
//!         .body(Full::new(Bytes::from(sse)))
//!         .unwrap();
//!     Ok::<_, std::convert::Infallible>(res)
//! });
//!
//! let client = ServiceBuilder::new()
//!     .layer(
//!         FirstTokenHedgeLayer::new()
//!             .with_delay(Duration::from_millis(800)) // or the adaptive p90 (the default)
//!             .with_max_attempts(2),
//!     )
//!     .service(upstream);
//!
//! let req = Request::post("/v1/chat/completions").body(Full::new(Bytes::from("{}")))?;
//! let res = client.oneshot(req).await?;
//! // The first token came well within the delay: no backup was sent.
//! let outcome = res.extensions().get::<HedgeOutcome>().cloned().unwrap();
//! assert_eq!((outcome.attempts, outcome.winner), (1, Some(0)));
//! let body = res.into_body().collect().await?.to_bytes();
//! assert!(body.ends_with(b"data: [DONE]\n\n"));
//! # Ok(())
//! # }
//! ```
//!
//! ## Why not `tower::hedge`
//!
//! Streaming LLM servers send `200 OK` at once and the first token seconds later.
//! `tower::hedge` measures latency to headers, so its percentile collapses to about zero, and
//! it commits to whichever replica sent headers first, even one that never emits a token. This
//! layer races attempts on their first token instead.
//!
//! ## How a request goes
//!
//! 1. **Eligibility** (one check in `call`): hedging on (at least two attempts), the predicate
//!    (default: `POST`, not marked non-streaming by
//!    [`RequestFacts`](tailguard_core::RequestFacts)), no opt-out header
//!    ([`OPT_OUT_HEADER`]), the per-[`Priority`](tailguard_core::Priority) switch
//!    ([`ClassPolicy::hedge`](tailguard_core::ClassPolicy), or
//!    [`with_priorities`](FirstTokenHedgeLayer::with_priorities)), a body size hint within the
//!    replay cap, and the rollout fraction. Anything else goes straight to the inner service.
//! 2. The request body is buffered for replay (core's
//!    [`ReplayBody`](tailguard_core::ReplayBody)); a body that turns out larger than the cap is
//!    sent once, intact and unhedged.
//! 3. The primary is sent; its response head is checked (a retryable status fails it at once,
//!    other non-`2xx` statuses are returned as they are) and its body read through a
//!    [`StreamTracker`](tailguard_core::StreamTracker), holding the frames.
//! 4. No token within the delay: a backup is sent (if the [`HedgeBudget`] allows), with an
//!    [`Attempt`] in its extensions and the [`ATTEMPT_HEADER`], so a router (or
//!    `tailguard-route`'s `ReplicaSet`) sends it to another replica. When that placer says a
//!    backup would wait at least so long wherever it went
//!    ([`Attempt::backup_wait`](tailguard_core::attempt::Attempt::backup_wait): every other
//!    replica is known to be slow), the backup is held until the attempt it backs up has waited
//!    as long. An attempt that fails before its first token (transport error, reset, retryable
//!    status, in-band error, end with no token) makes the next go out at once.
//! 5. The first attempt to produce a token wins: the response future resolves with its head,
//!    a [`HedgeBody`] that replays what it sent so far and then continues live, and a
//!    [`HedgeOutcome`](tailguard_core::HedgeOutcome) in the response extensions. The others
//!    are dropped, cancelling their upstream requests.
//!
//! Headers therefore reach the client only once a winner is committed or every attempt failed;
//! then the client gets the upstream's own error answer, or a rendered `502` when the best
//! failure was a stream with no token (never a `200` with no answer), see [`FirstTokenHedge`].
//!
//! A request whose extensions carry core's [`Deadlines`](tailguard_core::Deadlines) (a timeout
//! layer outside sets them) waits at most half of the first-token time it has left before each
//! backup, so a backup always has at least as long as the attempt before it had (see
//! [`HedgeDelay`]). With an adaptive delay, a backup (delay-triggered or a failover) is not
//! sent when the first-token time left is shorter than the expected time to first token (the
//! median of the estimate, once it has its minimum samples): it could not win and would only
//! add load; [`HedgeOutcome::deadline_skipped`](tailguard_core::HedgeOutcome) says so. Every
//! attempt carries the budget left when it is sent (`grpc-timeout`, or the configured HTTP
//! header, see [`ClientDeadline`](tailguard_core::ClientDeadline)), so a deadline-aware
//! upstream can drop work nobody waits for.
//!
//! ## What hedging costs
//!
//! The [`HedgeOutcome`](tailguard_core::HedgeOutcome) in the response extensions records, beside
//! the attempts sent and the winner, every losing attempt with how long it ran before it was
//! cancelled (or failed), the request body bytes sent on the losing attempts, and the prompt
//! tokens sent on them when the request's [`RequestFacts`](tailguard_core::RequestFacts) know
//! its `prompt_tokens`: the prefill the hedge paid for. `LatencyPhaseRecorder` turns them into
//! per-upstream counters and puts them on the request's log line. When a layer outside ends the
//! request during the race (a first-token timeout, a deadline, the client going away), no
//! response carries the outcome: the hedge reports it, every attempt a loser, to the request's
//! [`EndReport`](tailguard_core::EndReport) as it is dropped.
//!
//! ## Composition
//!
//! Put the hedge outside what should run once per attempt (a per-attempt first-token timeout,
//! a balancer, the client) and inside what should run once per request (admission, the
//! recorder). Layers below it see each attempt as a request of its own, with an [`Attempt`] in
//! its extensions. The hedge settles each attempt's [`Attempt`] at its first token, at a failure
//! before it, or when it commits to it without one ([`Settle`](tailguard_core::attempt::Settle)),
//! so whatever placed the attempt learns how its replica did: `tailguard-route`'s
//! `ReplicaSet` (`FirstTokenHedgeLayer::new().layer(ReplicaSet::new(replicas))`), or a balancer
//! of your own that binds an [`AttemptClaim`](tailguard_core::attempt::AttemptClaim) (core's
//! [attempt protocol](tailguard_core::attempt)). The two crates do not depend on each other.
//! Each raced attempt gets an [`EndReport`](tailguard_core::EndReport) of its own when the
//! request carries one, so a loser's end (it is dropped) never reaches the outer
//! report; the winner's reason is forwarded to it before the client sees the end of the body.
//!
//! ## Mid-stream resume
//!
//! [`ResumeLayer`], over the hedge: once the client has its first token, a stream that breaks
//! (a reset, a truncation, an in-band error, a terminal event before any finish reason)
//! continues on another replica, as one stream, from the text the client already has; off
//! unless added (the gateway's `--resume on`). A continuation is a later attempt of the same
//! request: the hedge adopts the [`Attempt`] the request arrives with, so a placer sends it
//! to a replica no earlier attempt went to. See [`ResumeLayer`] for what is resumed and how.
//!
//! ## tonic
//!
//! A tonic `Channel` takes exactly `tonic::body::Body`; the replayed request body keeps the
//! `Bytes` data of the body it replays, so wrapping it is all it takes:
//!
//! ```no_run
//! use http::Request;
//! use tailguard_core::ReplayBody;
//! use tailguard_hedge::FirstTokenHedgeLayer;
//! use tower::ServiceBuilder;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let channel = tonic::transport::Channel::from_static("http://127.0.0.1:50051").connect_lazy();
//! let hedged = ServiceBuilder::new()
//!     .layer(FirstTokenHedgeLayer::new())
//!     .map_request(|r: Request<ReplayBody<tonic::body::Body>>| r.map(tonic::body::Body::new))
//!     .service(channel);
//! // `hedged` is a `GrpcService`: hand it to any generated client, e.g.
//! // `GeneratorClient::new(hedged)`; every message of a server stream is a token.
//! # let _ = hedged;
//! # Ok(())
//! # }
//! ```
//!
//! ## Metrics
//!
//! * `tailguard_hedge_sent_total{trigger="delay"|"failure"}`: extra attempts sent;
//! * `tailguard_hedge_won_total`: races won by a backup's first token;
//! * `tailguard_hedge_budget_withdrawn_total{budget="hedge"|"failover"}` and
//!   `tailguard_hedge_budget_exhausted_total{budget}`: extra attempts each budget allowed and
//!   refused (a refused backup is asked for again at doubling intervals: each refusal counts);
//! * `tailguard_hedge_all_failed_total`: requests whose every attempt failed;
//! * `tailguard_hedge_delay_seconds{key}` (gauge): the adaptive delay in force, per estimate
//!   key (bounded by [`AdaptiveDelay::with_max_keys`]), or `key="fixed"`;
//! * `tailguard_hedge_delay_used_seconds` (histogram): the delay when a hedge fired (for a
//!   backup the budget first refused, the doubled interval of the ask that went);
//! * `tailguard_resumes_total{reason, outcome}`: streams [`ResumeLayer`] saw break after
//!   their first token, and what came of it.
//!
//! `tracing` debug events mark each attempt sent, failed, cancelled and committed.
//!
//! [`Attempt`]: tailguard_core::attempt::Attempt
//! [`ATTEMPT_HEADER`]: tailguard_core::attempt::ATTEMPT_HEADER

// Where things are: `config` (the configuration), `layer` (building it), `state` (what the
// services of one layer value share, and eligibility), `service` (`call` starting a race),
// `future` (the response future), `race` (one request's race: sending attempts, the hedge
// timer, commit, every attempt failed), `inflight` (one attempt read up to its first
// token), `verdict` (what a head, a frame, trailers or the end say; which failure ranks
// highest), `answer` (the rendered error, or the error, when every attempt failed), `template`
// (the request head each attempt is copied from), `body` (the client's body: replay, then
// live, or a rendered error), `delay`, `budget` and `shared_budget`; `resume` (mid-stream
// resume: `plan`, `read`, `layer`, `body`). The attempt protocol is
// core's (`tailguard_core::attempt`); `ReplicaSet` is in `tailguard-route`.
mod answer;
mod body;
mod budget;
mod config;
mod cost;
mod delay;
pub mod error;
pub mod future;
mod inflight;
mod layer;
mod metrics;
mod race;
mod resume;
mod service;
mod shared_budget;
mod state;
mod template;
mod verdict;

pub use body::HedgeBody;
pub use budget::HedgeBudget;
pub use config::{MAX_ATTEMPTS, OPT_OUT_HEADER};
pub use delay::{AdaptiveDelay, DelayKey, HedgeDelay};
pub use layer::FirstTokenHedgeLayer;
pub use resume::{NotResumable, Resume, ResumeBody, ResumeFuture, ResumeLayer};
pub use service::FirstTokenHedge;
pub use shared_budget::{BudgetBackend, Exchange, ExchangeFuture, SharedBudget};
