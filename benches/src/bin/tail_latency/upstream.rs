//! The pieces every strategy shares: a replica service over a pooled hyper client, the
//! in-process front server the load generator talks to, and body boxing.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::{Buf, Bytes};
use http::header::HeaderValue;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tailguard::core::attempt::Attempt;
use tokio::net::TcpListener;
use tokio::task::{JoinHandle, JoinSet};
use tower::ServiceExt;
use tower::util::BoxCloneService;

/// The error every strategy's stack reports.
pub(crate) type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A response body of any strategy, data as `Bytes`.
pub(crate) type BoxBody = UnsyncBoxBody<Bytes, BoxError>;
/// The pooled HTTP/1.1 client every replica service and sender shares.
pub(crate) type HttpClient = Client<HttpConnector, BoxBody>;
/// One strategy: a cloneable service from a buffered request to a streamed response.
pub(crate) type Stack = BoxCloneService<Request<Full<Bytes>>, Response<BoxBody>, BoxError>;

/// Boxes any body into [`BoxBody`], turning its data into `Bytes` (no copy for `Bytes`).
pub(crate) fn box_body<B>(body: B) -> BoxBody
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    body.map_frame(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
        .map_err(Into::into)
        .boxed_unsync()
}

/// The header carrying the front's sequence number of a request (so the replicas' logs can be
/// grouped per client request: primary and backups).
pub(crate) const BENCH_ID_HEADER: &str = "x-bench-id";

/// One replica: rewrites the request's authority to the replica and sends it through a
/// shared, pooled HTTP/1.1 client.
#[derive(Clone, Debug)]
pub(crate) struct Upstream {
    client: Client<HttpConnector, BoxBody>,
    base: Arc<str>,
}

impl Upstream {
    pub(crate) fn new(client: Client<HttpConnector, BoxBody>, base: String) -> Self {
        Upstream {
            client,
            base: base.into(),
        }
    }
}

/// A client with `TCP_NODELAY` and an unbounded idle pool, as a gateway would configure it.
pub(crate) fn client() -> Client<HttpConnector, BoxBody> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(connector)
}

impl<B> tower::Service<Request<B>> for Upstream
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Incoming>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (mut parts, body) = req.into_parts();
        let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let uri = format!("{}{pq}", self.base).parse::<http::Uri>();
        let client = self.client.clone();
        Box::pin(async move {
            parts.uri = uri?;
            parts.headers.remove(http::header::HOST);
            let res = client
                .request(Request::from_parts(parts, box_body(body)))
                .await?;
            Ok(res)
        })
    }
}

fn error_response(status: StatusCode) -> Response<BoxBody> {
    let mut res = Response::new(box_body(Empty::<Bytes>::new()));
    *res.status_mut() = status;
    res
}

async fn front(
    req: Request<Incoming>,
    stack: Stack,
    seq: Arc<AtomicU64>,
) -> Result<Response<BoxBody>, Infallible> {
    let (mut parts, body) = req.into_parts();
    let Ok(collected) = body.collect().await else {
        return Ok(error_response(StatusCode::BAD_REQUEST));
    };
    let i = seq.fetch_add(1, Ordering::Relaxed);
    parts.headers.insert(BENCH_ID_HEADER, HeaderValue::from(i));
    let body = collected.to_bytes();
    // Lets a router under `tower::hedge` send the hedge to the replica the primary did not use
    // (FirstTokenHedge sets its own).
    parts.extensions.insert(Attempt::primary());
    match stack
        .oneshot(Request::from_parts(parts, Full::new(body)))
        .await
    {
        Ok(res) => Ok(res),
        Err(_) => Ok(error_response(StatusCode::BAD_GATEWAY)),
    }
}

/// The in-process front server: HTTP/1.1 on `127.0.0.1:0`, serving `stack`. Abort the handle
/// to stop it and every connection.
pub(crate) async fn serve(stack: Stack) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let seq = Arc::new(AtomicU64::new(0));
    serve_fn(move |req| front(req, stack.clone(), seq.clone())).await
}

/// An HTTP/1.1 server on `127.0.0.1:0` answering every request with `handler`. Abort the
/// handle to stop it and every connection.
pub(crate) async fn serve_fn<F, Fut>(handler: F) -> std::io::Result<(SocketAddr, JoinHandle<()>)>
where
    F: Fn(Request<Incoming>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<Response<BoxBody>, Infallible>> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        while let Ok((tcp, _)) = listener.accept().await {
            let _ = tcp.set_nodelay(true);
            let svc = hyper::service::service_fn(handler.clone());
            conns.spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tcp), svc)
                    .await;
            });
            while conns.try_join_next().is_some() {}
        }
    });
    Ok((addr, task))
}
