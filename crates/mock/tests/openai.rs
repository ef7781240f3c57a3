//! OpenAI routes over a real socket.

mod common;

use std::time::Duration;

use common::*;
use tailguard_mock::{MockServer, Outcome, Script};

#[tokio::test(start_paused = true)]
async fn chat_stream_framing_and_timing() {
    let server = MockServer::start(
        Script::new()
            .ttft(Duration::from_millis(500))
            .tokens(4)
            .gap(Duration::from_millis(20)),
    )
    .await
    .unwrap();
    let c = collect(
        &client(),
        post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
    )
    .await;
    assert_eq!(c.status, 200);
    assert!(
        c.headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let events = c.data_events();
    assert_eq!(events.len(), 1 + 4 + 1 + 1, "{events:?}");
    assert!(events[0].contains(r#""delta":{"role":"assistant"}"#));
    assert!(events[1].contains(r#""content":"Hello""#));
    assert!(events[5].contains(r#""delta":{}"#) && events[5].contains(r#""finish_reason":"stop""#));
    assert_eq!(events[6], "[DONE]");
    // One event per frame.
    assert_eq!(c.frames.len(), 7);
    // Role chunk right away, first token at TTFT, then a gap per token.
    assert_eq!(c.frames[0].0 - c.start, Duration::ZERO);
    assert_eq!(c.frames[1].0 - c.start, Duration::from_millis(500));
    assert_eq!(c.frames[4].0 - c.start, Duration::from_millis(560));
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!((s.requests, s.completed, s.cancelled), (1, 1, 0));
    assert_eq!(s.log[0].outcome, Outcome::Completed);
    assert_eq!(
        s.log[0].first_token.unwrap() - s.log[0].started,
        Duration::from_millis(500)
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_the_body_is_counted_as_cancelled() {
    let server = MockServer::start(Script::new().stall_after(1, None))
        .await
        .unwrap();
    let client = client();
    let res = send(
        &client,
        post(
            &server.url(),
            "/v1/chat/completions",
            CHAT_STREAM,
            &[("x-tailguard-attempt", "1")],
        ),
    )
    .await;
    let mut body = res.into_body();
    use http_body_util::BodyExt;
    // role chunk and one token, then the stall.
    body.frame().await.unwrap().unwrap();
    body.frame().await.unwrap().unwrap();
    assert_eq!(server.stats().in_flight, 1);
    drop(body);
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!((s.requests, s.completed, s.cancelled), (1, 0, 1));
    assert_eq!(s.log[0].outcome, Outcome::Cancelled);
    assert_eq!(s.log[0].attempt.as_deref(), Some("1"));
    assert_eq!(s.log[0].tokens_sent, 1);
}
