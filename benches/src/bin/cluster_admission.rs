//! Cluster admission: what Redis leases cost per admitted request, and whether three gateways
//! sharing one capacity hold it at 1,000 requests/s.
//!
//! ```text
//! cargo run --release -p tailguard-benches --bin cluster_admission   # ~1 minute
//! ```
//!
//! Uses `TAILGUARD_REDIS_URL` when set, otherwise starts a private `redis-server` on a free
//! loopback port (persistence off) and kills it at the end.
//!
//! 1. **Added latency**: one request at a time through a `BoundedAdmission` gate (capacity 64)
//!    to an in-process service answering at once, its body read to the end; the local gate vs.
//!    the same gate in cluster mode (`RedisLeases` on loopback). Per-request time from call to
//!    body end (HDR, µs); the difference is what the lease costs an admitted request (one Lua
//!    script call before the request; the release is pipelined after the body, off the path).
//! 2. **Three gateways at 1,000 requests/s**: three gateways (`Gateway::start`, in this
//!    process, each with its own Redis connection) in front of one mock replica (streams of
//!    ~110 ms, 3 events), each with a local capacity of 64, no hedging; `tailguard-mock`'s open-loop load
//!    generator sends 333 requests/s (Poisson) to each for 10 s. Run once with local limits
//!    only and once with a shared cluster capacity of 64: the replica's high-water mark of
//!    concurrent streams, the statuses, and Redis work per request from `INFO commandstats`
//!    before and after (the INFO calls excluded): *commands*, every command Redis ran, those
//!    inside the Lua scripts included; *round trips*, the calls a gateway made (script calls,
//!    plus one per pipelined pair of release `ZREM`s).
//!
//! Results: a table on stdout and `benches/results/cluster_admission.json`.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use tailguard::admission::{BoundedAdmissionLayer, Cluster};
use tailguard_gateway::{
    AdmissionArgs, Args, ClusterArgs, Config, Dur, Gateway, HedgeArgs, PriorityArgs,
};
use tailguard_mock::MockServer;
use tailguard_mock::load::{LoadConfig, run};
use tailguard_redis::{Redis, RedisLeases};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

/// Requests per gate in part 1 (after as many for warm-up).
const SEQUENTIAL: usize = 5_000;
/// Part 2: the replica's streams (~110 ms), the rate per gateway and the window.
const STREAM_SCRIPT: &str = "ttft=50ms,tokens=2,gap=30ms";
const RATE_PER_GATEWAY: f64 = 1_000.0 / 3.0;
const WINDOW: Duration = Duration::from_secs(10);
const CAPACITY: u32 = 64;

#[derive(Serialize)]
struct Latency {
    gate: &'static str,
    p50_us: u64,
    p99_us: u64,
    p999_us: u64,
    redis_commands_per_request: f64,
    redis_round_trips_per_request: f64,
}

#[derive(Serialize)]
struct ClusterRun {
    mode: &'static str,
    scheduled: u64,
    statuses: BTreeMap<u16, u64>,
    peak_concurrent_at_replica: u64,
    capacity: String,
    redis_commands: u64,
    redis_commands_per_request: f64,
    redis_commands_per_admitted: f64,
    redis_round_trips_per_request: f64,
    redis_round_trips_per_admitted: f64,
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
}

#[derive(Serialize)]
struct Results {
    latency: Vec<Latency>,
    three_gateways: Vec<ClusterRun>,
    /// When the run started and the machine's load.
    run: tailguard_benches::run::RunInfo,
}

#[tokio::main]
async fn main() {
    if std::env::args().any(|a| a == "--help") {
        println!("cluster_admission: see the top of benches/src/bin/cluster_admission.rs");
        return;
    }
    let run_info = tailguard_benches::run::RunInfo::start();
    println!("{}", run_info.summary());
    let (url, server) = redis();
    let redis = Redis::new(&url, Duration::from_millis(500)).expect("redis url");
    let mut info = redis::Client::open(url.as_str())
        .expect("redis url")
        .get_multiplexed_async_connection()
        .await
        .expect("cannot reach Redis");

    let mut latency = Vec::new();
    for gate in ["local", "cluster"] {
        let layer = BoundedAdmissionLayer::new(CAPACITY);
        let layer = match gate {
            "local" => layer,
            _ => layer.with_cluster(Cluster::new(
                Arc::new(RedisLeases::new(redis.clone(), "bench")),
                &format!("latency-{}", std::process::id()),
                CAPACITY,
            )),
        };
        latency.push(sequential(gate, &layer, &mut info).await);
    }
    let mut three_gateways = Vec::new();
    for mode in ["local", "cluster"] {
        three_gateways.push(three_gateways_run(mode, &url, &mut info).await);
    }
    print(&latency, &three_gateways);
    let results = Results {
        latency,
        three_gateways,
        run: run_info.finish(),
    };
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/results/cluster_admission.json"
    );
    let json = serde_json::to_string_pretty(&results).expect("json");
    std::fs::write(path, json + "\n").expect("write results");
    println!("results: {path}");
    if let Some(mut s) = server {
        let _ = s.kill();
        let _ = s.wait();
    }
}

/// `TAILGUARD_REDIS_URL`, or a private redis-server (returned, to kill at the end).
fn redis() -> (String, Option<Child>) {
    if let Ok(url) = std::env::var("TAILGUARD_REDIS_URL")
        && !url.is_empty()
    {
        return (url, None);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let child = Command::new("redis-server")
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(std::env::temp_dir())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server is not installed (scripts/redis.sh installs it)");
    for _ in 0..500 {
        if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    (format!("redis://127.0.0.1:{port}/"), Some(child))
}

/// Redis work so far (`INFO commandstats`, the INFO calls excluded).
#[derive(Clone, Copy, Default)]
struct Work {
    /// Every command run, those inside scripts included.
    commands: u64,
    /// Script calls, plus one per pair of `ZREM`s (a release is one pipelined round trip).
    round_trips: u64,
}

impl std::ops::Sub for Work {
    type Output = Work;
    fn sub(self, o: Work) -> Work {
        Work {
            commands: self.commands - o.commands,
            round_trips: self.round_trips - o.round_trips,
        }
    }
}

async fn work(conn: &mut redis::aio::MultiplexedConnection) -> Work {
    let text: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO commandstats");
    let mut w = Work::default();
    for line in text.lines() {
        let Some((name, rest)) = line
            .strip_prefix("cmdstat_")
            .and_then(|l| l.split_once(':'))
        else {
            continue;
        };
        let calls = rest
            .split("calls=")
            .nth(1)
            .and_then(|c| c.split(',').next()?.parse::<u64>().ok())
            .unwrap_or(0);
        match name {
            "info" => continue,
            "evalsha" | "eval" => w.round_trips += calls,
            "zrem" => w.round_trips += calls / 2,
            _ => {}
        }
        w.commands += calls;
    }
    w
}

/// Part 1: one request at a time through `layer`.
async fn sequential(
    gate: &'static str,
    layer: &BoundedAdmissionLayer,
    info: &mut redis::aio::MultiplexedConnection,
) -> Latency {
    let svc = layer.layer(tower::service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(
            b"data: [DONE]\n\n",
        ))))
    }));
    let mut hist = Histogram::<u64>::new(3).expect("histogram");
    let mut before = Work::default();
    for i in 0..2 * SEQUENTIAL {
        if i == SEQUENTIAL {
            // Let the warm-up's last releases land before counting.
            tokio::time::sleep(Duration::from_millis(100)).await;
            before = work(info).await;
        }
        let start = Instant::now();
        let res = svc
            .clone()
            .oneshot(Request::new(()))
            .await
            .expect("infallible");
        assert!(
            res.status().is_success(),
            "{gate}: refused {}",
            res.status()
        );
        let _ = res.into_body().collect().await;
        if i >= SEQUENTIAL {
            let us = u64::try_from(start.elapsed().as_micros()).unwrap_or(u64::MAX);
            hist.saturating_record(us.max(1));
        }
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let ops = work(info).await - before;
    Latency {
        gate,
        p50_us: hist.value_at_quantile(0.5),
        p99_us: hist.value_at_quantile(0.99),
        p999_us: hist.value_at_quantile(0.999),
        redis_commands_per_request: ops.commands as f64 / SEQUENTIAL as f64,
        redis_round_trips_per_request: ops.round_trips as f64 / SEQUENTIAL as f64,
    }
}

/// Part 2: three gateways over one replica at 1,000 requests/s in all.
async fn three_gateways_run(
    mode: &'static str,
    url: &str,
    info: &mut redis::aio::MultiplexedConnection,
) -> ClusterRun {
    let replica = MockServer::start(STREAM_SCRIPT.parse().expect("script"))
        .await
        .expect("mock replica");
    let cluster = ClusterArgs {
        redis: (mode == "cluster").then(|| url.to_owned()),
        capacity: Some(CAPACITY),
        name: Some(format!("bench-{mode}-{}", std::process::id())),
        ..ClusterArgs::default()
    };
    let args = Args {
        listen: Some(([127, 0, 0, 1], 0).into()),
        upstreams: Some(vec![replica.url()]),
        models: Some(vec!["mock-llm".to_owned()]),
        admission: AdmissionArgs {
            capacity: Some(CAPACITY),
            // The shared capacity is what is measured: a fixed local limit, not an adaptive one.
            adaptive: Some(false),
            queue_len: Some(256),
            queue_timeout: Some(Dur(Duration::from_secs(2))),
            ..AdmissionArgs::default()
        },
        hedge: HedgeArgs {
            max_attempts: Some(1),
            failover_budget_ratio: Some(0.0),
            ..HedgeArgs::default()
        },
        priority: PriorityArgs {
            interactive_share: Some(0.0),
            ..PriorityArgs::default()
        },
        cluster,
        ..Args::default()
    };
    let mut gateways = Vec::new();
    for _ in 0..3 {
        let config = Config::resolve(Default::default(), &args).expect("config");
        gateways.push(Gateway::start(config).await.expect("gateway"));
    }
    let before = work(info).await;
    let loads = gateways.iter().enumerate().map(|(i, g)| {
        let config = LoadConfig::new(format!("http://{}", g.addr()))
            .rate(RATE_PER_GATEWAY)
            .duration(WINDOW)
            .max_requests(100_000)
            .request_timeout(Duration::from_secs(30))
            .drain_timeout(Duration::from_secs(30))
            .seed(i as u64 + 1);
        tokio::spawn(run(config))
    });
    let mut reports = Vec::new();
    for l in loads.collect::<Vec<_>>() {
        reports.push(l.await.expect("load task").expect("load"));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let ops = work(info).await - before;
    let mut statuses = BTreeMap::new();
    let mut ttft = Histogram::<u64>::new(3).expect("histogram");
    let mut scheduled = 0;
    for r in &reports {
        scheduled += r.scheduled;
        for (s, n) in &r.statuses {
            *statuses.entry(*s).or_insert(0) += n;
        }
        ttft.add(&r.ttft).expect("same histogram bounds");
    }
    let admitted = statuses.get(&200).copied().unwrap_or(0).max(1);
    let peak = replica.stats().peak_concurrent;
    for g in gateways {
        let _ = g.shutdown().await;
    }
    replica.shutdown().await;
    ClusterRun {
        mode,
        scheduled,
        statuses,
        peak_concurrent_at_replica: peak,
        capacity: match mode {
            "cluster" => format!("{CAPACITY} shared"),
            _ => format!("{CAPACITY} per gateway"),
        },
        redis_commands: ops.commands,
        redis_commands_per_request: ops.commands as f64 / scheduled.max(1) as f64,
        redis_commands_per_admitted: ops.commands as f64 / admitted as f64,
        redis_round_trips_per_request: ops.round_trips as f64 / scheduled.max(1) as f64,
        redis_round_trips_per_admitted: ops.round_trips as f64 / admitted as f64,
        ttft_p50_ms: ms(ttft.value_at_quantile(0.5)),
        ttft_p99_ms: ms(ttft.value_at_quantile(0.99)),
    }
}

/// The load generator's histograms are in microseconds.
fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

fn print(latency: &[Latency], runs: &[ClusterRun]) {
    println!("1. added latency per admitted request (one at a time, {SEQUENTIAL} requests)");
    println!(
        "{:<8} {:>8} {:>8} {:>9} {:>14} {:>16}",
        "gate", "p50 µs", "p99 µs", "p99.9 µs", "redis cmd/req", "round trips/req"
    );
    for l in latency {
        println!(
            "{:<8} {:>8} {:>8} {:>9} {:>14.2} {:>16.2}",
            l.gate,
            l.p50_us,
            l.p99_us,
            l.p999_us,
            l.redis_commands_per_request,
            l.redis_round_trips_per_request
        );
    }
    println!("\n2. three gateways, 1,000 requests/s for {WINDOW:?}, streams ~110 ms");
    for r in runs {
        println!(
            "{:<8} capacity {:<16} scheduled {:>6} statuses {:?} peak at replica {:>4} \
             redis cmd/req {:.2} (/admitted {:.2}) round trips/req {:.2} (/admitted {:.2}) \
             ttft p50 {:.1} ms p99 {:.1} ms",
            r.mode,
            r.capacity,
            r.scheduled,
            r.statuses,
            r.peak_concurrent_at_replica,
            r.redis_commands_per_request,
            r.redis_commands_per_admitted,
            r.redis_round_trips_per_request,
            r.redis_round_trips_per_admitted,
            r.ttft_p50_ms,
            r.ttft_p99_ms
        );
    }
}
