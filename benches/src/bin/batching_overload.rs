//! Issue 29's batching upstream: one `tailguard-mock` replica with a handful of slots that
//! queues the rest inside it (headers at once, the first token when a slot frees), offered
//! twice what its slots serve, through the gateway.
//!
//! ```text
//! cargo run --release -p tailguard-benches --bin batching_overload           # ~13 minutes
//! cargo run --release -p tailguard-benches --bin batching_overload -- --quick
//! cargo run --release -p tailguard-benches --bin batching_overload -- --only adaptive
//! ```
//!
//! `--only TEXT` runs the configurations whose flags contain `TEXT` and prints them without
//! writing the JSON (which holds every configuration).
//!
//! Each configuration gets a fresh replica and a fresh gateway (hedging off: there is one
//! replica) and the same open-loop Poisson load: 0.25x the replica's capacity (the unloaded
//! reference), then 0.8x, then 2x. The issue's figures are read in the 2x step's steady state
//! (its first [`SETTLE`] left out): how many streams the replica held at once (slots and its
//! own queue, from its request log, every 10 ms), the p99 time to first token of the requests
//! the gateway admitted (from the scheduled send time) against the unloaded step's, the
//! streams completed per second against the slots' capacity, and what the refused got: their
//! status, and the `Retry-After` of a probe request sent every 250 ms. The 0.8x step shows what a
//! configuration costs where the replica is busy but not overloaded. Results: a table on stdout and
//! `benches/results/batching_overload.json`.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tailguard_benches::batching::{SCRIPT, adaptive_limit, body, ms};
use tailguard_gateway::{Args, Config, Gateway, metrics_handle};
use tailguard_mock::load::{EndReason, LoadConfig};
use tailguard_mock::{MockServer, Outcome, ReplicaOptions, Script};
use tokio::time::{Instant, sleep_until};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The replica's slots: "a handful".
const SLOTS: u32 = 8;
/// Streams per second the slots complete: 8 slots over a stream of about
/// 80 ms + 31 × 25 ms × 1.25 (a full batch) plus the client's and the replica's own work,
/// 1.1 s as measured (a first run with 1.05 s completed 0.95x of it under overload).
const CAPACITY: f64 = SLOTS as f64 / 1.1;
/// The part of the 2x step left out as the configuration settles.
const SETTLE: Duration = Duration::from_secs(10);

/// One step of the offered load; a step with no name is sent but not measured (the 2x
/// step's first [`SETTLE`]).
struct Step {
    name: Option<&'static str>,
    load: f64,
    len: Duration,
}

const STEPS: [Step; 4] = [
    Step {
        name: Some("0.25x (unloaded)"),
        load: 0.25,
        len: Duration::from_secs(20),
    },
    Step {
        name: Some("0.8x"),
        load: 0.8,
        len: Duration::from_secs(30),
    },
    Step {
        name: None,
        load: 2.0,
        len: SETTLE,
    },
    Step {
        name: Some("2x"),
        load: 2.0,
        len: Duration::from_secs(40),
    },
];

/// A gateway configuration, named by the flags a user would set.
struct Variant {
    name: &'static str,
    adaptive: bool,
    /// `--replica-slots`: at most this many streams per replica, the admission capacity their
    /// sum.
    slots: Option<u32>,
    queue_timeout: Option<Duration>,
}

const VARIANTS: [Variant; 6] = [
    Variant {
        name: "defaults",
        adaptive: false,
        slots: None,
        queue_timeout: None,
    },
    Variant {
        name: "--admission-adaptive true",
        adaptive: true,
        slots: None,
        queue_timeout: None,
    },
    Variant {
        name: "--admission-adaptive true --admission-queue-timeout 250ms",
        adaptive: true,
        slots: None,
        queue_timeout: Some(Duration::from_millis(250)),
    },
    Variant {
        name: "--admission-adaptive true --admission-queue-timeout 100ms",
        adaptive: true,
        slots: None,
        queue_timeout: Some(Duration::from_millis(100)),
    },
    Variant {
        name: "--replica-slots 8",
        adaptive: false,
        slots: Some(SLOTS),
        queue_timeout: None,
    },
    Variant {
        name: "--replica-slots 8 --admission-queue-timeout 250ms",
        adaptive: false,
        slots: Some(SLOTS),
        queue_timeout: Some(Duration::from_millis(250)),
    },
];

#[derive(Serialize)]
struct StepResult {
    step: &'static str,
    offered_rps: f64,
    /// Seconds measured: the step, less [`SETTLE`] for the 2x step.
    measured_s: f64,
    p50_ttft_ms: Option<f64>,
    p99_ttft_ms: Option<f64>,
    /// Streams completed at the replica per second, over the capacity of its slots.
    goodput_vs_capacity: f64,
    /// Streams the replica held at once (its slots and its own queue): p99 and peak of a
    /// sample every 10 ms, in slots.
    at_replica_p99_slots: f64,
    at_replica_peak_slots: f64,
    /// Refusals by status.
    statuses: std::collections::BTreeMap<u16, u64>,
    /// Requests that ended neither completed nor refused.
    other_failures: u64,
    scheduled: u64,
}

#[derive(Serialize)]
struct Probe {
    /// Probes sent in the 2x step's steady state, and the refused ones.
    sent: u64,
    refused: u64,
    /// `Retry-After` seconds of the refused probes: the smallest and the largest.
    retry_after_min_s: Option<u64>,
    retry_after_max_s: Option<u64>,
    /// Refused probes without a `Retry-After`.
    missing_retry_after: u64,
}

#[derive(Serialize)]
struct VariantResult {
    config: &'static str,
    steps: Vec<StepResult>,
    probe: Probe,
    /// The adaptive limit's last value (the gauge), when the configuration has one.
    final_limit: Option<f64>,
    /// The 2x step's p99 TTFT over the unloaded step's (target ≤ 3).
    p99_vs_unloaded: Option<f64>,
}

fn gateway_config(v: &Variant, upstream: &str) -> Result<Config, BoxError> {
    let mut args = Args {
        upstreams: Some(vec![upstream.to_owned()]),
        ..Args::default()
    };
    args.hedge.replica_slots = v.slots;
    let mut c = Config::resolve(Default::default(), &args)?;
    c.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    c.hedge.max_attempts = 1;
    c.admission.adaptive = v.adaptive;
    if let Some(t) = v.queue_timeout {
        c.admission.queue_timeout = t;
    }
    Ok(c)
}

/// One request every 250 ms from `from` to `to`: the refused ones' `Retry-After`.
async fn probe(url: String, from: Instant, to: Instant) -> Probe {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let mut p = Probe {
        sent: 0,
        refused: 0,
        retry_after_min_s: None,
        retry_after_max_s: None,
        missing_retry_after: 0,
    };
    let mut sent = Vec::new();
    let mut at = from;
    while at < to {
        sleep_until(at).await;
        let req = http::Request::post(format!("{url}/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body())))
            .expect("valid request");
        let client = client.clone();
        // The refused ones' `Retry-After` (`Some(None)`: refused without one).
        sent.push(tokio::spawn(async move {
            let res = client.request(req).await.ok()?;
            let refused = !res.status().is_success();
            let ra = res
                .headers()
                .get(http::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
            let _ = res.into_body().collect().await;
            refused.then_some(ra)
        }));
        at += Duration::from_millis(250);
    }
    for t in sent {
        p.sent += 1;
        match t.await.ok().flatten() {
            Some(Some(s)) => {
                p.refused += 1;
                p.retry_after_min_s = Some(p.retry_after_min_s.map_or(s, |m| m.min(s)));
                p.retry_after_max_s = Some(p.retry_after_max_s.map_or(s, |m| m.max(s)));
            }
            Some(None) => {
                p.refused += 1;
                p.missing_retry_after += 1;
            }
            None => {}
        }
    }
    p
}

/// The streams the replica held at each 10 ms of `[from, to)`: p99 and peak.
fn at_replica(spans: &[(Instant, Option<Instant>)], from: Instant, to: Instant) -> (f64, f64) {
    let mut counts = Vec::new();
    let mut t = from;
    while t < to {
        let n = spans
            .iter()
            .filter(|(s, e)| *s <= t && e.is_none_or(|e| e > t))
            .count();
        counts.push(n);
        t += Duration::from_millis(10);
    }
    counts.sort_unstable();
    let p99 = counts.get(counts.len() * 99 / 100).copied().unwrap_or(0);
    let peak = counts.last().copied().unwrap_or(0);
    (p99 as f64 / SLOTS as f64, peak as f64 / SLOTS as f64)
}

async fn run_variant(v: &Variant, scale: u32) -> Result<VariantResult, BoxError> {
    let script: Script = SCRIPT.parse()?;
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let options = ReplicaOptions::new().batching(SLOTS);
    let mock = MockServer::start_with(addr, script, options).await?;
    let gw = Gateway::start(gateway_config(v, &mock.url())?).await?;
    let url = format!("http://{}", gw.addr());
    let start = Instant::now();
    let mut runs = Vec::new();
    let mut at = start;
    let mut probe_task = None;
    for (i, step) in STEPS.iter().enumerate() {
        let len = step.len / scale;
        let cfg = LoadConfig::new(url.clone())
            .rate(step.load * CAPACITY)
            .duration(len)
            .seed(i as u64 + 1)
            .body(body())
            .request_timeout(Duration::from_secs(60))
            .drain_timeout(Duration::from_secs(60));
        sleep_until(at).await;
        if step.load >= 2.0 && step.name.is_some() {
            probe_task = Some(tokio::spawn(probe(url.clone(), at, at + len)));
        }
        runs.push((at, at + len, tokio::spawn(tailguard_mock::load::run(cfg))));
        at += len;
    }
    let mut reports = Vec::new();
    for (from, to, run) in runs {
        reports.push((from, to, run.await??));
    }
    let probe = probe_task.ok_or("no measured 2x step")?.await?;
    let final_limit = adaptive_limit().filter(|_| v.adaptive);
    gw.shutdown().await?;
    let log = mock.stats().log;
    let spans: Vec<_> = log.iter().map(|r| (r.started, r.ended)).collect();
    let steps: Vec<StepResult> = STEPS
        .iter()
        .zip(&reports)
        .filter_map(|(step, report)| Some((step.name?, step, report)))
        .map(|(name, step, (from, to, r))| {
            let secs = to.duration_since(*from).as_secs_f64();
            let completed = log
                .iter()
                .filter(|r| r.outcome == Outcome::Completed)
                .filter(|r| r.ended.is_some_and(|e| e >= *from && e < *to))
                .count();
            let (p99, peak) = at_replica(&spans, *from, *to);
            let refused = r.count(EndReason::HttpStatus);
            let completed_c = r.count(EndReason::Completed);
            StepResult {
                step: name,
                offered_rps: step.load * CAPACITY,
                measured_s: secs,
                p50_ttft_ms: ms(&r.ttft, 0.5),
                p99_ttft_ms: ms(&r.ttft, 0.99),
                goodput_vs_capacity: completed as f64 / secs / CAPACITY,
                at_replica_p99_slots: p99,
                at_replica_peak_slots: peak,
                statuses: r
                    .statuses
                    .iter()
                    .filter(|(s, _)| **s >= 300)
                    .map(|(s, n)| (*s, *n))
                    .collect(),
                other_failures: r.scheduled.saturating_sub(completed_c + refused),
                scheduled: r.scheduled,
            }
        })
        .collect();
    let p99_vs_unloaded = match (steps[0].p99_ttft_ms, steps[steps.len() - 1].p99_ttft_ms) {
        (Some(u), Some(o)) if u > 0.0 => Some(o / u),
        _ => None,
    };
    Ok(VariantResult {
        config: v.name,
        steps,
        probe,
        final_limit,
        p99_vs_unloaded,
    })
}

fn print(results: &[VariantResult]) {
    for r in results {
        println!("{}", r.config);
        for s in &r.steps {
            let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0} ms"));
            println!(
                "  {:<17} p50 {:>9} p99 {:>9}  goodput {:.2}x  at the replica p99 {:.2}x, peak {:.2}x slots  refused {:?}  failed {}",
                s.step,
                f(s.p50_ttft_ms),
                f(s.p99_ttft_ms),
                s.goodput_vs_capacity,
                s.at_replica_p99_slots,
                s.at_replica_peak_slots,
                s.statuses,
                s.other_failures
            );
        }
        let p = &r.probe;
        println!(
            "  probes {} refused {} Retry-After {:?}..{:?} s (missing {}); limit {:?}; 2x p99 / unloaded {}",
            p.sent,
            p.refused,
            p.retry_after_min_s,
            p.retry_after_max_s,
            p.missing_retry_after,
            r.final_limit,
            r.p99_vs_unloaded
                .map_or("-".to_owned(), |x| format!("{x:.2}x"))
        );
    }
}

#[derive(Serialize)]
struct Output<'a> {
    slots: u32,
    capacity_rps: f64,
    script: &'static str,
    settle_s: f64,
    results: &'a [VariantResult],
    run: tailguard_benches::run::RunInfo,
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1));
    let scale = if quick { 4 } else { 1 };
    let run = tailguard_benches::run::RunInfo::start();
    println!("{}", run.summary());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let _ = metrics_handle();
    let mut results = Vec::new();
    for v in VARIANTS
        .iter()
        .filter(|v| only.is_none_or(|o| v.name.contains(o.as_str())))
    {
        eprintln!("running {} ...", v.name);
        results.push(rt.block_on(run_variant(v, scale))?);
    }
    print(&results);
    if quick || only.is_some() {
        return Ok(());
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    std::fs::create_dir_all(&dir)?;
    let out = Output {
        slots: SLOTS,
        capacity_rps: CAPACITY,
        script: SCRIPT,
        settle_s: SETTLE.as_secs_f64(),
        results: &results,
        run: run.finish(),
    };
    std::fs::write(
        dir.join("batching_overload.json"),
        serde_json::to_string_pretty(&out)?,
    )?;
    Ok(())
}
