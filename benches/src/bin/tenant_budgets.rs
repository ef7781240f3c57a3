//! Token budgets shared by three gateways on one Redis (issue 34): "streamed responses with and
//! without usage, client disconnects mid-stream: tokens admitted beyond the budget never exceed
//! one request's reservation, no reconciliation lost, no negative balance; Redis restarted
//! mid-run behaves as configured."
//!
//! ```text
//! cargo run --release -p tailguard-benches --bin tenant_budgets   # ~1.5 minutes
//! ```
//!
//! Starts a private `redis-server` (a free loopback port, no persistence; the restart phase kills
//! and restarts it, so `TAILGUARD_REDIS_URL` is not used). Each phase: two fresh mock replicas
//! ([`SCRIPT`]), three gateways (`Gateway::start`, no hedging, admission out of the way) with one
//! tenant of [`LIMIT`] output tokens a minute, and nine open-loop loads ([`MIXES`], three per
//! gateway): with usage, without usage, clients gone after 300 ms. Phases: each gateway its own
//! budget (no Redis); one budget in Redis; the same with Redis killed at 10 s and restarted empty
//! at 18 s (fail open). Measured: the replicas' tokens for every admitted request
//! (`RequestRecord::tokens_sent`) against limit × elapsed / minute + the limit, at the end and at
//! each admitted request's start; after each Redis phase, its settles done: reservation records
//! left (`SCAN`), `tailguard_tenant_reconciles_lost_total`, the bucket's raw level every 50 ms,
//! and the balance (limit + refill − tokens charged − level at the end: 0 when every reservation
//! was settled once). See benches/README.md §10. Results: a table on stdout and
//! `benches/results/tenant_budgets.json`.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use http::header::{HeaderName, HeaderValue};
use serde_json::{Value, json};
use tailguard::tenant::{Kind, Limit};
use tailguard_gateway::{AdmissionArgs, Args, ClusterArgs, Config, Gateway, HedgeArgs, TenantArgs};
use tailguard_mock::load::{LoadConfig, run};
use tailguard_mock::{MockServer, RequestRecord};
use tailguard_redis::{Redis, RedisTokenStore};
use tokio::sync::watch;
use tokio::time::{Instant, sleep, sleep_until};

/// The tenant's output tokens per minute, and the largest reservation (no `max_tokens`).
const LIMIT: u64 = 3_000;
const RESERVATION: u64 = 64;
const WINDOW_S: f64 = 60.0;
const TENANT: &str = "acme";
const SCRIPT: &str = "ttft=lognormal(40ms,0.3),tokens=40,gap=lognormal(15ms,0.3)";
/// The restart phase: Redis killed, then restarted, at these seconds of its 30.
const KILL_AT: f64 = 10.0;
const RESTART_AT: f64 = 18.0;
/// From then on the gateways are expected back on Redis (its last interval).
const SHARED_AT: f64 = 19.0;
/// The restart phase's intervals: name, start, end (seconds), what bounds their tokens.
const INTERVALS: [(&str, f64, f64, &str); 4] = [
    ("before the kill", 0.0, KILL_AT, "the shared bucket"),
    ("Redis down", KILL_AT, RESTART_AT, "3 local buckets"),
    ("reconnecting", RESTART_AT, SHARED_AT, "-"),
    ("shared again", SHARED_AT, f64::INFINITY, "a fresh bucket"),
];
/// Time for the last settles (4 attempts, 700 ms of backoff) before the checks.
const SETTLE: Duration = Duration::from_millis(1_500);
const USAGE: &str = concat!(
    r#"{"model":"mock-llm","stream":true,"stream_options":{"include_usage":true},"#,
    r#""messages":[{"role":"user","content":"Say hello"}]}"#
);
const NO_USAGE: &str = concat!(
    r#"{"model":"mock-llm","stream":true,"max_tokens":48,"#,
    r#""messages":[{"role":"user","content":"Say hello"}]}"#
);
/// Each kind of request (`x-bench-kind`): body, rate per gateway, client timeout in ms.
const MIXES: [(&str, &str, f64, u64); 3] = [
    ("usage", USAGE, 3.0, 30_000),
    ("no_usage", NO_USAGE, 3.0, 30_000),
    ("disconnect", USAGE, 1.5, 300),
];

/// The private redis-server, on one port so that a restart comes back where the gateways look
/// (cluster_admission's `redis()`, made restartable).
struct RedisServer {
    port: u16,
    child: Option<Child>,
}

impl RedisServer {
    fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn up(&mut self) {
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(std::env::temp_dir())
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server is not installed (scripts/redis.sh installs it)");
        for _ in 0..500 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.child = Some(child);
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The gateways' counters (process-wide, so taken as differences): refusals, store errors,
/// reconciliations lost, output tokens charged, overrun tokens.
type Counters = [f64; 5];
const COUNTERS: [(&str, &str); 5] = [
    ("tailguard_tenant_refusals_total", ""),
    ("tailguard_tenant_store_errors_total", ""),
    ("tailguard_tenant_reconciles_lost_total", ""),
    ("tailguard_tenant_tokens_total", "kind=\"output\""),
    ("tailguard_tenant_overrun_tokens_total", ""),
];

fn counters() -> Counters {
    let text = tailguard_gateway::metrics_handle().render();
    COUNTERS.map(|(name, filter)| {
        (text.lines())
            .filter_map(|l| l.rsplit_once(' '))
            .filter(|(k, _)| k.split('{').next() == Some(name) && k.contains(filter))
            .filter_map(|(_, v)| v.parse::<f64>().ok())
            .sum()
    })
}

fn minus(a: Counters, b: Counters) -> Counters {
    std::array::from_fn(|i| a[i] - b[i])
}

/// The counters as JSON fields.
fn counter_fields(c: Counters) -> Value {
    json!({ "refusals": c[0], "store_errors": c[1], "reconciles_lost": c[2],
            "tokens_charged": c[3], "overrun_tokens": c[4] })
}

/// One read of the tenant's bucket hash: `None` while Redis is unreachable, else each field's
/// level in tokens (`None`: not a non-negative integer).
type Sample = (Instant, Option<Vec<Option<f64>>>);

async fn sampler(url: String, key: String, mut stop: watch::Receiver<bool>) -> Vec<Sample> {
    let client = redis::Client::open(url).expect("url");
    let (mut conn, mut out) = (None, Vec::new());
    let limit = Duration::from_millis(100);
    while !*stop.borrow() {
        if conn.is_none() {
            let c = client.get_multiplexed_async_connection();
            conn = tokio::time::timeout(limit, c)
                .await
                .ok()
                .and_then(Result::ok);
        }
        let mut read = None;
        if let Some(c) = conn.as_mut() {
            let mut cmd = redis::cmd("HGETALL");
            let get = cmd.arg(&key).query_async::<BTreeMap<String, String>>(c);
            match tokio::time::timeout(limit, get).await {
                Ok(Ok(fields)) => read = Some(fields),
                _ => conn = None,
            }
        }
        let levels = read.map(|fields| {
            (fields.values())
                .map(|v| v.split(' ').next()?.parse::<u128>().ok())
                .map(|l| l.map(|l| l as f64 / 60e9))
                .collect()
        });
        out.push((Instant::now(), levels));
        let _ = tokio::time::timeout(Duration::from_millis(50), stop.changed()).await;
    }
    out
}

async fn gateways(replicas: &[String], cluster: Option<(String, String)>) -> Vec<Gateway> {
    let (redis, name) = cluster.unzip();
    let args = Args {
        listen: Some(([127, 0, 0, 1], 0).into()),
        upstreams: Some(replicas.to_vec()),
        models: Some(vec!["mock-llm".to_owned()]),
        // Out of the way: the budgets are under test.
        admission: AdmissionArgs {
            capacity: Some(512),
            adaptive: Some(false),
            ..AdmissionArgs::default()
        },
        // One upstream request per admitted request.
        hedge: HedgeArgs {
            max_attempts: Some(1),
            failover_budget_ratio: Some(0.0),
            ..HedgeArgs::default()
        },
        tenant: TenantArgs {
            named: Some(vec![TENANT.to_owned()]),
            output_tokens_per_minute: Some(LIMIT),
            default_max_tokens: Some(RESERVATION as u32),
            ..TenantArgs::default()
        },
        cluster: ClusterArgs {
            redis,
            name,
            ..ClusterArgs::default()
        },
        ..Args::default()
    };
    let mut out = Vec::new();
    for _ in 0..3 {
        let config = Config::resolve(Default::default(), &args).expect("config");
        out.push(Gateway::start(config).await.expect("gateway"));
    }
    out
}

/// Records of the tenant's reservations left in Redis.
async fn records_left(url: &str, prefix: &str) -> u64 {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis");
    let (mut cursor, mut n) = (0u64, 0u64);
    loop {
        let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg(&[
                "MATCH",
                &format!("{prefix}:{{{TENANT}}}:r:*"),
                "COUNT",
                "1000",
            ])
            .query_async(&mut conn)
            .await
            .expect("SCAN");
        (n, cursor) = (n + keys.len() as u64, next);
        if cursor == 0 {
            return n;
        }
    }
}

/// The budget `seconds` after the start: the initial burst plus the refill.
fn budget(seconds: f64) -> f64 {
    LIMIT as f64 * (1.0 + seconds / WINDOW_S)
}

/// One phase: its figures, and with `restart` the restart's (Redis killed and restarted).
async fn phase(index: usize, name: &str, seconds: f64, server: Option<&mut RedisServer>) -> Value {
    let restart = index == 2;
    let mut mocks = Vec::new();
    for _ in 0..2 {
        mocks.push(
            MockServer::start(SCRIPT.parse().expect("script"))
                .await
                .expect("mock"),
        );
    }
    let replicas: Vec<String> = mocks.iter().map(MockServer::url).collect();
    let cluster_name = format!("budgets-{}-{index}", std::process::id());
    let prefix = format!("tailguard:{cluster_name}");
    let url = server.as_ref().map(|s| s.url());
    let gws = gateways(&replicas, url.clone().map(|u| (u, cluster_name))).await;
    let (stop, stop_rx) = watch::channel(false);
    let key = format!("{prefix}:{{{TENANT}}}:tb");
    let samples = url.clone().map(|u| tokio::spawn(sampler(u, key, stop_rx)));
    let before = counters();
    let t0 = Instant::now();
    let mut loads = Vec::new();
    for (g, gw) in gws.iter().enumerate() {
        for (k, (kind, body, rate, timeout_ms)) in MIXES.into_iter().enumerate() {
            let header = |n, v| (HeaderName::from_static(n), HeaderValue::from_static(v));
            let ((t, tenant), (b, bench)) =
                (header("x-tenant", TENANT), header("x-bench-kind", kind));
            let config = LoadConfig::new(format!("http://{}", gw.addr()))
                .rate(rate)
                .duration(Duration::from_secs_f64(seconds))
                .max_requests(100_000)
                .body(body)
                .header(t, tenant)
                .header(b, bench)
                .request_timeout(Duration::from_millis(timeout_ms))
                .drain_timeout(Duration::from_secs(10))
                .seed((index * 100 + g * 10 + k) as u64 + 1);
            loads.push(tokio::spawn(run(config)));
        }
    }
    let at = |s: f64| t0 + Duration::from_secs_f64(s);
    let mut marks = [before; 5];
    if restart && let Some(s) = server {
        sleep_until(at(KILL_AT)).await;
        marks[1] = counters();
        tokio::task::block_in_place(|| s.kill());
        sleep_until(at(RESTART_AT)).await;
        marks[2] = counters();
        tokio::task::block_in_place(|| s.up());
        sleep_until(at(SHARED_AT)).await;
        marks[3] = counters();
    }
    let (mut scheduled, mut statuses) = (0, BTreeMap::<u16, u64>::new());
    for l in loads {
        let report = l.await.expect("load task").expect("load");
        scheduled += report.scheduled;
        for (s, n) in report.statuses {
            *statuses.entry(s).or_default() += n;
        }
    }
    sleep(SETTLE).await;
    let after = counters();
    marks[4] = after;
    let t_end = Instant::now();
    let _ = stop.send(true);
    let samples = match samples {
        Some(s) => s.await.expect("sampler"),
        None => Vec::new(),
    };

    // The replicas' logs: every admitted request, in order of arrival.
    let mut records: Vec<RequestRecord> = mocks.iter().flat_map(|m| m.stats().log).collect();
    records.sort_by_key(|r| r.started);
    let secs = |r: &RequestRecord| (r.started - t0).as_secs_f64();
    let mut admitted = BTreeMap::<&str, u64>::new();
    let (mut tokens, mut max_over) = (0u64, f64::MIN);
    for r in &records {
        let kind = r.headers.get("x-bench-kind").and_then(|v| v.to_str().ok());
        let kind = MIXES.iter().map(|m| m.0).find(|k| Some(*k) == kind);
        *admitted.entry(kind.unwrap_or("other")).or_default() += 1;
        tokens += u64::from(r.tokens_sent);
        max_over = max_over.max(tokens as f64 - budget(secs(r)));
    }
    let last = records.last().map_or(0.0, secs);
    let d = minus(after, before);
    let mut out = json!({
        "name": name, "shared": url.is_some(), "seconds": seconds, "scheduled": scheduled,
        "statuses": statuses, "admitted": admitted, "tokens_sent": tokens, "budget": budget(last),
        "overshoot": tokens as f64 - budget(last), "max_overshoot_any_time": max_over,
        "bucket": null, "reservations_left": null, "balance_error_tokens": null,
    });
    merge(&mut out, counter_fields(d));
    if let Some(u) = &url {
        let levels: Vec<Option<f64>> = samples
            .iter()
            .filter_map(|s| s.1.clone())
            .flatten()
            .collect();
        let valid = levels.iter().flatten();
        out["bucket"] = json!({
            "samples": levels.len(),
            "lowest_tokens": valid.clone().copied().reduce(f64::min),
            "negative_or_invalid": levels.iter().filter(|l| l.is_none()).count(),
            "above_limit": valid.filter(|l| **l > LIMIT as f64).count(),
        });
        out["reservations_left"] = json!(records_left(u, &prefix).await);
        if !restart && let Some(first) = records.first() {
            let redis = Redis::new(u, Duration::from_secs(1)).expect("url");
            let limit = Limit::per_minute(Kind::Output, LIMIT);
            let store = RedisTokenStore::new(redis, &prefix);
            let level = store.available(TENANT, &limit).await.expect("redis") as f64;
            let refilled = budget((t_end - first.started).as_secs_f64());
            out["balance_error_tokens"] = json!(refilled - d[3] - level);
        }
    }
    if restart {
        let back = samples
            .iter()
            .find(|s| s.0 >= at(RESTART_AT) && s.1.as_ref().is_some_and(|l| !l.is_empty()));
        let bounds = [
            Some(budget(KILL_AT)),
            Some(3.0 * budget(RESTART_AT - KILL_AT)),
            None,
            Some(budget(last - RESTART_AT)),
        ];
        let deltas = marks.windows(2).map(|w| minus(w[1], w[0]));
        let intervals: Vec<Value> = (INTERVALS.into_iter().zip(bounds))
            .zip(deltas)
            .map(|(((name, from, to, bound_is), bound), d)| {
                let inside: Vec<_> = (records.iter())
                    .filter(|r| (from..to).contains(&secs(r)))
                    .map(|r| u64::from(r.tokens_sent))
                    .collect();
                let mut i = json!({ "name": name, "from_s": from, "to_s": to.min(seconds),
                    "admitted": inside.len(), "tokens_sent": inside.iter().sum::<u64>(),
                    "bound": bound, "bound_is": bound_is });
                merge(&mut i, counter_fields(d));
                i
            })
            .collect();
        out["restart"] = json!({
            "kill_at_s": KILL_AT, "restart_at_s": RESTART_AT, "intervals": intervals,
            "shared_again_after_ms": back.map(|s| (s.0 - at(RESTART_AT)).as_secs_f64() * 1e3),
        });
    }
    for g in gws {
        let _ = g.shutdown().await;
    }
    for m in mocks {
        m.shutdown().await;
    }
    out
}

/// `into`'s fields with `from`'s added.
fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        a.extend(b);
    }
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--help") {
        println!("tenant_budgets: see the top of benches/src/bin/tenant_budgets.rs");
        return;
    }
    let run_info = tailguard_benches::run::RunInfo::start();
    println!("{}", run_info.summary());
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let mut server = RedisServer { port, child: None };
    server.up();
    let local = phase(0, "local buckets (no Redis)", 16.0, None).await;
    let shared = phase(1, "shared (Redis)", 24.0, Some(&mut server)).await;
    let mut restarted = phase(2, "shared, Redis restarted", 30.0, Some(&mut server)).await;
    server.kill();
    let restart = restarted["restart"].take();
    if let Some(p) = restarted.as_object_mut() {
        p.remove("restart");
    }
    let json = json!({
        "limit_output_tokens_per_minute": LIMIT,
        "reservation_tokens": RESERVATION,
        "script": SCRIPT,
        "phases": [local, shared, restarted],
        "restart": restart,
        "run": run_info.finish(),
    });
    match tailguard_benches::tables::tenant_budgets_table(&json) {
        Ok(t) => println!("\n{t}\n"),
        Err(e) => println!("table: {e}"),
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/results/tenant_budgets.json");
    let text = serde_json::to_string_pretty(&json).expect("json");
    std::fs::write(path, text + "\n").expect("write results");
    println!("results: {path}");
}
