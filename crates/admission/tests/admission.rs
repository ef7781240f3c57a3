//! BoundedAdmission semantics on a paused clock with an in-process streaming upstream.

mod common;

use std::io;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use http::StatusCode;
use http::header::RETRY_AFTER;
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tailguard_admission::{BoundedAdmissionLayer, Codel, Cost};
use tailguard_core::{
    AdmissionOutcome, BoxError, EndReason, EndReport, OverloadReason, Overloaded, RequestFacts,
};
use tokio::time::{Instant, advance, sleep};
use tower::{Layer, Service, ServiceExt, service_fn};

async fn json(res: Res) -> serde_json::Value {
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    serde_json::from_slice(&bytes).unwrap()
}

#[tokio::test(start_paused = true)]
async fn permit_is_held_until_the_stream_ends_not_until_headers() {
    let (up, mut ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(2).with_queue_timeout(Duration::from_secs(60));
    let h = layer.handle();
    let svc = layer.layer(up);

    let a = svc.clone().oneshot(request("a")).await.unwrap();
    let b = svc.clone().oneshot(request("b")).await.unwrap();
    // Both have headers; their bodies are still streaming.
    assert_eq!(h.in_flight(), 2);
    let c = spawn_call(&svc, request("c"));
    settle().await;
    assert_eq!(h.queued(), 1);
    let mut arrived_now = arrived(&mut ctl);
    assert_eq!(
        arrived_now.iter().map(|x| x.0.as_str()).collect::<Vec<_>>(),
        ["a", "b"],
        "c must not reach the upstream while a and b stream"
    );
    // Streams make progress: still no admission.
    for (_, tx) in &arrived_now {
        tx.send(data("data: tok\n\n")).unwrap();
    }
    sleep(Duration::from_secs(10)).await;
    assert!(!c.is_finished());
    // End a's stream: drop its sender and read the body to its end.
    let (_, tx_a) = arrived_now.remove(0);
    drop(tx_a);
    let a_bytes = drain(a.into_body()).await.unwrap();
    assert_eq!(&a_bytes[..], b"data: tok\n\n");
    let c = c.await.unwrap().unwrap();
    assert_eq!(c.status(), StatusCode::OK);
    let outcome = c.extensions().get::<AdmissionOutcome>().unwrap();
    assert_eq!(outcome.queue_wait, Duration::from_secs(10));
    assert_eq!(outcome.rejected, None);
    assert_eq!(arrived(&mut ctl)[0].0, "c");
    assert_eq!((h.in_flight(), h.queued()), (2, 0));

    // A client that disconnects mid-stream frees its permit.
    assert!(b.body().holds_permit());
    drop(b);
    assert_eq!(h.in_flight(), 1);
    drop(c);
    assert_eq!(h.in_flight(), 0);
    assert_eq!(h.in_flight_units(), 0);
}

#[tokio::test(start_paused = true)]
async fn response_without_body_releases_at_once_and_end_after_frame_releases() {
    let (up, _ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1);
    let h = layer.handle();
    let svc = layer.layer(up);
    let mut req = request("e");
    req.headers_mut().insert("x-empty", "1".parse().unwrap());
    let res = svc.clone().oneshot(req).await.unwrap();
    assert!(res.body().is_end_stream());
    assert!(!res.body().holds_permit());
    assert_eq!(h.in_flight(), 0, "an empty body releases at once");

    // `is_end_stream` turning true after the last frame releases before the trailing None.
    let h2 = BoundedAdmissionLayer::new(1);
    let handle = h2.handle();
    let svc = h2.layer(service_fn(|_: http::Request<()>| async {
        Ok::<_, io::Error>(http::Response::new(Full::new(Bytes::from_static(b"x"))))
    }));
    let res = svc.oneshot(http::Request::new(())).await.unwrap();
    let mut body = res.into_body();
    assert_eq!(handle.in_flight(), 1);
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), Bytes::from_static(b"x"));
    assert_eq!(handle.in_flight(), 0, "released with the last frame");
    assert!(body.is_end_stream());
}

#[tokio::test(start_paused = true)]
async fn body_error_and_inner_error_release() {
    let (up, mut ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1);
    let h = layer.handle();
    let svc = layer.layer(up);
    let res = svc.clone().oneshot(request("a")).await.unwrap();
    let (_, tx) = arrived(&mut ctl).pop().unwrap();
    tx.send(Step::Error).unwrap();
    let mut body = res.into_body();
    assert!(body.frame().await.unwrap().is_err());
    assert_eq!(h.in_flight(), 0, "a body error releases");
    // The body is kept (not dropped) yet holds nothing.
    assert!(!body.holds_permit());

    let mut req = request("f");
    req.headers_mut().insert("x-fail", "1".parse().unwrap());
    let err = svc.clone().oneshot(req).await.unwrap_err();
    assert_eq!(err.to_string(), "upstream failed");
    assert_eq!(h.in_flight(), 0, "an inner error releases");
}

#[tokio::test(start_paused = true)]
async fn queue_full_is_an_immediate_429_with_retry_after() {
    let (up, _ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1).with_queue_len(1);
    let h = layer.handle();
    let svc = layer.layer(up);
    let _a = svc.clone().oneshot(request("a")).await.unwrap();
    // a has held the only slot for 3 s when b queues and c arrives.
    advance(Duration::from_secs(3)).await;
    let _b = spawn_call(&svc, request("b"));
    settle().await;
    assert_eq!(h.queued(), 1);

    let report = EndReport::new();
    let mut req = request("c");
    req.extensions_mut().insert(report.clone());
    let start = Instant::now();
    let res = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO, "refused without waiting");
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(res.headers()["content-type"], "application/json");
    let retry: u64 = res.headers()[RETRY_AFTER]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // b and c each need a slot held at least 3 s so far: at least 6 s.
    assert_eq!(retry, 6);
    let outcome = res.extensions().get::<AdmissionOutcome>().unwrap().clone();
    assert_eq!(outcome.rejected, Some(OverloadReason::QueueFull));
    assert!(res.body().is_rejection());
    let v = json(res).await;
    assert_eq!(v["error"]["type"], "rate_limit_exceeded");
    assert_eq!(v["error"]["code"], "queue_full");
    assert_eq!(v["error"]["param"], serde_json::Value::Null);
    assert_eq!(
        v["error"]["message"],
        "overloaded: the wait queue is full (retry after 6s)"
    );
    assert_eq!(report.get(), Some(EndReason::Rejected));
    assert_eq!((h.in_flight(), h.queued()), (1, 1));

    // 503 is configurable.
    let (up, _ctl) = upstream();
    let svc = BoundedAdmissionLayer::new(1)
        .with_queue_len(0)
        .with_queue_full_status(StatusCode::SERVICE_UNAVAILABLE)
        .layer(up);
    let _a = svc.clone().oneshot(request("a")).await.unwrap();
    let res = svc.clone().oneshot(request("b")).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(json(res).await["error"]["type"], "server_overloaded");
}

#[tokio::test(start_paused = true)]
async fn deadline_is_a_503() {
    let (up, mut ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_timeout(Duration::from_millis(800))
        .with_codel(None);
    let h = layer.handle();
    let svc = layer.layer(up);
    let _a = svc.clone().oneshot(request("a")).await.unwrap();
    let report = EndReport::new();
    let mut req = request("b");
    req.extensions_mut().insert(report.clone());
    let start = Instant::now();
    let res = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(800));
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(
        res.headers()[RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse::<u64>()
            .unwrap()
            >= 1
    );
    let outcome = res.extensions().get::<AdmissionOutcome>().unwrap().clone();
    assert_eq!(outcome.queue_wait, Duration::from_millis(800));
    assert_eq!(outcome.rejected, Some(OverloadReason::QueueTimeout));
    assert_eq!(json(res).await["error"]["code"], "queue_timeout");
    assert_eq!(report.get(), Some(EndReason::Rejected));
    assert_eq!(h.queued(), 0);
    assert_eq!(arrived(&mut ctl).len(), 1, "b never reached the upstream");
}

#[tokio::test(start_paused = true)]
async fn codel_shrinks_the_deadline_under_a_standing_queue_and_restores_it() {
    let (up, mut ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_len(10)
        .with_queue_timeout(Duration::from_secs(2))
        .with_codel(Some(Codel {
            interval: Duration::from_millis(100),
            target: Duration::from_millis(5),
        }));
    let h = layer.handle();
    let svc = layer.layer(up);
    let a = svc.clone().oneshot(request("a")).await.unwrap();
    // The queue is empty: b gets the full deadline.
    let b = spawn_call(&svc, request("b"));
    settle().await;
    // Within the interval the queue is not standing yet: c gets the full deadline too.
    advance(Duration::from_millis(50)).await;
    let c = spawn_call(&svc, request("c"));
    settle().await;
    // 150 ms without the queue ever being empty: standing. d may wait only 5 ms.
    advance(Duration::from_millis(100)).await;
    let start = Instant::now();
    let d = svc.clone().oneshot(request("d")).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(5));
    assert_eq!(d.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(h.queued(), 2);
    // The queue drains: a ends, b is admitted; b ends, c is admitted.
    let (_, tx_a) = arrived(&mut ctl).pop().unwrap();
    drop(tx_a);
    drain(a.into_body()).await.unwrap();
    let b = b.await.unwrap().unwrap();
    assert_eq!(b.status(), StatusCode::OK);
    drop(b);
    let c = c.await.unwrap().unwrap();
    assert_eq!(c.status(), StatusCode::OK);
    assert_eq!(h.queued(), 0);
    // The queue was empty: a new waiter gets the full deadline back.
    let start = Instant::now();
    let e = svc.clone().oneshot(request("e")).await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
    drop(c);
    assert_eq!(h.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_dropped_waiter_leaves_the_queue_at_once_and_holds_nothing() {
    let (up, mut ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(4)
        .with_max_request_share(1.0)
        .with_cost(Cost::from_fn(|p| {
            p.headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        }))
        .with_queue_timeout(Duration::from_secs(60));
    let h = layer.handle();
    let svc = layer.layer(up);
    let a = svc.clone().oneshot(request("a")).await.unwrap();
    assert_eq!(h.in_flight_units(), 1);
    // A big waiter (4 units) blocks the head of the line; a small one waits behind it.
    let mut big = request("big");
    big.headers_mut().insert("x-cost", "4".parse().unwrap());
    let big = spawn_call(&svc, big);
    settle().await;
    let small = spawn_call(&svc, request("small"));
    settle().await;
    assert_eq!(h.queued(), 2);
    // The big one's client goes away: it leaves the queue at once, and the small one behind
    // it now fits and is admitted without waiting for any release.
    big.abort();
    settle().await;
    assert_eq!(h.queued(), 0);
    let small = small.await.unwrap().unwrap();
    assert_eq!(small.status(), StatusCode::OK);
    assert_eq!(h.in_flight_units(), 2);
    let names: Vec<_> = arrived(&mut ctl).into_iter().map(|x| x.0).collect();
    assert_eq!(names, ["a", "small"]);
    drop((a, small));
    assert_eq!((h.in_flight(), h.in_flight_units(), h.queued()), (0, 0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_waiter_dropped_between_grant_and_poll_returns_its_permit() {
    let (up, mut ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1).with_queue_timeout(Duration::from_secs(60));
    let h = layer.handle();
    let svc = layer.layer(up);
    let a = svc.clone().oneshot(request("a")).await.unwrap();
    // Create the waiting future by hand and poll it once so it is queued.
    let mut fut = Box::pin(svc.clone().oneshot(request("b")));
    assert!(futures_poll_once(fut.as_mut()).await.is_none());
    assert_eq!(h.queued(), 1);
    // a ends: b is granted (the permit is in b's channel) but b is never polled again.
    drop(a);
    assert_eq!((h.in_flight(), h.queued()), (1, 0));
    drop(fut);
    assert_eq!(
        h.in_flight(),
        0,
        "the permit in the dropped channel is released"
    );
    assert_eq!(arrived(&mut ctl).len(), 1, "b never reached the upstream");
}

async fn futures_poll_once<F: std::future::Future + Unpin>(f: F) -> Option<F::Output> {
    let mut f = f;
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn error_flavour_returns_overloaded() {
    let (up, _ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_len(1)
        .with_queue_timeout(Duration::from_millis(300))
        .with_codel(None)
        .with_error_mode();
    let h = layer.handle();
    let svc = layer.layer(up);
    let a = svc.clone().oneshot(request("a")).await.unwrap();
    let b = tokio::spawn(svc.clone().oneshot(request("b")));
    settle().await;
    let e: BoxError = svc.clone().oneshot(request("c")).await.unwrap_err();
    let o = e.downcast_ref::<Overloaded>().expect("typed error");
    assert_eq!(o.reason(), OverloadReason::QueueFull);
    assert_eq!(o.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(o.retry_after().is_some());
    let e = b.await.unwrap().unwrap_err();
    let o = e.downcast_ref::<Overloaded>().unwrap();
    assert_eq!(o.reason(), OverloadReason::QueueTimeout);
    assert_eq!(o.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(o.queue_wait(), Duration::from_millis(300));
    // Inner errors are boxed as they are.
    let mut req = request("f");
    req.headers_mut().insert("x-fail", "1".parse().unwrap());
    drop(a);
    let e = svc.clone().oneshot(req).await.unwrap_err();
    assert!(e.downcast_ref::<io::Error>().is_some());
    assert_eq!(h.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn cost_is_weighted_and_capped() {
    let (up, _ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(16)
        .with_cost(Cost::max_tokens(100))
        .with_max_request_share(0.25);
    let h = layer.handle();
    let svc = layer.layer(up);
    let mut r = request("a");
    r.extensions_mut()
        .insert(RequestFacts::new().with_max_tokens(250));
    let a = svc.clone().oneshot(r).await.unwrap();
    assert_eq!(h.in_flight_units(), 3);
    assert_eq!(a.extensions().get::<AdmissionOutcome>().unwrap().units, 3);
    // A huge request is capped at a quarter of the capacity.
    let mut r = request("b");
    r.extensions_mut()
        .insert(RequestFacts::new().with_max_tokens(100_000));
    let b = svc.clone().oneshot(r).await.unwrap();
    assert_eq!(h.in_flight_units(), 3 + 4);
    drop((a, b));
    assert_eq!(h.in_flight_units(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_reports_the_units_capped_at_the_current_limit() {
    let (up, _ctl) = upstream();
    // The adaptive limit starts at its minimum (4) for the seed probe, under a ceiling of 64.
    let layer = BoundedAdmissionLayer::new(64)
        .with_adaptive_limit(Some(tailguard_admission::AdaptiveLimit::new().with_min(4)))
        .with_cost(Cost::max_tokens(100))
        .with_max_request_share(0.25)
        .with_queue_len(0);
    let h = layer.handle();
    let svc = layer.layer(up);
    assert_eq!(h.limit(), 4);
    let mut held = Vec::new();
    for id in ["a", "b", "c", "d"] {
        held.push(svc.clone().oneshot(request(id)).await.unwrap());
    }
    // Cost 10 is capped at a quarter of the capacity (16) by its weight, and at a quarter of
    // the current limit (1) by the gate: the refusal reports what the gate decided on.
    let mut r = request("e");
    r.extensions_mut()
        .insert(RequestFacts::new().with_max_tokens(1_000));
    let res = svc.clone().oneshot(r).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    let o = res.extensions().get::<AdmissionOutcome>().unwrap();
    assert_eq!(o.units, 1, "{o:?}");
    drop(held);
}

#[tokio::test(start_paused = true)]
async fn a_big_request_is_not_starved_by_small_ones() {
    let (up, _ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(4)
        .with_max_request_share(1.0)
        .with_queue_len(100)
        .with_queue_timeout(Duration::from_secs(60))
        .with_codel(None)
        .with_cost(Cost::from_fn(|p| {
            p.headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        }));
    let h = layer.handle();
    let svc = layer.layer(up);
    let mut held = vec![svc.clone().oneshot(request("s0")).await.unwrap()];
    let mut big = request("big");
    big.headers_mut().insert("x-cost", "4".parse().unwrap());
    let big = spawn_call(&svc, big);
    settle().await;
    // Small requests keep arriving; they queue behind the big one instead of overtaking it.
    let smalls: Vec<_> = (0..3)
        .map(|i| spawn_call(&svc, request(&format!("s{}", i + 1))))
        .collect();
    settle().await;
    assert_eq!(h.in_flight_units(), 1);
    assert_eq!(h.queued(), 4);
    held.clear();
    let big = big.await.unwrap().unwrap();
    assert_eq!(h.in_flight_units(), 4);
    drop(big);
    for s in smalls {
        held.push(s.await.unwrap().unwrap());
    }
    assert_eq!(h.in_flight_units(), 3);
}

#[tokio::test(start_paused = true)]
async fn retry_after_follows_the_hold_times() {
    async fn retry_after_with_streams_of(len: Duration) -> u64 {
        let (up, mut ctl) = upstream();
        let layer = BoundedAdmissionLayer::new(1)
            .with_queue_len(1)
            .with_codel(None);
        let svc = layer.layer(up);
        // Ten streams back to back, each `len` long.
        for i in 0..10 {
            let res = svc.clone().oneshot(request(&i.to_string())).await.unwrap();
            let (_, tx) = arrived(&mut ctl).pop().unwrap();
            sleep(len).await;
            drop(tx);
            drain(res.into_body()).await.unwrap();
        }
        let _a = svc.clone().oneshot(request("a")).await.unwrap();
        let _b = spawn_call(&svc, request("b"));
        settle().await;
        let res = svc.clone().oneshot(request("c")).await.unwrap();
        assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
        res.headers()[RETRY_AFTER]
            .to_str()
            .unwrap()
            .parse()
            .unwrap()
    }
    // 2 units (b and c) through the one slot, each stream holding it 2 s: a few seconds.
    let slow = retry_after_with_streams_of(Duration::from_secs(2)).await;
    assert!((3..=6).contains(&slow), "slow drain: {slow}");
    // Streams ten times shorter: the floor of 1 s.
    let fast = retry_after_with_streams_of(Duration::from_millis(200)).await;
    assert_eq!(fast, 1);
}

#[tokio::test(start_paused = true)]
async fn adaptive_lifo_serves_the_newest_while_standing() {
    let (up, mut ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_len(10)
        .with_queue_timeout(Duration::from_secs(60))
        .with_codel(Some(Codel {
            interval: Duration::from_millis(100),
            target: Duration::from_secs(30),
        }))
        .with_aging(None)
        .with_adaptive_lifo(true);
    let svc = layer.layer(up);
    let a = svc.clone().oneshot(request("a")).await.unwrap();
    let first = spawn_call(&svc, request("first"));
    settle().await;
    advance(Duration::from_millis(200)).await;
    let last = spawn_call(&svc, request("last"));
    settle().await;
    drop(a);
    let last = last.await.unwrap().unwrap();
    assert_eq!(last.status(), StatusCode::OK);
    assert!(!first.is_finished());
    let names: Vec<_> = arrived(&mut ctl).into_iter().map(|x| x.0).collect();
    assert_eq!(names, ["a", "last"]);
    drop(last);
    assert_eq!(first.await.unwrap().unwrap().status(), StatusCode::OK);
}

/// The response future is `Send`, admitted or queued (the readiness it forwards is pinned down
/// by `tests/readiness.rs`).
#[tokio::test(start_paused = true)]
async fn the_response_future_is_send_admitted_or_queued() {
    fn assert_send<T: Send>(_: &T) {}
    let (up, mut ctl) = upstream();
    let mut svc = BoundedAdmissionLayer::new(1).layer(up);
    let admitted = svc.ready().await.unwrap().call(request("a"));
    assert_send(&admitted);
    let a = admitted.await.unwrap();
    assert_eq!(a.status(), StatusCode::OK);
    let queued = svc.ready().await.unwrap().call(request("b"));
    assert_send(&queued);
    let queued = tokio::spawn(queued);
    settle().await;
    assert!(!queued.is_finished(), "b waits for a's permit");
    drop(a);
    assert_eq!(queued.await.unwrap().unwrap().status(), StatusCode::OK);
    let names: Vec<_> = arrived(&mut ctl).into_iter().map(|x| x.0).collect();
    assert_eq!(names, ["a", "b"]);
}

#[tokio::test(start_paused = true)]
async fn outcome_extension_can_be_turned_off_for_admitted_responses() {
    let (up, _ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_len(0)
        .with_response_outcome(false);
    let svc = layer.layer(up);
    let a = svc.clone().oneshot(request("a")).await.unwrap();
    assert!(a.extensions().get::<AdmissionOutcome>().is_none());
    // Refusals always say why.
    let b = svc.clone().oneshot(request("b")).await.unwrap();
    assert_eq!(
        b.extensions().get::<AdmissionOutcome>().unwrap().rejected,
        Some(OverloadReason::QueueFull)
    );
}

#[tokio::test(start_paused = true)]
async fn a_refused_grpc_request_gets_a_trailers_only_grpc_response() {
    let (up, _ctl) = upstream();
    let svc = BoundedAdmissionLayer::new(1).with_queue_len(0).layer(up);
    let _a = svc.clone().oneshot(request("a")).await.unwrap();
    let mut req = request("b");
    req.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/grpc"),
    );
    let res = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-type"], "application/grpc");
    // RESOURCE_EXHAUSTED.
    assert_eq!(res.headers()["grpc-status"], "8");
    assert!(res.headers().contains_key("grpc-message"));
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(body.is_empty());
}

/// Admission reads the stream when no layer inside it does (here for the adaptive limit's first
/// token, fair queueing off): it reads it to the end, so a layer outside that follows the
/// request's progress record (the phase recorder) sees every token, not only the first.
#[tokio::test(start_paused = true)]
async fn as_the_streams_reader_admission_reads_it_to_the_end() {
    use tailguard_core::Dialect;
    use tailguard_core::progress::StreamProgress;
    let (up, mut ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(4)
        .with_adaptive_limit(Some(tailguard_admission::AdaptiveLimit::new()))
        .with_tenant_fairness(false);
    let svc = layer.layer(up);
    let mut r = request("a");
    r.headers_mut()
        .insert("x-sse", http::HeaderValue::from_static("1"));
    let outer = StreamProgress::of(r.extensions_mut());
    let res = svc.oneshot(r).await.unwrap();
    let mut follows = outer.reading(&Dialect::Auto, res.headers());
    assert!(
        !follows.is_reader(),
        "admission reads, the outer layer follows"
    );
    let feed = arrived(&mut ctl).remove(0).1;
    for _ in 0..5 {
        feed.send(data(TOKEN)).unwrap();
    }
    drop(feed);
    let mut body = res.into_body();
    while let Some(frame) = body.frame().await {
        follows.observe(frame.unwrap().data_ref().unwrap());
    }
    assert_eq!(follows.tokens(), 5);
}
