//! End to end over real loopback sockets: a hyper client (and a tonic `Channel`) behind
//! `FirstTokenHedge`, in front of `tailguard-mock` replicas, on a paused clock; where the
//! client's view matters, the hedge itself served by hyper as a gateway serves it.

use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tailguard_core::{
    BoxError, Deadlines, EndReason, EndReport, HedgeOutcome, ReplayBody, UpstreamFailure,
};
use tailguard_hedge::{AdaptiveDelay, FirstTokenHedgeLayer, HedgeBudget};
use tailguard_mock::{MockServer, Outcome, Script};
use tailguard_test_support::{CHAT, client as plain_client, ms, post, read_all};
use tokio::time::Instant;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};

mod common;

use common::layer;
use common::loopback::{client, replica};

/// Serves `svc` on a loopback port as a gateway does (the request body collected, then sent
/// through the stack; an error closes the connection); returns its base URL.
async fn serve<S, B>(svc: S) -> String
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let svc = svc.clone();
            let handler = hyper::service::service_fn(move |req: Request<Incoming>| {
                let svc = svc.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let body = body.collect().await?.to_bytes();
                    svc.oneshot(Request::from_parts(parts, Full::new(body)))
                        .await
                        .map_err(Into::<BoxError>::into)
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), handler),
            );
        }
    });
    format!("http://{addr}")
}

/// A request with deadlines as `SseIdleTimeout` sets them: `first_token` left from now.
fn within(mut req: Request<Full<Bytes>>, first_token: Duration) -> Request<Full<Bytes>> {
    req.extensions_mut().insert(Deadlines {
        first_token: Some(Instant::now() + first_token),
        total: None,
    });
    req
}

/// The bytes a direct call (no hedge) to `server` returns.
async fn direct(server: &MockServer, path: &str, body: &str, headers: &[(&str, &str)]) -> Vec<u8> {
    let res = plain_client()
        .request(post(&format!("{}{path}", server.url()), body, headers))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(!err);
    bytes
}

/// The outcome without its cost fields (tests/race.rs checks those).
fn outcome<B>(res: &Response<B>) -> HedgeOutcome {
    let mut o = res.extensions().get::<HedgeOutcome>().cloned().unwrap();
    o.losers.clear();
    o.wasted_prompt_bytes = 0;
    o.wasted_prompt_tokens = None;
    o
}

fn script() -> Script {
    Script::new().ttft(ms(80)).tokens(5).gap(ms(10))
}

#[tokio::test(start_paused = true)]
async fn fast_primary_sends_no_backup_and_bytes_equal_a_direct_call() {
    let server = MockServer::start(script()).await.unwrap();
    let reference = MockServer::start(script()).await.unwrap();
    let expected = direct(&reference, "/v1/chat/completions", CHAT, &[]).await;

    let svc = layer().layer(client());
    let start = Instant::now();
    let res = svc
        .oneshot(post(
            &format!("{}/v1/chat/completions", server.url()),
            CHAT,
            &[],
        ))
        .await
        .unwrap();
    let ttft = start.elapsed();
    assert!(ttft >= ms(80) && ttft < ms(100), "{ttft:?}");
    assert_eq!(outcome(&res), HedgeOutcome::new(1, 0, Some(ms(500))));
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(!err);
    assert_eq!(bytes, expected);
    tokio::time::sleep(ms(1000)).await;
    let s = server.stats();
    assert_eq!((s.requests, s.completed, s.cancelled), (1, 1, 0));
    assert_eq!(s.log[0].attempt.as_deref(), Some("0"));
}

#[tokio::test(start_paused = true)]
async fn one_balanced_service_with_per_attempt_behaviour() {
    // Mode (a): one inner service; the mock acts per attempt header.
    let server = MockServer::start(script()).await.unwrap();
    let headers = [
        ("x-mock-script-0", "ttft=10s"),
        ("x-mock-script-1", "ttft=40ms"),
    ];
    let reference = MockServer::start(script()).await.unwrap();
    let _ = direct(&reference, "/v1/chat/completions", CHAT, &[]).await;
    let mut h = headers.to_vec();
    h.push(("x-tailguard-attempt", "1"));
    let expected = direct(&reference, "/v1/chat/completions", CHAT, &h).await;

    let svc = layer().layer(client());
    let res = svc
        .oneshot(post(
            &format!("{}/v1/chat/completions", server.url()),
            CHAT,
            &headers,
        ))
        .await
        .unwrap();
    assert_eq!(outcome(&res), HedgeOutcome::new(2, 1, Some(ms(500))));
    let (bytes, _) = read_all(res.into_body()).await;
    assert_eq!(bytes, expected);
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!(s.requests, 2);
    assert_eq!(
        s.by_attempt("0").next().unwrap().outcome,
        Outcome::Cancelled
    );
    assert_eq!(
        s.by_attempt("1").next().unwrap().outcome,
        Outcome::Completed
    );
}

#[tokio::test(start_paused = true)]
async fn tower_hedge_does_not_hedge_a_slow_first_token() {
    // The same scenario through tower::hedge: it measures latency to headers, which the mock
    // sends at once, so it never sends a backup and the client waits for the slow token.
    #[derive(Clone)]
    struct ClonePolicy;
    impl tower::hedge::Policy<Request<Full<Bytes>>> for ClonePolicy {
        fn clone_request(&self, req: &Request<Full<Bytes>>) -> Option<Request<Full<Bytes>>> {
            let mut r = Request::new(req.body().clone());
            *r.method_mut() = req.method().clone();
            *r.uri_mut() = req.uri().clone();
            *r.headers_mut() = req.headers().clone();
            Some(r)
        }
        fn can_retry(&self, _: &Request<Full<Bytes>>) -> bool {
            true
        }
    }
    let server = MockServer::start(script()).await.unwrap();
    let url = format!("{}/v1/chat/completions", server.url());
    let mut hedge = tower::hedge::Hedge::new(
        plain_client(),
        ClonePolicy,
        10,
        0.9,
        Duration::from_secs(60),
    );
    // Warm tower's histogram up with ordinary requests.
    for _ in 0..20 {
        let res = hedge
            .ready()
            .await
            .unwrap()
            .call(post(&url, CHAT, &[]))
            .await
            .unwrap();
        let _ = read_all(res.into_body()).await;
    }
    server.reset_stats();
    let headers = [("x-mock-script-0", "ttft=5s"), ("x-mock-script", "ttft=5s")];
    let start = Instant::now();
    let res = hedge
        .ready()
        .await
        .unwrap()
        .call(post(&url, CHAT, &headers))
        .await
        .unwrap();
    let head = start.elapsed();
    let (bytes, _) = read_all(res.into_body()).await;
    let total = start.elapsed();
    assert!(head < ms(50), "headers came at once: {head:?}");
    assert!(
        total >= ms(5000),
        "the slow token was waited out: {total:?}"
    );
    assert!(String::from_utf8_lossy(&bytes).contains("[DONE]"));
    assert_eq!(server.stats().requests, 1, "tower::hedge sent no backup");

    // FirstTokenHedge on the same upstream: the backup (attempt 1, normal script) wins.
    server.reset_stats();
    let headers = [("x-mock-script-0", "ttft=5s")];
    let start = Instant::now();
    let res = layer()
        .layer(client())
        .oneshot(post(&url, CHAT, &headers))
        .await
        .unwrap();
    assert!(start.elapsed() < ms(700));
    assert_eq!(outcome(&res).winner, Some(1));
    let _ = read_all(res.into_body()).await;
    assert_eq!(server.stats().requests, 2);
}

/// Attempt 0 follows `primary` (script syntax); attempt 1 is well behaved. Returns when the
/// backup arrived relative to the primary, and the response bytes.
async fn failover(primary: &str) -> (Duration, Vec<u8>, HedgeOutcome) {
    let server = MockServer::start(script()).await.unwrap();
    let svc = layer().layer(client());
    let res = svc
        .oneshot(post(
            &format!("{}/v1/chat/completions", server.url()),
            CHAT,
            &[("x-mock-script-0", primary)],
        ))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let o = outcome(&res);
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(!err);
    let s = server.stats();
    assert_eq!(s.requests, 2, "{primary}");
    let gap = s.by_attempt("1").next().unwrap().started - s.by_attempt("0").next().unwrap().started;
    (gap, bytes, o)
}

#[tokio::test(start_paused = true)]
async fn primary_503_sends_the_backup_at_once() {
    let (gap, bytes, o) = failover("status=503, head_delay=30ms").await;
    assert!(gap >= ms(30) && gap < ms(40), "{gap:?}");
    assert_eq!(o, HedgeOutcome::new(2, 1, Some(ms(500))));
    assert!(String::from_utf8_lossy(&bytes).contains("[DONE]"));
}

#[tokio::test(start_paused = true)]
async fn primary_reset_sends_the_backup_at_once() {
    let (gap, _, o) = failover("reset=before_headers, head_delay=20ms").await;
    assert!(gap >= ms(20) && gap < ms(30), "{gap:?}");
    assert_eq!(o.winner, Some(1));
    // A reset after the head, before any token.
    let (gap, _, o) = failover("reset=0, ttft=60ms").await;
    assert!(gap >= ms(60) && gap < ms(70), "{gap:?}");
    assert_eq!(o.winner, Some(1));
}

#[tokio::test(start_paused = true)]
async fn primary_in_band_error_sends_the_backup_at_once() {
    let (gap, bytes, o) = failover("error_after=0, ttft=70ms").await;
    assert!(gap >= ms(70) && gap < ms(80), "{gap:?}");
    assert_eq!(o.winner, Some(1));
    assert!(!String::from_utf8_lossy(&bytes).contains("error"));
}

#[tokio::test(start_paused = true)]
async fn every_attempt_failing_returns_the_documented_failure() {
    // Both 503: the later one, with its Retry-After and its JSON error body.
    let server = MockServer::start(
        script()
            .status(StatusCode::SERVICE_UNAVAILABLE)
            .retry_after(Duration::from_secs(3)),
    )
    .await
    .unwrap();
    let res = layer()
        .layer(client())
        .oneshot(post(
            &format!("{}/v1/chat/completions", server.url()),
            CHAT,
            &[],
        ))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(res.headers()["retry-after"], "3");
    assert_eq!(
        outcome(&res),
        HedgeOutcome::all_failed(2, Some(ms(500))),
        "every attempt failed: no winner"
    );
    let (bytes, _) = read_all(res.into_body()).await;
    assert!(String::from_utf8_lossy(&bytes).contains("\"error\""));
    assert_eq!(server.stats().requests, 2);

    // An in-band error beats a 503: the client gets the upstream's error event.
    let server = MockServer::start(script()).await.unwrap();
    let res = layer()
        .layer(client())
        .oneshot(post(
            &format!("{}/v1/chat/completions", server.url()),
            CHAT,
            &[
                ("x-mock-script-0", "error_after=0"),
                ("x-mock-script-1", "status=503"),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(outcome(&res).winner, None, "a replayed failure is no win");
    let (bytes, _) = read_all(res.into_body()).await;
    let text = String::from_utf8_lossy(&bytes);
    assert!(text.contains("data: {\"error\""), "{text}");

    // Nothing listening: the transport error of the last attempt.
    let dead = {
        let s = MockServer::start(script()).await.unwrap();
        let url = s.url();
        s.shutdown().await;
        url
    };
    // Response mode keeps the inner service's error type: the client's own error.
    let err: hyper_util::client::legacy::Error = layer()
        .layer(client())
        .oneshot(post(&format!("{dead}/v1/chat/completions"), CHAT, &[]))
        .await
        .unwrap_err();
    assert!(err.is_connect(), "{err}");
}

#[tokio::test(start_paused = true)]
async fn budget_holds_under_a_half_slow_upstream() {
    // Half the requests (drawn by the mock's seeded RNG) have a 2 s first token on every
    // attempt; with a 200 ms delay each of them wants a hedge.
    let server = MockServer::start(script().ttft(tailguard_mock::Latency::mixture(
        tailguard_mock::Latency::Fixed(ms(20)),
        tailguard_mock::Latency::Fixed(ms(2000)),
        0.5,
    )))
    .await
    .unwrap();
    let svc = FirstTokenHedgeLayer::new()
        .with_delay(ms(200))
        .with_budget(HedgeBudget::new().with_floor(0.0))
        .layer(client());
    let url = format!("{}/v1/chat/completions", server.url());
    let n = 200u32;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..n {
        let svc = svc.clone();
        let req = post(&url, CHAT, &[]);
        tasks.spawn(async move {
            let res = svc.oneshot(req).await.unwrap();
            let o = outcome(&res);
            let _ = read_all(res.into_body()).await;
            o
        });
        tokio::time::sleep(ms(20)).await;
    }
    let (mut hedged, mut refused) = (0u32, 0u32);
    while let Some(o) = tasks.join_next().await {
        let o = o.unwrap();
        hedged += u32::from(o.attempts - 1);
        refused += u32::from(o.budget_exhausted);
    }
    // 10% of 200 requests plus the initial token, plus at most one max balance (10 tokens)
    // of debt: backups asked for again after a refusal borrow from future deposits.
    assert!(hedged <= 31, "{hedged}");
    assert!(hedged >= 20, "{hedged}");
    assert!(refused > 40, "{refused}");
    assert_eq!(server.stats().requests, u64::from(n + hedged));
}

#[tokio::test(start_paused = true)]
async fn body_over_the_replay_cap_passes_unhedged_and_intact() {
    let server = MockServer::start(script()).await.unwrap();
    let big = format!(
        r#"{{"model":"gpt-4o","stream":true,"messages":[{{"role":"user","content":"{}"}}]}}"#,
        "x".repeat(4000)
    );
    let res = layer()
        .with_replay_cap(1024)
        .layer(client())
        .oneshot(post(
            &format!("{}/v1/chat/completions", server.url()),
            &big,
            &[("x-mock-script", "ttft=2s")],
        ))
        .await
        .unwrap();
    assert_eq!(
        res.status(),
        StatusCode::OK,
        "the mock parsed the whole body"
    );
    assert!(res.extensions().get::<HedgeOutcome>().is_none());
    let (bytes, _) = read_all(res.into_body()).await;
    assert!(String::from_utf8_lossy(&bytes).contains("[DONE]"));
    let s = server.stats();
    assert_eq!(
        (s.requests, s.completed),
        (1, 1),
        "no backup despite the slow token"
    );
}

#[tokio::test(start_paused = true)]
async fn client_dropping_the_response_during_the_race_cancels_both_upstream() {
    let server = MockServer::start(script().ttft(ms(10_000))).await.unwrap();
    let svc = layer().layer(client());
    let url = format!("{}/v1/chat/completions", server.url());
    let task = tokio::spawn(svc.oneshot(post(&url, CHAT, &[])));
    tokio::time::sleep(ms(700)).await;
    assert_eq!(server.stats().requests, 2, "both attempts racing");
    task.abort();
    let _ = task.await;
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!((s.requests, s.cancelled, s.completed), (2, 2, 0));
}

#[tokio::test(start_paused = true)]
async fn tonic_streaming_call_is_hedged_through_a_channel() {
    use tailguard_mock::grpc::{GenerateClient, GenerateRequest};

    let server = MockServer::start(script()).await.unwrap();
    let channel = tonic::transport::Channel::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let stack = ServiceBuilder::new()
        .layer(layer())
        // A `Channel` takes tonic's own body type; the replayed body keeps its `Bytes` data.
        .map_request(|r: Request<ReplayBody<tonic::body::Body>>| r.map(tonic::body::Body::new))
        .service(channel);
    let mut client = GenerateClient::new(stack);

    let mut req = tonic::Request::new(GenerateRequest {
        prompt: "hi".into(),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("x-mock-script-0", "ttft=10s".parse().unwrap());
    let start = Instant::now();
    let res = client.generate(req).await.unwrap();
    assert!(start.elapsed() >= ms(580) && start.elapsed() < ms(600));
    let outcome = res.extensions().get::<HedgeOutcome>().cloned().unwrap();
    assert_eq!(
        (outcome.attempts, outcome.winner, outcome.delay),
        (2, Some(1), Some(ms(500)))
    );
    // The primary lost; the 9-byte gRPC message it was sent is what the hedge paid.
    assert_eq!(outcome.losers.len(), 1);
    assert_eq!(outcome.wasted_prompt_bytes, 9);
    let mut stream = res.into_inner();
    let mut texts = Vec::new();
    while let Some(msg) = stream.message().await.unwrap() {
        texts.push(msg.text);
    }
    assert_eq!(texts.len(), 6, "5 tokens and the final message: {texts:?}");
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!(s.requests, 2);
    assert_eq!(
        s.by_attempt("0").next().unwrap().outcome,
        Outcome::Cancelled
    );
    assert_eq!(
        s.by_attempt("1").next().unwrap().outcome,
        Outcome::Completed
    );
}

#[tokio::test(start_paused = true)]
async fn adaptive_delay_converges_to_the_p90_of_a_scripted_ttft_distribution() {
    // Log-normal TTFT, median 200 ms, sigma 0.5: p90 = 200 ms * e^(0.5 * 1.2816) = 379.6 ms.
    let server =
        MockServer::start(script().ttft(tailguard_mock::Latency::log_normal(ms(200), 0.5)))
            .await
            .unwrap();
    let svc = FirstTokenHedgeLayer::new()
        .with_delay(
            tailguard_hedge::AdaptiveDelay::new()
                .with_percentile(0.9)
                .with_window(Duration::from_secs(3600))
                .with_bounds(ms(1), ms(60_000)),
        )
        .with_budget(HedgeBudget::unlimited())
        .layer(client());
    let url = format!("{}/v1/chat/completions", server.url());
    let mut delays = Vec::new();
    for _ in 0..800 {
        let res = svc.clone().oneshot(post(&url, CHAT, &[])).await.unwrap();
        delays.push(outcome(&res).delay);
        let _ = read_all(res.into_body()).await;
    }
    // Before 20 samples (a request gives at most two: its winner's and a censored loser's, so
    // the first ten requests): the initial delay, or four times the slowest seen when sooner.
    assert_eq!(delays[0], Some(ms(500)));
    assert!(
        delays[..10].iter().all(|d| d.is_some_and(|d| d <= ms(500))),
        "at most the initial delay before 20 samples: {:?}",
        &delays[..10]
    );
    let d = delays.last().unwrap().unwrap().as_secs_f64() * 1000.0;
    assert!((d - 379.6).abs() < 379.6 * 0.07, "delay {d} ms");
    let s = server.stats();
    let hedges = s.requests - 800;
    assert!(
        hedges > 40,
        "once warm, the slowest first tokens were hedged: {hedges}"
    );
}

#[tokio::test(start_paused = true)]
async fn every_attempt_reset_before_its_first_token_gets_a_502_not_an_empty_reply() {
    // Issue 15: two replicas each send a role-only chunk, then reset the connection. The
    // client got no status line and no bytes, and the recorder logged a 200.
    let server = MockServer::start(script()).await.unwrap();
    let reset = [("x-mock-script", "reset=0")];
    let base = serve(layer().layer(replica(client(), server.url()))).await;
    let res = plain_client()
        .request(post(&format!("{base}/v1/chat/completions"), CHAT, &reset))
        .await
        .expect("a status line, not an empty reply");
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(res.headers()["content-type"], "application/json");
    let (bytes, err) = read_all(res.into_body()).await;
    assert!(!err);
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(v["error"]["type"], "upstream_error");
    assert_eq!(v["error"]["code"], "upstream_stream_broken");
    assert!(v["error"]["message"].is_string() && v["error"]["param"].is_null());
    assert_eq!(server.stats().requests, 2);

    // What a recorder outside the hedge sees: the status the client got, the true failure.
    let report = EndReport::new();
    let mut req = post(
        &format!("{}/v1/chat/completions", server.url()),
        CHAT,
        &reset,
    );
    req.extensions_mut().insert(report.clone());
    let res = layer().layer(client()).oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(outcome(&res), HedgeOutcome::all_failed(2, Some(ms(500))));
    assert_eq!(
        report.get(),
        Some(EndReason::UpstreamError(UpstreamFailure::Transport))
    );
}

#[tokio::test(start_paused = true)]
async fn a_grpc_call_reset_before_its_first_message_on_every_attempt_is_unavailable() {
    use tailguard_mock::grpc::{GenerateClient, GenerateRequest};

    let server = MockServer::start(script()).await.unwrap();
    let channel = tonic::transport::Channel::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let stack = ServiceBuilder::new()
        .layer(layer())
        .map_request(|r: Request<ReplayBody<tonic::body::Body>>| {
            r.map(|b| {
                tonic::body::Body::new(
                    b.map_frame(|f| f.map_data(|mut c| c.copy_to_bytes(c.remaining()))),
                )
            })
        })
        .service(channel);
    let mut client = GenerateClient::new(stack);
    let mut req = tonic::Request::new(GenerateRequest {
        prompt: "hi".into(),
        ..Default::default()
    });
    req.metadata_mut()
        .insert("x-mock-script", "reset=0".parse().unwrap());
    let status = client.generate(req).await.expect_err("no stream");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("before a first token"),
        "{status:?}"
    );
    assert_eq!(server.stats().requests, 2);
}

#[tokio::test(start_paused = true)]
async fn an_outage_leaves_the_adaptive_delay_alone_and_the_next_hedge_is_in_time() {
    // Issue 15: attempts cut off by the 3 s first-token timeout were recorded as censored
    // samples; after 4 requests with both replicas stuck the p90 was above 3 s, and a single
    // stuck replica then meant a 504 for the rest of the window.
    let server = MockServer::start(script()).await.unwrap();
    let svc = FirstTokenHedgeLayer::new()
        .with_delay(AdaptiveDelay::new())
        .with_budget(HedgeBudget::unlimited())
        .layer(client());
    let url = format!("{}/v1/chat/completions", server.url());
    let budget = Duration::from_secs(3);
    // The outer first-token timeout: SseIdleTimeout drops the race when the budget is gone.
    let ask = |headers: &[(&str, &str)]| {
        let req = within(post(&url, CHAT, headers), budget);
        tokio::time::timeout(budget, svc.clone().oneshot(req))
    };
    // Warm: 20 first tokens at 80 ms, the minimum sample count.
    for _ in 0..20 {
        let res = ask(&[]).await.unwrap().unwrap();
        let _ = read_all(res.into_body()).await;
    }
    // The outage: every attempt stuck until the timeout.
    for _ in 0..4 {
        let r = ask(&[("x-mock-script", "ttft=60s")]).await;
        assert!(r.is_err(), "timed out");
    }
    // One stuck replica: the delay is still the healthy p90, and the backup wins in time.
    let start = Instant::now();
    let res = ask(&[("x-mock-script-0", "ttft=60s")])
        .await
        .expect("a first token within the budget")
        .unwrap();
    let o = outcome(&res);
    assert_eq!((o.attempts, o.winner), (2, Some(1)));
    let delay = o.delay.unwrap();
    assert!(delay < ms(100), "the estimate was left alone: {delay:?}");
    assert!(start.elapsed() < ms(300), "{:?}", start.elapsed());
    let _ = read_all(res.into_body()).await;
}
