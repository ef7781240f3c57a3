//! Priority-aware admission: ordering, reserved shares, eviction, aging; with PriorityClass.

mod common;

use std::time::Duration;

use common::*;
use http::StatusCode;
use tailguard_admission::{BoundedAdmissionLayer, Codel};
use tailguard_core::{AdmissionOutcome, ClassPolicy, OverloadReason, Priority};
use tailguard_priority::PriorityClassLayer;
use tokio::time::advance;
use tower::{Layer, ServiceBuilder, ServiceExt};

fn names(ctl: &mut tokio::sync::mpsc::UnboundedReceiver<(String, Feed)>) -> Vec<String> {
    arrived(ctl).into_iter().map(|x| x.0).collect()
}

#[tokio::test(start_paused = true)]
async fn interactive_is_admitted_ahead_of_batch() {
    let (up, mut ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_len(10)
        .with_queue_timeout(Duration::from_secs(60))
        .with_aging(None);
    let h = layer.handle();
    let svc = layer.layer(up);
    let a = svc.clone().oneshot(request("a")).await.unwrap();
    let b1 = spawn_call(&svc, request_of("b1", Priority::batch()));
    let b2 = spawn_call(&svc, request_of("b2", Priority::batch()));
    settle().await;
    let i1 = spawn_call(&svc, request_of("i1", Priority::interactive()));
    let s1 = spawn_call(&svc, request_of("s1", Priority::standard()));
    settle().await;
    assert_eq!(h.queued_of(&Priority::batch()), 2);
    assert_eq!(names(&mut ctl), ["a"]);
    drop(a);
    let mut order = Vec::new();
    for fut in [i1, s1, b1, b2] {
        let res = fut.await.unwrap().unwrap();
        order.extend(names(&mut ctl));
        drop(res);
    }
    assert_eq!(order, ["i1", "s1", "b1", "b2"]);
    assert_eq!((h.in_flight(), h.queued()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn reserved_shares_hold_under_contention_and_are_borrowed_when_idle() {
    let (up, mut ctl) = upstream();
    // Batch reserves half of the capacity through the policy PriorityClass hands down.
    let classes = PriorityClassLayer::new().with_policy(
        Priority::batch(),
        ClassPolicy::new().with_reserved_share(0.5),
    );
    let admission = BoundedAdmissionLayer::new(4)
        .with_queue_len(10)
        .with_queue_timeout(Duration::from_secs(60))
        .with_aging(None);
    let h = admission.handle();
    let svc = ServiceBuilder::new()
        .layer(classes)
        .layer(admission)
        .service(up);
    let req = |id: &str, class: &str| {
        http::Request::builder()
            .header("x-id", id)
            .header("x-priority", class)
            .body(())
            .unwrap()
    };
    // Idle: interactive borrows all four units, batch's reserved half included.
    let mut running = Vec::new();
    for i in 0..4 {
        running.push(
            svc.clone()
                .oneshot(req(&format!("i{i}"), "interactive"))
                .await
                .unwrap(),
        );
    }
    assert_eq!(h.in_flight_units_of(&Priority::interactive()), 4);
    // Contention: three interactive wait, then two batch.
    let mut waiting = Vec::new();
    for id in ["i4", "i5", "i6"] {
        waiting.push(tokio::spawn(svc.clone().oneshot(req(id, "interactive"))));
    }
    settle().await;
    for id in ["b0", "b1"] {
        waiting.push(tokio::spawn(svc.clone().oneshot(req(id, "batch"))));
    }
    settle().await;
    names(&mut ctl);
    // Each release goes to batch until it holds its reserved two units, then to interactive.
    let mut order = Vec::new();
    for _ in 0..3 {
        running.remove(0);
        settle().await;
        order.extend(names(&mut ctl));
    }
    assert_eq!(order, ["b0", "b1", "i4"]);
    assert_eq!(h.in_flight_units_of(&Priority::batch()), 2);
    assert_eq!(h.in_flight_units_of(&Priority::interactive()), 2);
    drop(running);
    for w in waiting {
        drop(w.await.unwrap().unwrap());
    }
    assert_eq!((h.in_flight(), h.queued()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn when_full_the_youngest_waiter_of_the_lowest_class_is_shed_first() {
    let (up, _ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_len(3)
        .with_queue_timeout(Duration::from_secs(60));
    let h = layer.handle();
    let svc = layer.layer(up);
    let _a = svc.clone().oneshot(request("a")).await.unwrap();
    let b_old = spawn_call(&svc, request_of("b_old", Priority::batch()));
    settle().await;
    let s = spawn_call(&svc, request_of("s", Priority::sheddable()));
    settle().await;
    let b_young = spawn_call(&svc, request_of("b_young", Priority::batch()));
    settle().await;
    assert_eq!(h.queued(), 3);
    // An interactive arrival evicts the sheddable waiter (lowest class) first...
    let _i1 = spawn_call(&svc, request_of("i1", Priority::interactive()));
    settle().await;
    let res = s.await.unwrap().unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(
        res.extensions().get::<AdmissionOutcome>().unwrap().rejected,
        Some(OverloadReason::Evicted)
    );
    // ...then the youngest batch waiter.
    let _i2 = spawn_call(&svc, request_of("i2", Priority::interactive()));
    settle().await;
    assert!(b_young.is_finished());
    assert!(!b_old.is_finished());
    let res = b_young.await.unwrap().unwrap();
    let body = drain(res.into_body()).await.unwrap();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["code"], "evicted");
    // An arrival of the lowest waiting class (or lower) finds the queue full.
    let res = svc
        .clone()
        .oneshot(request_of("b2", Priority::batch()))
        .await
        .unwrap();
    assert_eq!(
        res.extensions().get::<AdmissionOutcome>().unwrap().rejected,
        Some(OverloadReason::QueueFull)
    );
    // Equal classes never evict each other.
    let _i3 = spawn_call(&svc, request_of("i3", Priority::interactive()));
    settle().await;
    assert!(b_old.is_finished(), "the last batch waiter went for i3");
    let res = svc
        .clone()
        .oneshot(request_of("i4", Priority::interactive()))
        .await
        .unwrap();
    assert_eq!(
        res.extensions().get::<AdmissionOutcome>().unwrap().rejected,
        Some(OverloadReason::QueueFull)
    );
    assert_eq!(h.queued_of(&Priority::interactive()), 3);
}

#[tokio::test(start_paused = true)]
async fn aging_lets_an_old_batch_request_through() {
    async fn first_admitted(aging: Option<Duration>) -> String {
        let (up, mut ctl) = upstream();
        let layer = BoundedAdmissionLayer::new(1)
            .with_queue_len(10)
            .with_queue_timeout(Duration::from_secs(60))
            .with_codel(None)
            .with_aging(aging);
        let svc = layer.layer(up);
        let a = svc.clone().oneshot(request("a")).await.unwrap();
        let b = spawn_call(&svc, request_of("batch", Priority::batch()));
        settle().await;
        advance(Duration::from_secs(1)).await;
        let i = spawn_call(&svc, request_of("interactive", Priority::interactive()));
        settle().await;
        names(&mut ctl);
        drop(a);
        settle().await;
        let first = names(&mut ctl).remove(0);
        for j in [b, i] {
            drop(j.await.unwrap().unwrap());
        }
        first
    }
    // With 200 ms aging, one second of waiting lifts batch (10) by 50 levels: above 30.
    assert_eq!(
        first_admitted(Some(Duration::from_millis(200))).await,
        "batch"
    );
    // Without aging the fresh interactive request goes first.
    assert_eq!(first_admitted(None).await, "interactive");
}

#[tokio::test(start_paused = true)]
async fn layer_configured_share_and_default_class() {
    let (up, mut ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(2)
        .with_queue_len(10)
        .with_queue_timeout(Duration::from_secs(60))
        .with_aging(None)
        .with_default_priority(Priority::batch())
        .with_reserved_share(Priority::sheddable(), 0.5);
    let h = layer.handle();
    let svc = layer.layer(up);
    let a = svc.clone().oneshot(request("a")).await.unwrap();
    let b = svc.clone().oneshot(request("b")).await.unwrap();
    assert_eq!(
        h.in_flight_of(&Priority::batch()),
        2,
        "no Priority: the default class"
    );
    let w1 = spawn_call(&svc, request_of("i", Priority::interactive()));
    settle().await;
    let w2 = spawn_call(&svc, request_of("x", Priority::sheddable()));
    settle().await;
    names(&mut ctl);
    drop(a);
    settle().await;
    assert_eq!(
        names(&mut ctl),
        ["x"],
        "the reserved share beats the higher class"
    );
    drop(b);
    settle().await;
    assert_eq!(names(&mut ctl), ["i"]);
    for w in [w1, w2] {
        drop(w.await.unwrap().unwrap());
    }
    assert_eq!(h.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn an_arrival_admitted_at_once_evicts_nobody() {
    let (up, mut ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(4)
        .with_queue_len(1)
        .with_max_request_share(1.0)
        .with_queue_timeout(Duration::from_secs(60))
        .with_cost(tailguard_admission::Cost::from_fn(|p| {
            p.headers
                .get("x-cost")
                .and_then(|v| v.to_str().ok()?.parse().ok())
                .unwrap_or(1)
        }));
    let h = layer.handle();
    let svc = layer.layer(up);
    let _a = svc.clone().oneshot(request("a")).await.unwrap();
    // A big batch waiter (4 units) fills the queue; 3 units are free but it does not fit.
    let mut big = request_of("big", Priority::batch());
    big.headers_mut().insert("x-cost", "4".parse().unwrap());
    let big = spawn_call(&svc, big);
    settle().await;
    assert_eq!(h.queued(), 1);
    // An interactive request of 1 unit outranks it and fits: admitted, and the batch waiter
    // keeps its place.
    let i = svc
        .clone()
        .oneshot(request_of("i", Priority::interactive()))
        .await
        .unwrap();
    assert_eq!(i.status(), StatusCode::OK);
    assert_eq!(h.queued(), 1);
    assert!(!big.is_finished());
    assert_eq!(names(&mut ctl), ["a", "i"]);
}

/// Issue 30: capacity 4, queue 4, eight slow `standard` streams (four running, four queued for
/// longer than the CoDel interval). An `interactive` arrival evicts the newest standard waiter,
/// is not held to the CoDel target by the standard queue standing behind it, and is admitted
/// first when a stream ends.
#[tokio::test(start_paused = true)]
async fn interactive_gets_through_a_standing_queue_of_standard() {
    let (up, mut ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(4)
        .with_queue_len(4)
        .with_codel(Some(Codel::default()));
    let h = layer.handle();
    let svc = layer.layer(up);
    let mut running = Vec::new();
    for i in 0..4 {
        let req = request_of(&format!("s{i}"), Priority::standard());
        running.push(svc.clone().oneshot(req).await.unwrap());
    }
    let queued: Vec<_> = (4..8)
        .map(|i| spawn_call(&svc, request_of(&format!("s{i}"), Priority::standard())))
        .collect();
    settle().await;
    assert_eq!(h.queued(), 4);
    // The standard queue stands: longer than the CoDel interval (100 ms).
    advance(Duration::from_millis(300)).await;
    let probe = spawn_call(&svc, request_of("i0", Priority::interactive()));
    settle().await;
    // Far past the CoDel target (5 ms): still waiting, not refused.
    advance(Duration::from_millis(500)).await;
    settle().await;
    assert!(!probe.is_finished(), "interactive was refused");
    drop(running.pop());
    let probe = probe.await.unwrap().unwrap();
    assert_eq!(probe.status(), StatusCode::OK);
    let got: Vec<_> = names(&mut ctl);
    assert_eq!(got.last().map(String::as_str), Some("i0"));
    // The newest standard waiter made room for it.
    let mut evicted = 0;
    for q in queued {
        if q.is_finished() {
            let res = q.await.unwrap().unwrap();
            assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
            let outcome = res.extensions().get::<AdmissionOutcome>().unwrap();
            assert_eq!(outcome.rejected, Some(OverloadReason::Evicted));
            evicted += 1;
        }
    }
    assert_eq!(evicted, 1);
}
