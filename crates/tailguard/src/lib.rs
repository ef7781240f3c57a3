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
        feature = "hedge"
    ),
    doc = include_str!("stack.md")
)]
//!
//! This facade re-exports [`tailguard_core`] as [`core`], and each layer crate behind a feature
//! of the same name (`full` enables all five):
//!
//! | feature | module | layer |
//! |---|---|---|
//! | `phases` | `phases` | `LatencyPhaseRecorderLayer`: queue wait, TTFT, gaps, total, end reason as metrics and tracing |
//! | `priority` | `priority` | `PriorityClassLayer`: classes with per-class policy the other layers read |
//! | `admission` | `admission` | `BoundedAdmissionLayer`: bounded in-flight streams and queue, fast 429/503 with `Retry-After` |
//! | `timeout` | `timeout` | `SseIdleTimeoutLayer`: head, first-token, idle and total timeouts keepalives cannot fool |
//! | `hedge` | `hedge` | `FirstTokenHedgeLayer`: a backup attempt when the first token is late; first token wins |
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
//!   hedge outcomes from the response.
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
//!   for replay and sends each attempt to another replica (with a `ReplicaSet`, or any router
//!   that reads the `Attempt` extension).
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
//! One piece of glue is needed: admission renders its refusals into the body type under it, so
//! that body's data must be `From<Bytes>`, and the timeout layer yields `Chunk<Bytes>`; a
//! `map_response` between them turns the data into `Bytes` without copying (see below). Any
//! subset of the layers composes in the same relative order.
//!
//! The example gateway (`cargo run --release --example gateway`, `examples/src/gateway`) runs
//! exactly this stack over a pooled hyper client and embedded mock replicas.

pub use tailguard_core as core;

/// `FirstTokenHedge`: hedge on the first token (feature `hedge`).
#[cfg(feature = "hedge")]
pub use tailguard_hedge as hedge;

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
