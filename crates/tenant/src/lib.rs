//! # tailguard-tenant
//!
//! Token budgets per tenant for LLM gateways: `TokenBudgetLayer` reserves each request's
//! prompt and output limit from its tenant's budgets before it goes on, settles the
//! reservation from what the response stream really used when it ends, and refuses what a
//! budget cannot hold with a **429 in the client's dialect** and an honest `Retry-After`.
//!
//! ```
//! use std::convert::Infallible;
//!
//! use bytes::Bytes;
//! use http::{Request, Response, StatusCode};
//! use http_body_util::{BodyExt, Full};
//! use tailguard_core::{RequestFacts, Tenant};
//! use tailguard_tenant::{Kind, Limit, LocalStore, TokenBudgetLayer};
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let per_minute = Limit::per_minute(Kind::Output, 100);
//! let store = LocalStore::new();
//! let budget = TokenBudgetLayer::new()
//!     .with_default_limits([per_minute])
//!     .with_store(store.clone());
//! let svc = ServiceBuilder::new()
//!     .layer(budget)
//!     .service(service_fn(|_req: Request<()>| async {
//!         // One content chunk, then the usage chunk: 5 output tokens.
//!         let sse = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n\
//!             data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":5}}\n\n\
//!             data: [DONE]\n\n";
//!         let res = Response::builder().header("content-type", "text/event-stream");
//!         Ok::<_, Infallible>(res.body(Full::new(Bytes::from(sse))).unwrap())
//!     }));
//! // The tenant comes from an identity layer, the facts from `RequestFactsLayer`.
//! let request = |tenant: Option<&str>, max_tokens: u32| {
//!     let mut req = Request::post("/v1/chat/completions").body(()).unwrap();
//!     req.extensions_mut().insert(RequestFacts::new().with_max_tokens(max_tokens));
//!     if let Some(t) = tenant {
//!         req.extensions_mut().insert(Tenant::new(t));
//!     }
//!     req
//! };
//!
//! // 80 of the 100 tokens are reserved while the answer streams...
//! let res = svc.clone().oneshot(request(Some("acme"), 80)).await.unwrap();
//! assert_eq!(store.available("acme", &per_minute), 20);
//! // ...and the 75 it did not use come back when it ends.
//! res.into_body().collect().await.unwrap();
//! assert_eq!(store.available("acme", &per_minute), 95);
//!
//! // 96 do not fit: 429, until the bucket refills one token (0.6 s, rounded up).
//! let res = svc.clone().oneshot(request(Some("acme"), 96)).await.unwrap();
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert_eq!(res.headers()["retry-after"], "1");
//! // More than the limit never fits: 429 without Retry-After.
//! let res = svc.clone().oneshot(request(Some("acme"), 500)).await.unwrap();
//! assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
//! assert!(res.headers().get("retry-after").is_none());
//! // A request without a tenant is not budgeted.
//! let res = svc.oneshot(request(None, 500)).await.unwrap();
//! assert_eq!(res.status(), StatusCode::OK);
//! # }
//! ```
//!
//! ## Limits
//!
//! A [`Limit`] is a number of tokens of a [`Kind`] — input (the prompt), output (the
//! answer) or both together — per [`Window`]: a minute, a day, or any period. Every tenant has
//! the [default limits](TokenBudgetLayer::with_default_limits) unless it has
//! [its own](TokenBudgetLayer::with_tenant_limits), which replace them. Each limit of a tenant
//! is a token bucket: it holds at most the limit and refills continuously at the limit per
//! window, so 60 output tokens per minute allow a burst of 60, then one a second; a day's limit
//! beside a minute's bounds what the bursts add up to. The arithmetic is exact integers (no
//! rounding drifts over a day).
//!
//! The tenant is core's [`Tenant`](tailguard_core::Tenant) in the request extensions, put
//! there by an identity layer (`tailguard-priority`'s `TenantLayer`). **A request without one
//! is not budgeted**, nor one of a tenant without limits: it passes untouched, and its
//! response body is the inner body as it is.
//!
//! ## Reservations
//!
//! Before a request goes on, its reservation is taken from every bucket of its tenant's limits
//! at once, or from none (one lock per store, so racing requests never take more than a bucket
//! holds):
//!
//! * **input**: the prompt's tokens when whoever parsed the request counted them
//!   ([`RequestFacts::prompt_tokens`](tailguard_core::RequestFacts)), else its bytes
//!   ([`RequestFacts::prompt_bytes`](tailguard_core::RequestFacts), or the body's
//!   `content-length` without facts) divided by
//!   [`with_bytes_per_token`](TokenBudgetLayer::with_bytes_per_token) (4), rounded up;
//! * **output**: the request's output limit — the largest of `max_tokens`,
//!   `max_completion_tokens` and `max_output_tokens` it sets, as
//!   [`RequestFacts::max_tokens`](tailguard_core::RequestFacts) has it — else
//!   [`with_default_max_tokens`](TokenBudgetLayer::with_default_max_tokens) (1024);
//! * a limit of kind total takes both.
//!
//! ## Refusals
//!
//! A reservation that some bucket cannot hold is refused with **429**, nothing taken: for
//! `/v1/messages` (any path whose last segment is `messages`) Anthropic's error object
//! (`{"type":"error","error":{"type":"rate_limit_error","message":..}}`), for gRPC requests a
//! trailers-only `RESOURCE_EXHAUSTED`, otherwise OpenAI's
//! (`{"error":{"message":..,"type":"rate_limit_exceeded","param":null,"code":..}}`).
//!
//! * **Retry-After**: the time until the scarcest bucket — the one that frees the request's
//!   share last — has refilled enough for it, in whole seconds rounded up (never 0), code
//!   [`CODE_EXCEEDED`]. Exact as long as nothing else is taken from that bucket meanwhile; a
//!   reservation in flight that gives tokens back can only make it sooner.
//! * **Never fits**: a reservation larger than a limit (a `max_tokens` of 8000 against 4000
//!   output tokens per minute) can never be admitted, whatever the wait: 429 without
//!   `Retry-After`, code [`CODE_TOO_LARGE`], and a message saying the request exceeds the
//!   tenant's limit (lower `max_tokens`, shorten the prompt). It is a 429 rather than a 400
//!   because the request is valid and another tenant's could pass: the limit is the tenant's.
//!   One that never fits decides before one that waits.
//!
//! A refusal reports [`EndReason::Rejected`](tailguard_core::EndReason) to the request's
//! [`EndReport`](tailguard_core::EndReport), if it has one.
//!
//! ## Reconciliation
//!
//! Each reservation is settled exactly once, when the response ends, with what the request
//! used: the store gives back what was reserved and not used (up to the limit), and takes what
//! was used beyond the reservation.
//!
//! * A **`2xx` stream** (SSE, NDJSON, gRPC) is read as it passes, through core's shared
//!   [progress record](tailguard_core::progress) (the layer asks it for usage and exact output
//!   counts), and settled when its body ends — its last frame, a body error, or the body
//!   dropped (the client went away). Input is the stream's reported prompt tokens, else the
//!   reserved estimate; output is its reported completion tokens, else the **content events
//!   that passed this layer** to the client: a stream without usage, a client that went away,
//!   a stream resumed on another replica (the record counts what the client got). Counted
//!   output is one token per content chunk, right for servers that send a token a chunk and
//!   short for ones that batch; ask for usage (`stream_options.include_usage`) for exact
//!   accounting.
//! * A `2xx` answer that is **not a stream** (a whole JSON document: an OpenAI chat completion
//!   or a Responses API response asked without `stream`, an Anthropic message) is kept as it
//!   passes, up to [`MAX_DOCUMENT_BYTES`] (1 MiB; its frames go on untouched), and read when
//!   its body ends cleanly: input is the prompt tokens its `usage` reports, else the reserved
//!   estimate; output is the completion tokens it reports, else the reserved output (core's
//!   [`Usage::from_json`](tailguard_core::Usage::from_json) reads it). A document over the
//!   cap, a body error, or a client that drops the body before its end is charged its
//!   reserved output (and its reported input is not known: the reserved estimate). One with
//!   no body at all is charged its input.
//! * An **error status** (or a trailers-only gRPC error), an error of the inner service, or the
//!   response future dropped before the head (the client went away while the request waited)
//!   charge **nothing**: the upstream produced no answer, so the whole reservation comes back.
//! * **Use beyond a reservation** (a server that ignored the limit, a prompt estimated short)
//!   is taken as far as a bucket holds: a balance never goes below zero, and what it could not
//!   cover is counted in `tailguard_tenant_overrun_tokens_total` (see [`LocalStore`]).
//! * A hedge's losing attempts are not charged: the tenant pays for the answer it got.
//!
//! ## Stores
//!
//! The buckets live in a [`Store`]: [`LocalStore`] (one process, the default), or one shared by
//! several gateways (`tailguard-redis`'s `RedisTokenStore`: the same buckets in Redis,
//! reservations that expire as used when a gateway dies), which answers [`Reply::Later`]; the
//! response future waits for it. A store that cannot decide (a shared one unreachable and
//! configured to fail closed) answers [`Decision::Unavailable`]: a 503 with `Retry-After`, code
//! `cluster_unavailable`, as admission's cluster mode answers.
//!
//! ## Metrics
//!
//! Labelled `tenant` = [`Tenant::label`](tailguard_core::Tenant::label) (bounded by the
//! identity layer):
//!
//! * `tailguard_tenant_tokens_total{tenant, kind}` (counter): tokens used, as reconciled,
//!   `kind` = `input` | `output`;
//! * `tailguard_tenant_reserved_tokens{tenant}` (gauge): tokens reserved by requests in
//!   flight (input and output);
//! * `tailguard_tenant_refusals_total{tenant, window, kind}` (counter): refusals, labelled by
//!   the limit that refused (`window` = `minute` | `day` | the period, e.g. `3600s`);
//! * `tailguard_tenant_overrun_tokens_total{tenant, window, kind}` (counter, [`LocalStore`]):
//!   use beyond a reservation that a bucket could not cover.
//!
//! ## In a stack
//!
//! Inside the layers that identify the tenant and read the request's facts, outside admission
//! (a request refused for its budget takes no admission slot, and one waiting for admission
//! holds its reservation, so the budget is not overcommitted by a queue). The recorder
//! (`tailguard-phases`) outside it reports the refusals like admission's.

mod body;
mod bucket;
mod future;
mod layer;
mod limit;
mod local;
mod metrics;
mod refusal;
mod reservation;
mod service;
mod store;

pub use body::BudgetBody;
pub use future::ResponseFuture;
pub use layer::{DEFAULT_BYTES_PER_TOKEN, DEFAULT_MAX_TOKENS, TokenBudgetLayer};
pub use limit::{Kind, Limit, Tokens, Window};
pub use local::LocalStore;
pub use refusal::{CODE_EXCEEDED, CODE_TOO_LARGE};
pub use reservation::MAX_DOCUMENT_BYTES;
pub use service::TokenBudget;
pub use store::{Decision, Reply, Shortfall, Store, Ticket};
