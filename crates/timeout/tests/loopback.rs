//! End to end over real loopback HTTP against `tailguard-mock`, on a paused clock.
//!
//! The layer wraps a hyper client (the way a gateway calls its upstream) and the mock serves
//! scripted streams. Limits are chosen so that no timer expires at the very instant the mock
//! sends a frame: with two tasks (client and mock) a tie would be decided by the scheduler.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use tailguard_core::{BoxError, EndReason, EndReport};
use tailguard_mock::{MockServer, Script};
use tailguard_test_support::{MESSAGES, client, collect, error_json, ms, post};
use tailguard_timeout::SseIdleTimeoutLayer;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

fn chat(server: &MockServer, report: &EndReport) -> Request<Full<Bytes>> {
    let mut req = tailguard_test_support::chat(&server.url(), &[]);
    req.extensions_mut().insert(report.clone());
    req
}

struct Outcome {
    status: StatusCode,
    text: String,
    elapsed: Duration,
    error: Option<BoxError>,
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
    B::Error: Into<BoxError>,
{
    let start = Instant::now();
    let res = svc.oneshot(req).await.expect("response");
    let status = res.status();
    let seen = collect(res.into_body(), start).await;
    Outcome {
        status,
        text: seen.text(),
        elapsed: seen.ended_at,
        error: seen.error.map(|(_, e)| e),
    }
}

fn error_code(event: &str) -> String {
    error_json(event)["error"]["code"]
        .as_str()
        .expect("error event")
        .to_owned()
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

/// A stream of `path` that stalls after two tokens behind keepalives every 700 ms, through an
/// idle timeout of 1.55 s: it ends 1.55 s after the first token.
async fn stalled_behind_keepalives(path: &str, body: &str) -> (MockServer, Outcome) {
    let script = Script::new()
        .ttft(ms(100))
        .tokens(10)
        .stall_after(2, None)
        .keepalive_every(ms(700));
    let server = MockServer::start(script).await.unwrap();
    let svc = SseIdleTimeoutLayer::new()
        .with_idle_timeout(ms(1550))
        .layer(client());
    let req = post(&format!("{}{path}", server.url()), body, &[]);
    let out = call(svc, req).await;
    assert_eq!(out.elapsed, ms(100 + 1550));
    (server, out)
}

#[tokio::test(start_paused = true)]
async fn anthropic_stream_behind_pings_ends_with_an_error_event() {
    let (server, out) = stalled_behind_keepalives("/v1/messages", MESSAGES).await;
    let events = out.events();
    assert!(events.iter().any(|e| e.starts_with("event: ping")));
    let last = events.last().unwrap();
    assert!(last.starts_with("event: error\ndata: "), "{last}");
    server.wait_idle().await;
    assert_eq!(server.stats().cancelled, 1);
}

#[tokio::test(start_paused = true)]
async fn responses_stream_behind_keepalives_ends_with_a_responses_error_event() {
    let body = r#"{"model":"gpt-4o-mini","stream":true,"input":"hi"}"#;
    let (server, out) = stalled_behind_keepalives("/v1/responses", body).await;
    let events = out.events();
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("event: response.output_text.delta"))
    );
    // The Responses API's own `error` event, and no chat-style `[DONE]` after it.
    let last = events.last().unwrap();
    let data = last
        .strip_prefix("event: error\ndata: ")
        .unwrap_or_else(|| panic!("not a Responses error event: {last}"));
    let v: serde_json::Value = serde_json::from_str(data.trim_end()).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["code"], "idle_timeout");
    assert!(v.get("error").is_none(), "chat's shape: {v}");
    assert!(!out.text.contains("[DONE]"), "{}", out.text);
    server.wait_idle().await;
    assert_eq!(server.stats().cancelled, 1);
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_ends_a_running_stream_in_band_after_its_last_whole_event() {
    let script = Script::new().ttft(ms(100)).gap(ms(100)).tokens(20);
    let server = MockServer::start(script).await.unwrap();
    let report = EndReport::new();
    let (stop, signal) = tokio::sync::watch::channel(false);
    let svc = SseIdleTimeoutLayer::new()
        .with_shutdown(signal)
        .layer(client());
    tokio::spawn(async move {
        tokio::time::sleep(ms(350)).await;
        stop.send(true).unwrap();
    });
    let out = call(svc, chat(&server, &report)).await;
    // Tokens at 0.1, 0.2 and 0.3 s; the signal at 0.35 s ends the stream while it waits.
    assert_eq!(out.elapsed, ms(350));
    let events = out.events();
    let n = events.len();
    assert_eq!(error_code(events[n - 2]), "shutdown");
    assert_eq!(
        error_json(events[n - 2])["error"]["type"],
        "server_shutdown"
    );
    assert_eq!(events[n - 1], "data: [DONE]");
    assert_eq!(
        events.iter().filter(|e| e.contains("\"content\"")).count(),
        3
    );
    assert_eq!(report.get(), Some(EndReason::Deadline));
    server.wait_idle().await;
    assert_eq!(server.stats().cancelled, 1, "upstream cancelled");
}
