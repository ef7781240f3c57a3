//! The layer-less baseline: the smallest hyper 1 proxy that does what the gateway's proxy path
//! does for a stream (round robin over the replicas, `TCP_NODELAY` on both sides, a pooled
//! keep-alive client, the response body passed through frame by frame), and nothing else: no
//! tailguard layer, no routing, no JSON, no log line, no metrics. It runs as a child process of
//! the bench (`gateway_nginx --bare-proxy URL...`), on a 2-worker runtime like the gateway's,
//! so the gap between it and nginx is what hyper and tokio cost, and the gap between it and the
//! gateway is what the gateway adds.
//!
//! With `--read-tokens` it also reads each response stream once, as the gateway's innermost
//! reading layer does (one [`Reading`] of a [`StreamProgress`], usage asked for, the dialect
//! chosen per response): the floor of what any token-aware front pays per frame, between the
//! bare proxy and the gateway in `--cpu` (issue 31).

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::uri::{PathAndQuery, Uri};
use http::{Request, header};
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tailguard::core::BoxError;
use tailguard::core::Dialect;
use tailguard::core::progress::{Reading, StreamProgress};
use tokio::net::TcpListener;

/// Serves on a free port of 127.0.0.1 until killed; prints `listening on http://ADDR` first.
/// `args`: `[--read-tokens] URL...`.
pub(crate) fn main(args: &[String]) -> Result<(), BoxError> {
    let (read_tokens, upstreams) = match args.split_first() {
        Some((flag, rest)) if flag == "--read-tokens" => (true, rest),
        _ => (false, args),
    };
    let upstreams: Arc<[Uri]> = upstreams
        .iter()
        .map(|u| u.parse())
        .collect::<Result<Vec<Uri>, _>>()?
        .into();
    if upstreams.is_empty()
        || upstreams
            .iter()
            .any(|u| u.scheme().is_none() || u.authority().is_none())
    {
        return Err("--bare-proxy needs upstream URLs such as http://127.0.0.1:8000".into());
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?
        .block_on(serve(upstreams, read_tokens))
}

async fn serve(upstreams: Arc<[Uri]>, read_tokens: bool) -> Result<(), BoxError> {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new()).build::<_, Incoming>(connector);
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    println!("bare proxy listening on http://{}", listener.local_addr()?);
    let next = Arc::new(AtomicUsize::new(0));
    loop {
        let (stream, _) = listener.accept().await?;
        stream.set_nodelay(true)?;
        let (client, next, upstreams) = (client.clone(), next.clone(), upstreams.clone());
        let svc = service_fn(move |mut req: Request<Incoming>| {
            let base = &upstreams[next.fetch_add(1, Ordering::Relaxed) % upstreams.len()];
            let mut parts = base.clone().into_parts();
            parts.path_and_query = Some(
                req.uri()
                    .path_and_query()
                    .cloned()
                    .unwrap_or_else(|| PathAndQuery::from_static("/")),
            );
            *req.uri_mut() =
                Uri::from_parts(parts).expect("a checked base URL with a path is a URI");
            req.headers_mut().remove(header::HOST);
            let res = client.request(req);
            async move {
                let res = res.await?;
                let reading = read_tokens.then(|| {
                    let progress = StreamProgress::detached();
                    progress.want_usage();
                    progress.reading(&Dialect::Auto, res.headers())
                });
                Ok::<_, hyper_util::client::legacy::Error>(
                    res.map(|inner| ReadBody { inner, reading }),
                )
            }
        });
        tokio::spawn(async move {
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}

/// The response body, passed through; with a [`Reading`], each frame is read on its way.
struct ReadBody {
    inner: Incoming,
    reading: Option<Reading>,
}

impl Body for ReadBody {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        let this = &mut *self;
        let frame = ready!(Pin::new(&mut this.inner).poll_frame(cx));
        if let Some(reading) = &mut this.reading {
            match &frame {
                Some(Ok(f)) => {
                    if let Some(data) = f.data_ref() {
                        reading.observe(data);
                    } else if let Some(trailers) = f.trailers_ref() {
                        reading.observe_trailers(trailers);
                    }
                }
                None => {
                    reading.finish();
                }
                Some(Err(_)) => {}
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
