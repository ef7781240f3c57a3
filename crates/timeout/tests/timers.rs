//! The timers against scripted in-process upstreams, on a paused clock.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{HeaderMap, HeaderName, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use tailguard_core::{
    ClassPolicy, Dialect, EndReason, EndReport, Phase, Priority, TimeoutError, UpstreamFailure,
};
use tailguard_test_support::*;
use tailguard_timeout::{
    FirstTokenClock, OnExpiry, SseIdleTimeoutBody, SseIdleTimeoutLayer, Timeouts,
};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

const SSE: &str = "text/event-stream";

type Upstream =
    tower::util::BoxCloneService<Request<()>, Response<ScriptBody>, std::convert::Infallible>;

/// An upstream that answers after `head_delay` with `content_type` and a scripted body.
fn upstream(head_delay: Duration, content_type: &'static str, body: ScriptBody) -> Upstream {
    let body = Arc::new(Mutex::new(Some(body)));
    tower::util::BoxCloneService::new(tower::service_fn(move |_req: Request<()>| {
        let body = body.clone();
        async move {
            tokio::time::sleep(head_delay).await;
            let body = body.lock().unwrap().take().expect("one call");
            Ok(Response::builder()
                .header("content-type", content_type)
                .body(body)
                .unwrap())
        }
    }))
}

async fn run(
    layer: SseIdleTimeoutLayer,
    req: Request<()>,
    head_delay: Duration,
    steps: Vec<Step>,
) -> (Response<SseIdleTimeoutBody<ScriptBody>>, Probe, Instant) {
    let (body, probe) = ScriptBody::new(steps).probed();
    let start = Instant::now();
    let svc = layer.layer(upstream(head_delay, SSE, body));
    let res = svc.oneshot(req).await.expect("response");
    (res, probe, start)
}

fn with_report() -> (Request<()>, EndReport) {
    let report = EndReport::new();
    let mut req = Request::new(());
    req.extensions_mut().insert(report.clone());
    (req, report)
}

fn keepalives(n: usize, every: u64) -> Vec<Step> {
    (0..n)
        .flat_map(|_| [wait_ms(every), data(KEEPALIVE)])
        .collect()
}

#[tokio::test(start_paused = true)]
async fn first_token_timeout_fires_behind_keepalives_at_its_setting() {
    let layer = SseIdleTimeoutLayer::new().with_first_token_timeout(secs(5));
    let mut steps = vec![data(ROLE)];
    steps.extend(keepalives(60, 1000));
    steps.push(data(token("late")));
    let (req, report) = with_report();
    let (res, probe, start) = run(layer, req, Duration::ZERO, steps).await;
    assert_eq!(res.status(), 200);
    let seen = collect(res.into_body(), start).await;

    assert_eq!(seen.ended_at, secs(5), "fires exactly at the limit");
    let events = seen.events();
    // role chunk, 4 keepalives (1s..4s; the one at 5s is delivered too: a ready frame wins),
    // then the error event and [DONE].
    assert_eq!(events.len(), 1 + 5 + 2, "{events:?}");
    let err = error_json(&events[events.len() - 2]);
    assert_eq!(err["error"]["code"], "first_token_timeout");
    assert_eq!(err["error"]["type"], "timeout_error");
    // The limit next to the time measured against it, not the time since the role chunk.
    assert_eq!(
        err["error"]["message"],
        "first token timeout: 5s without a first token (limit 5s); 5s into the request, \
         6 events seen"
    );
    assert_eq!(events.last().unwrap(), "data: [DONE]");
    assert!(probe.cancelled(), "upstream dropped at once");
    assert_eq!(report.get(), Some(EndReason::FirstTokenTimeout));
}

#[tokio::test(start_paused = true)]
async fn tower_http_body_timeout_never_fires_behind_keepalives() {
    // Same upstream: keepalives every second for a minute and no token. tower-http's body
    // timeout of 2 s restarts on every frame, so it never fires; the stalled generation runs
    // until the upstream gives up.
    let mut steps = vec![data(ROLE)];
    steps.extend(keepalives(60, 1000));
    let (body, probe) = ScriptBody::new(steps).probed();
    let start = Instant::now();
    let svc = tower_http::timeout::ResponseBodyTimeoutLayer::new(secs(2)).layer(upstream(
        Duration::ZERO,
        SSE,
        body,
    ));
    let res = svc.oneshot(Request::new(())).await.unwrap();
    let seen = collect(res.into_body(), start).await;
    assert!(seen.error.is_none(), "tower-http fired: {:?}", seen.error);
    assert_eq!(seen.ended_at, secs(60));
    assert_eq!(seen.events().len(), 61);
    assert!(!probe.cancelled());
}

#[tokio::test(start_paused = true)]
async fn idle_timeout_fires_after_stall_behind_keepalives() {
    let layer = SseIdleTimeoutLayer::new()
        .with_first_token_timeout(secs(10))
        .with_idle_timeout(secs(3));
    let mut steps = vec![data(ROLE)];
    for i in 0..5 {
        steps.extend([wait_ms(200), data(token(&format!("t{i}")))]);
    }
    // Stall: keepalives only.
    steps.extend(keepalives(30, 1000));
    steps.push(data(END));
    let (req, report) = with_report();
    let (res, probe, start) = run(layer, req, Duration::ZERO, steps).await;
    let seen = collect(res.into_body(), start).await;

    // Last token at 1.0 s, so the idle limit passes at 4.0 s.
    assert_eq!(seen.ended_at, ms(4000));
    let events = seen.events();
    let n = events.len();
    assert_eq!(events[n - 1], "data: [DONE]");
    let err = error_json(&events[n - 2]);
    assert_eq!(err["error"]["code"], "idle_timeout");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("since the last event")
    );
    assert_eq!(
        events.iter().filter(|e| e.contains("content")).count(),
        5,
        "every token delivered"
    );
    assert!(probe.cancelled());
    assert_eq!(report.get(), Some(EndReason::IdleTimeout));
}

#[tokio::test(start_paused = true)]
async fn steady_tokens_under_the_idle_limit_never_fire() {
    let layer = SseIdleTimeoutLayer::new()
        .with_first_token_timeout(secs(2))
        .with_idle_timeout(ms(500));
    let mut steps = vec![wait_ms(300), data(ROLE)];
    for i in 0..2000 {
        steps.extend([wait_ms(499), data(token(&format!("t{i}")))]);
        if i % 100 == 0 {
            steps.push(data(KEEPALIVE));
        }
    }
    steps.push(data(END));
    let (req, report) = with_report();
    let (res, probe, start) = run(layer, req, Duration::ZERO, steps).await;
    let seen = collect(res.into_body(), start).await;
    assert!(seen.error.is_none());
    let events = seen.events();
    assert_eq!(events.last().unwrap(), "data: [DONE]");
    assert!(events.iter().all(|e| !e.contains("\"error\"")));
    assert_eq!(seen.ended_at, ms(300 + 2000 * 499));
    assert!(!probe.cancelled());
    assert_eq!(report.get(), None);
}

#[tokio::test(start_paused = true)]
async fn total_deadline_fires_on_a_steady_stream() {
    let layer = SseIdleTimeoutLayer::new()
        .with_idle_timeout(secs(1))
        .with_total_timeout(secs(10));
    let mut steps = vec![data(ROLE)];
    for i in 0..100 {
        steps.extend([wait_ms(400), data(token(&format!("t{i}")))]);
    }
    let (req, report) = with_report();
    let (res, probe, start) = run(layer, req, Duration::ZERO, steps).await;
    let seen = collect(res.into_body(), start).await;
    assert_eq!(seen.ended_at, secs(10));
    let events = seen.events();
    assert_eq!(
        error_json(&events[events.len() - 2])["error"]["code"],
        "deadline_exceeded"
    );
    // Tokens at 0.4 s .. 10.0 s: the one due at exactly 10 s wins the tie.
    assert_eq!(events.iter().filter(|e| e.contains("content")).count(), 25);
    assert!(probe.cancelled());
    assert_eq!(report.get(), Some(EndReason::Deadline));
}

#[tokio::test(start_paused = true)]
async fn a_stall_inside_an_event_never_reaches_the_client_half_sent() {
    let layer = SseIdleTimeoutLayer::new()
        .with_first_token_timeout(secs(5))
        .with_idle_timeout(secs(2));
    let steps = vec![
        data(ROLE),
        wait_ms(100),
        data(token("a")),
        // One event split across three frames, the boundary inside the JSON line...
        data("data: {\"choices\":[{\"index\":0,\"delta\":{\"cont"),
        wait_ms(100),
        data("ent\":\"b\"}}]}\n"),
        wait_ms(100),
        data(
            "\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"c\"}}]}\n\ndata: {\"choi",
        ),
        // ...then the upstream stalls in the middle of the next one, behind keepalive bytes
        // that never come.
        wait_ms(60_000),
        data("ces\":[]}\n\n"),
    ];
    let (res, probe, start) = run(layer, Request::new(()), Duration::ZERO, steps).await;
    let seen = collect(res.into_body(), start).await;
    let events = seen.events(); // asserts the stream ends on an event boundary
    let n = events.len();
    assert_eq!(events[n - 1], "data: [DONE]");
    assert_eq!(error_json(&events[n - 2])["error"]["code"], "idle_timeout");
    for e in &events[..n - 2] {
        let json = e.strip_prefix("data: ").expect("data event");
        serde_json::from_str::<serde_json::Value>(json).expect("every event is whole JSON");
    }
    assert_eq!(events.iter().filter(|e| e.contains("content")).count(), 3);
    // Last progress event ("c") at 0.3 s.
    assert_eq!(seen.ended_at, ms(2300));
    seen.assert_whole_events_at_every_instant();
    assert!(probe.cancelled());
}

#[tokio::test(start_paused = true)]
async fn split_events_are_released_whole_and_in_order() {
    // No timeout fires: the held-back bytes come out as soon as their event completes, and the
    // client receives exactly the upstream's bytes.
    let layer = SseIdleTimeoutLayer::new().with_idle_timeout(secs(1));
    let whole = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n".repeat(3) + END;
    let steps: Vec<Step> = whole
        .as_bytes()
        .chunks(7)
        .flat_map(|c| [wait_ms(10), Step::Data(Bytes::copy_from_slice(c))])
        .collect();
    let (res, probe, start) = run(layer, Request::new(()), Duration::ZERO, steps).await;
    let seen = collect(res.into_body(), start).await;
    assert_eq!(seen.text(), whole);
    seen.assert_whole_events_at_every_instant();
    assert!(!probe.cancelled());
}

#[tokio::test(start_paused = true)]
async fn head_timeout_is_a_504_in_openai_json() {
    let layer = SseIdleTimeoutLayer::new().with_head_timeout(secs(2));
    let (req, report) = with_report();
    let (res, probe, start) = run(layer, req, secs(30), vec![data(token("x"))]).await;
    assert_eq!(start.elapsed(), secs(2));
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    assert_eq!(res.headers()["content-type"], "application/json");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["type"], "timeout_error");
    assert_eq!(v["error"]["code"], "head_timeout");
    assert_eq!(report.get(), Some(EndReason::HeadTimeout));
    // The body was never produced: the upstream future (which owned it) is gone.
    assert!(probe.dropped.load(std::sync::atomic::Ordering::SeqCst));
}

#[tokio::test(start_paused = true)]
async fn headers_ready_at_the_limit_win() {
    let layer = SseIdleTimeoutLayer::new().with_head_timeout(secs(2));
    let (res, _probe, _start) = run(layer, Request::new(()), secs(2), vec![data(END)]).await;
    assert_eq!(res.status(), 200);
}

#[tokio::test(start_paused = true)]
async fn first_token_before_headers_names_its_phase() {
    let layer = SseIdleTimeoutLayer::new()
        .with_head_timeout(secs(10))
        .with_first_token_timeout(secs(3))
        .with_error_mode();
    let body = ScriptBody::new(vec![data(token("x"))]);
    let svc = layer.layer(upstream(secs(30), SSE, body));
    let start = Instant::now();
    let err = svc.oneshot(Request::new(())).await.unwrap_err();
    assert_eq!(start.elapsed(), secs(3));
    let t = err.downcast_ref::<TimeoutError>().expect("typed error");
    assert_eq!(t.phase(), Phase::FirstToken);
    assert_eq!(t.limit(), secs(3));
    assert_eq!(t.elapsed(), secs(3));
    assert_eq!(t.events(), 0);
}

#[tokio::test(start_paused = true)]
async fn grpc_request_gets_a_trailers_only_deadline_exceeded() {
    let layer = SseIdleTimeoutLayer::new().with_head_timeout(secs(1));
    let req = Request::builder()
        .header("content-type", "application/grpc")
        .body(())
        .unwrap();
    let (res, _, _) = run(layer, req, secs(5), vec![]).await;
    assert_eq!(res.status(), 200);
    assert_eq!(res.headers()["content-type"], "application/grpc");
    assert_eq!(res.headers()["grpc-status"], "4");
    assert!(
        res.headers()["grpc-message"]
            .to_str()
            .unwrap()
            .starts_with("head timeout")
    );
    assert!(res.body().is_end_stream());
}

#[tokio::test(start_paused = true)]
async fn grpc_stream_ends_with_deadline_exceeded_trailers_and_no_partial_message() {
    let layer = SseIdleTimeoutLayer::new().with_idle_timeout(secs(1));
    let m1 = grpc_message(b"hello");
    let m2 = grpc_message(b"world, partly");
    let steps = vec![
        Step::Data(m1.clone()),
        wait_ms(100),
        Step::Data(m2.slice(..7)),
        wait_ms(60_000),
        Step::Data(m2.slice(7..)),
    ];
    let (report_req, report) = with_report();
    let (body, probe) = ScriptBody::new(steps).probed();
    let start = Instant::now();
    let svc = layer.layer(upstream(Duration::ZERO, "application/grpc", body));
    let res = svc.oneshot(report_req).await.unwrap();
    let seen = collect(res.into_body(), start).await;
    assert_eq!(
        seen.bytes(),
        m1.to_vec(),
        "the partial second message is held back"
    );
    let trailers = seen.trailers.expect("trailers");
    assert_eq!(trailers["grpc-status"], "4");
    assert!(
        trailers["grpc-message"]
            .to_str()
            .unwrap()
            .starts_with("idle timeout")
    );
    assert_eq!(seen.ended_at, secs(1));
    assert!(probe.cancelled());
    assert_eq!(report.get(), Some(EndReason::IdleTimeout));
}

#[tokio::test(start_paused = true)]
async fn body_error_flavour_carries_phase_events_and_gap() {
    let layer = SseIdleTimeoutLayer::new()
        .with_idle_timeout(secs(2))
        .with_on_expiry(OnExpiry::BodyError);
    let steps = vec![
        data(ROLE),
        wait_ms(500),
        data(token("a")),
        wait_ms(500),
        data(token("b")),
        data(KEEPALIVE),
        data("data: {\"choi"),
        wait_ms(10_000),
        data(END),
    ];
    let (res, probe, start) = run(layer, Request::new(()), Duration::ZERO, steps).await;
    let seen = collect(res.into_body(), start).await;
    let (at, err) = seen.error.as_ref().expect("body error");
    let at = *at;
    assert_eq!(at, secs(3));
    let t = err.downcast_ref::<TimeoutError>().expect("TimeoutError");
    assert_eq!(t.phase(), Phase::Idle);
    assert_eq!(t.limit(), secs(2));
    assert_eq!(t.elapsed(), secs(3));
    assert_eq!(t.events(), 4, "role, two tokens, a keepalive");
    assert_eq!(t.since_last_event(), Some(secs(2)));
    // Nothing is held back in this flavour: the partial event went out as it came.
    assert!(seen.text().ends_with("data: {\"choi"));
    assert!(probe.cancelled());
}

#[tokio::test(start_paused = true)]
async fn anthropic_streams_end_with_an_error_event() {
    let layer = SseIdleTimeoutLayer::new().with_first_token_timeout(secs(2));
    let steps = vec![
        data(
            "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\"}}\n\n",
        ),
        wait_ms(1000),
        data("event: ping\ndata: {\"type\": \"ping\"}\n\n"),
        wait_ms(10_000),
    ];
    let (res, _, start) = run(layer, Request::new(()), Duration::ZERO, steps).await;
    let seen = collect(res.into_body(), start).await;
    assert_eq!(seen.ended_at, secs(2));
    let events = seen.events();
    let last = events.last().unwrap();
    assert!(last.starts_with("event: error\ndata: "), "{last}");
    let v: serde_json::Value =
        serde_json::from_str(last.lines().nth(1).unwrap().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(v["error"]["type"], "timeout_error");
}

#[tokio::test(start_paused = true)]
async fn keepalives_reset_idle_only_when_configured() {
    let script = || {
        let mut s = vec![data(token("a"))];
        s.extend(keepalives(5, 1000));
        s.push(data(token("b")));
        s.push(data(END));
        s
    };
    let strict = SseIdleTimeoutLayer::new().with_idle_timeout(ms(2500));
    let (res, _, start) = run(strict, Request::new(()), Duration::ZERO, script()).await;
    assert_eq!(collect(res.into_body(), start).await.ended_at, ms(2500));

    let lenient = SseIdleTimeoutLayer::new()
        .with_idle_timeout(ms(2500))
        .with_keepalive_resets_idle(true);
    let (res, _, start) = run(lenient, Request::new(()), Duration::ZERO, script()).await;
    let seen = collect(res.into_body(), start).await;
    assert_eq!(seen.ended_at, secs(5));
    assert_eq!(seen.events().last().unwrap(), "data: [DONE]");
    assert!(seen.events().iter().all(|e| !e.contains("\"error\"")));
}

#[tokio::test(start_paused = true)]
async fn first_token_clock_can_start_at_headers() {
    let steps = || vec![wait_ms(2500), data(token("a")), data(END)];
    let from_call = SseIdleTimeoutLayer::new().with_first_token_timeout(secs(3));
    let (res, _, start) = run(from_call, Request::new(()), secs(1), steps()).await;
    let seen = collect(res.into_body(), start).await;
    assert_eq!(seen.ended_at, secs(3));
    assert!(seen.text().contains("first_token_timeout"));

    let from_headers = SseIdleTimeoutLayer::new()
        .with_first_token_timeout(secs(3))
        .with_first_token_clock(FirstTokenClock::FromHeaders);
    let (res, _, start) = run(from_headers, Request::new(()), secs(1), steps()).await;
    let seen = collect(res.into_body(), start).await;
    assert_eq!(seen.ended_at, ms(3500));
    assert!(!seen.text().contains("error"));
}

#[tokio::test(start_paused = true)]
async fn per_request_header_and_priority_overrides() {
    let layer = SseIdleTimeoutLayer::new()
        .with_first_token_timeout(secs(10))
        .with_priority_timeouts(
            Priority::interactive(),
            Timeouts::new().with_first_token(secs(2)),
        )
        .with_override_header(Phase::FirstToken, HeaderName::from_static("x-ttft-ms"));
    let steps = || vec![wait_ms(20_000), data(token("a"))];

    let (res, _, start) = run(layer.clone(), Request::new(()), Duration::ZERO, steps()).await;
    assert_eq!(collect(res.into_body(), start).await.ended_at, secs(10));

    let mut req = Request::new(());
    req.extensions_mut().insert(Priority::interactive());
    let (res, _, start) = run(layer.clone(), req, Duration::ZERO, steps()).await;
    assert_eq!(collect(res.into_body(), start).await.ended_at, secs(2));

    // A ClassPolicy from PriorityClass beats the layer's per-priority table.
    let mut req = Request::new(());
    req.extensions_mut().insert(Priority::interactive());
    req.extensions_mut()
        .insert(ClassPolicy::new().with_first_token_timeout(secs(4)));
    let (res, _, start) = run(layer.clone(), req, Duration::ZERO, steps()).await;
    assert_eq!(collect(res.into_body(), start).await.ended_at, secs(4));

    let req = Request::builder()
        .header("x-ttft-ms", "1500")
        .body(())
        .unwrap();
    let (res, _, start) = run(layer.clone(), req, Duration::ZERO, steps()).await;
    assert_eq!(collect(res.into_body(), start).await.ended_at, ms(1500));

    // The extension beats the header.
    let mut req = Request::builder()
        .header("x-ttft-ms", "1500")
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert(Timeouts::new().with_first_token(ms(700)));
    let (res, _, start) = run(layer, req, Duration::ZERO, steps()).await;
    assert_eq!(collect(res.into_body(), start).await.ended_at, ms(700));
}

#[tokio::test(start_paused = true)]
async fn a_client_that_does_not_read_counts_for_total_but_not_for_idle() {
    let layer = SseIdleTimeoutLayer::new()
        .with_idle_timeout(secs(1))
        .with_total_timeout(secs(100));
    let mut steps = vec![data(token("a"))];
    for i in 0..10 {
        steps.extend([wait_ms(500), data(token(&format!("t{i}")))]);
    }
    steps.push(data(END));
    let (res, probe, start) = run(layer, Request::new(()), Duration::ZERO, steps).await;
    let mut body = std::pin::pin!(res.into_body());
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    // The client goes away for 30 s while the upstream keeps producing on schedule: the idle
    // timer must not blame the upstream for the client's absence.
    tokio::time::sleep(secs(30)).await;
    let rest = collect(body.as_mut(), start).await;
    let events = rest.events();
    assert!(
        events.iter().all(|e| !e.contains("\"error\"")),
        "{events:?}"
    );
    assert_eq!(events.last().unwrap(), "data: [DONE]");
    assert!(!probe.cancelled());

    // The total deadline, wall-clock, does count the client's absence: frames the upstream
    // already produced are still delivered, and the deadline fires when the body next waits.
    let layer = SseIdleTimeoutLayer::new().with_total_timeout(secs(10));
    let steps = vec![
        data(token("a")),
        data(token("b")),
        data(token("c")),
        wait_ms(30_000),
        data(END),
    ];
    let (res, probe, start) = run(layer, Request::new(()), Duration::ZERO, steps).await;
    let mut body = std::pin::pin!(res.into_body());
    body.frame().await.unwrap().unwrap();
    tokio::time::sleep(secs(11)).await;
    let rest = collect(body.as_mut(), start).await;
    let events = rest.events();
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!(error_json(&events[2])["error"]["code"], "deadline_exceeded");
    assert_eq!(rest.ended_at, secs(11));
    assert!(probe.cancelled());
}

#[tokio::test(start_paused = true)]
async fn an_upstream_flooding_ready_keepalives_cannot_hold_a_timer_off() {
    // Every frame is ready at once; the client reads one every 100 ms, so the body never waits.
    // The flood check (every 32 frames in a row) still fires the first-token timer.
    let layer = SseIdleTimeoutLayer::new().with_first_token_timeout(secs(1));
    let steps = (0..1000).map(|_| data(KEEPALIVE)).collect();
    let (res, probe, start) = run(layer, Request::new(()), Duration::ZERO, steps).await;
    let mut body = std::pin::pin!(res.into_body());
    let mut text = String::new();
    while let Some(frame) = body.frame().await {
        let mut data = frame.unwrap().into_data().unwrap();
        text.push_str(std::str::from_utf8(&data.copy_to_bytes(data.remaining())).unwrap());
        tokio::time::sleep(ms(100)).await;
    }
    // 32 keepalives delivered at 0.0 .. 3.1 s; the check before the 33rd fires at 3.2 s.
    assert_eq!(text.matches(": keepalive").count(), 32);
    assert!(text.contains("first_token_timeout"));
    // (The error event and [DONE] come in one frame at 3.2 s; the end is seen at 3.3 s.)
    assert_eq!(start.elapsed(), ms(3300));
    assert!(probe.cancelled());
}

#[tokio::test(start_paused = true)]
async fn forwards_trailers_size_hint_and_end_of_stream() {
    // With the terminal-event check off, the end of the data passes through as it came.
    let layer = SseIdleTimeoutLayer::new()
        .with_idle_timeout(secs(1))
        .with_require_terminal_event(false);
    let mut trailers = HeaderMap::new();
    trailers.insert("x-usage", "42".parse().unwrap());
    let a = "data: {\"choices\":[{\"delta\":{\"content\":\"x\"}}]}\n\n";
    let body = ScriptBody::new(vec![
        data(a),
        data("data: [DO"),
        Step::Trailers(trailers.clone()),
    ]);
    let body = body.with_exact_hint((a.len() + 9) as u64);
    let svc = layer.layer(upstream(Duration::ZERO, SSE, body));
    let res = svc.oneshot(Request::new(())).await.unwrap();
    let mut body = std::pin::pin!(res.into_body());
    assert_eq!(body.size_hint().exact(), Some((a.len() + 9) as u64));
    assert!(!body.is_end_stream());
    let f = body.frame().await.unwrap().unwrap();
    assert_eq!(f.data_ref().map(bytes::Buf::remaining), Some(a.len()));
    // "data: [DO" arrives and is held back (incomplete event), then the trailers end the data:
    // unchecked, the fragment is released (the upstream cut it) and the trailers follow.
    let f = body.frame().await.unwrap().unwrap();
    assert_eq!(f.data_ref().map(bytes::Buf::remaining), Some(9));
    assert!(!body.is_end_stream());
    let f = body.frame().await.unwrap().unwrap();
    assert_eq!(f.trailers_ref(), Some(&trailers));
    assert!(body.is_end_stream());
    assert!(body.frame().await.is_none());

    // Without timers a complete stream passes through as it is.
    let whole = format!("{a}{END}");
    let body = ScriptBody::new(vec![data(a), data(END)]);
    let svc = SseIdleTimeoutLayer::new().layer(upstream(
        Duration::ZERO,
        SSE,
        body.with_exact_hint(whole.len() as u64),
    ));
    let res = svc.oneshot(Request::new(())).await.unwrap();
    let body = res.into_body();
    assert_eq!(body.size_hint().exact(), Some(whole.len() as u64));
    let seen = collect(body, Instant::now()).await;
    assert_eq!(seen.text(), whole);
}

#[tokio::test(start_paused = true)]
async fn a_stream_cut_short_is_not_at_its_end_until_its_ending_is_out() {
    // The inner body says it is at its end after its last frame (a server that trusts that
    // stops polling): a stream cut short must not, or its ending would never be sent.
    let body = ScriptBody::new(vec![data(token("a"))]);
    let svc = SseIdleTimeoutLayer::new().layer(upstream(Duration::ZERO, SSE, body));
    let res = svc.oneshot(Request::new(())).await.unwrap();
    let mut body = std::pin::pin!(res.into_body());
    assert!(body.frame().await.unwrap().unwrap().is_data());
    assert!(!body.is_end_stream(), "the ending is still to come");
    let mut f = body.frame().await.unwrap().unwrap().into_data().unwrap();
    let text = String::from_utf8(f.copy_to_bytes(f.remaining()).to_vec()).unwrap();
    assert!(text.contains("upstream_error_truncated"), "{text}");
    assert!(text.ends_with("data: [DONE]\n\n"));
    assert!(body.is_end_stream());
    assert!(body.frame().await.is_none());

    // A complete stream is at its end after [DONE], as the inner body says.
    let body = ScriptBody::new(vec![data(token("a")), data(END)]);
    let svc = SseIdleTimeoutLayer::new().layer(upstream(Duration::ZERO, SSE, body));
    let res = svc.oneshot(Request::new(())).await.unwrap();
    let mut body = std::pin::pin!(res.into_body());
    body.frame().await.unwrap().unwrap();
    body.frame().await.unwrap().unwrap();
    assert!(body.is_end_stream());
}

#[tokio::test(start_paused = true)]
async fn upstream_errors_end_in_band_and_done_streams_end_quietly() {
    let layer = SseIdleTimeoutLayer::new().with_idle_timeout(secs(1));
    // A body error inside an event: the partial event is dropped, the client gets the error
    // event, [DONE] and a clean end.
    let (req, report) = with_report();
    let (res, _, start) = run(
        layer.clone(),
        req,
        Duration::ZERO,
        vec![data(token("a")), data("data: {\"choi"), Step::Error],
    )
    .await;
    let seen = collect(res.into_body(), start).await;
    assert!(seen.error.is_none(), "{:?}", seen.error);
    let events = seen.events();
    assert_eq!(events.len(), 3, "{events:?}");
    let err = error_json(&events[1]);
    assert_eq!(err["error"]["type"], "upstream_error");
    assert_eq!(err["error"]["code"], "upstream_error_transport");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("upstream reset"),
        "{err}"
    );
    assert_eq!(events[2], "data: [DONE]");
    assert_eq!(
        report.get(),
        Some(EndReason::UpstreamError(UpstreamFailure::Transport))
    );

    // In the body-error flavour the upstream's error passes through.
    let (res, _, start) = run(
        layer.clone().with_on_expiry(OnExpiry::BodyError),
        Request::new(()),
        Duration::ZERO,
        vec![data(token("a")), Step::Error],
    )
    .await;
    let seen = collect(res.into_body(), start).await;
    let (_, err) = seen.error.expect("error");
    assert!(err.downcast_ref::<std::io::Error>().is_some());

    // After [DONE] an upstream that lingers is cut without an error event, and a body error
    // or a fragment after it is no news either (the fragment is dropped).
    for tail in [
        vec![wait_ms(60_000), data(KEEPALIVE)],
        vec![Step::Error],
        vec![data("data: {\"cho")],
    ] {
        let (req, report) = with_report();
        let mut steps = vec![data(token("a")), data(END)];
        steps.extend(tail);
        let (res, _, start) = run(layer.clone(), req, Duration::ZERO, steps).await;
        let seen = collect(res.into_body(), start).await;
        assert!(seen.error.is_none());
        assert_eq!(seen.events().last().unwrap(), "data: [DONE]");
        assert!(!seen.text().contains("error"));
        assert_eq!(report.get(), None);
    }
    let (res, probe, start) = run(
        layer,
        Request::new(()),
        Duration::ZERO,
        vec![
            data(token("a")),
            data(END),
            wait_ms(60_000),
            data(KEEPALIVE),
        ],
    )
    .await;
    assert_eq!(collect(res.into_body(), start).await.ended_at, secs(1));
    assert!(probe.cancelled());
}

#[tokio::test(start_paused = true)]
async fn ndjson_and_custom_dialects() {
    let layer = SseIdleTimeoutLayer::new()
        .with_dialect(Dialect::AnySse)
        .with_first_token_timeout(secs(1));
    let (res, _, start) = run(
        layer,
        Request::new(()),
        Duration::ZERO,
        vec![data(KEEPALIVE), wait_ms(5000), data("data: x\n\n")],
    )
    .await;
    let seen = collect(res.into_body(), start).await;
    assert_eq!(seen.ended_at, secs(1));

    let layer = SseIdleTimeoutLayer::new().with_idle_timeout(secs(1));
    let body = ScriptBody::new(vec![
        data("{\"response\":\"a\"}\n"),
        wait_ms(5000),
        data("{\"response\":\"b\"}\n"),
    ]);
    let svc = layer.layer(upstream(Duration::ZERO, "application/x-ndjson", body));
    let start = Instant::now();
    let res = svc.oneshot(Request::new(())).await.unwrap();
    let seen = collect(res.into_body(), start).await;
    let text = seen.text();
    let lines: Vec<_> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    let v: serde_json::Value = serde_json::from_str(lines[1]).unwrap();
    assert_eq!(v["error"]["code"], "idle_timeout");
}

#[tokio::test(start_paused = true)]
async fn dropping_the_response_future_or_body_cancels_the_upstream() {
    let layer = SseIdleTimeoutLayer::new()
        .with_head_timeout(secs(5))
        .with_idle_timeout(secs(1));
    let (body, probe) =
        ScriptBody::new(vec![data(token("a")), wait_ms(100), data(token("b"))]).probed();
    let svc = layer.clone().layer(upstream(secs(1), SSE, body));
    let fut = svc.oneshot(Request::new(()));
    let _ = tokio::time::timeout(ms(500), fut).await;
    assert!(probe.dropped.load(std::sync::atomic::Ordering::SeqCst));

    let (body, probe) =
        ScriptBody::new(vec![data(token("a")), wait_ms(100), data(token("b"))]).probed();
    let svc = layer.layer(upstream(Duration::ZERO, SSE, body));
    let res = svc.oneshot(Request::new(())).await.unwrap();
    let mut body = Box::pin(res.into_body());
    body.frame().await.unwrap().unwrap();
    drop(body);
    assert!(probe.cancelled());
}

#[tokio::test(start_paused = true)]
async fn absurd_header_values_neither_panic_nor_fire() {
    let layer = SseIdleTimeoutLayer::new()
        .with_override_header(Phase::Head, HeaderName::from_static("x-head-ms"))
        .with_override_header(Phase::FirstToken, HeaderName::from_static("x-ttft-ms"))
        .with_override_header(Phase::Idle, HeaderName::from_static("x-idle-ms"))
        .with_override_header(Phase::Total, HeaderName::from_static("x-total-ms"));
    let max = u64::MAX.to_string();
    let big = (u64::MAX / 1_000_000).to_string();
    for value in [max.as_str(), big.as_str(), "-1", "1e9", ""] {
        let req = Request::builder()
            .header("x-head-ms", value)
            .header("x-ttft-ms", value)
            .header("x-idle-ms", value)
            .header("x-total-ms", value)
            .body(())
            .unwrap();
        let steps = vec![wait_ms(5000), data(token("a")), wait_ms(5000), data(END)];
        let (res, probe, start) = run(layer.clone(), req, secs(1), steps).await;
        let seen = collect(res.into_body(), start).await;
        assert_eq!(seen.ended_at, secs(11), "{value}");
        assert!(!seen.text().contains("error"), "{value}");
        assert!(!probe.cancelled());
    }
}

#[tokio::test(start_paused = true)]
async fn an_event_over_the_scan_cap_ends_the_stream_with_a_protocol_error() {
    let layer = SseIdleTimeoutLayer::new().with_idle_timeout(secs(1));
    // A line longer than the 1 MiB cap that never ends: not `completed`, and not read on.
    let big = format!("data: {}", "x".repeat(600_000));
    let chunk = "x".repeat(64 * 1024);
    let mut steps = vec![data(token("a")), data(&big)];
    for _ in 0..16 {
        steps.extend([wait_ms(100), data(&chunk)]);
    }
    steps.extend([data("\n\n"), data(END)]);
    let (req, report) = with_report();
    let (res, probe, start) = run(layer, req, Duration::ZERO, steps).await;
    let seen = collect(res.into_body(), start).await;
    assert!(seen.error.is_none(), "{:?}", seen.error);
    let events = seen.events();
    assert_eq!(events.len(), 3, "the token, the error, [DONE]");
    assert!(events[0].contains("\"content\":\"a\""));
    let err = error_json(&events[1]);
    assert_eq!(err["error"]["code"], "upstream_error_protocol");
    assert_eq!(events[2], "data: [DONE]");
    // The cap is crossed by the 7th 64 KiB piece, at 0.7 s: the upstream is dropped there.
    assert_eq!(seen.ended_at, ms(700));
    assert!(probe.cancelled());
    assert_eq!(
        report.get(),
        Some(EndReason::UpstreamError(UpstreamFailure::Protocol))
    );
}
