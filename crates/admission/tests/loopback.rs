//! BoundedAdmission in a hyper gateway in front of the mock LLM upstream, over real loopback
//! HTTP on a paused clock.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tailguard_admission::{AdmissionHandle, BoundedAdmissionLayer};
use tailguard_core::{AdmissionOutcome, BoxError};
use tailguard_mock::{MockServer, Script};
use tailguard_test_support::{HttpClient, chat, client};
use tokio::net::TcpListener;
use tokio::time::{Instant, sleep, timeout};
use tower::{Service, ServiceBuilder};

/// Forwards every request to the mock upstream.
#[derive(Clone)]
struct Proxy {
    client: HttpClient,
    upstream: String,
}

impl Service<Request<Incoming>> for Proxy {
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Incoming>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let client = self.client.clone();
        let upstream = self.upstream.clone();
        Box::pin(async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await?.to_bytes();
            let up = Request::post(format!("{upstream}{}", parts.uri.path()))
                .header("content-type", "application/json")
                .body(Full::new(body))?;
            Ok(client.request(up).await?)
        })
    }
}

/// Starts a gateway `admission -> proxy -> mock` on 127.0.0.1:0; the queue wait is echoed in
/// an `x-queue-wait-ms` response header.
async fn gateway(layer: BoundedAdmissionLayer, mock: &MockServer) -> String {
    let svc = ServiceBuilder::new()
        .map_response(|mut res: Response<_>| {
            if let Some(o) = res.extensions().get::<AdmissionOutcome>() {
                let ms = o.queue_wait.as_millis().to_string();
                res.headers_mut()
                    .insert("x-queue-wait-ms", ms.parse().unwrap());
            }
            res
        })
        .layer(layer)
        .service(Proxy {
            client: client(),
            upstream: mock.url(),
        });
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let svc = TowerToHyperService::new(svc.clone());
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    format!("http://{addr}")
}

async fn until(h: &AdmissionHandle, what: &str, f: impl Fn(&AdmissionHandle) -> bool) {
    timeout(Duration::from_secs(60), async {
        while !f(h) {
            sleep(Duration::from_millis(1)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"));
}

fn wait_ms(res: &Response<Incoming>) -> u64 {
    res.headers()["x-queue-wait-ms"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn permit_is_held_for_the_whole_stream_and_freed_by_a_disconnect() {
    // Streams of 20 tokens 100 ms apart: about two seconds each.
    let mock = MockServer::start(
        Script::new()
            .ttft(Duration::from_millis(10))
            .tokens(20)
            .gap(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let layer = BoundedAdmissionLayer::new(2).with_queue_timeout(Duration::from_secs(30));
    let h = layer.handle();
    let gw = gateway(layer, &mock).await;
    let client = client();

    let a = client.request(chat(&gw, &[])).await.unwrap();
    let b = client.request(chat(&gw, &[])).await.unwrap();
    assert_eq!((a.status(), b.status()), (StatusCode::OK, StatusCode::OK));
    assert_eq!(
        h.in_flight(),
        2,
        "headers are out, the permits are still held"
    );
    let c = tokio::spawn({
        let client = client.clone();
        let req = chat(&gw, &[]);
        async move { client.request(req).await.unwrap() }
    });
    until(&h, "c to queue", |h| h.queued() == 1).await;
    let queued_at = Instant::now();
    // The streams flow; c waits for a stream to end, not for headers.
    let mut a_body = a.into_body();
    let first = a_body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    sleep(Duration::from_millis(500)).await;
    assert_eq!((h.in_flight(), h.queued()), (2, 1));
    assert!(!c.is_finished());
    assert_eq!(mock.stats().requests, 2, "c has not reached the upstream");

    // The client of a disconnects mid-stream: its permit is freed and c goes in.
    drop(a_body);
    let c = c.await.unwrap();
    assert_eq!(c.status(), StatusCode::OK);
    let waited = wait_ms(&c);
    assert!(waited >= 500, "c waited {waited} ms");
    assert!(Duration::from_millis(waited) <= queued_at.elapsed() + Duration::from_millis(5));
    until(&h, "a's upstream to be cancelled", |_| {
        mock.stats().cancelled == 1
    })
    .await;

    // b and c run to their end; then nothing is held.
    let b = b.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&b).ends_with("data: [DONE]\n\n"));
    let c = c.into_body().collect().await.unwrap().to_bytes();
    assert!(String::from_utf8_lossy(&c).ends_with("data: [DONE]\n\n"));
    until(&h, "every permit to be released", |h| h.in_flight() == 0).await;
    let stats = mock.stats();
    assert_eq!(
        (stats.requests, stats.completed, stats.cancelled),
        (3, 2, 1)
    );
    mock.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn full_queue_and_deadline_over_http() {
    let mock = MockServer::start(
        Script::new()
            .ttft(Duration::from_millis(10))
            .tokens(30)
            .gap(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_len(1)
        .with_codel(None)
        .with_queue_timeout(Duration::from_millis(400));
    let h = layer.handle();
    let gw = gateway(layer, &mock).await;
    let client = client();
    let a = client.request(chat(&gw, &[])).await.unwrap();
    let b = tokio::spawn({
        let client = client.clone();
        let req = chat(&gw, &[]);
        async move { client.request(req).await.unwrap() }
    });
    until(&h, "b to queue", |h| h.queued() == 1).await;
    // The queue is full: an immediate 429 with the OpenAI error body and Retry-After.
    let c = client.request(chat(&gw, &[])).await.unwrap();
    assert_eq!(c.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(
        c.headers()["retry-after"]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    assert_eq!(c.headers()["content-type"], "application/json");
    let body = c.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "queue_full");
    assert_eq!(v["error"]["type"], "rate_limit_exceeded");
    // b reaches its deadline: 503.
    let b = b.await.unwrap();
    assert_eq!(b.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(wait_ms(&b), 400);
    let body = b.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "queue_timeout");
    assert_eq!(
        mock.stats().requests,
        1,
        "refused requests never reach the upstream"
    );
    drop(a);
    until(&h, "a's permit to be released", |h| h.in_flight() == 0).await;
    mock.shutdown().await;
}
