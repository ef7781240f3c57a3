//! # tailguard-priority
//!
//! `PriorityClass`: one classification drives the whole stack. Each request is put into one of
//! an ordered set of named classes (by default `critical` > `interactive` > `standard` >
//! `batch` > `sheddable`), and the [`Priority`](tailguard_core::Priority) and the class's
//! [`ClassPolicy`](tailguard_core::ClassPolicy) go into the request extensions, where admission
//! (reserved shares, shedding order), hedging (per-class switch), timeouts (per-class limits) and
//! the recorder (the `priority` label) read them. The `Priority` is also copied into the
//! response extensions, so a recorder placed *outside* `PriorityClass` still labels every
//! request with its class (where it goes in a stack, and why:
//! [the recommended order](../tailguard/index.html#the-recommended-order), in the `tailguard`
//! facade).
//!
//! ```
//! use std::convert::Infallible;
//!
//! use http::{Method, Request, Response};
//! use tailguard_core::{ClassPolicy, Priority};
//! use tailguard_priority::PriorityClassLayer;
//! use tower::{ServiceBuilder, ServiceExt, service_fn};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let classes = PriorityClassLayer::new()
//!     .with_policy(Priority::interactive(), ClassPolicy::new().with_reserved_share(0.5))
//!     .with_route(Some(Method::POST), "/v1/batches*", Priority::batch())
//!     // Callers without credentials never rank above `standard`.
//!     .with_ceiling(|parts| {
//!         (!parts.headers.contains_key("authorization")).then(Priority::standard)
//!     });
//! let svc = ServiceBuilder::new()
//!     .layer(classes)
//!     .service(service_fn(|req: Request<()>| async move {
//!         let p = req.extensions().get::<Priority>().unwrap().clone();
//!         let share = req.extensions().get::<ClassPolicy>().unwrap().reserved_share;
//!         Ok::<_, Infallible>(Response::new((p, share)))
//!     }));
//!
//! let req = Request::builder()
//!     .header("x-priority", "interactive")
//!     .header("authorization", "Bearer sk-..")
//!     .body(())
//!     .unwrap();
//! let (p, share) = svc.clone().oneshot(req).await.unwrap().into_body();
//! assert_eq!((p, share), (Priority::interactive(), Some(0.5)));
//!
//! // Without credentials the same claim is capped at `standard`.
//! let req = Request::builder().header("x-priority", "interactive").body(()).unwrap();
//! let (p, _) = svc.oneshot(req).await.unwrap().into_body();
//! assert_eq!(p, Priority::standard());
//! # }
//! ```
//!
//! ## Rules
//!
//! In order, the first that answers wins: a user closure, a route/method table, the client's
//! header (default `x-priority`) mapped through an allowlist (clients cannot invent classes; by
//! default every class but `critical` may be named) and capped by an optional ceiling, and the
//! default class (`standard`). See [`PriorityClassLayer`].
//!
//! ## Tenants
//!
//! [`TenantLayer`] says who each request is for: core's [`Tenant`](tailguard_core::Tenant),
//! from a configured header (`x-tenant`) or a hash of the API key, with a bounded metric
//! label, for admission's fair queueing and the token budgets of `tailguard-tenant`.
//!
//! ## Metrics
//!
//! `tailguard_priority_classified_total` (counter; labels `priority`, the class name, and
//! `source`: `classifier`|`route`|`header`|`default`), counted into the recorder in use when
//! the request is classified.

pub mod future;
mod layer;
mod service;
mod table;
mod tenant;

pub use layer::{Classification, DEFAULT_HEADER, PriorityClassLayer, Source};
pub use service::PriorityClass;
pub use table::PolicyTable;
pub use tenant::{TENANT_HEADER, TenantLayer, TenantService};
