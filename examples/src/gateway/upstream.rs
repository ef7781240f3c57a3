//! One upstream replica: the shared, pooled hyper client aimed at one base URL.

use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::uri::{PathAndQuery, Uri};
use http::{Request, Response};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tailguard::core::{BoxError, ReplayBody};
use tailguard::phases::Upstream as UpstreamLabel;
use tower::Service;

/// The request body the replicas take: the hedge's replayable body over the parsed request.
pub type UpstreamBody = ReplayBody<Full<Bytes>>;

/// The pooled client every replica shares (its pool is keyed by authority).
pub type HttpClient = Client<HttpConnector, UpstreamBody>;

/// A replica: sends requests to `base` (scheme and authority), keeping their path and query, and
/// labels the response with its name for the recorder's bounded `upstream` label.
#[derive(Clone, Debug)]
pub struct Replica {
    client: HttpClient,
    base: Uri,
    label: Arc<str>,
}

impl Replica {
    /// A replica at `base`, named `label`.
    pub fn new(client: HttpClient, base: Uri, label: impl Into<Arc<str>>) -> Self {
        Replica {
            client,
            base,
            label: label.into(),
        }
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
        let mut parts = self.base.clone().into_parts();
        parts.path_and_query = Some(
            req.uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
        );
        let uri = Uri::from_parts(parts);
        let client = self.client.clone();
        let label = self.label.clone();
        Box::pin(async move {
            *req.uri_mut() = uri?;
            req.headers_mut().remove(http::header::HOST);
            let mut res = client.request(req).await?;
            res.extensions_mut().insert(UpstreamLabel::new(label));
            Ok(res)
        })
    }
}
