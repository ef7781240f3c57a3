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

#[tokio::test(start_paused = true)]
async fn reading_to_done_then_dropping_is_completed() {
    let server = MockServer::start(Script::new().tokens(3)).await.unwrap();
    let res = send(
        &client(),
        post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
    )
    .await;
    let mut body = res.into_body();
    use http_body_util::BodyExt;
    loop {
        let f = body.frame().await.unwrap().unwrap().into_data().unwrap();
        if f.as_ref() == b"data: [DONE]\n\n" {
            break;
        }
    }
    // Stop reading right at [DONE], as many clients do.
    drop(body);
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!((s.completed, s.cancelled), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn same_scenario_same_timeline() {
    async fn timeline() -> Vec<(u64, Duration, Duration)> {
        let server = MockServer::start(
            Script::new()
                .ttft(tailguard_mock::Latency::log_normal(
                    Duration::from_millis(80),
                    0.7,
                ))
                .gap(tailguard_mock::Latency::log_normal(
                    Duration::from_millis(5),
                    0.3,
                ))
                .tokens(6),
        )
        .await
        .unwrap();
        let c = client();
        let reqs = (0..5).map(|i| {
            let c = c.clone();
            let url = server.url();
            async move {
                tokio::time::sleep(Duration::from_millis(i * 3)).await;
                collect(&c, post(&url, "/v1/chat/completions", CHAT_STREAM, &[])).await
            }
        });
        let _ = futures_join_all(reqs).await;
        let s = server.stats();
        s.log
            .iter()
            .map(|r| {
                (
                    r.index,
                    r.first_token.unwrap() - r.started,
                    r.ended.unwrap() - r.started,
                )
            })
            .collect()
    }
    let a = timeline().await;
    let b = timeline().await;
    assert_eq!(a, b);
    assert_eq!(a.len(), 5);
}

/// Joins futures without pulling in futures-util.
async fn futures_join_all<F: std::future::Future + Send + 'static>(
    fs: impl IntoIterator<Item = F>,
) -> Vec<F::Output>
where
    F::Output: Send,
{
    let handles: Vec<_> = fs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(start_paused = true)]
async fn model_names_are_escaped_and_completions_non_streamed() {
    let server = MockServer::start(Script::new().tokens(2)).await.unwrap();
    let body = r#"{"model":"we\"ird\\ mödel","stream":true,"messages":[]}"#;
    let c = collect(
        &client(),
        post(&server.url(), "/v1/chat/completions", body, &[]),
    )
    .await;
    for ev in c.data_events().iter().filter(|e| *e != "[DONE]") {
        let v: serde_json::Value = serde_json::from_str(ev).unwrap();
        assert_eq!(v["model"], "we\"ird\\ mödel");
    }
    let c = collect(
        &client(),
        post(&server.url(), "/v1/completions", r#"{"prompt":"a b"}"#, &[]),
    )
    .await;
    let v: serde_json::Value = serde_json::from_str(&c.text()).unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["choices"][0]["text"], "Hello there");
    assert_eq!(v["usage"]["prompt_tokens"], 2);
}

#[tokio::test(start_paused = true)]
async fn non_streamed_knobs() {
    let server = MockServer::start(
        Script::new()
            .ttft(Duration::from_millis(100))
            .tokens(3)
            .gap(Duration::from_millis(10)),
    )
    .await
    .unwrap();
    let body = r#"{"messages":[]}"#;
    let c = collect(
        &client(),
        post(&server.url(), "/v1/chat/completions", body, &[]),
    )
    .await;
    // The whole body arrives after TTFT and the gaps.
    assert_eq!(c.frames[0].0 - c.start, Duration::from_millis(120));
    let c = collect(
        &client(),
        post(
            &server.url(),
            "/v1/chat/completions",
            body,
            &[(tailguard_mock::SCRIPT_HEADER, "error_after=1")],
        ),
    )
    .await;
    assert_eq!(c.status, 500);
    let r = client()
        .request(post(
            &server.url(),
            "/v1/chat/completions",
            body,
            &[(tailguard_mock::SCRIPT_HEADER, "reset_after=1")],
        ))
        .await;
    assert!(r.is_err());
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!((s.completed, s.error_events, s.resets), (1, 1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn works_on_a_real_clock_and_many_connections() {
    let server = MockServer::start(Script::new().tokens(5)).await.unwrap();
    let c = client();
    let handles: Vec<_> = (0..32)
        .map(|_| {
            let c = c.clone();
            let url = server.url();
            tokio::spawn(async move {
                collect(&c, post(&url, "/v1/chat/completions", CHAT_STREAM, &[])).await
            })
        })
        .collect();
    for h in handles {
        let c = h.await.unwrap();
        assert_eq!(c.data_events().len(), 8);
    }
    server.wait_idle().await;
    assert_eq!(server.stats().completed, 32);
}
