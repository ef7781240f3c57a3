//! A tonic client `Channel` guarded by tailguard: the mock's gRPC `Generate` service, hedged on
//! the first streamed message, with first-token and idle timeouts, and every phase recorded.
//!
//! ```text
//! cargo run --release --example tonic_client                 # over two embedded mock replicas
//! cargo run --release --example tonic_client -- http://127.0.0.1:50051 http://127.0.0.1:50052
//! ```
//!
//! With no URL it starts two mock replicas, the first congested (first message after 2 s). The
//! `ReplicaSet` picks primaries round robin and a backup takes the next turn, so here each call's
//! primary lands on the congested replica; after 200 ms without a message the hedge sends a
//! backup to the other replica, whose first message wins, and the primary is cancelled.
//!
//! Stack, outermost first: `LatencyPhaseRecorder -> SseIdleTimeout -> FirstTokenHedge ->
//! ReplicaSet of Channels`. Each gRPC message of a server stream is a token.

use std::time::Duration;

use http::Request;
use tailguard::core::{BoxError, ReplayBody};
use tailguard::hedge::FirstTokenHedgeLayer;
use tailguard::phases::{LatencyPhaseRecorderLayer, PhaseReport};
use tailguard::route::ReplicaSet;
use tailguard::timeout::SseIdleTimeoutLayer;
use tailguard_mock::grpc::{GENERATE_PATH, GenerateClient, GenerateRequest};
use tailguard_mock::{MockServer, Script};
use tonic::transport::Channel;
use tower::ServiceBuilder;

fn print_report(r: &PhaseReport) {
    let ms = |d: Option<Duration>| {
        d.map_or("-".to_owned(), |d| {
            format!("{:.1}ms", d.as_secs_f64() * 1e3)
        })
    };
    let hedge = r.hedge.as_ref().map_or("-".to_owned(), |h| match h.winner {
        Some(w) => format!("{} attempt(s), winner {w}", h.attempts),
        None => format!("{} attempt(s), all failed", h.attempts),
    });
    println!(
        "\n  phase report: end={} upstream={} ttft={} total={} messages={} max_gap={} hedge: {}",
        r.end_reason,
        r.labels.upstream(),
        ms(r.time_to_first_token),
        ms(Some(r.total)),
        r.output_events,
        ms((r.gaps.count > 0).then_some(r.gaps.max)),
        hedge,
    );
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let mut urls: Vec<String> = std::env::args().skip(1).collect();
    let mut mocks = Vec::new();
    if urls.is_empty() {
        let congested = Script::new()
            .ttft(Duration::from_secs(2))
            .tokens(12)
            .gap(Duration::from_millis(20));
        let healthy = Script::new()
            .ttft(Duration::from_millis(50))
            .tokens(12)
            .gap(Duration::from_millis(20));
        for script in [congested, healthy] {
            let m = MockServer::start(script).await?;
            urls.push(m.url());
            mocks.push(m);
        }
        println!("mock replicas: {} (congested), {}", urls[0], urls[1]);
    }

    let mut channels = Vec::new();
    for url in &urls {
        channels.push(Channel::from_shared(url.clone())?.connect_lazy());
    }
    let guarded = ServiceBuilder::new()
        .layer(
            LatencyPhaseRecorderLayer::new()
                .with_routes([GENERATE_PATH])
                .with_sink(print_report),
        )
        .layer(
            SseIdleTimeoutLayer::new()
                .with_first_token_timeout(Duration::from_secs(5))
                .with_idle_timeout(Duration::from_secs(1)),
        )
        .layer(FirstTokenHedgeLayer::new().with_delay(Duration::from_millis(200)))
        // A `Channel` takes tonic's own body type (the replayed body keeps its `Bytes` data).
        .map_request(|r: Request<ReplayBody<tonic::body::Body>>| r.map(tonic::body::Body::new))
        .service(ReplicaSet::new(channels));

    let mut client = GenerateClient::new(guarded);
    for call in 1..=2 {
        print!("call {call}: ");
        let request = GenerateRequest {
            prompt: "Say hello".into(),
            max_tokens: 0,
            model: "mock-llm".into(),
        };
        let mut stream = client.generate(request).await?.into_inner();
        while let Some(msg) = stream.message().await? {
            match msg.finish_reason {
                Some(reason) => print!(" [{reason}]"),
                None => print!("{}", msg.text),
            }
            use std::io::Write;
            std::io::stdout().flush().ok();
        }
        // The report is printed by the recorder when the stream ends.
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    for m in mocks {
        m.shutdown().await;
    }
    Ok(())
}
