//! The five tailguard layers on an existing axum `Router`, with no glue: one `.layer(...)` call
//! over an `Infallible` handler, no `HandleErrorLayer`, no body mapping.
//!
//! ```text
//! cargo run --release --example axum_router
//! ```
//!
//! The router's own handler proxies `POST /v1/chat/completions` to two embedded mock replicas,
//! picking the replica by the hedge's `Attempt` number. The first replica is congested (first
//! token after 2 s): after 300 ms without a token the hedge calls the handler again as attempt
//! 1, which goes to the healthy replica, whose first token wins; the congested attempt is
//! cancelled. The recorder prints the phase report.

use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::Response;
use axum::routing::post;
use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tailguard::admission::BoundedAdmissionLayer;
use tailguard::core::BoxError;
use tailguard::core::attempt::Attempt;
use tailguard::hedge::FirstTokenHedgeLayer;
use tailguard::phases::{LatencyPhaseRecorderLayer, PhaseReport};
use tailguard::priority::PriorityClassLayer;
use tailguard::timeout::SseIdleTimeoutLayer;
use tailguard_mock::{MockServer, Script};
use tower::ServiceBuilder;

/// The handler's state: a pooled client and the replicas' base URLs.
#[derive(Clone)]
struct Upstreams {
    client: Client<HttpConnector, Body>,
    urls: Vec<String>,
}

/// The router's own handler, as it was before tailguard: forwards the request to a replica
/// (here chosen by the hedge's attempt number, so a backup goes to another replica).
async fn chat(State(up): State<Upstreams>, mut req: Request) -> Result<Response, StatusCode> {
    let attempt = req.extensions().get::<Attempt>().map_or(0, Attempt::number);
    let base = &up.urls[usize::from(attempt) % up.urls.len()];
    *req.uri_mut() = format!("{base}/v1/chat/completions")
        .parse()
        .map_err(|_| StatusCode::BAD_GATEWAY)?;
    let res = up
        .client
        .request(req)
        .await
        .map_err(|_| StatusCode::BAD_GATEWAY)?;
    Ok(res.map(Body::new))
}

fn print_report(r: &PhaseReport) {
    let hedge = r.hedge.as_ref().map_or("-".to_owned(), |h| {
        let winner = h.winner.map_or("none".to_owned(), |w| w.to_string());
        format!("{} attempt(s), winner {winner}", h.attempts)
    });
    println!(
        "\n\nphase report: end={} ttft={:?} total={:?} tokens={} hedge: {hedge}",
        r.end_reason, r.time_to_first_token, r.total, r.output_events,
    );
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let congested = MockServer::start(Script::new().ttft(Duration::from_secs(2)).tokens(8)).await?;
    let healthy =
        MockServer::start(Script::new().ttft(Duration::from_millis(50)).tokens(8)).await?;
    let upstreams = Upstreams {
        client: Client::builder(TokioExecutor::new()).build_http(),
        urls: vec![congested.url(), healthy.url()],
    };

    // The existing router...
    let app = Router::new()
        .route("/v1/chat/completions", post(chat))
        .with_state(upstreams)
        // ...and tailguard on it: layer configuration only.
        .layer(
            ServiceBuilder::new()
                .layer(
                    LatencyPhaseRecorderLayer::new()
                        .with_routes(["/v1/chat/completions"])
                        .with_sink(print_report),
                )
                .layer(PriorityClassLayer::new())
                .layer(BoundedAdmissionLayer::new(64))
                .layer(
                    SseIdleTimeoutLayer::new()
                        .with_first_token_timeout(Duration::from_secs(10))
                        .with_idle_timeout(Duration::from_secs(5)),
                )
                .layer(FirstTokenHedgeLayer::new().with_delay(Duration::from_millis(300))),
        );

    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    println!(
        "router on http://{addr}; replicas {} (congested), {}",
        congested.url(),
        healthy.url()
    );

    // One streamed chat completion through the router.
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = http::Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"Hi"}]}"#,
        )))?;
    let mut body = client.request(req).await?.into_body();
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
