//! One upstream replica: the shared, pooled hyper client aimed at one base URL.

use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::header::{self, HeaderMap, HeaderName};
use http::uri::Uri;
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tailguard::core::{BoxError, ReplayBody, Upstream as UpstreamLabel};
use tailguard::route::{BaseUri, InvalidBaseUri};
use tower::Service;

/// The request body the replicas take: the hedge's replayable body over the resume layer's
/// (a pass-through unless `--resume on`) over the one that core's `RequestFactsLayer`
/// buffered (the replays share its bytes).
pub type UpstreamBody = ReplayBody<ReplayBody<ReplayBody<axum::body::Body>>>;

/// The pooled client every replica shares (its pool is keyed by authority).
pub type HttpClient = Client<HttpConnector, UpstreamBody>;

/// The connector of [`upstream_client`]: `TCP_NODELAY` on every upstream connection (a
/// request is one small write; waiting for an ACK before sending it only adds latency).
pub fn upstream_connector() -> HttpConnector {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector
}

/// Idle connections the pool keeps per upstream (nginx's `keepalive`; vLLM runs at most 256
/// sequences at once by default): the rest are closed as their requests end. Unbounded, a burst
/// left thousands of idle connections behind, and closing them all at once when they timed out
/// stalled the streams running then (`gateway_nginx`, 250 streams/s just after a burst at
/// 1,000/s: p99 time to first token 277 ms, 31 ms with this cap).
const MAX_IDLE_PER_UPSTREAM: usize = 256;

/// The pooled client the replicas share, over [`upstream_connector`], keeping at most 256 idle
/// connections per upstream, each for 4 s: uvicorn-based servers (vLLM, SGLang,
/// llama-cpp-python) close idle keep-alive connections after 5 s, and a request sent on a
/// connection the server is closing fails before it was read. Below that limit the pool closes
/// first; reconnecting on loopback or in a cluster costs far less than a failed attempt.
pub fn upstream_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(4))
        .pool_max_idle_per_host(MAX_IDLE_PER_UPSTREAM)
        .build(upstream_connector())
}

/// Hop-by-hop headers (RFC 9110 §7.6.1, and the older `Keep-Alive`, `Proxy-Connection` and
/// proxy authentication ones): they describe one connection, so a proxy drops them.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Removes the hop-by-hop headers: those named in `Connection`, then the fixed set.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // Most messages carry none of them: look at the names there are before removing any (a
    // removal hashes the name it is given). No `Connection` header, no names in it.
    if !headers.keys().any(|k| HOP_BY_HOP.contains(k)) {
        return;
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named.iter().chain(&HOP_BY_HOP) {
        headers.remove(name);
    }
}

/// A replica: the shared client aimed at `base` by the route crate's [`BaseUri`] (scheme, authority
/// and path prefix), labelling the response with its name for the recorder's bounded
/// `upstream` label. The request goes out as HTTP/1.1 (an HTTP/2 client's too); hop-by-hop
/// headers are dropped from it before it leaves and from the response as it comes back.
#[derive(Clone, Debug)]
pub struct Replica {
    client: BaseUri<HttpClient>,
    label: Arc<str>,
}

impl Replica {
    /// A replica at `base`, named `label`; `base` needs a scheme and an authority.
    pub fn new(
        client: HttpClient,
        base: &Uri,
        label: impl Into<Arc<str>>,
    ) -> Result<Self, InvalidBaseUri> {
        Ok(Replica {
            client: BaseUri::new(client, base)?,
            label: label.into(),
        })
    }
}

impl Service<Request<UpstreamBody>> for Replica {
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Response<Incoming>, BoxError>> + Send>,
    >;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        // The legacy client is always ready; its pool waits inside the response future.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request<UpstreamBody>) -> Self::Future {
        // The pool speaks HTTP/1.1 to the upstreams, whatever the client spoke.
        *req.version_mut() = http::Version::HTTP_11;
        strip_hop_by_hop(req.headers_mut());
        let response = self.client.call(req);
        let label = self.label.clone();
        Box::pin(async move {
            let mut res = response.await?;
            strip_hop_by_hop(res.headers_mut());
            res.extensions_mut().insert(UpstreamLabel::new(label));
            Ok(res)
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use http_body_util::BodyExt;
    use hyper::server::conn::http1;
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use tokio::net::TcpListener;
    use tokio::sync::Barrier;

    use super::*;

    /// A server that answers once `n` requests are in flight at once (so each has a connection
    /// of its own), counting the connections still open.
    async fn server(n: usize) -> (Uri, Arc<AtomicUsize>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri: Uri = format!("http://{}/", listener.local_addr().unwrap())
            .parse()
            .unwrap();
        let open = Arc::new(AtomicUsize::new(0));
        let (barrier, count) = (Arc::new(Barrier::new(n)), open.clone());
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let (barrier, count) = (barrier.clone(), count.clone());
                count.fetch_add(1, Ordering::SeqCst);
                tokio::spawn(async move {
                    let svc = service_fn(move |_req| {
                        let barrier = barrier.clone();
                        async move {
                            barrier.wait().await;
                            Ok::<_, std::convert::Infallible>(Response::new(
                                http_body_util::Full::new(bytes::Bytes::from_static(b"ok")),
                            ))
                        }
                    });
                    let io = TokioIo::new(stream);
                    let _ = http1::Builder::new().serve_connection(io, svc).await;
                    count.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        (uri, open)
    }

    #[tokio::test]
    async fn the_pool_keeps_at_most_256_idle_connections_per_upstream_after_a_burst() {
        let burst = MAX_IDLE_PER_UPSTREAM + 44;
        let (uri, open) = server(burst).await;
        let client = upstream_client();
        let mut requests = tokio::task::JoinSet::new();
        for _ in 0..burst {
            let req = Request::get(uri.clone())
                .body(UpstreamBody::from_bytes(bytes::Bytes::new()))
                .unwrap();
            let client = client.clone();
            requests.spawn(async move {
                let res = client.request(req).await.unwrap();
                res.into_body().collect().await.unwrap();
            });
        }
        while let Some(r) = requests.join_next().await {
            r.unwrap();
        }
        // The connections past the cap close as their responses end; the server sees them go.
        for _ in 0..1000 {
            if open.load(Ordering::SeqCst) <= MAX_IDLE_PER_UPSTREAM {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(open.load(Ordering::SeqCst), MAX_IDLE_PER_UPSTREAM);
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_go() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, X-Hop"),
            ("connection", "x-other"),
            ("x-hop", "1"),
            ("x-other", "2"),
            ("keep-alive", "timeout=5"),
            ("proxy-connection", "keep-alive"),
            ("proxy-authorization", "Basic eA=="),
            ("te", "trailers"),
            ("trailer", "x-checksum"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("x-end-to-end", "kept"),
            ("content-type", "application/json"),
        ] {
            h.append(k, v.parse().unwrap());
        }
        strip_hop_by_hop(&mut h);
        let mut left: Vec<_> = h.keys().map(|k| k.as_str()).collect();
        left.sort_unstable();
        assert_eq!(left, ["content-type", "x-end-to-end"]);
    }
}
