//! The five layers over a `ReplicaSet` of a pooled hyper client, on an axum route, with no glue:
//! `Router::route_service` takes the stack as it is, because `BadGatewayLayer` answers the
//! client's transport errors with a 502 and makes the stack `Infallible`.
//!
//! ```text
//! cargo run --release --example axum_replicas
//! ```
//!
//! Two embedded mock replicas, the first congested (first token after 2 s): the set places the
//! primary, the hedge sends a backup to the other replica after 300 ms, its first token wins,
//! and the response says so in `x-tailguard-hedge`. The recorder prints the phase report, with
//! the replica that served it as the `upstream` label and the request's model as `model`
//! (`RequestFactsLayer` read it from the body, once, for every layer).

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::HeaderName;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tailguard::admission::BoundedAdmissionLayer;
use tailguard::core::{BadGatewayLayer, BoxError, ReplayBody, RequestFactsLayer};
use tailguard::hedge::FirstTokenHedgeLayer;
use tailguard::phases::{LatencyPhaseRecorderLayer, PhaseReport};
use tailguard::priority::PriorityClassLayer;
use tailguard::route::ReplicaSet;
use tailguard::timeout::SseIdleTimeoutLayer;
use tailguard_mock::{MockServer, Script};
use tower::ServiceBuilder;

fn print_report(r: &PhaseReport) {
    println!(
        "\n\nphase report: end={} ttft={:?} upstream={} model={} hedge={:?}",
        r.end_reason,
        r.time_to_first_token,
        r.labels.upstream(),
        r.labels.model(),
        r.hedge.as_ref().map(|h| h.header_value()),
    );
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let congested = MockServer::start(Script::new().ttft(Duration::from_secs(2)).tokens(8)).await?;
    let healthy =
        MockServer::start(Script::new().ttft(Duration::from_millis(50)).tokens(8)).await?;
    let bases = [congested.url().parse()?, healthy.url().parse()?];

    // The upstream: one pooled client aimed at each replica's base URL. Its body type is the
    // hedge's replay of the request-facts layer's buffer (the two share the bytes).
    let client = Client::builder(TokioExecutor::new()).build_http::<ReplayBody<ReplayBody<Body>>>();
    let replicas = ReplicaSet::from_base_uris(client, &bases)?;

    // Layer configuration only.
    let stack = ServiceBuilder::new()
        .layer(BadGatewayLayer::new())
        .layer(RequestFactsLayer::new())
        .layer(
            LatencyPhaseRecorderLayer::new()
                .with_models(["mock-llm"])
                .with_sink(print_report),
        )
        .layer(PriorityClassLayer::new())
        .layer(BoundedAdmissionLayer::new(64))
        .layer(SseIdleTimeoutLayer::new().with_idle_timeout(Duration::from_secs(5)))
        .layer(
            FirstTokenHedgeLayer::new()
                .with_delay(Duration::from_millis(300))
                .with_outcome_header(Some(HeaderName::from_static("x-tailguard-hedge"))),
        )
        .service(replicas);
    let app = Router::new().route_service("/v1/chat/completions", stack);

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });

    // One streamed chat completion through the route.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"Hi"}]}"#,
        )))?;
    let res = client.request(req).await?;
    println!(
        "x-tailguard-hedge: {:?}",
        res.headers().get("x-tailguard-hedge")
    );
    let mut body = res.into_body();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            print!("{}", String::from_utf8_lossy(&data));
        }
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    congested.shutdown().await;
    healthy.shutdown().await;
    Ok(())
}
