//! # tailguard-phases
//!
//! [`LatencyPhaseRecorderLayer`] records every phase of every LLM request that passes through
//! it — admission queue wait, time to headers, time to first *token*, every gap between output
//! events, time per output token, total, output events, usage, end reason, hedge outcome — as
//! [`metrics`] histograms and counters, as a [`tracing`] span with one event at the end, and as a
//! plain [`PhaseReport`] handed to any [`PhaseSink`] of your own (access logs, billing).
//!
//! ```
//! use std::convert::Infallible;
//! use std::sync::{Arc, Mutex};
//!
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use tailguard_core::RequestFacts;
//! use tailguard_phases::{LatencyPhaseRecorderLayer, PhaseReport};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let reports = Arc::new(Mutex::new(Vec::<PhaseReport>::new()));
//! let sink = reports.clone();
//! let svc = ServiceBuilder::new()
//!     .layer(
//!         LatencyPhaseRecorderLayer::new()
//!             .with_routes(["/v1/chat/completions"])
//!             .with_models(["gpt-4o"])
//!             .with_upstream("vllm")
//!             .with_sink(move |r: &PhaseReport| sink.lock().unwrap().push(r.clone())),
//!     )
//!     .service(service_fn(|_req: Request<Full<Bytes>>| async {
//!         let sse = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
//!                    data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n\
//!                    data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
//!                    data: [DONE]\n\n";
//!         let res = Response::builder()
//!             .header("content-type", "text/event-stream")
//!             .body(Full::new(Bytes::from(sse)))
//!             .unwrap();
//!         Ok::<_, Infallible>(res)
//!     }));
//!
//! let mut req = Request::post("/v1/chat/completions").body(Full::default()).unwrap();
//! req.extensions_mut().insert(RequestFacts::new().with_model("gpt-4o-2024-08-06"));
//! let res = svc.oneshot(req).await.unwrap();
//! assert!(res.headers().contains_key("x-request-id"));
//! res.into_body().collect().await.unwrap();
//!
//! let reports = reports.lock().unwrap();
//! let r = &reports[0];
//! assert_eq!(r.end_reason.as_str(), "completed");
//! assert_eq!(r.output_events, 1); // the role-only chunk is not a token
//! assert_eq!(r.labels.model(), "gpt-4o");
//! assert_eq!(r.labels.route(), "/v1/chat/completions");
//! assert!(r.time_to_first_token.is_some());
//! # }
//! ```
//!
//! ## Where it goes
//!
//! Outermost, so that its clock starts before admission queueing (where it goes in a stack, and
//! why: [the recommended order](../tailguard/index.html#the-recommended-order), in the
//! `tailguard` facade). It creates the [`EndReport`](tailguard_core::EndReport) through which
//! inner layers (timeouts, admission, hedging) tell it why they ended a stream. It reads
//! [`AdmissionOutcome`], [`HedgeOutcome`], [`Priority`] and [`RequestFacts`] from the request
//! extensions, or from the response extensions when an inner layer put them there (as
//! `PriorityClass` does with the `Priority`).
//!
//! ## What is measured
//!
//! All durations run from the recorder's `call`:
//!
//! * **queue wait**: [`AdmissionOutcome::queue_wait`];
//! * **time to headers**: until the inner response future resolves;
//! * **time to first token** (TTFT): until the body frame that completes the first *token*
//!   event as the core classifier sees it (a role-only first chunk, a keepalive or a `ping` is
//!   not a token); streamed responses only;
//! * **gaps**: one per body frame carrying output events after the first token, measured from the
//!   previous such frame; events completing in the same frame are one arrival (see
//!   [`GapStats`]);
//! * **time per output token**: `(total - TTFT) / (output events - 1)`, only with more than one;
//! * **total**: until the frame carrying the stream's terminal event (`data: [DONE]`,
//!   `message_stop`, NDJSON `"done": true`) was handed on, when the stream had one (the client
//!   had its whole answer then, whatever the connection did afterwards); else until the body
//!   ended, failed, or was dropped;
//! * **output events**: token events (every gRPC message is one); **usage** when the stream
//!   reports it.
//!
//! A response is *streamed* when its `content-type` is SSE, gRPC or NDJSON as core's
//! [`Dialect::resolve_stream`](tailguard_core::Dialect::resolve_stream) decides (or any success
//! response under an explicit [`with_dialect`](LatencyPhaseRecorderLayer::with_dialect)); other
//! responses (a JSON completion, an error page) get no TTFT, gaps or events: total only.
//!
//! ## End reasons
//!
//! The first reason an inner layer reported wins; then a rejection seen in the
//! [`AdmissionOutcome`] (`rejected`), an error status (`upstream_error_4xx` / `_5xx`), a
//! gRPC error status in the headers, or a `2xx` answer that is not a stream (a whole JSON
//! completion or error document) to a request whose [`RequestFacts`] say `stream: true`
//! (`upstream_error_protocol`: the client's stream reads nothing); then what the recorder saw
//! itself: `completed` (the body ended; `upstream_error_in_band` if the stream carried an
//! error event or a non-zero `grpc-status` trailer), `upstream_error_transport` (the body or
//! the service failed), or `client_disconnect` (the body, or the response future, was dropped
//! before the end). A stream that carried junk its dialect cannot carry (see
//! [`Class::Malformed`](tailguard_core::Class::Malformed)), which no inner layer ended, is
//! `upstream_error_protocol` however it ended: a client that fails to decode the junk and
//! closes the connection is no `client_disconnect`.
//!
//! Once the frame carrying the stream's terminal event (`data: [DONE]`, `message_stop`,
//! NDJSON `"done": true`) has been handed on, the client has its whole answer: a later drop of
//! the body is `completed` (or `upstream_error_in_band` if the stream carried an error event),
//! not `client_disconnect`. Clients such as the openai SDK close the connection as soon as they
//! read `[DONE]`, often before the upstream's end of body arrives. For the same reason a
//! `client_disconnect` an inner layer reported after that frame is overruled; any other
//! reported reason still wins (an inner timeout layer that ends a finished stream quietly
//! reports nothing). A gRPC stream ends with its trailers, so it is `completed` when they are
//! handed on with `grpc-status` 0.
//!
//! "Handed on" means given to the layer or server above, not read by the client: `completed`
//! says the whole answer left the stack, into hyper's write buffer and the kernel's socket
//! buffer. A client that stops reading once those buffers hold the rest of a long stream (a
//! slow reader at 92k of 200k events) is still `completed` when the last frame is handed on;
//! the bytes it never read are not measured (the socket's send queue is below the HTTP server,
//! out of a body wrapper's sight). A client that closes the connection before the last frame
//! is handed on is `client_disconnect`, as hyper then drops the body.
//!
//! ## Labels
//!
//! Metric labels are bounded: `route` (a [`Route`] request extension, a
//! [route function](LatencyPhaseRecorderLayer::with_route_fn) such as axum's `MatchedPath`, or
//! the [configured routes](LatencyPhaseRecorderLayer::with_routes), else `other`), `model`
//! (normalised against the [configured models](LatencyPhaseRecorderLayer::with_models), else
//! `other`), `upstream`, `priority`, `end_reason` ([`end_reason_label`]) and `streamed`. Request
//! ids and raw client strings appear in traces and reports only.
//!
//! [`MetricNames::otel_genai`] switches to the OpenTelemetry GenAI client metrics
//! (`gen_ai.client.operation.duration`, `gen_ai.client.operation.time_to_first_chunk`, ...,
//! semantic conventions v1.41.0), which add `gen_ai.operation.name` (per route, see
//! [`DEFAULT_OPERATIONS`]), `gen_ai.provider.name`
//! ([`with_provider`](LatencyPhaseRecorderLayer::with_provider)) and `error.type`;
//! [`MetricNames::otel_genai_server`] to the model-server ones.
//!
//! ## Prometheus
//!
//! `metrics-exporter-prometheus` renders histograms as summaries unless it is given buckets, so
//! a plain `install_recorder()` exports no `_bucket` series. Give it the recommended buckets of
//! every histogram ([`MetricNames::histogram_buckets`]) in one loop:
//!
//! ```
//! use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
//! use tailguard_phases::MetricNames;
//!
//! let mut builder = PrometheusBuilder::new();
//! for (name, buckets) in MetricNames::tailguard().histogram_buckets() {
//!     builder = builder
//!         .set_buckets_for_metric(Matcher::Full(name.into()), buckets)
//!         .expect("the tables are not empty");
//! }
//! // In a program: `let handle = builder.install_recorder()?;` and serve `handle.render()`.
//! let handle = builder.build_recorder().handle();
//! # let _ = handle.render();
//! ```
//!
//! ## Request ids
//!
//! `x-request-id` is taken from the request when it is short printable ASCII, else generated
//! ([`RequestId::generate`]); it is set on the request sent inward, inserted into its
//! extensions, and set on the response (replacing any id the upstream chose, so the client gets
//! back the id the logs carry).
//!
//! ## Per frame
//!
//! The stream is read once per request, by the innermost layer that reads it (core's
//! [`progress`](tailguard_core::progress)): behind `SseIdleTimeout` the recorder follows the
//! timeout's reading (one uncontended lock per frame, no scan); alone it scans each data frame
//! incrementally with core's [`StreamTracker`](tailguard_core::StreamTracker), without a lock
//! or an allocation. Gaps reach
//! histograms as they happen, through a handle resolved once per streamed response
//! ([`PhaseSink::gap_histogram`]); everything else is emitted once per request, at its end.

mod body;
pub mod future;
mod labels;
mod layer;
mod metric_names;
mod metrics_sink;
mod recording;
mod report;
mod report_fmt;
mod request_id;
mod service;
mod sink;

pub use body::LatencyPhaseRecorderBody;
pub use labels::{DEFAULT_OPERATIONS, OTHER, Route, UNKNOWN};
pub use layer::LatencyPhaseRecorderLayer;
pub use metric_names::{MetricNames, buckets};
pub use metrics_sink::{MAX_CACHED_LABEL_SETS, MetricsSink};
pub use report::{GapStats, PhaseLabels, PhaseReport, end_reason_label};
pub use request_id::{MAX_REQUEST_ID_LEN, RequestId, X_REQUEST_ID};
pub use service::LatencyPhaseRecorder;
pub use sink::{PhaseSink, TracingSink};

#[cfg(doc)]
use tailguard_core::{AdmissionOutcome, HedgeOutcome, Priority, RequestFacts};
