//! `ReplicaSet` on its own, driven through core's attempt protocol as any sender of attempts
//! (the hedge, or a user's own) drives it: no `tailguard-hedge` here.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use tailguard_core::attempt::{Attempt, Settle};
use tailguard_route::{ReplicaBody, ReplicaSet};
use tower::{Service, ServiceExt, service_fn};

type Replica = tower::util::ServiceFn<
    fn(Request<()>) -> std::future::Ready<Result<Response<Full<Bytes>>, Infallible>>,
>;

/// `n` replicas; which one an attempt went to, the set records in its `Attempt`.
fn replicas(n: u8) -> Vec<Replica> {
    fn answer(_: Request<()>) -> std::future::Ready<Result<Response<Full<Bytes>>, Infallible>> {
        std::future::ready(Ok(Response::new(Full::new(Bytes::from_static(b"ok")))))
    }
    (0..n).map(|_| service_fn(answer as fn(_) -> _)).collect()
}

/// Sends one attempt; the replica it went to (its index, as the set recorded it) and the body.
async fn send(
    set: &ReplicaSet<Replica>,
    attempt: &Attempt,
) -> (u64, Response<ReplicaBody<Full<Bytes>>>) {
    let mut req = Request::new(());
    req.extensions_mut().insert(attempt.clone());
    let res = set.clone().oneshot(req).await.unwrap();
    let replica = attempt.tried().last().unwrap().0;
    (replica, res)
}

#[tokio::test(start_paused = true)]
async fn failures_a_sender_reports_eject_a_replica_from_primary_selection() {
    let set = ReplicaSet::new(replicas(2));
    // The sender reports every attempt on replica 0 failed before its first token, every
    // attempt on replica 1 a first token at once.
    let mut failures = 0;
    while failures < 5 {
        let attempt = Attempt::primary();
        let (replica, _res) = send(&set, &attempt).await;
        if replica == 0 {
            attempt.settle(Settle::Failed);
            failures += 1;
        } else {
            attempt.settle(Settle::Token);
        }
    }
    // Five in a row: replica 0 is out of primary selection (for 30 s by default).
    for _ in 0..20 {
        let attempt = Attempt::primary();
        let (replica, _res) = send(&set, &attempt).await;
        assert_eq!(replica, 1);
        attempt.settle(Settle::Token);
    }
    // After the ejection period it is back, to be probed.
    tokio::time::advance(Duration::from_secs(31)).await;
    let mut back = false;
    for _ in 0..20 {
        let attempt = Attempt::primary();
        back |= send(&set, &attempt).await.0 == 0;
        attempt.settle(Settle::Token);
    }
    assert!(back, "replica 0 gets primaries again");
}

#[tokio::test(start_paused = true)]
async fn a_slot_is_held_until_the_body_ends_or_is_dropped() {
    let mut set = ReplicaSet::new(replicas(1)).with_slots(Some(1));
    assert_eq!(set.total_slots(), Some(1));
    let (_, first) = send(&set, &Attempt::primary()).await;
    // The one slot is taken: the next attempt waits in the set.
    let waiting = tokio::spawn({
        let set = set.clone();
        async move { send(&set, &Attempt::primary()).await.1 }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!waiting.is_finished());
    // The first body read to its end frees the slot.
    let bytes = first.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(&bytes[..], b"ok");
    let second = waiting.await.unwrap();
    // Dropped unread, a body frees its slot too.
    drop(second);
    set.ready().await.unwrap();
    let res = set.call(Request::new(())).await.unwrap();
    assert!(res.into_body().collect().await.is_ok());
}

/// Issue 32: every response says which replica served it, as the `upstream` label the recorder
/// reads: `replica-{index}` by default, the names given, the base's authority for a set made
/// from base URIs; a name the replica set itself is kept.
#[tokio::test(start_paused = true)]
async fn responses_carry_their_replicas_upstream_label() {
    use tailguard_core::Upstream;
    let label = |res: &Response<ReplicaBody<Full<Bytes>>>| {
        res.extensions()
            .get::<Upstream>()
            .map(|u| u.as_str().to_owned())
    };
    let set = ReplicaSet::new(replicas(2));
    let primary = Attempt::primary();
    let (i, res) = send(&set, &primary).await;
    assert_eq!(label(&res), Some(format!("replica-{i}")));
    let named = ReplicaSet::new(replicas(2)).with_names(["vllm-a", "vllm-b"]);
    let primary = Attempt::primary();
    let (i, res) = send(&named, &primary).await;
    assert_eq!(
        label(&res),
        Some(["vllm-a", "vllm-b"][i as usize].to_owned())
    );

    // From base URIs: the authority; a replica's own label wins.
    let own = service_fn(|_: Request<()>| async {
        let mut res = Response::new(Full::new(Bytes::new()));
        res.extensions_mut().insert(Upstream::new("own"));
        Ok::<_, Infallible>(res)
    });
    let bases: Vec<http::Uri> = vec!["http://10.0.0.7:8000/v1".parse().unwrap()];
    let set = ReplicaSet::from_base_uris(
        service_fn(|_: Request<()>| async {
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::new())))
        }),
        &bases,
    )
    .unwrap();
    let res = set.clone().oneshot(Request::new(())).await.unwrap();
    assert_eq!(
        res.extensions().get::<Upstream>().unwrap().as_str(),
        "10.0.0.7:8000"
    );
    let res = ReplicaSet::new([own])
        .oneshot(Request::new(()))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Upstream>().unwrap().as_str(), "own");
}
