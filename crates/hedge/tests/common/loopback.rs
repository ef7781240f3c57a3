//! The loopback tests' hyper client and replicas (shared by `loopback.rs` and the workspace's
//! `tests/tests/hedge_replica_set.rs`).

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tailguard_core::ReplayBody;
use tailguard_test_support::{HttpClient, client_of};
use tower::{Service, ServiceExt};

pub type HedgeClient = HttpClient<ReplayBody<Full<Bytes>>>;

pub fn client() -> HedgeClient {
    client_of()
}

/// A replica: the shared client with requests sent to `base`.
pub fn replica(
    client: HedgeClient,
    base: String,
) -> impl Service<
    Request<ReplayBody<Full<Bytes>>>,
    Response = Response<hyper::body::Incoming>,
    Error = hyper_util::client::legacy::Error,
    Future: Send,
> + Clone
+ Send
+ 'static {
    client.map_request(move |mut r: Request<ReplayBody<Full<Bytes>>>| {
        *r.uri_mut() = format!("{base}{}", r.uri().path()).parse().unwrap();
        r
    })
}
