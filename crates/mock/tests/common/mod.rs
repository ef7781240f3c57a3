//! A plain hyper client for the tests.
#![allow(dead_code, unreachable_pub)]

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::time::Instant;

#[allow(unused_imports)] // not every test file streams the default chat request
pub use tailguard_test_support::{CHAT as CHAT_STREAM, HttpClient, client};

pub fn h2_client() -> HttpClient {
    Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http()
}

pub fn post(url: &str, path: &str, body: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    tailguard_test_support::post(&format!("{url}{path}"), body, headers)
}

pub async fn send(client: &HttpClient, req: Request<Full<Bytes>>) -> Response<Incoming> {
    client.request(req).await.unwrap()
}

/// Every data frame with the time it arrived, and how the body ended.
pub struct Collected {
    pub status: StatusCode,
    pub headers: http::HeaderMap,
    pub frames: Vec<(Instant, Bytes)>,
    pub trailers: Option<http::HeaderMap>,
    pub error: bool,
    pub start: Instant,
}

impl Collected {
    pub fn text(&self) -> String {
        self.frames
            .iter()
            .map(|(_, b)| String::from_utf8_lossy(b).into_owned())
            .collect()
    }

    /// Data events (SSE `data:` payloads), in order.
    pub fn data_events(&self) -> Vec<String> {
        self.text()
            .split("\n\n")
            .filter_map(|ev| {
                ev.lines()
                    .find_map(|l| l.strip_prefix("data: ").map(str::to_owned))
            })
            .collect()
    }

    /// Time of the first frame whose text contains `needle`, from the start.
    pub fn time_of(&self, needle: &str) -> Option<std::time::Duration> {
        self.frames
            .iter()
            .find(|(_, b)| String::from_utf8_lossy(b).contains(needle))
            .map(|(t, _)| *t - self.start)
    }
}

pub async fn collect(client: &HttpClient, req: Request<Full<Bytes>>) -> Collected {
    let start = Instant::now();
    let res = send(client, req).await;
    collect_response(res, start).await
}

pub async fn collect_response(res: Response<Incoming>, start: Instant) -> Collected {
    let (parts, mut body) = res.into_parts();
    let mut frames = Vec::new();
    let mut trailers = None;
    let mut error = false;
    while let Some(f) = body.frame().await {
        match f {
            Ok(f) => match f.into_data() {
                Ok(d) => frames.push((Instant::now(), d)),
                Err(f) => trailers = f.into_trailers().ok(),
            },
            Err(_) => {
                error = true;
                break;
            }
        }
    }
    Collected {
        status: parts.status,
        headers: parts.headers,
        frames,
        trailers,
        error,
        start,
    }
}
