//! `Retry-After` from the observed permit hold times: what a refused client is told, and that
//! honouring it finds room. Paused clock; streams are held by the client for a set time.

mod common;

use std::time::Duration;

use common::*;
use http::StatusCode;
use http::header::RETRY_AFTER;
use tailguard_admission::{BoundedAdmission, BoundedAdmissionLayer};
use tailguard_core::{AdmissionOutcome, OverloadReason, Priority};
use tokio::task::JoinHandle;
use tokio::time::{Instant, advance, sleep};
use tower::ServiceExt;
use tower::layer::Layer;

/// What a client saw: the status, and for a refusal its reason and `Retry-After` in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Seen {
    status: StatusCode,
    refusal: Option<(OverloadReason, u64)>,
}

fn seen(res: &Res) -> Seen {
    let refusal = res
        .extensions()
        .get::<AdmissionOutcome>()
        .and_then(|o| o.rejected)
        .map(|reason| {
            let secs = res.headers()[RETRY_AFTER]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            (reason, secs)
        });
    Seen {
        status: res.status(),
        refusal,
    }
}

/// Sends `req`; once admitted, the client holds the stream for `hold` and then drops it.
fn stream_for(
    svc: &BoundedAdmission<Upstream>,
    req: http::Request<()>,
    hold: Duration,
) -> JoinHandle<Seen> {
    let svc = svc.clone();
    tokio::spawn(async move {
        let res = svc.oneshot(req).await.unwrap();
        let s = seen(&res);
        if s.status == StatusCode::OK {
            sleep(hold).await;
        }
        s
    })
}

/// Sends `req`, which must be refused at once; the reason and `Retry-After`.
async fn refused(
    svc: &BoundedAdmission<Upstream>,
    req: http::Request<()>,
) -> (OverloadReason, u64) {
    let start = Instant::now();
    let res = svc.clone().oneshot(req).await.unwrap();
    assert_eq!(start.elapsed(), Duration::ZERO, "refused without waiting");
    seen(&res).refusal.expect("refused")
}

#[tokio::test(start_paused = true)]
async fn first_refusal_of_a_burst_says_at_least_how_long_slots_have_been_held() {
    let (up, _ctl) = upstream();
    // The default deadline (2 s): it used to be the figure before anything was released.
    let layer = BoundedAdmissionLayer::new(2).with_queue_len(2);
    let h = layer.handle();
    let svc = layer.layer(up);
    let long = Duration::from_secs(60);
    let _held: Vec<_> = (0..2)
        .map(|i| stream_for(&svc, request(&format!("s{i}")), long))
        .collect();
    settle().await;
    advance(Duration::from_secs(5)).await;
    // The streams have held both slots for 5 s and nothing was released yet; the queue fills.
    let queued: Vec<_> = (0..2)
        .map(|i| stream_for(&svc, request(&format!("q{i}")), long))
        .collect();
    settle().await;
    assert_eq!((h.in_flight(), h.queued()), (2, 2));

    let (reason, secs) = refused(&svc, request("late")).await;
    assert_eq!(reason, OverloadReason::QueueFull);
    assert!(secs >= 5, "{secs}");
    // 2 waiters ahead plus itself, each needing a slot held at least 5 s, 2 slots: 7.5 s.
    assert_eq!(secs, 8);

    // The waiters reach their deadline 2 s later: their 503s say at least as much.
    for q in queued {
        let s = q.await.unwrap();
        assert_eq!(s.status, StatusCode::SERVICE_UNAVAILABLE);
        let (reason, secs) = s.refusal.unwrap();
        assert_eq!(reason, OverloadReason::QueueTimeout);
        // At 7 s: one or no waiter ahead plus itself, 7 s per slot, 2 slots.
        assert!((4..=7).contains(&secs), "{secs}");
    }
}

#[tokio::test(start_paused = true)]
async fn evicted_and_timed_out_waiters_get_the_estimate_too() {
    let (up, _ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_len(1)
        .with_codel(None);
    let svc = layer.layer(up);
    let _a = stream_for(&svc, request("a"), Duration::from_secs(60));
    settle().await;
    advance(Duration::from_secs(3)).await;
    let batch = stream_for(&svc, request_of("b", Priority::batch()), Duration::ZERO);
    settle().await;
    let interactive = stream_for(
        &svc,
        request_of("i", Priority::interactive()),
        Duration::ZERO,
    );
    settle().await;
    // The interactive arrival evicts the batch waiter, which now has it ahead: 2 slots' worth
    // of a slot held at least 3 s.
    let s = batch.await.unwrap();
    assert_eq!(s.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(s.refusal, Some((OverloadReason::Evicted, 6)));
    // The interactive waiter's deadline passes at 5 s: one slot held at least 5 s.
    let s = interactive.await.unwrap();
    assert_eq!(s.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(s.refusal, Some((OverloadReason::QueueTimeout, 5)));
}

#[tokio::test(start_paused = true)]
async fn a_client_that_honours_retry_after_finds_room() {
    for secs in [3, 5, 12] {
        let hold = Duration::from_secs(secs);
        let (up, _ctl) = upstream();
        let layer = BoundedAdmissionLayer::new(2)
            .with_queue_len(2)
            .with_queue_timeout(Duration::from_secs(600))
            .with_codel(None);
        let h = layer.handle();
        let svc = layer.layer(up);
        // A first round of streams, each holding its slot for `hold`.
        let first: Vec<_> = (0..2)
            .map(|i| stream_for(&svc, request(&format!("w{i}")), hold))
            .collect();
        for f in first {
            assert_eq!(f.await.unwrap().status, StatusCode::OK);
        }
        advance(Duration::from_millis(500)).await;
        // A burst: two streams admitted, two queued behind them, all holding for `hold`.
        let burst: Vec<_> = (0..4)
            .map(|i| stream_for(&svc, request(&format!("b{i}")), hold))
            .collect();
        settle().await;
        assert_eq!((h.in_flight(), h.queued()), (2, 2));
        let (reason, after) = refused(&svc, request("client")).await;
        assert_eq!(reason, OverloadReason::QueueFull);
        // The client comes back when told, while the streams run their course.
        sleep(Duration::from_secs(after)).await;
        let retry = stream_for(&svc, request("client"), Duration::ZERO);
        settle().await;
        assert!(
            !retry.is_finished(),
            "hold {hold:?}: refused again after {after}s"
        );
        assert!(h.queued() + h.in_flight() >= 1);
        assert_eq!(retry.await.unwrap().status, StatusCode::OK);
        for b in burst {
            assert_eq!(b.await.unwrap().status, StatusCode::OK);
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_reserved_share_gives_its_class_its_own_figure() {
    /// In flight: 2 batch and 2 standard streams, held 4 s so far; queued: 7 standard, 1 batch.
    /// The figures told to a batch and a sheddable arrival.
    async fn figures(batch_share: Option<f64>) -> (u64, u64) {
        let (up, _ctl) = upstream();
        let mut layer = BoundedAdmissionLayer::new(4)
            .with_queue_len(8)
            .with_queue_timeout(Duration::from_secs(600))
            .with_codel(None)
            .with_aging(None);
        if let Some(share) = batch_share {
            layer = layer.with_reserved_share(Priority::batch(), share);
        }
        let h = layer.handle();
        let svc = layer.layer(up);
        let long = Duration::from_secs(600);
        let mut held = Vec::new();
        for i in 0..2 {
            held.push(stream_for(
                &svc,
                request_of(&format!("b{i}"), Priority::batch()),
                long,
            ));
            held.push(stream_for(&svc, request(&format!("s{i}")), long));
        }
        settle().await;
        advance(Duration::from_secs(4)).await;
        for i in 0..7 {
            held.push(stream_for(&svc, request(&format!("q{i}")), long));
        }
        held.push(stream_for(&svc, request_of("qb", Priority::batch()), long));
        settle().await;
        assert_eq!((h.in_flight(), h.queued()), (4, 8));
        let (r1, batch) = refused(&svc, request_of("batch", Priority::batch())).await;
        let (r2, shed) = refused(&svc, request_of("shed", Priority::sheddable())).await;
        assert_eq!(
            (r1, r2),
            (OverloadReason::QueueFull, OverloadReason::QueueFull)
        );
        (batch, shed)
    }
    // Without a share, both wait for the whole queue (8 + 1 units, 4 s per slot, 4 slots).
    assert_eq!(figures(None).await, (9, 9));
    // Half the capacity reserved for batch: its own waiter and itself go through its 2
    // reserved slots (2 units, 4 s per slot, 2 slots); the sheddable class still waits for all.
    assert_eq!(figures(Some(0.5)).await, (4, 9));
}

#[tokio::test(start_paused = true)]
async fn the_estimate_follows_hold_times_as_they_change() {
    let (up, _ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_len(1)
        .with_queue_timeout(Duration::from_secs(600))
        .with_codel(None);
    let svc = layer.layer(up);

    /// `n` streams back to back, each held `hold`.
    async fn rounds(svc: &BoundedAdmission<Upstream>, n: usize, hold: Duration) {
        for i in 0..n {
            let s = stream_for(svc, request(&format!("r{i}")), hold)
                .await
                .unwrap();
            assert_eq!(s.status, StatusCode::OK);
        }
    }
    /// One stream admitted and one queued, both held `hold`; after `after`, the figure told
    /// to a third; then both run their course.
    async fn probe(svc: &BoundedAdmission<Upstream>, hold: Duration, after: Duration) -> u64 {
        let a = stream_for(svc, request("a"), hold);
        settle().await;
        advance(after).await;
        let b = stream_for(svc, request("b"), hold);
        settle().await;
        let (reason, secs) = refused(svc, request("c")).await;
        assert_eq!(reason, OverloadReason::QueueFull);
        a.await.unwrap();
        b.await.unwrap();
        secs
    }

    rounds(&svc, 6, Duration::from_secs(4)).await;
    // 2 units ahead, 4 s per slot.
    let slow = probe(&svc, Duration::from_secs(4), Duration::ZERO).await;
    assert!((8..=9).contains(&slow), "{slow}");
    // Streams get shorter: the figure falls.
    rounds(&svc, 12, Duration::from_secs(1)).await;
    let fast = probe(&svc, Duration::from_secs(1), Duration::ZERO).await;
    assert!(fast < slow && fast <= 3, "{fast} after {slow}");
    // Streams get longer: the figure rises while the first long one is still held.
    let longer = probe(&svc, Duration::from_secs(10), Duration::from_secs(6)).await;
    assert!(longer > fast, "{longer} after {fast}");
}

/// `req` with a client deadline of `deadline` in the default header.
fn with_deadline(id: &str, deadline: &str) -> http::Request<()> {
    let mut req = request(id);
    req.headers_mut()
        .insert("x-request-timeout", deadline.parse().unwrap());
    req
}

#[tokio::test(start_paused = true)]
async fn a_deadline_shorter_than_the_expected_wait_is_refused_at_once() {
    let (up, _ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_len(4)
        .with_queue_timeout(Duration::from_secs(30))
        .with_codel(None);
    let h = layer.handle();
    let svc = layer.layer(up);
    // One stream holds the slot for 10 s, then another for 10 s: holds of 10 s are seen.
    stream_for(&svc, request("a"), Duration::from_secs(10))
        .await
        .unwrap();
    let _held = stream_for(&svc, request("b"), Duration::from_secs(60));
    settle().await;
    advance(Duration::from_secs(5)).await;
    // The expected wait is about 10 s: a 2 s deadline cannot make it.
    let (reason, after) = refused(&svc, with_deadline("short", "2")).await;
    assert_eq!(reason, OverloadReason::DeadlineTooShort);
    assert!(after >= 5, "Retry-After {after}");
    let res = svc
        .clone()
        .oneshot(with_deadline("short2", "2s"))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(h.queued(), 0, "never queued");
    // A 12 s deadline is queued, and waits no longer than it: refused at 12 s, not at 30 s.
    let start = Instant::now();
    let waiting = stream_for(&svc, with_deadline("long", "12"), Duration::ZERO);
    settle().await;
    assert_eq!(h.queued(), 1);
    let s = waiting.await.unwrap();
    assert_eq!(start.elapsed(), Duration::from_secs(12));
    assert_eq!(s.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(s.refusal.map(|r| r.0), Some(OverloadReason::QueueTimeout));
}
