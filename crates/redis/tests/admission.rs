//! Cluster-mode admission against a real redis-server (scripts/redis.sh starts one and sets
//! TAILGUARD_REDIS_URL; without it these tests fail under CI, and say so and skip elsewhere).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{OwnRedis, Streams, free_port, pool, redis_url, upstream};
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tailguard_admission::LeaseSpec;
use tailguard_admission::{BoundedAdmissionLayer, Cluster, FailMode, LeaseBackend};
use tailguard_redis::{Redis, RedisLeases};
use tower::{Layer, ServiceExt};

const TIMEOUT: Duration = Duration::from_millis(200);
/// Far longer than anything here may take: a request still unanswered then has hung.
const HANG: Duration = Duration::from_secs(20);

fn leases(url: &str) -> Arc<RedisLeases> {
    let redis = Redis::new(url, TIMEOUT).expect("redis url");
    Arc::new(RedisLeases::new(redis, "tailguard-test"))
}

/// A gate of local capacity 8 in front of a cluster capacity of `capacity`.
fn gate(url: &str, pool: &str, capacity: u32, fail: FailMode) -> BoundedAdmissionLayer {
    let cluster = Cluster::new(leases(url), pool, capacity)
        .with_fail_mode(fail)
        .with_timeout(TIMEOUT)
        .with_lease_ttl(Duration::from_secs(1));
    BoundedAdmissionLayer::new(8)
        .with_queue_len(40)
        .with_codel(None)
        .with_queue_timeout(Duration::from_secs(5))
        .with_cluster(cluster)
}

/// One request through `gate` to an upstream streaming for `d`, its body read to the end: the
/// status, the `Retry-After` and the error code of a refusal.
async fn send(gate: &BoundedAdmissionLayer, d: Duration, streams: &Streams) -> Answer {
    let svc = gate.layer(upstream(d, streams.clone()));
    let res = tokio::time::timeout(HANG, async {
        let res = svc.oneshot(Request::new(())).await.expect("infallible");
        let status = res.status();
        let retry = res.headers().get(http::header::RETRY_AFTER).is_some();
        let body = res.into_body().collect().await.expect("body").to_bytes();
        let code = serde_code(&body);
        Answer {
            status,
            retry,
            code,
        }
    });
    res.await.expect("a request hung")
}

#[derive(Debug)]
struct Answer {
    status: StatusCode,
    retry: bool,
    code: String,
}

impl Answer {
    fn refused_honestly(&self) -> bool {
        matches!(self.status.as_u16(), 429 | 503) && self.retry
    }
}

fn serde_code(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    text.split("\"code\":\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap_or("")
        .to_owned()
}

/// Three gates (each with its own connection, as three gateways have) share a capacity of 8:
/// 100 concurrent streams never put more than 8 in flight at the upstream, and every request
/// is answered: admitted, or refused with a status and a `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gates_sharing_a_capacity_of_8_never_exceed_it() {
    let Some(url) = redis_url("three_gates_sharing_a_capacity_of_8_never_exceed_it") else {
        return;
    };
    let pool = pool("limit");
    let streams = Streams::default();
    let gates: Vec<_> = (0..3)
        .map(|_| gate(&url, &pool, 8, FailMode::Closed))
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..100 {
        let (g, s) = (gates[i % 3].clone(), streams.clone());
        tasks.spawn(async move { send(&g, Duration::from_millis(50), &s).await });
    }
    let answers = tasks.join_all().await;
    let admitted = answers
        .iter()
        .filter(|a| a.status == StatusCode::OK)
        .count();
    eprintln!(
        "100 streams over 3 gates: {admitted} admitted, at most {} in flight at the upstream",
        streams.max()
    );
    assert!(streams.max() <= 8, "{} streams at once", streams.max());
    assert!(
        answers
            .iter()
            .all(|a| a.status == StatusCode::OK || a.refused_honestly()),
        "{answers:?}"
    );
    // The capacity was used and reused, not just refused.
    assert!(admitted > 8, "{answers:?}");
}

/// A holder that never releases (a gateway killed mid-stream: no release, no renewal) leaks
/// its lease for one TTL; then the capacity is back.
#[tokio::test]
async fn a_lease_never_released_is_reclaimed_after_its_ttl() {
    let Some(url) = redis_url("a_lease_never_released_is_reclaimed_after_its_ttl") else {
        return;
    };
    let b = leases(&url);
    let spec = LeaseSpec {
        pool: pool("crash").into(),
        class: "standard".into(),
        units: 1,
        pool_capacity: 2,
        class_capacity: 2,
        ttl: Duration::from_secs(1),
    };
    for _ in 0..2 {
        assert!(b.try_acquire(&spec).await.expect("redis").is_some());
    }
    assert!(b.try_acquire(&spec).await.expect("redis").is_none(), "full");
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    assert!(
        b.try_acquire(&spec).await.expect("redis").is_some(),
        "the leaked leases expired"
    );
}

/// A lease is renewed while its body streams: a stream longer than the TTL keeps its
/// capacity, and another gate waits until it ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_is_renewed_while_its_body_streams() {
    let Some(url) = redis_url("a_lease_is_renewed_while_its_body_streams") else {
        return;
    };
    let pool = pool("renew");
    let streams = Streams::default();
    let (a, b) = (
        gate(&url, &pool, 1, FailMode::Closed),
        gate(&url, &pool, 1, FailMode::Closed).with_queue_timeout(Duration::from_millis(300)),
    );
    let long = {
        let s = streams.clone();
        tokio::spawn(async move { send(&a, Duration::from_millis(2_500), &s).await })
    };
    // Past the TTL of the long stream's first lease: still held, renewed.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let refused = send(&b, Duration::from_millis(10), &streams).await;
    assert_eq!(
        refused.status,
        StatusCode::SERVICE_UNAVAILABLE,
        "{refused:?}"
    );
    assert_eq!(refused.code, "queue_timeout");
    assert_eq!(long.await.expect("task").status, StatusCode::OK);
    let after = send(&b, Duration::from_millis(10), &streams).await;
    assert_eq!(
        after.status,
        StatusCode::OK,
        "released at the end of the body"
    );
    assert_eq!(streams.max(), 1);
}

/// An unreachable Redis: fail open admits on the local limit, fail closed answers 503
/// `cluster_unavailable` with a `Retry-After`; neither hangs.
#[tokio::test]
async fn an_unreachable_redis_fails_open_or_closed_without_hanging() {
    let url = format!("redis://127.0.0.1:{}/", free_port());
    let streams = Streams::default();
    let open = send(
        &gate(&url, "down", 8, FailMode::Open),
        Duration::ZERO,
        &streams,
    )
    .await;
    assert_eq!(open.status, StatusCode::OK, "{open:?}");
    let closed = send(
        &gate(&url, "down", 8, FailMode::Closed),
        Duration::ZERO,
        &streams,
    )
    .await;
    assert_eq!(closed.status, StatusCode::SERVICE_UNAVAILABLE, "{closed:?}");
    assert_eq!(closed.code, "cluster_unavailable");
    assert!(closed.retry);
}

/// Redis restarted mid-run: while it is down the configured failure mode holds and nothing
/// hangs; once it is back the cluster limit is enforced again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_fails_closed_then_enforces_the_limit_again() {
    let port = free_port();
    let Some(server) = OwnRedis::start(port) else {
        return;
    };
    let url = format!("redis://127.0.0.1:{port}/");
    let pool = pool("restart");
    let streams = Streams::default();
    let closed =
        gate(&url, &pool, 1, FailMode::Closed).with_queue_timeout(Duration::from_millis(300));
    let open = gate(&url, &pool, 1, FailMode::Open);
    assert_eq!(
        send(&closed, Duration::ZERO, &streams).await.status,
        StatusCode::OK
    );

    drop(server);
    let down = send(&closed, Duration::ZERO, &streams).await;
    assert_eq!(
        (down.status, down.code.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "cluster_unavailable")
    );
    assert_eq!(
        send(&open, Duration::ZERO, &streams).await.status,
        StatusCode::OK
    );

    let _server = OwnRedis::start(port).expect("restarted");
    let mut back = false;
    for _ in 0..100 {
        if send(&closed, Duration::ZERO, &streams).await.status == StatusCode::OK {
            back = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(back, "admission resumed once Redis was back");
    // The limit holds again: one long stream, and a second request waits it out.
    let long = {
        let (g, s) = (open.clone(), streams.clone());
        tokio::spawn(async move { send(&g, Duration::from_millis(800), &s).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    let refused = send(&closed, Duration::ZERO, &streams).await;
    assert_eq!(
        (refused.status, refused.code.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "queue_timeout")
    );
    assert_eq!(long.await.expect("task").status, StatusCode::OK);
}
