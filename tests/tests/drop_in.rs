//! The ergonomics cannot regress: all five layers, in the recommended order and in their
//! default (response) modes, stack with no glue on an axum `Router` (and under
//! `route_service`), on a tonic `Channel` client and on a hyper client served through hyper's
//! `service_fn`. Each stack is built and sends one request (over loopback to the mock where
//! an upstream is needed).
//!
//! The one adaptation left is tonic's own: a `Channel` takes exactly `tonic::body::Body`, so
//! the hedge's replayable request body is wrapped with `tonic::body::Body::new` (the body keeps
//! its `Bytes` data, so that is all it takes).

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tailguard::admission::BoundedAdmissionLayer;
use tailguard::core::{HedgeOutcome, ReplayBody};
use tailguard::hedge::FirstTokenHedgeLayer;
use tailguard::phases::LatencyPhaseRecorderLayer;
use tailguard::priority::PriorityClassLayer;
use tailguard::timeout::SseIdleTimeoutLayer;
use tailguard_mock::grpc::{GenerateClient, GenerateRequest};
use tailguard_mock::{MockServer, Script};
use tower::{ServiceBuilder, ServiceExt, service_fn};

const SSE: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
const CHAT: &str =
    r#"{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;

/// The five layers, configuration only. Every layer value is a `Clone` config; `ServiceBuilder`
/// stacks them outermost first.
macro_rules! tailguard {
    () => {
        ServiceBuilder::new()
            .layer(LatencyPhaseRecorderLayer::new().with_routes(["/v1/chat/completions"]))
            .layer(PriorityClassLayer::new())
            .layer(BoundedAdmissionLayer::new(8))
            .layer(
                SseIdleTimeoutLayer::new()
                    .with_first_token_timeout(Duration::from_secs(10))
                    .with_idle_timeout(Duration::from_secs(5)),
            )
            .layer(FirstTokenHedgeLayer::new().with_delay(Duration::from_millis(500)))
    };
}

async fn sse_handler() -> Response<String> {
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(SSE.to_owned())
        .unwrap()
}

fn chat() -> Request<axum::body::Body> {
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(axum::body::Body::from(CHAT))
        .unwrap()
}

#[tokio::test]
async fn an_axum_router_takes_the_stack_as_a_layer() {
    let app = axum::Router::new()
        .route("/v1/chat/completions", axum::routing::post(sse_handler))
        .layer(tailguard!());
    let res = app.oneshot(chat()).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, SSE.as_bytes());
}

#[tokio::test]
async fn an_axum_route_service_takes_the_stack_over_an_infallible_service() {
    let upstream = service_fn(|_req: Request<ReplayBody<axum::body::Body>>| async {
        Ok::<_, Infallible>(sse_handler().await)
    });
    let app =
        axum::Router::new().route_service("/v1/chat/completions", tailguard!().service(upstream));
    let res = app.oneshot(chat()).await.unwrap();
    assert_eq!(
        res.extensions().get::<HedgeOutcome>().map(|h| h.attempts),
        Some(1)
    );
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body, SSE.as_bytes());
}

#[tokio::test]
async fn a_tonic_channel_client_takes_the_stack() {
    let mock = MockServer::start(Script::new().tokens(3)).await.unwrap();
    let channel = tonic::transport::Channel::from_shared(mock.url())
        .unwrap()
        .connect_lazy();
    let stack = tailguard!()
        .map_request(|r: Request<ReplayBody<tonic::body::Body>>| r.map(tonic::body::Body::new))
        .service(channel);
    let mut client = GenerateClient::new(stack);
    let request = GenerateRequest {
        prompt: "hi".into(),
        max_tokens: 0,
        model: "mock-llm".into(),
    };
    let mut stream = client.generate(request).await.unwrap().into_inner();
    let mut text = String::new();
    while let Some(msg) = stream.message().await.unwrap() {
        text.push_str(&msg.text);
    }
    assert!(!text.is_empty());
    mock.shutdown().await;
}

#[tokio::test]
async fn a_hyper_client_takes_the_stack_and_hyper_serves_it() {
    let mock = MockServer::start(Script::new().tokens(3)).await.unwrap();
    let upstream: Client<_, ReplayBody<Incoming>> =
        Client::builder(TokioExecutor::new()).build_http();
    let stack = tailguard!().service(upstream);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let base: http::Uri = mock.url().parse().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let handler = hyper::service::service_fn(move |mut req: Request<Incoming>| {
            // The proxy's own routing: every request goes to the mock.
            let mut parts = base.clone().into_parts();
            parts.path_and_query = req.uri().path_and_query().cloned();
            *req.uri_mut() = http::Uri::from_parts(parts).unwrap();
            stack.clone().oneshot(req)
        });
        hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(tcp), handler)
            .await
            .unwrap();
    });

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(CHAT.as_bytes())))
        .unwrap();
    let res = client.request(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    mock.shutdown().await;
}
