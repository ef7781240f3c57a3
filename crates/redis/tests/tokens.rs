//! Token budgets shared through a real redis-server (scripts/redis.sh starts one and sets
//! TAILGUARD_REDIS_URL; without it these tests fail under CI, and say so and skip elsewhere).

mod common;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use common::{OwnRedis, free_port, pool, redis_url};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tailguard_admission::FailMode;
use tailguard_core::render::retry_after_secs;
use tailguard_core::{RequestFacts, Tenant};
use tailguard_redis::{Redis, RedisTokenStore};
use tailguard_tenant::{
    Decision, Kind, Limit, LocalStore, Shortfall, Store, Ticket, TokenBudgetLayer, Tokens, Window,
};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

/// Generous: the tests share two cores with the rest of the suite.
const TIMEOUT: Duration = Duration::from_secs(2);

/// A gateway's store: its own connection, failing closed so that an error shows.
fn gateway(url: &str, prefix: &str) -> RedisTokenStore {
    let redis = Redis::new(url, TIMEOUT).expect("redis url");
    RedisTokenStore::new(redis, prefix)
        .with_timeout(TIMEOUT)
        .with_fail_mode(FailMode::Closed)
}

/// 100 output tokens a day: one token back every 864 s, so nothing refills during a test.
fn day() -> Limit {
    Limit::per_day(Kind::Output, 100)
}

fn out(n: u64) -> Tokens {
    Tokens::new(0, n)
}

async fn reserved(store: &impl Store, t: &Tenant, limits: &[Limit], want: Tokens) -> Ticket {
    match store.reserve(t, limits, want).await {
        Decision::Reserved(ticket) => ticket,
        other => panic!("{want:?} was not reserved: {other:?}"),
    }
}

async fn refused(store: &impl Store, t: &Tenant, limits: &[Limit], want: Tokens) -> Shortfall {
    match store.reserve(t, limits, want).await {
        Decision::Refused(s) => s,
        other => panic!("{want:?} was not refused: {other:?}"),
    }
}

async fn available(store: &RedisTokenStore, t: &Tenant, limit: &Limit) -> u64 {
    store.available(t.id(), limit).await.expect("redis")
}

/// Waits until `store` holds `want` tokens of `limit` for `t` (a reconciliation sent in the
/// background), or fails after 5 s.
async fn eventually(store: &RedisTokenStore, t: &Tenant, limit: &Limit, want: u64) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = available(store, t, limit).await;
        if now == want {
            return;
        }
        assert!(Instant::now() < deadline, "{now} tokens, never {want}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Two gateways, one budget: what one reserves the other cannot, what one gives back the
/// other can take, and a refusal says when the budget will hold the request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_one_budget() {
    let Some(url) = redis_url("two_gateways_share_one_budget") else {
        return;
    };
    let prefix = pool("tokens-share");
    let (a, b) = (gateway(&url, &prefix), gateway(&url, &prefix));
    let (t, limits) = (Tenant::new("acme"), [day()]);
    let ta = reserved(&a, &t, &limits, out(60)).await;
    assert_eq!(available(&b, &t, &day()).await, 40);
    let s = refused(&b, &t, &limits, out(50)).await;
    assert_eq!((s.limit, s.wanted, s.available), (day(), 50, 40));
    // 10 tokens short at 864 s a token (less the microseconds since the take).
    let wait = s.retry_after.expect("fits later");
    assert!(wait <= Duration::from_secs(8640) && wait > Duration::from_secs(8639));
    // A used 20 of its 60: 40 come back, and B's request fits.
    assert!(
        a.settle(&t, &limits, ta, out(60), out(20))
            .await
            .expect("redis")
    );
    assert_eq!(available(&b, &t, &day()).await, 80);
    let tb = reserved(&b, &t, &limits, out(50)).await;
    assert_eq!(available(&a, &t, &day()).await, 30);
    // Reconciled from `Drop` (sent in the background): B used nothing.
    b.reconcile(&t, &limits, tb, out(50), Tokens::ZERO);
    eventually(&a, &t, &day(), 80).await;
}

/// A reservation is settled once: a second reconciliation of it, from either gateway, does
/// nothing; use beyond a reservation takes the balance to zero, never below.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_is_settled_exactly_once_and_never_below_zero() {
    let Some(url) = redis_url("a_reservation_is_settled_exactly_once") else {
        return;
    };
    let prefix = pool("tokens-once");
    let (a, b) = (gateway(&url, &prefix), gateway(&url, &prefix));
    let (t, limits) = (Tenant::new("acme"), [day()]);
    let t1 = reserved(&a, &t, &limits, out(60)).await;
    let t2 = reserved(&a, &t, &limits, out(30)).await;
    assert!(a.settle(&t, &limits, t1, out(60), out(60)).await.unwrap());
    assert_eq!(available(&a, &t, &day()).await, 10);
    // Again, as if it had used nothing: no 60 come back.
    assert!(
        !a.settle(&t, &limits, t1, out(60), Tokens::ZERO)
            .await
            .unwrap()
    );
    assert!(
        !b.settle(&t, &limits, t1, out(60), Tokens::ZERO)
            .await
            .unwrap()
    );
    a.reconcile(&t, &limits, t1, out(60), Tokens::ZERO);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(available(&a, &t, &day()).await, 10);
    assert!(
        b.settle(&t, &limits, t2, out(30), Tokens::ZERO)
            .await
            .unwrap()
    );
    assert_eq!(available(&a, &t, &day()).await, 40);
    // 40 reserved, 100 used: the 60 beyond take the balance to zero, not below.
    let t3 = reserved(&b, &t, &limits, out(40)).await;
    assert!(b.settle(&t, &limits, t3, out(40), out(100)).await.unwrap());
    assert_eq!(available(&a, &t, &day()).await, 0);
    let s = refused(&a, &t, &limits, out(1)).await;
    assert!(s.retry_after.expect("fits later") <= Duration::from_secs(864));
    // A refund stops at the limit.
    let fresh = Tenant::new("fresh");
    let t4 = reserved(&a, &fresh, &limits, out(10)).await;
    assert!(
        a.settle(&fresh, &limits, t4, out(10), Tokens::ZERO)
            .await
            .unwrap()
    );
    assert_eq!(available(&a, &fresh, &day()).await, 100);
}

/// A gateway that dies mid-stream never reconciles: its reservation expires after the TTL and
/// is settled as fully used — nothing comes back, and a late reconciliation does nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_gateways_reservation_expires_as_used() {
    let Some(url) = redis_url("a_dead_gateways_reservation_expires_as_used") else {
        return;
    };
    let prefix = pool("tokens-dead");
    let (t, limits) = (Tenant::new("acme"), [day()]);
    let dead = gateway(&url, &prefix).with_reservation_ttl(Duration::from_secs(1));
    let ticket = reserved(&dead, &t, &limits, out(60)).await;
    drop(dead);
    let mut conn = redis::Client::open(url.as_str())
        .expect("url")
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let in_flight = format!("{prefix}:{{acme}}:r:*");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(&in_flight)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(keys.len(), 1, "the reservation is recorded");
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(&in_flight)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(keys.is_empty(), "the reservation expired: {keys:?}");
    let alive = gateway(&url, &prefix);
    assert!(
        !alive
            .settle(&t, &limits, ticket, out(60), Tokens::ZERO)
            .await
            .unwrap()
    );
    assert_eq!(available(&alive, &t, &day()).await, 40);
}

/// 150 reservations of 7 tokens at once, over three gateways, from a budget of 500: exactly
/// 71 are admitted. Then all 71 reconcile at once (5 used of 7): every refund arrives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_reserves_never_admit_more_than_the_budget() {
    let Some(url) = redis_url("concurrent_reserves_never_admit_more_than_the_budget") else {
        return;
    };
    let prefix = pool("tokens-race");
    let gateways: Vec<_> = (0..3).map(|_| gateway(&url, &prefix)).collect();
    let limit = Limit::per_day(Kind::Total, 500);
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..150 {
        let g = gateways[i % 3].clone();
        tasks.spawn(async move {
            let d = g
                .reserve(&Tenant::new("acme"), &[limit], Tokens::new(3, 4))
                .await;
            (g, d)
        });
    }
    let answers = tasks.join_all().await;
    assert!(
        answers
            .iter()
            .all(|(_, d)| !matches!(d, Decision::Unavailable(_))),
        "{answers:?}"
    );
    let admitted: Vec<_> = answers
        .into_iter()
        .filter_map(|(g, d)| match d {
            Decision::Reserved(ticket) => Some((g, ticket)),
            _ => None,
        })
        .collect();
    assert_eq!(admitted.len(), 71);
    let t = Tenant::new("acme");
    assert_eq!(available(&gateways[0], &t, &limit).await, 3);
    let mut tasks = tokio::task::JoinSet::new();
    for (g, ticket) in admitted {
        tasks.spawn(async move {
            let t = Tenant::new("acme");
            g.settle(&t, &[limit], ticket, Tokens::new(3, 4), Tokens::new(3, 2))
                .await
        });
    }
    assert!(tasks.join_all().await.into_iter().all(|r| r.unwrap()));
    assert_eq!(available(&gateways[1], &t, &limit).await, 3 + 71 * 2);
}

/// Refusals are the local store's: the same limit decides, with the same numbers, and the same
/// wait up to the time that passed between the two asks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_after_is_computed_as_the_local_store_computes_it() {
    let Some(url) = redis_url("retry_after_is_computed_as_the_local_store_computes_it") else {
        return;
    };
    let prefix = pool("tokens-retry");
    let hour = Limit::new(Window::Every(Duration::from_secs(3600)), Kind::Total, 600);
    let day = Limit::per_day(Kind::Output, 1000);
    // 7 tokens per 10 days: waits that are not whole seconds.
    let odd = Limit::new(Window::Every(Duration::from_secs(864_000)), Kind::Input, 7);
    let cases: [(&[Limit], Tokens, &[Tokens]); 3] = [
        (
            &[hour, day],
            Tokens::new(100, 500),
            &[Tokens::new(0, 600), Tokens::new(0, 700), Tokens::new(1, 0)],
        ),
        (
            &[odd],
            Tokens::new(5, 0),
            &[Tokens::new(3, 0), Tokens::new(8, 0)],
        ),
        (&[odd, hour], Tokens::new(7, 0), &[Tokens::new(1, 1)]),
    ];
    let redis = gateway(&url, &prefix);
    for (i, (limits, first, then)) in cases.into_iter().enumerate() {
        let local = LocalStore::new();
        let t = Tenant::new(format!("t{i}"));
        let started = Instant::now();
        reserved(&local, &t, limits, first).await;
        reserved(&redis, &t, limits, first).await;
        for &want in then {
            let l = refused(&local, &t, limits, want).await;
            let r = refused(&redis, &t, limits, want).await;
            let (lw, rw) = (l.retry_after, r.retry_after);
            assert_eq!(
                Shortfall {
                    retry_after: None,
                    ..l
                },
                Shortfall {
                    retry_after: None,
                    ..r
                }
            );
            assert_eq!(lw.is_some(), rw.is_some(), "{l:?} {r:?}");
            if let (Some(lw), Some(rw)) = (lw, rw) {
                let slack = started.elapsed();
                assert!(lw.abs_diff(rw) <= slack, "{lw:?} {rw:?} {slack:?}");
                assert_eq!(retry_after_secs(lw), retry_after_secs(rw));
            }
        }
    }
}

/// Limits at the edge of the arithmetic (`u64::MAX` tokens per `u64::MAX` ns) work as
/// locally: no overflow, no rounding.
#[tokio::test]
async fn the_largest_limits_are_exact() {
    let Some(url) = redis_url("the_largest_limits_are_exact") else {
        return;
    };
    let store = gateway(&url, &pool("tokens-huge"));
    let huge = Limit::new(Window::Every(Duration::MAX), Kind::Total, u64::MAX);
    let t = Tenant::new("big");
    let all = Tokens::new(u64::MAX / 2, u64::MAX / 2 + 1);
    let ticket = reserved(&store, &t, &[huge], all).await;
    // One token per nanosecond comes back: far less than the limit since the take.
    assert!(available(&store, &t, &huge).await < 1_000_000_000_000);
    assert!(
        store
            .settle(&t, &[huge], ticket, all, Tokens::ZERO)
            .await
            .unwrap()
    );
    assert_eq!(available(&store, &t, &huge).await, u64::MAX);
}

/// A reservation whose answer timed out may have been taken: it is given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservation_whose_answer_timed_out_is_given_back() {
    let Some(url) = redis_url("a_reservation_whose_answer_timed_out_is_given_back") else {
        return;
    };
    let prefix = pool("tokens-late");
    let (t, limits) = (Tenant::new("acme"), [day()]);
    let store = gateway(&url, &prefix).with_timeout(Duration::from_millis(50));
    // Loads the script, so that the late call runs without another round trip.
    let warm = reserved(&store, &Tenant::new("warm"), &limits, out(1)).await;
    store.reconcile(&Tenant::new("warm"), &limits, warm, out(1), out(1));
    // Another client keeps the server busy for 400 ms.
    let busy = {
        let url = url.clone();
        tokio::spawn(async move {
            let mut conn = redis::Client::open(url.as_str())
                .unwrap()
                .get_multiplexed_async_connection()
                .await
                .unwrap();
            let spin = "local t0 = redis.call('TIME'); local n = 0
                repeat n = n + 1; local t = redis.call('TIME')
                until (t[1] - t0[1]) * 1000000 + (t[2] - t0[2]) > 400000 or n > 100000000
                return n";
            let _: i64 = redis::cmd("EVAL")
                .arg(spin)
                .arg(0)
                .query_async(&mut conn)
                .await
                .unwrap();
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    let d = store.reserve(&t, &limits, out(60)).await;
    assert_eq!(d, Decision::Unavailable(Duration::from_secs(1)));
    busy.await.unwrap();
    // The reservation ran after the busy script (the bucket was written), then its give-back.
    let check = gateway(&url, &prefix);
    eventually(&check, &t, &day(), 100).await;
    let mut conn = redis::Client::open(url.as_str())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let written: bool = redis::cmd("EXISTS")
        .arg(format!("{prefix}:{{acme}}:tb"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(written, "the late reservation ran");
}

/// An SSE answer of one content chunk and a usage chunk of `completion` output tokens.
fn sse(completion: u64) -> Response<Full<Bytes>> {
    let body = format!(
        "data: {{\"choices\":[{{\"delta\":{{\"content\":\"Hi\"}}}}]}}\n\n\
         data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":3,\"completion_tokens\":{completion}}}}}\n\n\
         data: [DONE]\n\n"
    );
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(Full::new(Bytes::from(body)))
        .unwrap()
}

fn chat(tenant: &str, max_tokens: u32) -> Request<()> {
    let mut req = Request::post("/v1/chat/completions").body(()).unwrap();
    req.extensions_mut()
        .insert(RequestFacts::new().with_max_tokens(max_tokens));
    req.extensions_mut().insert(Tenant::new(tenant));
    req
}

/// The status, `Retry-After` and body of one request through `layer`, read to the end.
async fn send(layer: &TokenBudgetLayer, req: Request<()>) -> (StatusCode, Option<String>, String) {
    let svc = layer.layer(tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(sse(5))
    }));
    let res = tokio::time::timeout(Duration::from_secs(20), svc.oneshot(req))
        .await
        .expect("a request hung")
        .expect("infallible");
    let status = res.status();
    let retry = res
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_owned());
    let body = res.into_body().collect().await.unwrap().to_bytes();
    (status, retry, String::from_utf8_lossy(&body).into_owned())
}

/// Two gateways' layers on one Redis: a stream on one is charged its usage, which the other
/// sees; the other refuses what is left short with an honest `Retry-After`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_layers_share_a_budget_through_streams() {
    let Some(url) = redis_url("two_gateways_layers_share_a_budget_through_streams") else {
        return;
    };
    let prefix = pool("tokens-layer");
    let (a, b) = (gateway(&url, &prefix), gateway(&url, &prefix));
    let layer = |s: &RedisTokenStore| {
        TokenBudgetLayer::new()
            .with_default_limits([day()])
            .with_store(s.clone())
    };
    let (la, lb) = (layer(&a), layer(&b));
    let (status, _, _) = send(&la, chat("acme", 80)).await;
    assert_eq!(status, StatusCode::OK);
    // 5 output tokens used of the 80 reserved.
    eventually(&b, &Tenant::new("acme"), &day(), 95).await;
    let (status, retry, body) = send(&lb, chat("acme", 96)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    assert_eq!(retry.as_deref(), Some("864"));
    assert!(body.contains("token_budget_exceeded"), "{body}");
    let (status, retry, _) = send(&lb, chat("acme", 500)).await;
    assert_eq!((status, retry), (StatusCode::TOO_MANY_REQUESTS, None));
}

/// Redis stopped mid-run: fail closed refuses with 503 `cluster_unavailable` and a
/// `Retry-After`, fail open reserves from the gateway's local store (and reconciles there);
/// neither hangs. Restarted (without persistence), Redis budgets again, from full buckets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_stopped_and_restarted_fails_open_or_closed_as_configured() {
    let port = free_port();
    let Some(server) = OwnRedis::start(port) else {
        return;
    };
    let url = format!("redis://127.0.0.1:{port}/");
    let prefix = pool("tokens-restart");
    let timeout = Duration::from_millis(200);
    let closed = gateway(&url, &prefix).with_timeout(timeout);
    let open = gateway(&url, &prefix)
        .with_timeout(timeout)
        .with_fail_mode(FailMode::Open);
    let (t, limits) = (Tenant::new("acme"), [day()]);
    reserved(&closed, &t, &limits, out(10)).await;
    reserved(&open, &t, &limits, out(10)).await;
    assert_eq!(available(&open, &t, &day()).await, 80);

    drop(server);
    let started = Instant::now();
    let d = closed.reserve(&t, &limits, out(10)).await;
    assert_eq!(d, Decision::Unavailable(Duration::from_secs(1)));
    let local = reserved(&open, &t, &limits, out(10)).await;
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(open.fallback().available("acme", &day()), 90);
    open.reconcile(&t, &limits, local, out(10), out(4));
    assert_eq!(open.fallback().available("acme", &day()), 96);
    // Through the layer: 503 in OpenAI's dialect, with `Retry-After`; open admits.
    let layer = |s: &RedisTokenStore| {
        TokenBudgetLayer::new()
            .with_default_limits([day()])
            .with_store(s.clone())
    };
    let (status, retry, body) = send(&layer(&closed), chat("acme", 10)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(retry.as_deref(), Some("1"));
    assert!(body.contains("\"code\":\"cluster_unavailable\""), "{body}");
    let (status, _, _) = send(&layer(&open), chat("acme", 10)).await;
    assert_eq!(status, StatusCode::OK);

    let _server = OwnRedis::start(port).expect("restarted");
    let deadline = Instant::now() + Duration::from_secs(10);
    let ticket = loop {
        match closed.reserve(&t, &limits, out(30)).await {
            Decision::Reserved(ticket) => break ticket,
            d => assert!(Instant::now() < deadline, "Redis never came back: {d:?}"),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    // A fresh bucket (the old one was lost with the server), shared again.
    assert_eq!(available(&open, &t, &day()).await, 70);
    let s = refused(&open, &t, &limits, out(80)).await;
    assert_eq!(s.available, 70);
    assert!(
        closed
            .settle(&t, &limits, ticket, out(30), Tokens::ZERO)
            .await
            .unwrap()
    );
}
