//! # tailguard
//!
//! Tower middleware that guards the tail latency of LLM streaming calls. Streaming servers send
//! `200 OK` at once and the first token much later, so middleware that acts on "the response"
//! acts on headers; every tailguard layer acts on *tokens* instead: the first content-bearing
//! event of the stream and the gaps between events.
//!
#![cfg_attr(
    all(
        feature = "phases",
        feature = "priority",
        feature = "admission",
        feature = "timeout",
        feature = "hedge",
        feature = "route"
    ),
    doc = include_str!("stack.md")
)]
//!
//! This facade re-exports [`tailguard_core`] as [`core`], and each layer crate (and the
//! balancer, `route`) behind a feature of the same name (`full` enables all seven):
//!
//! | feature | module | layer |
//! |---|---|---|
//! | `phases` | `phases` | `LatencyPhaseRecorderLayer`: queue wait, TTFT, gaps, total, end reason as metrics and tracing |
//! | `priority` | `priority` | `PriorityClassLayer`: classes with per-class policy the other layers read |
//! | `admission` | `admission` | `BoundedAdmissionLayer`: bounded in-flight streams and queue, fast 429/503 with `Retry-After` |
//! | `timeout` | `timeout` | `SseIdleTimeoutLayer`: head, first-token, idle and total timeouts keepalives cannot fool |
//! | `hedge` | `hedge` | `FirstTokenHedgeLayer`: a backup attempt when the first token is late; first token wins |
//! | `route` | `route` | `ReplicaSet`: places each attempt by the replicas' first tokens, with slots, ejection and base URIs |
//! | `tenant` | `tenant` | `TokenBudgetLayer`: token budgets per tenant (`priority`'s `TenantLayer` says who), reserved at admission, settled from the stream |
//!
//! ```
//! use tailguard::core::{EndReason, Priority};
//!
//! assert!(Priority::interactive() > Priority::batch());
//! assert_eq!(EndReason::IdleTimeout.as_str(), "idle_timeout");
//! ```
//!
//! ## The recommended order
//!
//! This is the one place the order and its reasons are told; the other crates' docs link here.
//! Outermost first:
//!
//! ```text
//! LatencyPhaseRecorder -> PriorityClass -> BoundedAdmission -> SseIdleTimeout -> FirstTokenHedge -> upstream client
//! ```
//!
//! * **`LatencyPhaseRecorder` outermost**, so that its clock starts before the admission queue
//!   (the queue wait is part of what the caller feels) and it sees every outcome, refusals
//!   included. It creates the `EndReport` through which the inner layers tell it *why* they
//!   ended a stream (a timeout, a refusal, an upstream failure), and reads the admission and
//!   hedge outcomes from the response. `PriorityClass`, inside it, copies the request's
//!   `Priority` into the response extensions, so the recorder still labels every request with
//!   its class.
//! * **`PriorityClass` next**: admission (reserved shares, shedding order), the timeouts
//!   (per-class limits) and the hedge (per-class switch) read the `Priority` and `ClassPolicy`
//!   it puts into the request extensions, so it must run before all of them.
//! * **`BoundedAdmission` outside the timeouts and the hedge**: its permit is held until the
//!   response body ends, so it bounds concurrent *generations*; the time a request waits in its
//!   queue has its own deadline (and CoDel) and does not eat into the first-token timeout; and a
//!   hedged request holds one permit however many attempts it races (the hedge's extra load is
//!   bounded by its own budget).
//! * **`SseIdleTimeout` outside the hedge**: the first-token and total limits cover the whole
//!   race, which is the latency the caller sees, and a timed-out stream is ended once, in the
//!   client's dialect, with every attempt cancelled.
//! * **`FirstTokenHedge` innermost**, right on the upstream client: it buffers the request body
//!   for replay and sends each attempt to another replica (with `route::ReplicaSet` under it, or
//!   any router that reads the `Attempt` extension: core's attempt protocol, `core::attempt`,
//!   through which the hedge tells the set of each attempt's first token or failure).
//!
//! Over an upstream client that can fail (hyper's pooled client: `legacy::Error`), core's
//! `BadGatewayLayer` outermost answers its errors with a 502 in the client's protocol and makes
//! the stack `Infallible`, which axum's `Router::route_service` takes as it is
//! (`examples/axum_replicas.rs`). Core's `RequestFactsLayer`, when used, goes outside the
//! recorder: it reads the JSON body once, and the recorder's `model` label, the hedge's
//! `stream: false` check and admission's cost read what it found (without it the model label is
//! `unknown`).
//!
//! Any subset of the layers composes in the same relative order, with no glue between them:
//! every layer keeps its body's data type (`B::Data: From<Bytes>`, which every hyper, axum and
//! tonic body has) and, in its default mode, the inner service's error type.
//!
//! **A client's deadline** (`grpc-timeout`, or `x-request-timeout` on HTTP) is read by the
//! first layer that acts on the time left — `BoundedAdmission` in this order, else
//! `SseIdleTimeout` — through one function, `tailguard_core::ClientDeadline::accept`, which the
//! others then find done. Reading it there anchors it at arrival, so time spent queued counts
//! against it, and any subset of the layers still honours it. It only ever tightens the
//! request's `Deadlines`, the one source of time left: admission refuses at once what cannot be
//! served in time, the timeouts fire at it, the hedge sends no backup that could not win, and
//! every attempt carries the budget left upstream.
//!
//! The gateway (`cargo run --release -p tailguard-gateway`, `crates/gateway`) runs
//! exactly this stack over a pooled hyper client and embedded mock replicas;
//! `examples/examples/axum_router.rs` puts it on an existing axum `Router`.
//!
//! ## Errors: response mode and error mode
//!
//! Every layer that can refuse or end a request itself has two modes, chosen by type:
//! [`Respond`](core::Respond), the default, and [`Fail`](core::Fail), chosen with
//! `with_error_mode()` on the layer. In response mode a layer renders its own refusals and
//! timeouts as responses (an OpenAI-shaped JSON error with the right status, or a trailers-only
//! gRPC response for a gRPC request) and its service keeps the inner service's error type,
//! like tower-http's `TimeoutLayer`; so the whole stack over an `Infallible` axum handler is
//! `Infallible`, and `Router::layer` and `route_service` take it with no `HandleErrorLayer`.
//! In error mode the layer's own ends are `Err`s of a typed error boxed as a
//! [`BoxError`](core::BoxError), which is then the service's error type.
//!
//! What can come out of each layer's service as an `Err`:
//!
//! | layer | response mode (default) | error mode (`with_error_mode()`) |
//! |---|---|---|
//! | `LatencyPhaseRecorder` | the inner service's error (recorded) | no error mode |
//! | `PriorityClass` | the inner service's error | no error mode |
//! | `BoundedAdmission` | the inner service's error; refusals are `429`/`503` responses with `Retry-After` | also [`Overloaded`](core::Overloaded) |
//! | `SseIdleTimeout` | the inner service's error; an expiry before headers is a `504` (gRPC: `grpc-status: 4`) | also [`TimeoutError`](core::TimeoutError) |
//! | `FirstTokenHedge` | the inner service's error, when no attempt got a response; every other failed race is answered (the upstream's own error replayed, or a rendered `502`/`504`), a request body that fails while buffered is a `400` | also [`UpstreamError`](core::UpstreamError) when every attempt failed, `RequestBodyError` |
//!
//! Response *bodies* are another matter: after the headers are out, a layer ends a stream
//! in-band (an error event in the stream's dialect, or gRPC trailers); `SseIdleTimeout`'s body
//! error type is [`BoxError`](core::BoxError), which every server takes, and it carries a
//! [`TimeoutError`](core::TimeoutError) or [`UpstreamError`](core::UpstreamError) only with
//! `OnExpiry::BodyError`, or the inner body's own error for a body it does not watch.
//!
//! ## State
//!
//! One layer value is one piece of state: every service it builds (every `layer()` call, as
//! axum's `Router::layer` makes once per route) and every clone of the layer share it, like
//! tower's `GlobalConcurrencyLimitLayer`: one `BoundedAdmissionLayer` is one gate, one
//! `FirstTokenHedgeLayer` one TTFT estimate and budget, one `LatencyPhaseRecorderLayer` one sink.
//! Each `with_*` call starts a new state with the changed configuration; for separate state,
//! build separate layer values. Every service also has the same constructor,
//! `Service::new(inner, &layer)`, the same as `layer.layer(inner)`, and every layer crate the
//! same module rule: only `future` and `error` are public modules (the types signatures name);
//! everything else is at the crate root.

pub use tailguard_core as core;

/// `FirstTokenHedge`: hedge on the first token (feature `hedge`).
#[cfg(feature = "hedge")]
pub use tailguard_hedge as hedge;

/// `ReplicaSet`: placement by first-token signals, slots, ejection, base URIs (feature `route`).
#[cfg(feature = "route")]
pub use tailguard_route as route;

/// `SseIdleTimeout`: first-token, idle and total timeouts (feature `timeout`).
#[cfg(feature = "timeout")]
pub use tailguard_timeout as timeout;

/// `BoundedAdmission`: bounded in-flight work and wait queue (feature `admission`).
#[cfg(feature = "admission")]
pub use tailguard_admission as admission;

/// `PriorityClass`: request classification and per-class policy (feature `priority`).
#[cfg(feature = "priority")]
pub use tailguard_priority as priority;

/// `LatencyPhaseRecorder`: every phase of every request (feature `phases`).
#[cfg(feature = "phases")]
pub use tailguard_phases as phases;

/// `TokenBudgetLayer`: token budgets per tenant (feature `tenant`).
#[cfg(feature = "tenant")]
pub use tailguard_tenant as tenant;

/// The README snippets of the workspace, compiled and run as doctests where users copy them.
#[cfg(all(doctest, feature = "full"))]
mod readme {
    #[doc = include_str!("../../../README.md")]
    mod workspace {}
    #[doc = include_str!("../README.md")]
    mod tailguard {}
    #[doc = include_str!("../../core/README.md")]
    mod core {}
    #[doc = include_str!("../../admission/README.md")]
    mod admission {}
    #[doc = include_str!("../../hedge/README.md")]
    mod hedge {}
    #[doc = include_str!("../../route/README.md")]
    mod route {}
    #[doc = include_str!("../../phases/README.md")]
    mod phases {}
    #[doc = include_str!("../../priority/README.md")]
    mod priority {}
    #[doc = include_str!("../../timeout/README.md")]
    mod timeout {}
}
