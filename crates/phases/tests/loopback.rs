//! The recorder around a real hyper client (and a tonic channel) talking to `tailguard-mock`
//! over loopback, on a paused clock.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tailguard_core::{EndReason, RequestFacts, UpstreamFailure};
use tailguard_mock::grpc::{GenerateClient, GenerateRequest};
use tailguard_mock::{MockServer, Script};
use tailguard_phases::{LatencyPhaseRecorder, LatencyPhaseRecorderLayer};
use tower::ServiceExt;

const CHAT_USAGE: &str = r#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"hi"}]}"#;

fn recorder(layer: LatencyPhaseRecorderLayer) -> LatencyPhaseRecorder<HttpClient> {
    LatencyPhaseRecorder::new(
        client(),
        &layer
            .with_routes(["/v1/chat/completions", "/v1/messages"])
            .with_models(["gpt-4o", "claude-3-5-sonnet"])
            .with_upstream("mock"),
    )
}

/// A streamed request to `path` on `server`, with a mock script and the request facts.
fn post(server: &MockServer, path: &str, body: &str, script: Option<&str>) -> Request<Full<Bytes>> {
    let headers: Vec<_> = script
        .map(|s| (tailguard_mock::SCRIPT_HEADER, s))
        .into_iter()
        .collect();
    let mut req = common::post(&format!("{}{path}", server.url()), body, &headers);
    let model = if path.contains("messages") {
        "claude-3-5-sonnet-20241022"
    } else {
        "gpt-4o"
    };
    req.extensions_mut()
        .insert(RequestFacts::new().with_model(model).with_stream(true));
    req
}

#[tokio::test(start_paused = true)]
async fn openai_stream_exact_phases() {
    let server = MockServer::start(
        Script::new()
            .head_delay(Duration::from_millis(30))
            .ttft(Duration::from_millis(100))
            .tokens(5)
            .gap(Duration::from_millis(20))
            .keepalive_every(Duration::from_millis(15)),
    )
    .await
    .unwrap();
    let (layer, reports, snap) = layer();
    let svc = recorder(layer);
    let res = svc
        .oneshot(post(&server, "/v1/chat/completions", CHAT, None))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-request-id"].len(), 32);
    res.into_body().collect().await.unwrap();

    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::Completed);
    assert_eq!(r.time_to_headers, Some(ms(30)));
    // The role-only chunk right after the head and the keepalives do not count.
    assert_eq!(r.time_to_first_token, Some(ms(130)));
    // The finish chunk (`"delta":{}` with `finish_reason`) is not output: 5 tokens.
    assert_eq!(r.output_events, 5);
    // Four 20 ms gaps between the tokens.
    assert_eq!(r.gaps.count, 4);
    assert_eq!(
        (r.gaps.min, r.gaps.max, r.gaps.sum),
        (ms(20), ms(20), ms(80))
    );
    assert_eq!(r.total, ms(210));
    // (210 - 130) / (5 - 1)
    assert_eq!(r.time_per_output_token, Some(ms(20)));
    assert!(r.done_seen);
    assert_eq!(r.labels.model(), "gpt-4o");
    assert_eq!(r.labels.route(), "/v1/chat/completions");

    let all = snapshot(&snap);
    assert_secs(
        &metric(&all, "tailguard_time_to_first_token_seconds").hist(),
        &[0.13],
    );
    assert_secs(
        &metric(&all, "tailguard_inter_token_gap_seconds").hist(),
        &[0.02, 0.02, 0.02, 0.02],
    );
    assert_secs(
        &metric(&all, "tailguard_request_duration_seconds").hist(),
        &[0.21],
    );
    assert_secs(&metric(&all, "tailguard_output_events").hist(), &[5.0]);
    // The upstream saw the generated request id.
    let stats = server.stats();
    assert_eq!(stats.completed, 1);
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn anthropic_stream_with_pings_and_usage() {
    let server = MockServer::start(
        Script::new()
            .ttft(Duration::from_millis(200))
            .tokens(3)
            .gap(Duration::from_millis(50))
            .keepalive_every(Duration::from_millis(70)),
    )
    .await
    .unwrap();
    let (layer, reports, _snap) = layer();
    let svc = recorder(layer);
    let res = svc
        .clone()
        .oneshot(post(&server, "/v1/messages", MESSAGES, None))
        .await
        .unwrap();
    res.into_body().collect().await.unwrap();
    let res = svc
        .oneshot(post(&server, "/v1/chat/completions", CHAT_USAGE, None))
        .await
        .unwrap();
    res.into_body().collect().await.unwrap();

    let all = reports.all();
    assert_eq!(all.len(), 2);
    let a = &all[0];
    assert_eq!(a.end_reason, EndReason::Completed);
    assert_eq!(a.time_to_first_token, Some(ms(200)));
    assert_eq!(a.output_events, 3);
    assert_eq!(a.gaps.count, 2);
    assert_eq!(a.gaps.max, ms(50));
    assert_eq!(a.labels.model(), "claude-3-5-sonnet");
    assert!(a.done_seen, "message_stop");
    let o = &all[1];
    let u = o.usage.expect("include_usage");
    assert_eq!(u.completion_tokens, Some(3));
    assert!(u.prompt_tokens.is_some());
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn upstream_failures_over_loopback() {
    let server = MockServer::start(Script::new().tokens(4).gap(Duration::from_millis(10)))
        .await
        .unwrap();
    let (layer, reports, snap) = layer();
    let svc = recorder(layer);
    for script in [
        "status=500",
        "status=429,retry_after=2s",
        "error_after=2",
        "reset=2",
    ] {
        let res = svc
            .clone()
            .oneshot(post(&server, "/v1/chat/completions", CHAT, Some(script)))
            .await
            .unwrap();
        let _ = res.into_body().collect().await;
    }
    let reasons: Vec<_> = reports.all().iter().map(|r| r.end_reason).collect();
    assert_eq!(
        reasons,
        [
            EndReason::UpstreamError(UpstreamFailure::Status(StatusCode::INTERNAL_SERVER_ERROR)),
            EndReason::UpstreamError(UpstreamFailure::Status(StatusCode::TOO_MANY_REQUESTS)),
            EndReason::UpstreamError(UpstreamFailure::InBand),
            EndReason::UpstreamError(UpstreamFailure::Transport),
        ]
    );
    let all = reports.all();
    assert_eq!(all[2].output_events, 2);
    assert_eq!(all[3].output_events, 2);
    let mut labels: Vec<_> = snapshot(&snap)
        .into_iter()
        .filter(|s| s.name == "tailguard_requests_total")
        .map(|s| s.label("end_reason").unwrap().to_owned())
        .collect();
    labels.sort();
    assert_eq!(
        labels,
        [
            "upstream_error_4xx",
            "upstream_error_5xx",
            "upstream_error_in_band",
            "upstream_error_transport"
        ]
    );
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn client_disconnect_mid_stream_over_loopback() {
    let server = MockServer::start(
        Script::new()
            .ttft(Duration::from_millis(40))
            .tokens(10)
            .gap(Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let (layer, reports, _snap) = layer();
    let svc = recorder(layer);
    let res = svc
        .oneshot(post(&server, "/v1/chat/completions", CHAT, None))
        .await
        .unwrap();
    let mut body = res.into_body();
    let mut seen = String::new();
    while seen.matches("\"content\"").count() < 2 {
        let f = body.frame().await.unwrap().unwrap();
        if let Ok(d) = f.into_data() {
            seen.push_str(&String::from_utf8_lossy(&d));
        }
    }
    drop(body);
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::ClientDisconnect);
    assert_eq!(r.output_events, 2);
    assert_eq!(r.time_to_first_token, Some(ms(40)));
    assert_eq!(r.total, ms(140));
    server.wait_idle().await;
    assert_eq!(
        server.stats().cancelled,
        1,
        "the upstream saw the cancellation"
    );
    server.shutdown().await;
}

/// gRPC through tonic: every message is a token (the mock's final `finish_reason` message too).
#[tokio::test(start_paused = true)]
async fn grpc_stream_through_tonic() {
    let server = MockServer::start(
        Script::new()
            .ttft(Duration::from_millis(60))
            .tokens(4)
            .gap(Duration::from_millis(15)),
    )
    .await
    .unwrap();
    let (layer, reports, snap) = layer();
    let channel = tonic::transport::Channel::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let svc = LatencyPhaseRecorder::new(
        channel,
        &layer.with_routes(["/tailguard.mock.v1.Generator"]),
    );
    let mut client = GenerateClient::new(svc);
    let mut stream = client
        .generate(GenerateRequest {
            prompt: "hi".into(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    let mut n = 0;
    while let Some(_msg) = stream.message().await.unwrap() {
        n += 1;
    }
    assert_eq!(n, 5);
    drop(stream);
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::Completed);
    assert!(r.labels.streamed());
    assert_eq!(r.labels.route(), "/tailguard.mock.v1.Generator");
    assert_eq!(r.output_events, 5);
    assert_eq!(r.time_to_first_token, Some(ms(60)));
    // The final message follows the last token at once, in a frame of its own: a zero gap.
    assert_eq!(r.gaps.count, 4);
    assert_eq!(
        (r.gaps.min, r.gaps.max, r.gaps.sum),
        (ms(0), ms(15), ms(45))
    );
    let all = snapshot(&snap);
    assert_secs(
        &metric(&all, "tailguard_time_to_first_token_seconds").hist(),
        &[0.06],
    );

    // A trailers-only gRPC error.
    let mut req = GenerateRequest {
        prompt: "hi".into(),
        ..Default::default()
    }
    .into_request_with(tailguard_mock::SCRIPT_HEADER, "status=503");
    let _ = client.generate(req.take()).await;
    let all = reports.all();
    assert_eq!(all.len(), 2);
    assert_eq!(
        all[1].end_reason,
        EndReason::UpstreamError(UpstreamFailure::InBand)
    );
    server.shutdown().await;
}

trait IntoRequestWith {
    fn into_request_with(self, k: &'static str, v: &'static str) -> Holder;
}

struct Holder(Option<tonic::Request<GenerateRequest>>);

impl Holder {
    fn take(&mut self) -> tonic::Request<GenerateRequest> {
        self.0.take().unwrap()
    }
}

impl IntoRequestWith for GenerateRequest {
    fn into_request_with(self, k: &'static str, v: &'static str) -> Holder {
        let mut r = tonic::Request::new(self);
        r.metadata_mut().insert(k, v.parse().unwrap());
        Holder(Some(r))
    }
}
