//! A plain hyper client for the loopback tests (feature `client`).

use bytes::Bytes;
use http_body::Body;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// An HTTP/1 client over plain TCP sending request bodies of type `B`.
pub type HttpClient<B = Full<Bytes>> = Client<HttpConnector, B>;

/// A new [`HttpClient`] sending `Full<Bytes>` bodies.
pub fn client() -> HttpClient {
    client_of()
}

/// A new [`HttpClient`] sending bodies of type `B`.
pub fn client_of<B>() -> HttpClient<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
{
    Client::builder(TokioExecutor::new()).build_http()
}
