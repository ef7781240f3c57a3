//! # tailguard-admission
//!
//! `BoundedAdmission`: bounded work, honest fast failure. A tower layer for LLM streaming calls
//! that bounds the capacity in use *through the end of each response body* and the queue in
//! front of it, and refuses what it cannot take fast, with an honest `Retry-After`.
//!
//! ```
//! use std::convert::Infallible;
//!
//! use bytes::Bytes;
//! use http_body_util::{BodyExt, Full};
//! use tailguard_admission::BoundedAdmissionLayer;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let admission = BoundedAdmissionLayer::new(64).with_queue_len(128);
//! let handle = admission.handle();
//! let svc = ServiceBuilder::new()
//!     .layer(admission)
//!     .service(service_fn(|_req: http::Request<()>| async {
//!         let body = Full::new(Bytes::from_static(b"data: [DONE]\n\n"));
//!         Ok::<_, Infallible>(http::Response::new(body))
//!     }));
//!
//! let res = svc.oneshot(http::Request::new(())).await.unwrap();
//! // The permit is held while the body streams...
//! assert_eq!(handle.in_flight(), 1);
//! let bytes = res.into_body().collect().await.unwrap().to_bytes();
//! assert_eq!(&bytes[..], b"data: [DONE]\n\n");
//! // ...and released when it ends.
//! assert_eq!(handle.in_flight(), 0);
//! # }
//! ```
//!
//! ## Why `ConcurrencyLimit` is not enough
//!
//! `tower::limit::ConcurrencyLimit` releases its permit when the response *headers* exist, so
//! for a streamed generation it bounds nothing; it also queues without bound in `poll_ready`
//! and never refuses. `LoadShed` refuses but has no queue, no deadline, no status code and no
//! `Retry-After`.
//!
//! ## Semantics
//!
//! * **Capacity in units.** Each request holds [`Cost`] units (1 by default) from admission
//!   until its response body ends: the last frame, `is_end_stream()` turning true after a
//!   frame, a body error, or the body dropped. A response whose body is empty at once releases
//!   at once; an inner error releases at once. One request holds at most
//!   [`with_max_request_share`](BoundedAdmissionLayer::with_max_request_share) of the capacity
//!   (its cost is capped, never refused), so a huge prompt neither monopolises the gate nor
//!   waits forever for it to empty.
//! * **Bounded queue with deadlines.** A request that does not fit waits in a queue of
//!   [`with_queue_len`](BoundedAdmissionLayer::with_queue_len) requests, inside the response
//!   future (decisions are made in `call`; `poll_ready` only forwards the inner service's
//!   readiness). Each waiter has a deadline; at the deadline it is refused with **503**. A
//!   waiter whose caller goes away (the future is dropped) leaves the queue at once and holds
//!   nothing.
//! * **CoDel (off by default).** With [`with_codel`](BoundedAdmissionLayer::with_codel), a
//!   request that arrives while its own class or a higher one has had waiters for the CoDel
//!   interval (100 ms) may wait only the target (5 ms): the gate fails fast instead of letting
//!   latency build. Once those waiters drain, arrivals get the full deadline again. A standing
//!   queue of lower classes does not shorten a higher class's wait (it goes ahead of them). Off
//!   by default: a permit is held for a whole stream, so a queue standing for 100 ms is ordinary
//!   at moderate load, and the target would refuse requests the next stream's end admits.
//!   Optional adaptive LIFO serves the newest waiter of a class first while its queue stands.
//! * **Refusals.** A full queue refuses at once with **429** (configurable to 503). Bodies are
//!   OpenAI-style JSON (`{"error":{"message":..,"type":..,"param":null,"code":"queue_full"}}`);
//!   every refusal (`queue_full`, `queue_timeout`, `evicted`) carries a `Retry-After` derived
//!   from the observed permit hold times (see [Retry-After](#retry-after)). The error mode
//!   ([`BoundedAdmissionLayer::with_error_mode`]) returns
//!   [`Overloaded`](tailguard_core::Overloaded) as a `BoxError` instead, for tonic stacks.
//!   If the request carries an [`EndReport`](tailguard_core::EndReport), a refusal reports
//!   [`EndReason::Rejected`](tailguard_core::EndReason::Rejected).
//! * **Priority.** The [`Priority`](tailguard_core::Priority) in the request extensions (written
//!   by `tailguard-priority`, or anyone) picks the class; requests without one are `standard`.
//!   The queue serves higher classes first; each aging period a waiter has waited raises its
//!   effective level by 10, so lower classes cannot starve.
//!   A class can have a reserved share of the capacity
//!   ([`ClassPolicy::reserved_share`](tailguard_core::ClassPolicy) in the request extensions, or
//!   [`with_reserved_share`](BoundedAdmissionLayer::with_reserved_share)): it binds only under
//!   contention — while a class holds less than its share and has waiters, its waiters are
//!   served before everyone else's; idle reserved capacity is borrowed freely (running streams
//!   are never pre-empted). When the queue is full, an arriving request evicts the youngest
//!   waiter of the lowest class below its own, which gets the refusal (`evicted`) instead.
//!   The queue is served head-of-line: if the next waiter in order does not fit, later ones
//!   wait too, so large requests are not starved by small ones.
//! * **Fair queueing across tenants.** Within a class, waiters are served by tenant
//!   ([`Tenant`](tailguard_core::Tenant) in the request extensions; requests without one are
//!   one anonymous tenant): the tenant that has received the least weighted service in tokens
//!   goes next, its oldest waiter first (see [Fair queueing](#fair-queueing)). Classes still
//!   come first, exactly as above. On by default
//!   ([`with_tenant_fairness`](BoundedAdmissionLayer::with_tenant_fairness)): it only reorders
//!   waiters — nothing is refused or held back that FIFO would admit — and with one tenant, or
//!   none, the order is FIFO as without it.
//! * **Outcome and metrics.** [`AdmissionOutcome`](tailguard_core::AdmissionOutcome) (queue
//!   wait, units, refusal reason) goes into the response extensions. Metrics (`metrics` crate,
//!   label `priority` = class name, bounded by configuration):
//!   `tailguard_admission_in_flight` and `tailguard_admission_queued` (gauges),
//!   `tailguard_admission_admitted_total` (counter, label `path` = `immediate`|`queued`),
//!   `tailguard_admission_rejected_total` (counter, label `reason` = `queue_full`|
//!   `queue_timeout`|`evicted`), `tailguard_admission_queue_wait_seconds` (histogram, admitted
//!   requests). Under fair queueing, per tenant (label `tenant` = the tenant's bounded
//!   [`label`](tailguard_core::Tenant::label); requests without a tenant are not counted):
//!   `tailguard_admission_tenant_admitted_total` (counter) and
//!   `tailguard_admission_tenant_queue_wait_seconds` (histogram, 0 for an admission at once).
//!   Handles are registered when a class (a tenant label) is first seen, so install the recorder
//!   before the first request.
//!
//! * **Cluster mode.** [`with_cluster`](BoundedAdmissionLayer::with_cluster) shares a
//!   capacity among several gateways through a [`LeaseBackend`] (`tailguard-redis` implements
//!   one on Redis): each admitted request also holds a lease of the cluster-wide capacity,
//!   renewed while its body streams. Waiting stays local; when the backend is unreachable the
//!   gate falls back to its local limits or refuses with 503 ([`FailMode`]). See [`Cluster`].
//!
//! * **Adaptive limit.** [`with_adaptive_limit`](BoundedAdmissionLayer::with_adaptive_limit)
//!   (off by default) makes the capacity a ceiling: the gate admits up to a limit that follows
//!   the upstream's time to first token, measured from each permit's grant to the first output
//!   token, against a no-load baseline re-measured by briefly holding the limit at its minimum
//!   (a gradient controller that remembers the knee where raising the limit last made first
//!   tokens queue; see [`adaptive`] for the algorithm and its constants). Reserved
//!   shares, the cap on one request's cost and `Retry-After` are fractions of the *current*
//!   limit; when it falls below what is in use nothing is revoked (new admissions wait), when
//!   it rises waiters are admitted at once. [`AdmissionHandle::limit`] reads it; gauges
//!   `tailguard_admission_limit`, `tailguard_admission_baseline_ttft_seconds` and
//!   `tailguard_admission_gradient` publish it. In cluster mode it moves the local limit only.
//!
//! One layer value is one gate: clones of the layer and every service it builds share it.
//!
//! ## Deadlines
//!
//! A request's time left is read from core's [`Deadlines`](tailguard_core::Deadlines) in its
//! extensions, after the client's own deadline (`grpc-timeout`, or `x-request-timeout` on
//! HTTP; see [`ClientDeadline`](tailguard_core::ClientDeadline) and
//! [`with_client_deadline`](BoundedAdmissionLayer::with_client_deadline)) has been read at
//! arrival. A request that does not fit at once and whose deadline leaves less time than the
//! wait it can expect in the queue (the estimate behind `Retry-After`, unrounded) is refused at
//! once with **503** `deadline_too_short` (gRPC `DEADLINE_EXCEEDED`) and a `Retry-After`,
//! instead of timing out in the queue; one that is queued waits at most the time its deadline
//! leaves (then it is refused as `queue_timeout`). A request admitted at once is never refused
//! for its deadline: the timeout layer inside ends it on time.
//!
//! ## Fair queueing
//!
//! After the virtual token counter (VTC) of Sheng et al., "Fairness in Serving Large Language
//! Models" (OSDI 2024). The gate keeps a counter per tenant id: the weighted service the tenant
//! received, in tokens over its [`weight`](tailguard_core::Tenant::weight).
//!
//! * **Order.** Classes are ranked as always (reserved share, effective level with aging, age of
//!   the class's oldest waiter, or newest under adaptive LIFO). Of the class that goes, the
//!   waiter of the tenant with the least counter goes; ties (equal counters, as a lift makes)
//!   go to the tenant holding fewer units in flight per weight, then to the oldest waiter. Within
//!   a tenant, its oldest waiter goes (its newest under adaptive LIFO). Head-of-line as always:
//!   if that waiter does not fit, nobody passes it.
//! * **Charge.** At admission a tenant's counter grows by `(input tokens × w_in + expected
//!   output × w_out) / weight`. Input tokens are
//!   [`RequestFacts::prompt_tokens`](tailguard_core::RequestFacts) when counted, else the prompt's
//!   bytes (`RequestFacts::prompt_bytes`, else `Content-Length`, as [`Cost::prompt_bytes`] reads
//!   them) over 4. Expected output is the request's `max_tokens` capped at
//!   [`with_expected_output_tokens`](BoundedAdmissionLayer::with_expected_output_tokens) (256),
//!   or that cap without one. `w_in` = 1 and `w_out` = 2 by default
//!   ([`with_tenant_token_weights`](BoundedAdmissionLayer::with_tenant_token_weights)).
//! * **Correction.** When the response body ends (or fails, or is dropped) the charge is
//!   corrected with the real output: the usage the stream reported when a layer asked for it
//!   (the phase recorder does), else its token events, as the request's shared progress record
//!   ([`StreamProgress`](tailguard_core::progress::StreamProgress)) holds them. The gate follows
//!   the record once, at the end, and reads no byte itself: exact when a layer inside it reads
//!   the stream (`SseIdleTimeout` in the usual stack), short of the last frame when the reader
//!   is outside it, and unknown — the expected output stands — when no layer reads the stream
//!   (with an adaptive limit the gate reads it itself, so the count is exact). An error status,
//!   an empty body or a failed call counts no output; a 2xx answer that is not a stream keeps
//!   the expected output; a request refused after admission (a failed cluster lease) is charged
//!   nothing.
//! * **Lift.** When a tenant that had no waiter gets one, its counter becomes at least the least
//!   counter among tenants with waiters, so a tenant that was idle cannot bank credit and then
//!   take a burst ahead of the others. When nobody waits, it is lifted to the gate's floor
//!   instead, a virtual time that never falls: the largest of the counters of tenants admitted
//!   while nobody waited, of the least counter among waiters whenever a tenant joined them, and
//!   of the last waiter to leave the queue. So service taken while nobody else wanted it is
//!   neither credit nor debt for later (a newly seen tenant starts at the floor too).
//! * **Work-conserving.** Fair queueing only reorders waiters: whenever capacity is free, the
//!   next waiter is admitted whoever its tenant, so an idle tenant's share goes to the others.
//!   It refuses nothing: queue bounds, deadlines, eviction (the newest waiter of the lowest
//!   class) and `Retry-After` are per class and gate as without it.
//! * **Memory.** A tenant with nothing waiting and nothing in flight is forgotten, so the gate
//!   keeps at most one counter per waiter or request in flight. A forgotten tenant that returns
//!   starts at the floor and is lifted like any other: the debt it had (service beyond the other
//!   tenants') is forgiven, so a tenant that sends one large request at a time, with pauses in
//!   between, is not held back for its past requests (it holds at most what it has in flight).
//! * **Across gates.** Counters are local to the gate unless shared
//!   ([`with_shared_fairness`](BoundedAdmissionLayer::with_shared_fairness), e.g. through
//!   `tailguard-redis`'s `RedisFairShare`): then a tenant's counter also grows by the service
//!   the other gates gave it, exchanged in the background every period (100 ms by default), so
//!   a tenant flooding two gateways ranks behind one that uses a single gateway on both. Each
//!   gate still orders only its own waiters; a failed exchange leaves it ordering by its own
//!   counters (see [`SharedFairness`]).
//!
//! ## Retry-After
//!
//! `Retry-After` says how long until a refused request, sent again, can be admitted: by then
//! the work queued ahead of it has been admitted, so a client that honours it finds room in the
//! queue instead of coming straight back into a full one.
//!
//! * **Hold times.** A permit's hold time runs from admission until its body ends or is
//!   dropped. Per class and for the whole gate, the gate keeps a decayed mean of ended holds
//!   (per unit; a hold that ended 10 s ago weighs e⁻¹ of one that just ended, so a change in
//!   the upstream's speed or in what clients ask shows within one or two answer lengths, while
//!   a busy gate still averages over many holds). Permits still held count at their age so far,
//!   a lower bound of their hold: they can raise the estimate, never lower it below the mean of
//!   ended holds. So before anything was released — the first refusal of a burst — the figure
//!   already says at least how long the slots have been held, and streams that got longer raise
//!   it before they end. The estimate leans long when a few permits are held far longer than
//!   the rest. A gate that has held nothing for long yet answers 1 s: it never claims more than
//!   it has seen.
//! * **Work ahead.** Ahead of a refused request of class `c` are the units queued in `c` and in
//!   higher classes (lower classes are served after it and evicted for it), plus its own units.
//!   They are admitted as the capacity left to `c` frees — the capacity less the reserved
//!   shares of lower classes that have waiters, since those slots go back to their class — at
//!   the gate-wide hold time, since whatever holds the shared capacity is what frees it:
//!   `ahead × hold / capacity`.
//! * **Reserved shares.** A class with a reserved share also drains its own waiters through its
//!   reserved units, at its own hold time (the gate's while it has held nothing):
//!   `(own queued + own units) × class hold / reserved units`. The sooner of the two figures
//!   wins, since both paths admit it.
//! * **Independent of past load.** The figure rests on how long slots are held, not on how
//!   many were released lately: a full gate frees capacity at the capacity over the hold time
//!   (Little's law) whatever the traffic before it filled, so the first refusal after a quiet
//!   spell is as honest as one deep in an overload.
//! * **Rounding.** Whole seconds, rounded up, at least 1, at most 60: a client told to wait more
//!   than a minute is better served trying elsewhere, and a longer figure would extrapolate far
//!   past the holds the gate has seen. The status does not depend on the estimate: 429 (or the
//!   configured status) for `queue_full` and `evicted`, 503 for `queue_timeout`.

pub mod adaptive;
mod body;
mod cluster;
mod controller;
mod cost;
mod drain;
pub mod error;
mod fair;
mod fair_share;
pub mod future;
mod gate;
mod lanes;
mod layer;
mod metrics;
mod queue;
mod service;

pub use adaptive::AdaptiveLimit;
pub use body::AdmissionBody;
pub use cluster::{
    BackendError, BackendFuture, Cluster, DEFAULT_BACKEND_TIMEOUT, DEFAULT_LEASE_TTL,
    DEFAULT_POLL_INTERVAL, FailMode, LeaseBackend, LeaseId, LeaseSpec,
};
pub use cost::Cost;
pub use fair::{
    DEFAULT_EXPECTED_OUTPUT_TOKENS, DEFAULT_INPUT_TOKEN_WEIGHT, DEFAULT_OUTPUT_TOKEN_WEIGHT,
};
pub use fair_share::{FairShareBackend, ServiceReport, SharedFairness, tenant_key};
pub use layer::{
    AdmissionHandle, BoundedAdmissionLayer, Codel, DEFAULT_AGING, DEFAULT_CODEL_INTERVAL,
    DEFAULT_CODEL_TARGET, DEFAULT_MAX_REQUEST_SHARE, DEFAULT_QUEUE_TIMEOUT,
};
pub use service::BoundedAdmission;
pub use tailguard_core::{Fail, Respond};
