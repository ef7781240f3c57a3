//! # tailguard-route
//!
//! [`ReplicaSet`]: a tower balancer for LLM streaming calls that places each attempt by what
//! it learns of each replica's *first tokens*, not of its response heads (a streaming server
//! sends `200 OK` at once). It places every attempt of a hedged request on a replica no earlier
//! attempt of the same request went to, holds per-replica slots, ejects outliers, and aims one
//! pooled client at many base URIs ([`BaseUri`]).
//!
//! ```
//! use bytes::Bytes;
//! use http::{Request, Response};
//! use http_body_util::{BodyExt, Full};
//! use tailguard_core::attempt::{Attempt, Settle};
//! use tailguard_route::ReplicaSet;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), tailguard_core::BoxError> {
//! // Two replicas (in a gateway: one pooled hyper client aimed at each base URI, see
//! // `ReplicaSet::from_base_uris`).
//! let replica = |name: &'static str| {
//!     service_fn(move |_req: Request<Full<Bytes>>| async move {
//!         Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::from(name))))
//!     })
//! };
//! let client = ServiceBuilder::new()
//!     // Here goes what sends the attempts of a request (tailguard-hedge's
//!     // `FirstTokenHedgeLayer`), and what runs once per attempt.
//!     .service(ReplicaSet::new([replica("a"), replica("b")]).with_slots(Some(4)));
//!
//! // The primary attempt of a request, as the hedge sends it.
//! let primary = Attempt::primary();
//! let mut req = Request::new(Full::new(Bytes::from("{}")));
//! req.extensions_mut().insert(primary.clone());
//! let res = client.clone().oneshot(req).await?;
//! // The hedge tells the set how the attempt went: its first token arrived (a sample of that
//! // replica's time to first token).
//! primary.settle(Settle::Token);
//! let first = res.into_body().collect().await?.to_bytes();
//!
//! // A backup of the same request goes to the replica the primary did not.
//! let mut req = Request::new(Full::new(Bytes::from("{}")));
//! req.extensions_mut().insert(primary.next(1));
//! let second = client.oneshot(req).await?.into_body().collect().await?.to_bytes();
//! assert_ne!(first, second);
//! assert_eq!(primary.tried().len(), 2);
//! # Ok(())
//! # }
//! ```
//!
//! ## With the hedge
//!
//! Put the set under `tailguard-hedge`'s `FirstTokenHedge`:
//! `FirstTokenHedgeLayer::new().layer(ReplicaSet::new(replicas))`. The two crates do not
//! depend on each other: the hedge sends each attempt with core's
//! [`Attempt`](tailguard_core::attempt::Attempt) in its extensions and settles it at its first
//! token, failure or commit ([`Settle`](tailguard_core::attempt::Settle)); the set binds an
//! [`AttemptClaim`](tailguard_core::attempt::AttemptClaim) of its own to each attempt it
//! places, and hears of it. A balancer of your own can listen to the same signals (see
//! [`tailguard_core::attempt`]).
//!
//! ## How an attempt is placed
//!
//! * **Primary**: by default ([`Routing::LeastWait`]) power of two choices over each replica's
//!   expected wait for a first token: the attempts on it still waiting for one, times a
//!   peak-EWMA of its recent times to first token (10 s decay) in which an attempt still
//!   waiting, or cancelled before its token, counts at least as long as it waited. With
//!   [`Routing::RoundRobin`], the next replica in turn. A primary placed on a replica only
//!   because its estimate decayed (what was last known of it would have lost to the other
//!   choice), or whose estimate is only a lower bound (its last news was a wait cut short or a
//!   failure), or the first on a replica it has no news of (which takes no more until it
//!   answers, and meanwhile counts as the others' median), is marked a probe, with the other
//!   choice's expected wait when that one has news
//!   ([`Attempt::mark_probe_against`](tailguard_core::attempt::Attempt::mark_probe_against)):
//!   the hedge backs a slow probe up even when its budget is empty, borrowing from the budget's
//!   future deposits, and after twice that expected wait when sooner than its delay. A replica
//!   whose estimate is a wait cut short takes primaries on that bound at growing pauses, one
//!   decay period, then two, then four, until a first token comes there; the other choice
//!   goes meanwhile, however many wait there (a cut wait says the replica takes at least
//!   that long, not how much longer: issue 29's real bench showed such a replica busy with
//!   traffic nobody sees taking a primary whenever the other had two streams waiting).
//! * **Backup**: the best-scored replica the request's `Attempt` has not recorded (an attempt
//!   its replica interrupted for a newer one does not count: its failover may wait there).
//!   When every such replica is known to be slow (its probes on a wait cut short were cut
//!   short twice in a row, and its pause lasts), the set tells the hedge the least a backup
//!   would wait there
//!   ([`Attempt::backup_wait`](tailguard_core::attempt::Attempt::backup_wait)), and the hedge
//!   holds the backup until the attempt it backs up has waited as long (issue 29's real bench:
//!   requests queued on the one free replica were backed up on the busy one, and lost).
//! * **Ejection** ([`Ejection`]): consecutive failures before a first token, or a first-token
//!   estimate far over the others', take a replica out of primary selection for a while; never
//!   the last one.
//! * **Slots** ([`ReplicaSet::with_slots`]): an attempt is placed only on a replica with a free
//!   slot and holds it until its body ([`ReplicaBody`]) ends or is dropped, or its sender
//!   settles it as failed or empty (a kept failure's body may live on unread); otherwise it
//!   waits in the set, and the oldest request waiting takes the next slot that suits it. A
//!   primary also waits for a full replica instead of taking a free one when the full one is
//!   expected to give a first token sooner (slot wait included), for at most as long as the
//!   free one is expected to take.
//! * **Interruptions** ([`ReplicaSet::with_interruption_hold`]): a replica that ends a stream
//!   (without a token, broken off, or cut short after its first token as its sender reports,
//!   [`Attempt::cut_short`](tailguard_core::attempt::Attempt::cut_short)) just after the set
//!   placed a newer attempt on it (a single-slot llama-cpp-python server) gets one attempt at
//!   a time for the next 60 s (twice as long after each repeat, until it is seen streaming two
//!   at once); the rest wait in the set for its slot instead of interrupting
//!   another stream. With the hedge's empty-stream retry, an interrupting server needs no
//!   `with_slots`. Before the set has seen a replica interrupt, a backup does not go beside a
//!   stream on a replica it has not seen streaming two attempts at once within that hold: it
//!   waits for the stream to end (issue 29's interrupt runs: the first request of every run was
//!   cut off after its first token by the second's backup). Nor does a primary while another
//!   replica in selection has room and may not cut a stream: it takes the other, or waits for
//!   the stream to end when that is expected sooner (the replica's average slot hold, or
//!   before its first, as long again as the stream has run, then its first-token time), for
//!   at most as long as the other is expected to take. Only when no such replica is left
//!   (every replica in selection streams, or a set of one) does a primary go beside the
//!   stream: that is how the set learns a replica serves several at once. Until then a
//!   batching server's primaries take the replicas with room, or wait no longer than those
//!   are expected to take.
//!
//! ## Metrics
//!
//! * `tailguard_hedge_ejections_total{replica, reason="failures"|"slow"}`: outlier ejections
//!   (the name it had when the set was part of `tailguard-hedge`).
//! * `tailguard_route_interruptions_total{replica}`: streams a replica ended for a newer
//!   attempt (each one renews its one-at-a-time hold).

// Where things are: `set` (the service and its settings), `config` (routing and slots),
// `place` (picking the replica of one attempt), `health` (the shared state and each attempt's
// claim, settled through core's attempt protocol), `score` (one replica's expected wait),
// `eject` (outlier ejection), `line` (attempts waiting for a slot, oldest first), `future`
// and `body` (an attempt waiting for its slot, then holding it), `base_uri`.
mod base_uri;
mod body;
mod config;
mod eject;
pub mod future;
mod health;
mod line;
mod metrics;
mod place;
mod score;
mod set;

pub use base_uri::{BaseUri, InvalidBaseUri};
pub use body::ReplicaBody;
pub use config::Routing;
pub use eject::Ejection;
pub use set::ReplicaSet;
