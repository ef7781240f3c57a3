//! Tail latency of LLM streaming calls, strategy by strategy, over real loopback HTTP.
//!
//! ```text
//! cargo run --release -p tailguard-benches --bin tail_latency            # ~4.5 minutes
//! cargo run --release -p tailguard-benches --bin tail_latency -- --quick # ~1 minute
//! cargo run --release -p tailguard-benches --bin tail_latency -- --scenario a
//! ```
//!
//! For each scenario, each strategy gets its own replicas (`tailguard-mock` servers on
//! `127.0.0.1:0`, same scripts, same seeds) and its own in-process front server (HTTP/1.1)
//! whose service is the strategy's tower stack over a pooled hyper client to the replicas. The
//! mock's open-loop load generator sends the same Poisson arrival schedule (same seed, same
//! request count) to every front and measures time to first token and total time from each
//! request's *scheduled* send time. Strategies run one after the other (side by side, five load
//! generators and ten replicas saturate two cores and distort every figure). Results: one table on stdout,
//! `benches/results/tail_latency.json` and one SVG per scenario with the TTFT CDFs.

mod plot;
mod strategy;
mod upstream;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tailguard_mock::load::{EndReason, LoadConfig, Percentiles};
use tailguard_mock::{Latency, MockServer, Outcome, Script, SplitMix64, Stats};
use tokio::task::JoinSet;

use crate::strategy::Strategy;
use crate::upstream::{BENCH_ID_HEADER, BoxError, Upstream};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One replica: its script, and optionally a queue of per-request scripts it follows first.
#[derive(Clone, Debug)]
struct Replica {
    script: Script,
    queue: Vec<Script>,
}

#[derive(Clone, Debug)]
struct Scenario {
    key: &'static str,
    title: &'static str,
    description: &'static str,
    replicas: Vec<Replica>,
    /// Requests sent straight to a replica by other clients, outside the measured traffic:
    /// (replica, first at, then every, their `x-mock-script`), within the sending window.
    background: Vec<(usize, Duration, Duration, &'static str)>,
    /// How long one background request occupies its replica (for the oracle router).
    background_hold: Duration,
    rate: f64,
    requests: u64,
    fixed_delay: Duration,
    /// The TTFT distribution of a healthy, idle replica (for the floor).
    fast: Latency,
}

/// Scenario A: a congested replica, the problem statement's numbers scaled by 0.1.
fn scenario_a(requests: u64) -> Scenario {
    let fast = Latency::log_normal(ms(50), 0.05);
    let script = |seed| {
        Script::new()
            .ttft(Latency::mixture(fast.clone(), Latency::ms(500), 0.05))
            .tokens(20)
            .gap(ms(5))
            .seed(seed)
    };
    Scenario {
        key: "a",
        title: "A: congested replica",
        description: "2 replicas; TTFT lognormal(50ms, 0.05), 5% of requests land on a congested replica (TTFT 500ms); 20 tokens 5ms apart; 100 req/s",
        replicas: vec![
            Replica {
                script: script(11),
                queue: Vec::new(),
            },
            Replica {
                script: script(12),
                queue: Vec::new(),
            },
        ],
        background: Vec::new(),
        background_hold: Duration::ZERO,
        rate: 100.0,
        requests,
        fixed_delay: ms(60),
        fast,
    }
}

/// Scenario B: head-of-line blocking behind long prompts on single-slot replicas.
fn scenario_b(requests: u64) -> Scenario {
    let fast = Latency::log_normal(ms(20), 0.05);
    let script = |seed| {
        Script::new()
            .ttft(fast.clone())
            .tokens(5)
            .gap(ms(2))
            .single_slot(true)
            .seed(seed)
    };
    const LONG: &str = "ttft=800ms";
    Scenario {
        key: "b",
        title: "B: head-of-line blocking",
        description: "2 single-slot replicas (one generation at a time); measured requests TTFT lognormal(20ms, 0.05), 5 tokens 2ms apart, 20 req/s; other clients' long-prompt requests (TTFT 800ms) reach each replica directly every 12 s (staggered by 6 s), so about 7% of the time a replica is occupied and short requests queue behind it",
        replicas: vec![
            Replica {
                script: script(21),
                queue: Vec::new(),
            },
            Replica {
                script: script(22),
                queue: Vec::new(),
            },
        ],
        background: vec![
            (0, ms(2000), ms(12_000), LONG),
            (1, ms(8000), ms(12_000), LONG),
        ],
        // TTFT 800 ms, 5 tokens 2 ms apart, a few ms of loopback.
        background_hold: ms(815),
        rate: 20.0,
        requests,
        fixed_delay: ms(50),
        fast,
    }
}

/// Scenario C: one flaky replica.
fn scenario_c(requests: u64) -> Scenario {
    let fast = Latency::log_normal(ms(50), 0.05);
    let healthy = |seed| {
        Script::new()
            .ttft(fast.clone())
            .tokens(20)
            .gap(ms(5))
            .seed(seed)
    };
    // 10% of the flaky replica's requests get a 503, 10% a connection reset, both before the
    // first token; the rest are served normally. One script per request, in arrival order.
    let mut rng = SplitMix64::new(33);
    let queue = (0..requests * 2)
        .map(|_| {
            let x = rng.next_f64();
            if x < 0.1 {
                healthy(32).status(http::StatusCode::SERVICE_UNAVAILABLE)
            } else if x < 0.2 {
                healthy(32).reset_before_headers()
            } else {
                healthy(32)
            }
        })
        .collect();
    Scenario {
        key: "c",
        title: "C: flaky replica",
        description: "2 replicas, TTFT lognormal(50ms, 0.05), 20 tokens 5ms apart; 20% of one replica's requests fail before the first token (10% 503, 10% connection reset); 100 req/s",
        replicas: vec![
            Replica {
                script: healthy(31),
                queue: Vec::new(),
            },
            Replica {
                script: healthy(32),
                queue,
            },
        ],
        background: Vec::new(),
        background_hold: Duration::ZERO,
        rate: 100.0,
        requests,
        fixed_delay: ms(60),
        fast,
    }
}

/// Milliseconds percentiles.
#[derive(Clone, Debug, Serialize)]
struct Ms {
    count: u64,
    p50: f64,
    p90: f64,
    p99: f64,
    p999: f64,
    max: f64,
}

impl Ms {
    fn of(h: &Histogram<u64>) -> Self {
        let p = Percentiles::of(h);
        Ms {
            count: p.count,
            p50: p.p50 * 1e3,
            p90: p.p90 * 1e3,
            p99: p.p99 * 1e3,
            p999: p.p999 * 1e3,
            max: p.max * 1e3,
        }
    }
}

#[derive(Clone, Debug, Serialize)]
struct StrategyResult {
    #[serde(skip)]
    strategy: Strategy,
    key: &'static str,
    name: &'static str,
    /// Requests sent by the load generator.
    sent: u64,
    ttft_ms: Ms,
    total_ms: Ms,
    /// Requests the replicas received beyond one per client request, % of requests sent.
    extra_upstream_pct: f64,
    /// Client requests that used more than one upstream attempt.
    hedged: u64,
    /// Upstream requests the replicas saw cancelled by the client (losers, mostly).
    cancelled_upstream: u64,
    /// Client-visible errors (anything but a completed stream), % of requests sent.
    error_pct: f64,
    /// End reasons as the load generator saw them.
    end_reasons: BTreeMap<String, u64>,
    /// The hedge delay: configured (fixed), else the median of the delays measured between
    /// a primary's and its backup's arrival at the replicas (delay-triggered hedges only).
    hedge_delay_ms: Option<f64>,
    /// Hedge delay + the fast replica's p99 TTFT.
    floor_ms: Option<f64>,
    /// p99 TTFT / floor.
    p99_over_floor: Option<f64>,
    /// p99 TTFT / no-hedge p99 TTFT.
    p99_vs_no_hedge: Option<f64>,
    /// p99 TTFT / tower::hedge p99 TTFT.
    p99_vs_tower_hedge: Option<f64>,
    #[serde(skip)]
    ttft_hist: Histogram<u64>,
}

#[derive(Clone, Debug, Serialize)]
struct ScenarioResult {
    key: &'static str,
    title: &'static str,
    description: &'static str,
    rate: f64,
    requests: u64,
    fixed_delay_ms: f64,
    fast_replica_p99_ttft_ms: f64,
    strategies: Vec<StrategyResult>,
}

/// p99 of the fast replica's scripted TTFT, from 200,000 draws of the mock's own distribution.
fn fast_p99(fast: &Latency) -> Duration {
    let mut rng = SplitMix64::new(99);
    let mut v: Vec<Duration> = (0..200_000).map(|_| fast.sample(&mut rng)).collect();
    v.sort_unstable();
    v[v.len() * 99 / 100]
}

/// Median delay between a client request's first and second upstream attempt, over the
/// requests whose first attempt did not fail outright (so: hedges triggered by the delay).
fn hedges(stats: &[Stats]) -> (u64, Option<Duration>) {
    let mut groups: BTreeMap<String, Vec<(tokio::time::Instant, Outcome)>> = BTreeMap::new();
    for s in stats {
        for r in &s.log {
            if let Some(id) = r.headers.get(BENCH_ID_HEADER).and_then(|v| v.to_str().ok()) {
                groups
                    .entry(id.to_owned())
                    .or_default()
                    .push((r.started, r.outcome));
            }
        }
    }
    let mut hedged = 0;
    let mut delays = Vec::new();
    for attempts in groups.values_mut() {
        if attempts.len() < 2 {
            continue;
        }
        hedged += 1;
        attempts.sort_by_key(|a| a.0);
        let failed = matches!(
            attempts[0].1,
            Outcome::Status(_) | Outcome::ResetBeforeHeaders
        );
        if !failed {
            delays.push(attempts[1].0 - attempts[0].0);
        }
    }
    delays.sort_unstable();
    (hedged, delays.get(delays.len() / 2).copied())
}

async fn run_strategy(sc: Arc<Scenario>, st: Strategy) -> Result<StrategyResult, BoxError> {
    let mut servers = Vec::new();
    for r in &sc.replicas {
        let s = MockServer::start(r.script.clone()).await?;
        if !r.queue.is_empty() {
            s.push_scripts(r.queue.clone());
        }
        servers.push(s);
    }
    let client = upstream::client();
    let replicas = servers
        .iter()
        .map(|s| Upstream::new(client.clone(), s.url()))
        .collect();
    let expected = Duration::from_secs_f64(sc.requests as f64 / sc.rate);
    // The background schedule, for the oracle: a long prompt occupies its replica from its
    // send time for its TTFT plus its tokens (and a margin for the loopback).
    let start = tokio::time::Instant::now();
    let mut windows = Vec::new();
    for &(replica, first, every, _) in &sc.background {
        let mut at = first;
        while at < expected.mul_f64(1.3) + Duration::from_secs(1) {
            windows.push((replica, at, at + sc.background_hold));
            at += every;
        }
    }
    let busy = strategy::Busy {
        start,
        windows: windows.into(),
    };
    let stack = strategy::build(st, replicas, sc.fixed_delay, busy);
    let (addr, front) = upstream::serve(stack).await?;
    let window = expected.mul_f64(1.3) + Duration::from_secs(1);
    let mut background = JoinSet::new();
    for &(replica, first, every, script) in &sc.background {
        let mut at = first;
        while at < expected {
            let url = format!("{}/v1/chat/completions", servers[replica].url());
            let client = client.clone();
            background.spawn(async move {
                tokio::time::sleep(at).await;
                let req = http::Request::post(url)
                    .header(tailguard_mock::SCRIPT_HEADER, script)
                    .header(http::header::CONTENT_TYPE, "application/json")
                    .body(upstream::box_body(http_body_util::Full::new(
                        bytes::Bytes::from_static(tailguard_mock::load::DEFAULT_BODY.as_bytes()),
                    )));
                if let Ok(req) = req
                    && let Ok(res) = client.request(req).await
                {
                    let _ = http_body_util::BodyExt::collect(res.into_body()).await;
                }
            });
            at += every;
        }
    }
    let report = tailguard_mock::load::run(
        LoadConfig::new(format!("http://{addr}"))
            .rate(sc.rate)
            .max_requests(sc.requests)
            .duration(window)
            .request_timeout(Duration::from_secs(20))
            .drain_timeout(Duration::from_secs(20))
            .seed(7),
    )
    .await?;
    for s in &servers {
        let _ = tokio::time::timeout(Duration::from_secs(5), s.wait_idle()).await;
    }
    front.abort();
    background.abort_all();
    let stats: Vec<Stats> = servers.iter().map(MockServer::stats).collect();
    for s in servers {
        s.shutdown().await;
    }
    let sent = report.scheduled - report.count(EndReason::Dropped);
    // The measured traffic only (background requests carry no bench id), from the mock's log.
    let measured = || {
        stats
            .iter()
            .flat_map(|s| &s.log)
            .filter(|r| r.headers.contains_key(BENCH_ID_HEADER))
    };
    let upstream = measured().count() as u64;
    let cancelled = measured()
        .filter(|r| r.outcome == Outcome::Cancelled)
        .count() as u64;
    let errors = sent - report.count(EndReason::Completed);
    let (hedged, measured_delay) = hedges(&stats);
    let delay = match st {
        Strategy::NoHedge => None,
        Strategy::FixedDelay => Some(sc.fixed_delay),
        _ => measured_delay,
    };
    let pct = |n: u64| {
        if sent == 0 {
            0.0
        } else {
            n as f64 * 100.0 / sent as f64
        }
    };
    Ok(StrategyResult {
        strategy: st,
        key: st.key(),
        name: st.name(),
        sent,
        ttft_ms: Ms::of(&report.ttft),
        total_ms: Ms::of(&report.total),
        extra_upstream_pct: pct(upstream.saturating_sub(sent)),
        hedged,
        cancelled_upstream: cancelled,
        error_pct: pct(errors),
        end_reasons: report
            .summary()
            .end_reasons
            .into_iter()
            .collect::<BTreeMap<_, _>>(),
        hedge_delay_ms: delay.map(|d| d.as_secs_f64() * 1e3),
        floor_ms: None,
        p99_over_floor: None,
        p99_vs_no_hedge: None,
        p99_vs_tower_hedge: None,
        ttft_hist: report.ttft.clone(),
    })
}

async fn run_scenario(sc: Scenario, only: Option<&str>) -> Result<ScenarioResult, BoxError> {
    let sc = Arc::new(sc);
    let fast_p99_ms = fast_p99(&sc.fast).as_secs_f64() * 1e3;
    let mut results = Vec::new();
    for st in Strategy::ALL {
        if only.is_some_and(|k| k != st.key()) {
            continue;
        }
        if st == Strategy::Oracle && sc.background.is_empty() {
            continue;
        }
        eprintln!("  {}", st.name());
        results.push(run_strategy(sc.clone(), st).await?);
    }
    let p99_of = |key: &str, rs: &[StrategyResult]| {
        rs.iter()
            .find(|r| r.key == key)
            .map(|r| r.ttft_ms.p99)
            .filter(|p| *p > 0.0)
    };
    let no_hedge = p99_of(Strategy::NoHedge.key(), &results);
    let tower = p99_of(Strategy::TowerHedge.key(), &results);
    for r in &mut results {
        let p99 = r.ttft_ms.p99;
        r.floor_ms = r.hedge_delay_ms.map(|d| d + fast_p99_ms);
        r.p99_over_floor = r.floor_ms.map(|f| p99 / f);
        r.p99_vs_no_hedge = no_hedge.map(|b| p99 / b);
        r.p99_vs_tower_hedge = tower.map(|b| p99 / b);
    }
    Ok(ScenarioResult {
        key: sc.key,
        title: sc.title,
        description: sc.description,
        rate: sc.rate,
        requests: sc.requests,
        fixed_delay_ms: sc.fixed_delay.as_secs_f64() * 1e3,
        fast_replica_p99_ttft_ms: fast_p99_ms,
        strategies: results,
    })
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

fn print(sc: &ScenarioResult) {
    println!("\n== {} ({} requests)", sc.title, sc.requests);
    println!("   {}", sc.description);
    println!(
        "   fast replica p99 TTFT {:.1} ms; fixed delay {:.0} ms",
        sc.fast_replica_p99_ttft_ms, sc.fixed_delay_ms
    );
    println!(
        "{:<29} {:>49} | {:>49} | {:>6} {:>5} {:>5} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}",
        "",
        "TTFT ms: p50 / p90 / p99 / p99.9 / max",
        "total ms: p50 / p90 / p99 / p99.9 / max",
        "extra%",
        "cncl",
        "err%",
        "delay",
        "floor",
        "/floor",
        "/none",
        "/tower",
        "",
    );
    for r in &sc.strategies {
        let t = &r.ttft_ms;
        let o = &r.total_ms;
        let pass = if r.strategy.first_token() {
            let ok = r.p99_vs_no_hedge.is_some_and(|x| x <= 0.25)
                && r.p99_vs_tower_hedge.is_some_and(|x| x <= 0.25)
                && r.p99_over_floor.is_some_and(|x| x <= 1.3)
                && r.extra_upstream_pct <= 10.0;
            if ok { "met" } else { "missed" }
        } else {
            ""
        };
        println!(
            "{:<29} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} | {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} | {:>6.1} {:>5} {:>5.1} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6}",
            r.name,
            t.p50,
            t.p90,
            t.p99,
            t.p999,
            t.max,
            o.p50,
            o.p90,
            o.p99,
            o.p999,
            o.max,
            r.extra_upstream_pct,
            r.cancelled_upstream,
            r.error_pct,
            opt(r.hedge_delay_ms, 1),
            opt(r.floor_ms, 1),
            opt(r.p99_over_floor, 2),
            opt(r.p99_vs_no_hedge, 2),
            opt(r.p99_vs_tower_hedge, 2),
            pass,
        );
    }
}

#[derive(Serialize)]
struct Output<'a> {
    bench: &'static str,
    quick: bool,
    targets: &'static str,
    scenarios: &'a [ScenarioResult],
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let only = args
        .iter()
        .position(|a| a == "--scenario")
        .and_then(|i| args.get(i + 1))
        .map(|s| s.to_ascii_lowercase());
    let only_strategy = args
        .iter()
        .position(|a| a == "--strategy")
        .and_then(|i| args.get(i + 1))
        .cloned();
    if args.iter().any(|a| a == "--help" || a == "-h") {
        let keys: Vec<&str> = Strategy::ALL.iter().map(|s| s.key()).collect();
        println!(
            "usage: tail_latency [--quick] [--scenario a|b|c] [--strategy {}]",
            keys.join("|")
        );
        return Ok(());
    }
    let scale = |n: u64| if quick { n / 5 } else { n };
    let scenarios = [
        scenario_a(scale(2000)),
        scenario_b(scale(500)),
        scenario_c(scale(1000)),
    ];
    let mut results = Vec::new();
    for sc in scenarios {
        if only.as_deref().is_some_and(|o| o != sc.key) {
            continue;
        }
        eprintln!(
            "running {} ({} requests at {} req/s per strategy)...",
            sc.title, sc.requests, sc.rate
        );
        let r = run_scenario(sc, only_strategy.as_deref()).await?;
        print(&r);
        results.push(r);
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    std::fs::create_dir_all(&dir)?;
    let out = Output {
        bench: "tail_latency",
        quick,
        targets: "first-token strategies: p99 TTFT <= 0.25x no hedge and tower::hedge, <= 1.3x floor, extra load <= 10%",
        scenarios: &results,
    };
    let json_path = dir.join("tail_latency.json");
    std::fs::write(&json_path, serde_json::to_string_pretty(&out)?)?;
    println!("\nwrote {}", json_path.display());
    for r in &results {
        let path = dir.join(format!("tail_latency_{}.svg", r.key));
        let series: Vec<(&str, &Histogram<u64>)> = r
            .strategies
            .iter()
            .map(|s| (s.name, &s.ttft_hist))
            .collect();
        plot::ttft_cdf(&path, r.title, &series)?;
        println!("wrote {}", path.display());
    }
    Ok(())
}
