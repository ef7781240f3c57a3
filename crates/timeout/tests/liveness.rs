//! The liveness timer beside the idle (progress) one: any bytes reset it, so a silent
//! connection is caught quickly while a slow generation that sends keepalives is not.

use std::sync::{Arc, Mutex};

use http::{Request, Response};
use tailguard_core::{ClassPolicy, EndReason, EndReport};
use tailguard_test_support::*;
use tailguard_timeout::{SseIdleTimeoutLayer, Timeouts};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

/// Runs `req` through `layer` over an SSE upstream that answers at once with `steps`.
async fn run(layer: SseIdleTimeoutLayer, req: Request<()>, steps: Vec<Step>) -> (Collected, Probe) {
    let (body, probe) = ScriptBody::new(steps).probed();
    let body = Arc::new(Mutex::new(Some(body)));
    let svc = layer.layer(tower::service_fn(move |_req: Request<()>| {
        let body = body.lock().unwrap().take().expect("one call");
        async move {
            Ok::<_, std::convert::Infallible>(
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(body)
                    .unwrap(),
            )
        }
    }));
    let start = Instant::now();
    let res = svc.oneshot(req).await.expect("response");
    (collect(res.into_body(), start).await, probe)
}

fn with_report() -> (Request<()>, EndReport) {
    let report = EndReport::new();
    let mut req = Request::new(());
    req.extensions_mut().insert(report.clone());
    (req, report)
}

/// Progress limit 30 s, liveness limit 3 s.
fn layer() -> SseIdleTimeoutLayer {
    SseIdleTimeoutLayer::new()
        .with_first_token_timeout(secs(60))
        .with_idle_timeout(secs(30))
        .with_liveness_timeout(secs(3))
}

#[tokio::test(start_paused = true)]
async fn a_slow_generation_behind_keepalives_outlives_the_liveness_limit() {
    // A reasoning model: 20 s of processing comments before its first token, then a 10 s
    // think between tokens, still behind comments. Neither gap reaches the progress limits,
    // and no silence reaches the liveness one.
    let mut steps = vec![data(ROLE)];
    for _ in 0..20 {
        steps.extend([wait_ms(1000), data(": processing\n\n")]);
    }
    steps.push(data(token("a")));
    for _ in 0..5 {
        steps.extend([wait_ms(2000), data("event: ping\ndata: {}\n\n")]);
    }
    steps.extend([data(token("b")), data(END)]);
    let (req, report) = with_report();
    let (seen, probe) = run(layer(), req, steps).await;
    assert!(seen.error.is_none(), "{:?}", seen.error);
    assert_eq!(seen.ended_at, secs(30));
    assert_eq!(seen.events().last().unwrap(), "data: [DONE]");
    assert!(!probe.cancelled());
    assert_eq!(report.get(), None);
}

#[tokio::test(start_paused = true)]
async fn a_silent_connection_ends_with_its_own_reason_and_message() {
    let steps = vec![
        data(ROLE),
        wait_ms(500),
        data(token("a")),
        wait_ms(60_000),
        data(END),
    ];
    let (req, report) = with_report();
    let (seen, probe) = run(layer(), req, steps).await;
    // The last bytes arrived at 0.5 s: silent for 3 s by 3.5 s, long before the idle limit.
    assert_eq!(seen.ended_at, ms(3500));
    let events = seen.events();
    let n = events.len();
    assert_eq!(events[n - 1], "data: [DONE]");
    let err = error_json(&events[n - 2]);
    assert_eq!(err["error"]["code"], "liveness_timeout");
    let message = err["error"]["message"].as_str().unwrap();
    assert!(message.starts_with("liveness timeout"), "{message}");
    assert!(probe.cancelled());
    assert_eq!(report.get(), Some(EndReason::LivenessTimeout));
}

#[tokio::test(start_paused = true)]
async fn silence_before_the_first_token_is_caught_too() {
    // Headers, then nothing at all: the liveness clock runs from the headers.
    let steps = vec![wait_ms(60_000), data(END)];
    let (req, report) = with_report();
    let (seen, _) = run(layer(), req, steps).await;
    assert_eq!(seen.ended_at, secs(3));
    assert_eq!(report.get(), Some(EndReason::LivenessTimeout));
}

#[tokio::test(start_paused = true)]
async fn the_limit_is_per_class_and_per_request() {
    let silent = || vec![data(ROLE), data(token("a")), wait_ms(60_000), data(END)];
    // The class allows 10 s of silence...
    let (mut req, report) = with_report();
    req.extensions_mut()
        .insert(ClassPolicy::new().with_liveness_timeout(secs(10)));
    let (seen, _) = run(layer(), req, silent()).await;
    assert_eq!(seen.ended_at, secs(10));
    assert_eq!(report.get(), Some(EndReason::LivenessTimeout));
    // ...and one request's override, 5 s, wins over the class.
    let (mut req, report) = with_report();
    req.extensions_mut()
        .insert(ClassPolicy::new().with_liveness_timeout(secs(10)));
    req.extensions_mut()
        .insert(Timeouts::new().with_liveness(secs(5)));
    let (seen, _) = run(layer(), req, silent()).await;
    assert_eq!(seen.ended_at, secs(5));
    assert_eq!(report.get(), Some(EndReason::LivenessTimeout));
    // Without a liveness limit the idle one catches the same stall, later.
    let (req, report) = with_report();
    let plain = SseIdleTimeoutLayer::new().with_idle_timeout(secs(30));
    let (seen, _) = run(plain, req, silent()).await;
    assert_eq!(seen.ended_at, secs(30));
    assert_eq!(report.get(), Some(EndReason::IdleTimeout));
}
