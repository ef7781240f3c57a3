//! Cluster mode across real processes: gateway binaries sharing one real redis-server, in
//! front of mock replicas (in this process) that count the streams they serve.
//!
//! scripts/test.sh starts a private redis-server and sets TAILGUARD_REDIS_URL; without it these
//! tests fail under CI and say so and skip elsewhere. Real processes run on the real clock, so the tests assert on counts and bounds
//! (the mocks' high-water mark, statuses, attempts), and time only bounds how long a wait may
//! last before the test calls it hung.

mod common;

use std::net::SocketAddr;
use std::path::PathBuf;

use common::{Client, GatewayProc, RedisProc, free_port, mock, setup, unique, wait_until};
use http::StatusCode;
use tailguard_mock::MockServer;

/// A stream of about 200 ms.
const SHORT: &str = "ttft=5ms,tokens=10,gap=20ms";
/// A stream that runs until the client goes away.
const ENDLESS: &str = "ttft=5ms,tokens=1000000,gap=50ms";

/// The flags of a gateway in front of `upstreams` sharing the pool `name` of `capacity` on
/// `redis`: no hedging, no failover, no reserved share (only the cluster limit is under
/// test), and a Redis timeout generous enough for a loaded machine.
fn flags(redis: &str, name: &str, capacity: u32, upstreams: &[&MockServer]) -> Vec<String> {
    let mut f: Vec<String> = upstreams
        .iter()
        .flat_map(|m| ["--upstream".to_owned(), m.url()])
        .collect();
    f.extend(
        [
            "--redis",
            redis,
            "--cluster-name",
            name,
            "--cluster-capacity",
            &capacity.to_string(),
            "--redis-timeout",
            "1s",
            "--hedge-max-attempts",
            "1",
            "--failover-budget-ratio",
            "0",
            "--outlier-ejection",
            "off",
            "--priority-interactive-share",
            "0",
        ]
        .map(str::to_owned),
    );
    f
}

fn with(mut flags: Vec<String>, more: &[&str]) -> Vec<String> {
    flags.extend(more.iter().map(|s| (*s).to_owned()));
    flags
}

/// `flags` with the value of `flag` (one of [`flags`]'s) replaced by `value`.
fn set(mut flags: Vec<String>, flag: &str, value: &str) -> Vec<String> {
    let at = flags
        .iter()
        .position(|a| a == flag)
        .expect("a flag of flags()");
    flags[at + 1] = value.to_owned();
    flags
}

/// Opens `n` endless streams through `addr` (each admitted: 200) and returns them.
async fn hold(
    client: &Client,
    addr: SocketAddr,
    n: usize,
) -> Vec<http::Response<hyper::body::Incoming>> {
    let mut held = Vec::new();
    for _ in 0..n {
        let res = client.open(addr, ENDLESS).await;
        assert_eq!(
            res.status(),
            StatusCode::OK,
            "an endless stream was refused"
        );
        held.push(res);
    }
    held
}

/// Three gateways, each with a local capacity of 8, share a cluster capacity of 8: 100
/// concurrent streams spread over them never put more than 8 in flight at the replica, and
/// every request is answered (admitted, or refused with a `Retry-After`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateway_processes_never_exceed_the_shared_capacity() {
    let test = "three_gateway_processes_never_exceed_the_shared_capacity";
    let Some((redis, bin)) = setup(test) else {
        return;
    };
    let replica = mock(SHORT).await;
    let name = unique("share8");
    let f = with(
        flags(&redis, &name, 8, &[&replica]),
        &["--admission-capacity", "8", "--admission-queue-len", "100"],
    );
    let f = with(f, &["--admission-queue-timeout", "30s"]);
    let gateways = start_all(&bin, &[f.clone(), f.clone(), f]).await;
    let client = Client::default();
    let tasks: Vec<_> = (0..100)
        .map(|i| {
            let (client, addr) = (client.clone(), gateways[i % 3].addr);
            tokio::spawn(async move { client.send(addr, SHORT).await })
        })
        .collect();
    let mut admitted = 0;
    for t in tasks {
        let answer = t.await.expect("request task");
        assert!(answer.answered(), "unanswered: {answer:?}");
        admitted += usize::from(answer.status == StatusCode::OK);
    }
    let stats = replica.stats();
    eprintln!(
        "admitted {admitted} of 100, peak at the replica {}",
        stats.peak_concurrent
    );
    assert!(
        stats.peak_concurrent <= 8,
        "{} streams in flight at once at the replica, over the cluster capacity of 8",
        stats.peak_concurrent
    );
    assert_eq!(
        stats.requests, admitted as u64,
        "one stream per admitted request"
    );
    assert!(admitted > 8, "only {admitted} of 100 admitted");
}

/// A gateway SIGKILLed while it holds the whole cluster capacity: its leases are never
/// released, yet another gateway admits that capacity again once they expire (TTL 2 s here;
/// its queue timeout of 6 s leaves 4 s for a loaded machine).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_gateway_s_capacity_is_back_within_the_lease_ttl() {
    let test = "a_killed_gateway_s_capacity_is_back_within_the_lease_ttl";
    let Some((redis, bin)) = setup(test) else {
        return;
    };
    let replica = mock(SHORT).await;
    let name = unique("sigkill");
    let f = with(
        flags(&redis, &name, 4, &[&replica]),
        &["--cluster-lease-ttl", "2s", "--admission-queue-len", "8"],
    );
    let [mut victim, short, patient]: [GatewayProc; 3] = start_all(
        &bin,
        &[
            f.clone(),
            with(f.clone(), &["--admission-queue-timeout", "300ms"]),
            with(f, &["--admission-queue-timeout", "6s"]),
        ],
    )
    .await
    .try_into()
    .unwrap_or_else(|_| unreachable!());
    let client = Client::default();
    let held = hold(&client, victim.addr, 4).await;
    wait_until("4 streams at the replica", || {
        replica.stats().in_flight == 4
    })
    .await;
    let refused = client.send(short.addr, SHORT).await;
    assert_eq!(
        (refused.status, refused.code.as_str(), refused.retry_after),
        (StatusCode::SERVICE_UNAVAILABLE, "queue_timeout", true),
        "the cluster is full while the victim streams"
    );

    victim.kill().await;
    wait_until("the replica to see the victim gone", || {
        replica.stats().in_flight == 0
    })
    .await;
    drop(held);
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (client, addr) = (client.clone(), patient.addr);
            tokio::spawn(async move { client.send(addr, SHORT).await })
        })
        .collect();
    for t in tasks {
        let answer = t.await.expect("request task");
        assert_eq!(
            answer.status,
            StatusCode::OK,
            "the victim's capacity did not come back: {answer:?}\n{}",
            patient.output()
        );
    }
    assert!(replica.stats().peak_concurrent <= 4);
}

/// Redis killed and restarted mid-run, under a fail-open and a fail-closed gateway sharing a
/// capacity of 2: while it is down, fail closed refuses with 503 `cluster_unavailable` and fail
/// open admits on its local limit (4); nothing hangs; once it is back the cluster limit holds
/// again for both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_restart_keeps_the_failure_modes_then_the_cluster_limit() {
    let test = "a_redis_restart_keeps_the_failure_modes_then_the_cluster_limit";
    let bin = common::gateway_bin();
    let port = free_port();
    let Some(server) = RedisProc::start(port, test).await else {
        return;
    };
    let url = format!("redis://127.0.0.1:{port}/");
    let replica = mock(SHORT).await;
    let f = with(
        flags(&url, &unique("restart"), 2, &[&replica]),
        &["--admission-capacity", "4", "--admission-queue-len", "8"],
    );
    let f = set(
        with(f, &["--admission-queue-timeout", "300ms"]),
        "--redis-timeout",
        "200ms",
    );
    let [open, closed]: [GatewayProc; 2] = start_all(
        &bin,
        &[
            with(f.clone(), &["--cluster-fail", "open"]),
            with(f, &["--cluster-fail", "closed"]),
        ],
    )
    .await
    .try_into()
    .unwrap_or_else(|_| unreachable!());
    let client = Client::default();
    cluster_limit_holds(&client, &replica, &open, &closed).await;

    server.kill().await;
    let down = client.send(closed.addr, SHORT).await;
    assert_eq!(
        (down.status, down.code.as_str(), down.retry_after),
        (StatusCode::SERVICE_UNAVAILABLE, "cluster_unavailable", true),
        "fail closed while Redis is down"
    );
    // Fail open: the local capacity of 4, not the cluster's 2, and not more.
    let held = hold(&client, open.addr, 4).await;
    wait_until("4 streams at the replica", || {
        replica.stats().in_flight == 4
    })
    .await;
    let over = client.send(open.addr, SHORT).await;
    assert_eq!(
        (over.status, over.code.as_str()),
        (StatusCode::SERVICE_UNAVAILABLE, "queue_timeout"),
        "fail open keeps the local limit"
    );
    drop(held);
    wait_until("the replica idle", || replica.stats().in_flight == 0).await;

    let _server = RedisProc::start(port, test)
        .await
        .expect("redis-server restarted");
    // Each gateway finds Redis back on a call of its own (and logs so): until then fail open
    // still admits on the local limits alone.
    for g in [&open, &closed] {
        let back = tokio::time::timeout(common::HANG, async {
            while !g.output().contains("cluster backend back") {
                assert!(client.send(g.addr, SHORT).await.answered());
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        });
        back.await.expect("the gateway finds Redis back");
    }
    cluster_limit_holds(&client, &replica, &open, &closed).await;
}

/// With the cluster's 2 units held through `open`, both gateways refuse a third stream.
async fn cluster_limit_holds(
    client: &Client,
    replica: &MockServer,
    open: &GatewayProc,
    closed: &GatewayProc,
) {
    let held = hold(client, open.addr, 2).await;
    wait_until("2 streams at the replica", || {
        replica.stats().in_flight == 2
    })
    .await;
    for g in [open, closed] {
        let refused = client.send(g.addr, SHORT).await;
        assert_eq!(
            (refused.status, refused.code.as_str(), refused.retry_after),
            (StatusCode::SERVICE_UNAVAILABLE, "queue_timeout", true),
            "the cluster limit of 2 holds at {}:\n{}",
            g.addr,
            g.output()
        );
    }
    drop(held);
    wait_until("the replica idle", || replica.stats().in_flight == 0).await;
}

/// Three gateways hedging (fixed 50 ms delay, budget ratio 0.1) over two replicas half of
/// whose first tokens take 500 ms: extra attempts across all three stay within one shared
/// budget, `0.1 × requests + max balance (10)`, where three local budgets would allow
/// `0.1 × requests + 3 × 10`, and a hedge for every slow request would be about half of them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hedge_ratio_across_three_gateways_stays_within_the_shared_budget() {
    let test = "the_hedge_ratio_across_three_gateways_stays_within_the_shared_budget";
    let Some((redis, bin)) = setup(test) else {
        return;
    };
    let slow = "ttft=mix(0.5,5ms,500ms),tokens=2,gap=1ms";
    let replicas = [mock(slow).await, mock(slow).await];
    let f = flags(&redis, &unique("hedge"), 256, &[&replicas[0], &replicas[1]]);
    // The hedge under test instead of none; fail closed, so that a slow Redis call can only
    // withhold a hedge (fail open would hedge on the local bucket meanwhile).
    let f = set(f, "--hedge-max-attempts", "2");
    let f = with(
        f,
        &[
            "--hedge-delay",
            "50ms",
            "--hedge-budget-ratio",
            "0.1",
            "--routing",
            "round-robin",
        ],
    );
    let f = with(
        f,
        &["--admission-capacity", "256", "--cluster-fail", "closed"],
    );
    let gateways = start_all(&bin, &[f.clone(), f.clone(), f]).await;
    let client = Client::default();
    const REQUESTS: usize = 300;
    for wave in 0..REQUESTS / 30 {
        let tasks: Vec<_> = (0..30)
            .map(|i| {
                let (client, addr) = (client.clone(), gateways[(wave + i) % 3].addr);
                tokio::spawn(async move { client.send(addr, slow).await })
            })
            .collect();
        for t in tasks {
            let answer = t.await.expect("request task");
            assert_eq!(answer.status, StatusCode::OK, "{answer:?}");
        }
    }
    let (mut primaries, mut extras) = (0, 0);
    for r in &replicas {
        for rec in r.stats().log {
            match rec.attempt.as_deref() {
                Some("0") => primaries += 1,
                _ => extras += 1,
            }
        }
    }
    eprintln!("{primaries} primaries, {extras} extra attempts");
    assert_eq!(primaries, REQUESTS, "one primary per request");
    let bound = REQUESTS / 10 + 10;
    assert!(
        extras <= bound,
        "{extras} extra attempts for {REQUESTS} requests, over the shared budget of {bound}"
    );
    assert!(extras > 0, "no hedge at all under a 50%-slow upstream");
}

/// Two gateways share one tenant's token budget (issue 34): 30 output tokens a minute, 10
/// reserved per request (the default `max_tokens`; the mock's answers are 10 tokens, counted as
/// they pass). Three answers through the first gateway use it up, and the second refuses the
/// tenant's next request with 429 and a `Retry-After`, as the first does; another tenant still
/// passes, and so does the same tenant at a gateway with another cluster name (its own budget).
/// The tenants' fair-share counters end up in Redis too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_share_one_tenant_s_token_budget() {
    let test = "two_gateways_share_one_tenant_s_token_budget";
    let Some((redis, bin)) = setup(test) else {
        return;
    };
    let replica = mock(SHORT).await;
    let name = unique("tokens");
    let f = with(
        flags(&redis, &name, 64, &[&replica]),
        &[
            "--tenant-output-tokens-per-minute",
            "30",
            "--tenant-default-max-tokens",
            "10",
        ],
    );
    let apart = set(f.clone(), "--cluster-name", &unique("tokens-apart"));
    let [first, second, apart]: [GatewayProc; 3] = start_all(&bin, &[f.clone(), f, apart])
        .await
        .try_into()
        .unwrap_or_else(|_| unreachable!());
    let client = Client::default();
    for _ in 0..3 {
        let used = client.send_as(first.addr, SHORT, Some("acme")).await;
        assert!(
            used.status == StatusCode::OK && used.done,
            "within the budget: {used:?}\n{}",
            first.output()
        );
    }
    for g in [&second, &first] {
        let refused = client.send_as(g.addr, SHORT, Some("acme")).await;
        assert_eq!(
            (refused.status, refused.code.as_str(), refused.retry_after),
            (
                StatusCode::TOO_MANY_REQUESTS,
                tailguard::tenant::CODE_EXCEEDED,
                true
            ),
            "the budget used up through the first gateway, at {}:\n{}",
            g.addr,
            g.output()
        );
    }
    for (g, tenant) in [(&second, "globex"), (&apart, "acme")] {
        let passed = client.send_as(g.addr, SHORT, Some(tenant)).await;
        assert_eq!(passed.status, StatusCode::OK, "{tenant} at {}", g.addr);
    }
    // The shared bucket, where the gateway keeps it (`tailguard:NAME:{TENANT}:tb`): less than
    // one request's 10 tokens, whatever refilled meanwhile (one every 2 s).
    let store = tailguard_redis::RedisTokenStore::new(
        tailguard_redis::Redis::new(&redis, std::time::Duration::from_secs(5)).expect("url"),
        &format!("tailguard:{name}"),
    );
    let limit = tailguard::tenant::Limit::per_minute(tailguard::tenant::Kind::Output, 30);
    let left = store.available("acme", &limit).await.expect("redis");
    assert!(left < 10, "{left} tokens left in the shared bucket");
    assert_eq!(replica.stats().requests, 5, "the refused never reached it");
    // The tenants' fair-share counters are shared too (`tailguard:{NAME}:fair`): acme's
    // service counts what the first gateway served it, globex's what the second did. Read
    // after the gateways' next exchange (every 100 ms).
    let fair = tailguard_redis::RedisFairShare::new(
        tailguard_redis::Redis::new(&redis, std::time::Duration::from_secs(5)).expect("url"),
        "tailguard",
        &name,
    );
    let wanted = ["acme", "globex"].map(|t| tailguard::admission::tenant_key(Some(t)));
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let report = tailguard::admission::ServiceReport {
            served: Vec::new(),
            wanted: wanted.to_vec(),
        };
        let totals = tailguard::admission::FairShareBackend::exchange(&fair, report)
            .await
            .expect("redis");
        // Three answers of 10 tokens at 2 a token, at least, and one for globex.
        if totals[0] >= 60.0 && totals[1] >= 20.0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "fair-share totals {totals:?} never reached"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// Starts one gateway per flag set.
async fn start_all(bin: &PathBuf, flags: &[Vec<String>]) -> Vec<GatewayProc> {
    let mut out = Vec::new();
    for f in flags {
        out.push(GatewayProc::start(bin, f).await);
    }
    out
}
