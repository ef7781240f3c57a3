//! End to end over real loopback HTTP against `tailguard-mock`, on a paused clock.
//!
//! The layer wraps a hyper client (the way a gateway calls its upstream) and the mock serves
//! scripted streams. Limits are chosen so that no timer expires at the very instant the mock
//! sends a frame: with two tasks (client and mock) a tie would be decided by the scheduler.

use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tailguard_core::{EndReason, EndReport};
use tailguard_mock::{MockServer, Script};
use tailguard_timeout::SseIdleTimeoutLayer;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

type HttpClient = Client<HttpConnector, Full<Bytes>>;

const CHAT_STREAM: &str =
    r#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"hi there"}]}"#;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn client() -> HttpClient {
    Client::builder(TokioExecutor::new()).build_http()
}

fn chat(server: &MockServer, report: &EndReport) -> Request<Full<Bytes>> {
    let mut req = Request::post(format!("{}/v1/chat/completions", server.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(CHAT_STREAM.as_bytes())))
        .unwrap();
    req.extensions_mut().insert(report.clone());
    req
}

struct Outcome {
    status: StatusCode,
    text: String,
    elapsed: Duration,
    error: Option<tailguard_core::BoxError>,
}

impl Outcome {
    /// SSE events split on blank lines; panics if the text ends mid-event.
    fn events(&self) -> Vec<&str> {
        assert!(
            self.text.ends_with("\n\n"),
            "ends mid-event: {:?}",
            self.text
        );
        self.text.split_terminator("\n\n").collect()
    }
}

async fn call<S, B>(svc: S, req: Request<Full<Bytes>>) -> Outcome
where
    S: tower::Service<Request<Full<Bytes>>, Response = http::Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: Into<tailguard_core::BoxError>,
{
    let start = Instant::now();
    let res = svc.oneshot(req).await.expect("response");
    let status = res.status();
    let mut body = std::pin::pin!(res.into_body());
    let mut text = Vec::new();
    let mut error = None;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => {
                if let Ok(mut d) = f.into_data() {
                    text.extend_from_slice(&d.copy_to_bytes(d.remaining()));
                }
            }
            Err(e) => {
                error = Some(e.into());
                break;
            }
        }
    }
    Outcome {
        status,
        text: String::from_utf8(text).unwrap(),
        elapsed: start.elapsed(),
        error,
    }
}

fn error_code(event: &str) -> String {
    let v: serde_json::Value =
        serde_json::from_str(event.strip_prefix("data: ").expect("data event")).unwrap();
    v["error"]["code"].as_str().expect("error event").to_owned()
}

#[tokio::test(start_paused = true)]
async fn keepalives_do_not_fool_the_first_token_timer_but_fool_tower_http() {
    // Keepalive comments every second, and the first token never comes.
    let script = Script::new()
        .keepalive_every(ms(1000))
        .stall_after(0, Some(Duration::from_secs(60)))
        .tokens(1);
    let server = MockServer::start(script).await.unwrap();

    let report = EndReport::new();
    let svc = SseIdleTimeoutLayer::new()
        .with_first_token_timeout(ms(4500))
        .layer(client());
    let out = call(svc, chat(&server, &report)).await;
    assert_eq!(out.status, 200);
    assert_eq!(out.elapsed, ms(4500), "fires exactly at its setting");
    let events = out.events();
    assert_eq!(
        events
            .iter()
            .filter(|e| e.starts_with(": keepalive"))
            .count(),
        4
    );
    assert_eq!(error_code(events[events.len() - 2]), "first_token_timeout");
    assert_eq!(events[events.len() - 1], "data: [DONE]");
    assert_eq!(report.get(), Some(EndReason::FirstTokenTimeout));
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!((s.requests, s.cancelled, s.completed), (1, 1, 0));

    // tower-http's body timeout, 2 s: every keepalive restarts it, so it never fires and the
    // stalled generation runs its full minute.
    server.reset_stats();
    let svc = tower_http::timeout::ResponseBodyTimeoutLayer::new(ms(2000)).layer(client());
    let out = call(svc, chat(&server, &EndReport::new())).await;
    assert!(out.error.is_none(), "tower-http fired: {:?}", out.error);
    assert!(out.elapsed >= Duration::from_secs(60), "{:?}", out.elapsed);
    assert!(out.text.ends_with("data: [DONE]\n\n"));
    server.wait_idle().await;
    assert_eq!(server.stats().completed, 1);
}

#[tokio::test(start_paused = true)]
async fn a_stall_after_tokens_behind_keepalives_hits_the_idle_timer() {
    let script = Script::new()
        .ttft(ms(200))
        .gap(ms(100))
        .tokens(20)
        .stall_after(5, None)
        .keepalive_every(ms(1000));
    let server = MockServer::start(script).await.unwrap();
    let report = EndReport::new();
    let svc = SseIdleTimeoutLayer::new()
        .with_first_token_timeout(ms(2050))
        .with_idle_timeout(ms(2050))
        .layer(client());
    let out = call(svc, chat(&server, &report)).await;
    // Token 5 at 0.2 + 4 * 0.1 = 0.6 s, then only keepalives: the idle limit passes at 2.65 s.
    assert_eq!(out.elapsed, ms(2650));
    let events = out.events();
    let n = events.len();
    assert_eq!(error_code(events[n - 2]), "idle_timeout");
    assert_eq!(events[n - 1], "data: [DONE]");
    assert_eq!(
        events.iter().filter(|e| e.contains("\"content\"")).count(),
        5
    );
    assert!(events.iter().any(|e| e.starts_with(": keepalive")));
    assert_eq!(report.get(), Some(EndReason::IdleTimeout));
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!((s.cancelled, s.completed), (1, 0), "upstream cancelled");
}

#[tokio::test(start_paused = true)]
async fn steady_streams_pass_and_the_total_deadline_fires() {
    let script = Script::new().ttft(ms(300)).gap(ms(450)).tokens(400);
    let server = MockServer::start(script).await.unwrap();
    let layer = SseIdleTimeoutLayer::new()
        .with_first_token_timeout(ms(1000))
        .with_idle_timeout(ms(500));
    let report = EndReport::new();
    let out = call(layer.clone().layer(client()), chat(&server, &report)).await;
    assert!(out.error.is_none());
    let events = out.events();
    assert!(events.iter().all(|e| !e.contains("\"error\"")));
    assert_eq!(
        events.iter().filter(|e| e.contains("\"content\"")).count(),
        400
    );
    assert_eq!(events.last().copied(), Some("data: [DONE]"));
    assert_eq!(report.get(), None);
    server.wait_idle().await;
    assert_eq!(server.stats().completed, 1);

    // The same stream under a 30.1 s total deadline.
    server.reset_stats();
    let report = EndReport::new();
    let svc = layer.with_total_timeout(ms(30_100)).layer(client());
    let out = call(svc, chat(&server, &report)).await;
    assert_eq!(out.elapsed, ms(30_100));
    let events = out.events();
    assert_eq!(error_code(events[events.len() - 2]), "deadline_exceeded");
    assert_eq!(report.get(), Some(EndReason::Deadline));
    server.wait_idle().await;
    assert_eq!(server.stats().cancelled, 1);
}

#[tokio::test(start_paused = true)]
async fn head_timeout_is_a_504_in_openai_json_over_loopback() {
    let server = MockServer::start(Script::new().head_delay(Duration::from_secs(30)))
        .await
        .unwrap();
    let report = EndReport::new();
    let svc = SseIdleTimeoutLayer::new()
        .with_head_timeout(ms(1500))
        .layer(client());
    let start = Instant::now();
    let res = svc.oneshot(chat(&server, &report)).await.unwrap();
    assert_eq!(start.elapsed(), ms(1500));
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(res.headers()["content-type"], "application/json");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "head_timeout");
    assert_eq!(v["error"]["type"], "timeout_error");
    assert_eq!(report.get(), Some(EndReason::HeadTimeout));
    server.wait_idle().await;
    assert_eq!(server.stats().cancelled, 1);
}

#[tokio::test(start_paused = true)]
async fn anthropic_stream_behind_pings_ends_with_an_error_event() {
    let script = Script::new()
        .ttft(ms(100))
        .tokens(10)
        .stall_after(2, None)
        .keepalive_every(ms(700));
    let server = MockServer::start(script).await.unwrap();
    let svc = SseIdleTimeoutLayer::new()
        .with_idle_timeout(ms(1550))
        .layer(client());
    let req = Request::post(format!("{}/v1/messages", server.url()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"claude","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap();
    let out = call(svc, req).await;
    assert_eq!(out.elapsed, ms(100 + 1550));
    let events = out.events();
    assert!(events.iter().any(|e| e.starts_with("event: ping")));
    let last = events.last().unwrap();
    assert!(last.starts_with("event: error\ndata: "), "{last}");
    server.wait_idle().await;
    assert_eq!(server.stats().cancelled, 1);
}
