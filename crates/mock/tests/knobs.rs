//! Every script knob over a real socket with a plain hyper client, on a paused clock.

mod common;

use std::time::Duration;

use common::*;
use http_body_util::BodyExt;
use tailguard_mock::{Latency, MockServer, Outcome, SCRIPT_HEADER, Script};
use tokio::time::Instant;

const MS: fn(u64) -> Duration = Duration::from_millis;

async fn chat(server: &MockServer, headers: &[(&str, &str)]) -> Collected {
    collect(
        &client(),
        post(&server.url(), "/v1/chat/completions", CHAT_STREAM, headers),
    )
    .await
}

fn token_times(c: &Collected) -> Vec<Duration> {
    c.frames
        .iter()
        .filter(|(_, b)| std::str::from_utf8(b).unwrap().contains("\"content\":\""))
        .map(|(t, _)| *t - c.start)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn head_delay_delays_the_head() {
    let server = MockServer::start(Script::new().head_delay(MS(300)).ttft(MS(100)))
        .await
        .unwrap();
    let start = Instant::now();
    let res = send(
        &client(),
        post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
    )
    .await;
    assert_eq!(start.elapsed(), MS(300));
    let c = collect_response(res, start).await;
    assert_eq!(token_times(&c)[0], MS(400));
    let rec = &server.stats().log[0];
    assert_eq!(rec.headers_sent.unwrap() - rec.started, MS(300));
}

#[tokio::test(start_paused = true)]
async fn ttft_gap_and_token_count() {
    let server = MockServer::start(Script::new().ttft(MS(250)).tokens(5).gap(MS(10)))
        .await
        .unwrap();
    let c = chat(&server, &[]).await;
    assert_eq!(
        token_times(&c),
        vec![MS(250), MS(260), MS(270), MS(280), MS(290)]
    );
    assert!(c.text().ends_with("data: [DONE]\n\n"));
    assert_eq!(server.stats().log[0].tokens_sent, 5);
}

#[tokio::test(start_paused = true)]
async fn lognormal_ttft_is_seeded_and_reproducible() {
    let script = Script::new()
        .ttft(Latency::log_normal(MS(100), 0.5))
        .tokens(1)
        .seed(9);
    let mut runs = Vec::new();
    for _ in 0..2 {
        let server = MockServer::start(script.clone()).await.unwrap();
        let mut ttfts = Vec::new();
        for _ in 0..20 {
            ttfts.push(token_times(&chat(&server, &[]).await)[0]);
        }
        runs.push(ttfts);
    }
    assert_eq!(runs[0], runs[1]);
    let distinct: std::collections::BTreeSet<_> = runs[0].iter().collect();
    assert!(distinct.len() > 15, "draws vary: {:?}", runs[0]);
    assert!(runs[0].iter().any(|d| *d < MS(100)) && runs[0].iter().any(|d| *d > MS(100)));
    // Another seed, other draws.
    let server = MockServer::start(script.seed(10)).await.unwrap();
    let other = token_times(&chat(&server, &[]).await)[0];
    assert_ne!(other, runs[0][0]);
}

#[tokio::test(start_paused = true)]
async fn mixture_sends_a_fraction_slow() {
    let server = MockServer::start(
        Script::new()
            .ttft(Latency::mixture(Latency::ms(10), Latency::ms(1000), 0.25))
            .tokens(1),
    )
    .await
    .unwrap();
    let mut slow = 0;
    for _ in 0..80 {
        let t = token_times(&chat(&server, &[]).await)[0];
        assert!(t == MS(10) || t == MS(1000), "{t:?}");
        slow += usize::from(t == MS(1000));
    }
    assert!((8..=32).contains(&slow), "{slow} of 80 slow");
}

#[tokio::test(start_paused = true)]
async fn stall_for_a_time_then_resume() {
    let server = MockServer::start(
        Script::new()
            .tokens(4)
            .gap(MS(10))
            .stall_after(2, Some(MS(700))),
    )
    .await
    .unwrap();
    let c = chat(&server, &[]).await;
    assert_eq!(token_times(&c), vec![MS(0), MS(10), MS(720), MS(730)]);
    assert_eq!(server.stats().completed, 1);
}

#[tokio::test(start_paused = true)]
async fn stall_forever_behind_keepalives() {
    let server = MockServer::start(
        Script::new()
            .ttft(MS(50))
            .stall_after(1, None)
            .keepalive_every(MS(100)),
    )
    .await
    .unwrap();
    let start = Instant::now();
    let res = send(
        &client(),
        post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
    )
    .await;
    let mut body = res.into_body();
    let mut seen = Vec::new();
    // Role chunk, token at 50ms, then keepalives at 100, 200, ... forever.
    while seen.len() < 8 {
        let f = body.frame().await.unwrap().unwrap().into_data().unwrap();
        seen.push((start.elapsed(), String::from_utf8(f.to_vec()).unwrap()));
    }
    assert!(seen[0].1.contains("\"role\""));
    assert_eq!(seen[1].0, MS(50));
    for (i, (t, text)) in seen[2..].iter().enumerate() {
        assert_eq!(text, ": keepalive\n\n");
        assert_eq!(*t, MS(100 * (i as u64 + 1)));
    }
    drop(body);
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!((s.cancelled, s.completed), (1, 0));
    assert_eq!(s.log[0].tokens_sent, 1);
}

#[tokio::test(start_paused = true)]
async fn keepalives_during_ttft_and_anthropic_pings() {
    let server = MockServer::start(
        Script::new()
            .ttft(MS(350))
            .tokens(1)
            .keepalive_every(MS(100)),
    )
    .await
    .unwrap();
    let c = chat(&server, &[]).await;
    let kas: Vec<_> = c
        .frames
        .iter()
        .filter(|(_, b)| b.starts_with(b": keepalive"))
        .map(|(t, _)| *t - c.start)
        .collect();
    assert_eq!(kas, vec![MS(100), MS(200), MS(300)]);
    let a = collect(
        &client(),
        post(
            &server.url(),
            "/v1/messages",
            r#"{"stream":true,"max_tokens":5}"#,
            &[],
        ),
    )
    .await;
    let pings: Vec<_> = a
        .frames
        .iter()
        .filter(|(_, b)| b.starts_with(b"event: ping"))
        .map(|(t, _)| *t - a.start)
        .collect();
    // One ping in the preamble (as Anthropic sends it), then one per period.
    assert_eq!(pings, vec![MS(0), MS(100), MS(200), MS(300)]);
}

#[tokio::test(start_paused = true)]
async fn error_statuses_with_retry_after() {
    for (status, kind) in [
        (429, "rate_limit_exceeded"),
        (500, "server_error"),
        (503, "server_overloaded"),
    ] {
        let server = MockServer::start(
            Script::new()
                .status(http::StatusCode::from_u16(status).unwrap())
                .retry_after(Duration::from_millis(1500))
                .head_delay(MS(20)),
        )
        .await
        .unwrap();
        let c = chat(&server, &[]).await;
        assert_eq!(c.status, status);
        assert_eq!(c.headers["retry-after"], "2");
        assert_eq!(c.headers["content-type"], "application/json");
        let v: serde_json::Value = serde_json::from_str(&c.text()).unwrap();
        assert_eq!(v["error"]["type"], kind);
        assert_eq!(c.frames[0].0 - c.start, MS(20));
        let s = server.stats();
        assert_eq!(s.status_errors, 1);
        assert_eq!(s.log[0].outcome, Outcome::Status(status));
        // Anthropic route: Anthropic error shape.
        let a = collect(&client(), post(&server.url(), "/v1/messages", "{}", &[])).await;
        let v: serde_json::Value = serde_json::from_str(&a.text()).unwrap();
        assert_eq!(v["type"], "error");
        assert!(v["error"]["type"].as_str().unwrap().ends_with("_error"));
    }
}

#[tokio::test(start_paused = true)]
async fn status_fraction_fails_some() {
    let server = MockServer::start(
        Script::new()
            .status(http::StatusCode::SERVICE_UNAVAILABLE)
            .status_fraction(0.3),
    )
    .await
    .unwrap();
    let mut failed = 0;
    for _ in 0..100 {
        failed += usize::from(chat(&server, &[]).await.status == 503);
    }
    assert!((15..=45).contains(&failed), "{failed}");
    assert_eq!(server.stats().status_errors, failed as u64);
}

#[tokio::test(start_paused = true)]
async fn reset_before_headers() {
    let server = MockServer::start(Script::new().reset_before_headers().head_delay(MS(5)))
        .await
        .unwrap();
    let err = client()
        .request(post(
            &server.url(),
            "/v1/chat/completions",
            CHAT_STREAM,
            &[],
        ))
        .await;
    assert!(err.is_err());
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!(s.resets, 1);
    assert_eq!(s.log[0].outcome, Outcome::ResetBeforeHeaders);
    assert_eq!(s.cancelled, 0);
}

#[tokio::test(start_paused = true)]
async fn reset_after_tokens_over_h1_and_h2() {
    for client in [client(), h2_client()] {
        let server = MockServer::start(Script::new().reset_after_tokens(3).gap(MS(1)))
            .await
            .unwrap();
        let c = collect(
            &client,
            post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
        )
        .await;
        assert_eq!(c.status, 200);
        assert!(c.error, "body must fail");
        assert_eq!(token_times(&c).len(), 3);
        assert!(!c.text().contains("[DONE]"));
        server.wait_idle().await;
        let s = server.stats();
        assert_eq!(s.resets, 1);
        assert_eq!(s.log[0].outcome, Outcome::ResetAfterTokens(3));
    }
}

#[tokio::test(start_paused = true)]
async fn in_band_error_event_after_tokens() {
    let server = MockServer::start(Script::new().error_event_after(2))
        .await
        .unwrap();
    let c = chat(&server, &[]).await;
    assert!(!c.error);
    let ev = c.data_events();
    // role, 2 tokens, error, [DONE]
    assert_eq!(ev.len(), 5, "{ev:?}");
    let err: serde_json::Value = serde_json::from_str(&ev[3]).unwrap();
    assert_eq!(err["error"]["type"], "server_error");
    assert_eq!(ev[4], "[DONE]");
    let s = server.stats();
    assert_eq!(s.error_events, 1);
    assert_eq!(s.log[0].outcome, Outcome::ErrorEvent(2));
}

#[tokio::test(start_paused = true)]
async fn single_slot_queues_requests_head_of_line() {
    let server = MockServer::start(
        Script::new()
            .single_slot(true)
            .ttft(MS(100))
            .tokens(3)
            .gap(MS(50)),
    )
    .await
    .unwrap();
    let url = server.url();
    let c = client();
    let start = Instant::now();
    let tasks: Vec<_> = (0..3)
        .map(|_| {
            let c = c.clone();
            let url = url.clone();
            tokio::spawn(async move {
                let res = send(&c, post(&url, "/v1/chat/completions", CHAT_STREAM, &[])).await;
                collect_response(res, start).await
            })
        })
        .collect();
    let mut firsts = Vec::new();
    for t in tasks {
        firsts.push(token_times(&t.await.unwrap())[0]);
    }
    firsts.sort();
    // Each request takes 100 + 2*50 = 200ms of the slot.
    assert_eq!(firsts, vec![MS(100), MS(300), MS(500)]);
    let s = server.stats();
    assert_eq!(s.peak_concurrent, 3);
    assert_eq!(s.completed, 3);
}

#[tokio::test(start_paused = true)]
async fn dropping_a_queued_request_frees_its_place() {
    let server = MockServer::start(Script::new().single_slot(true).ttft(MS(100)).tokens(1))
        .await
        .unwrap();
    let c = client();
    // The first holds the slot; the second queues and gives up; the third follows the first.
    let start = Instant::now();
    let first = send(
        &c,
        post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
    )
    .await;
    let second = send(
        &c,
        post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
    )
    .await;
    drop(second);
    let third = send(
        &c,
        post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
    )
    .await;
    let (a, b) = tokio::join!(
        collect_response(first, start),
        collect_response(third, start)
    );
    assert_eq!(token_times(&a)[0], MS(100));
    assert_eq!(token_times(&b)[0], MS(200));
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!((s.completed, s.cancelled), (2, 1));
}

#[tokio::test(start_paused = true)]
async fn header_overrides_and_attempt_scripts() {
    let server = MockServer::start(Script::new().ttft(MS(10)).tokens(2))
        .await
        .unwrap();
    let c = chat(&server, &[(SCRIPT_HEADER, "ttft=500ms,tokens=20,gap=5ms")]).await;
    let t = token_times(&c);
    assert_eq!((t.len(), t[0], t[19]), (20, MS(500), MS(595)));
    // Attempt 1 stalls, attempt 2 is fast: one request, two behaviours.
    let headers = [
        (SCRIPT_HEADER, "tokens=3"),
        ("x-mock-script-1", "ttft=10s"),
        ("x-mock-script-2", "ttft=20ms"),
    ];
    let mut h1 = headers.to_vec();
    h1.push(("x-tailguard-attempt", "1"));
    let mut h2 = headers.to_vec();
    h2.push(("x-tailguard-attempt", "2"));
    let (a, b) = tokio::join!(chat(&server, &h1), chat(&server, &h2));
    assert_eq!(token_times(&a), vec![MS(10_000); 3]);
    assert_eq!(token_times(&b), vec![MS(20); 3]);
    let s = server.stats();
    assert_eq!(s.by_attempt("2").count(), 1);
    // Both attempts' headers and bodies are in the log.
    for r in &s.log[1..] {
        assert_eq!(r.body.as_ref(), CHAT_STREAM.as_bytes());
        assert_eq!(r.headers["x-mock-script-1"], "ttft=10s");
    }
    let rec = s.by_attempt("1").next().unwrap();
    assert_eq!(rec.first_token.unwrap() - rec.started, MS(10_000));
    // A bad script is a 400, not a panic.
    let bad = chat(&server, &[(SCRIPT_HEADER, "ttft=soon")]).await;
    assert_eq!(bad.status, 400);
    assert!(bad.text().contains("invalid mock script"));
}

#[tokio::test(start_paused = true)]
async fn queued_scripts_then_set_script() {
    let server = MockServer::start(Script::new().tokens(1)).await.unwrap();
    server.push_scripts([
        Script::new().ttft(MS(300)).tokens(1),
        Script::new().status(http::StatusCode::TOO_MANY_REQUESTS),
    ]);
    assert_eq!(token_times(&chat(&server, &[]).await)[0], MS(300));
    assert_eq!(chat(&server, &[]).await.status, 429);
    assert_eq!(token_times(&chat(&server, &[]).await)[0], MS(0));
    server.set_script(Script::new().ttft(MS(7)).tokens(1));
    assert_eq!(token_times(&chat(&server, &[]).await)[0], MS(7));
    assert_eq!(server.script().token_count(), 1);
    server.reset_stats();
    assert_eq!(server.stats().requests, 0);
    chat(&server, &[]).await;
    assert_eq!(server.stats().log.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn client_gone_before_headers_is_cancelled() {
    let server = MockServer::start(Script::new().head_delay(Duration::from_secs(5)))
        .await
        .unwrap();
    let c = client();
    let r = tokio::time::timeout(
        MS(100),
        c.request(post(
            &server.url(),
            "/v1/chat/completions",
            CHAT_STREAM,
            &[],
        )),
    )
    .await;
    assert!(r.is_err());
    drop(c);
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!(s.cancelled, 1);
    let rec = &s.log[0];
    assert!(rec.headers_sent.is_none());
    // Noticed when the connection closed, not at the end of the head delay.
    assert!(rec.ended.unwrap() - rec.started < Duration::from_secs(5));
}

#[tokio::test(start_paused = true)]
async fn h2_stream_reset_is_cancelled_and_connection_survives() {
    let server = MockServer::start(Script::new().stall_after(2, None))
        .await
        .unwrap();
    let c = h2_client();
    let res = send(
        &c,
        post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
    )
    .await;
    assert_eq!(res.version(), http::Version::HTTP_2);
    let mut body = res.into_body();
    for _ in 0..3 {
        body.frame().await.unwrap().unwrap();
    }
    drop(body);
    server.wait_idle().await;
    assert_eq!(server.stats().cancelled, 1);
    // The same connection keeps serving.
    server.set_script(Script::new().tokens(2));
    let c2 = collect(
        &c,
        post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
    )
    .await;
    assert_eq!(token_times(&c2).len(), 2);
    assert_eq!(server.stats().completed, 1);
}

#[tokio::test(start_paused = true)]
async fn shutdown_cancels_streams_in_flight() {
    for c in [client(), h2_client()] {
        let server = MockServer::start(Script::new().stall_after(0, None))
            .await
            .unwrap();
        let res = send(
            &c,
            post(&server.url(), "/v1/chat/completions", CHAT_STREAM, &[]),
        )
        .await;
        let mut body = res.into_body();
        body.frame().await.unwrap().unwrap();
        let addr = server.addr();
        server.shutdown().await;
        // The body ends (connection closed or stream reset), and nothing listens any more.
        assert!(matches!(body.frame().await, Some(Err(_)) | None));
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}

#[tokio::test(start_paused = true)]
async fn hostile_clients_get_errors_not_panics() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let server = MockServer::start(Script::new()).await.unwrap();
    // Garbage instead of HTTP.
    let mut s = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
    s.write_all(b"\x00\x01garbage\r\n\r\n").await.unwrap();
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf).await;
    // Odd attempt values and a body over the cap.
    let c = chat(&server, &[("x-tailguard-attempt", "a b/ü?")]).await;
    assert_eq!(c.status, 200);
    let big = "x".repeat(tailguard_mock::MAX_REQUEST_BODY + 1);
    let c = collect(
        &client(),
        post(&server.url(), "/v1/chat/completions", &big, &[]),
    )
    .await;
    assert_eq!(c.status, 413);
    // Scripts with absurd durations are clamped or rejected, never a panic.
    let c = chat(
        &server,
        &[(
            SCRIPT_HEADER,
            "keepalive=18446744073709551615s,stall_for=18446744073709551615s,tokens=1",
        )],
    )
    .await;
    assert!(c.status == 400 || c.status == 200);
    let res = send(
        &client(),
        post(
            &server.url(),
            "/v1/chat/completions",
            CHAT_STREAM,
            &[(
                SCRIPT_HEADER,
                "keepalive=1000000000000s,head_delay=1ms,ttft=1h,tokens=1",
            )],
        ),
    )
    .await;
    assert_eq!(res.status(), 200);
    drop(res);
    server.wait_idle().await;
    let st = server.stats();
    assert_eq!(st.in_flight, 0);
    assert_eq!(st.by_attempt("a b/ü?").count(), 1);
    assert!(
        st.log
            .iter()
            .all(|r| r.outcome != tailguard_mock::Outcome::InFlight)
    );
}

#[tokio::test(start_paused = true)]
async fn wait_requests_and_record_helpers() {
    let servers = MockServer::start_replicas(2, Script::new().head_delay(MS(30)).ttft(MS(70)))
        .await
        .unwrap();
    assert_ne!(servers[0].addr(), servers[1].addr());
    let url = servers[1].url();
    let task = tokio::spawn(async move {
        tokio::time::sleep(MS(500)).await;
        collect(
            &client(),
            post(&url, "/v1/chat/completions", CHAT_STREAM, &[]),
        )
        .await
    });
    let start = Instant::now();
    servers[1].wait_requests(1).await;
    assert_eq!(start.elapsed(), MS(500));
    task.await.unwrap();
    let s = servers[1].stats();
    let r = &s.log[0];
    assert_eq!(r.time_to_headers(), Some(MS(30)));
    assert_eq!(r.ttft(), Some(MS(100)));
    assert_eq!(r.total(), Some(MS(100)));
    assert_eq!(servers[0].stats().requests, 0);
}
