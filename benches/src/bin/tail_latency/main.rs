//! Tail latency of LLM streaming calls, strategy by strategy, over real loopback HTTP.
//!
//! ```text
//! cargo run --release -p tailguard-benches --bin tail_latency            # ~14 minutes
//! cargo run --release -p tailguard-benches --bin tail_latency -- --quick # about a fifth of that
//! cargo run --release -p tailguard-benches --bin tail_latency -- --scenario d_slots --strategy tower_p2c
//! ```
//!
//! For each scenario, each strategy gets its own replicas (`tailguard-mock` servers on
//! `127.0.0.1:0`, same scripts, same seeds) and its own in-process front server (HTTP/1.1)
//! whose service is the strategy's tower stack over a pooled hyper client to the replicas. The
//! mock's open-loop load generator sends the same Poisson arrival schedule (same seed, same
//! request count) to every front and measures time to first token and total time from each
//! request's *scheduled* send time. Strategies run one after the other (side by side, five load
//! generators and ten replicas saturate two cores and distort every figure). Results: one table
//! per scenario on stdout and, for a run of every scenario, `benches/results/tail_latency.json`
//! and one SVG per scenario with the TTFT CDFs (`--scenario` and `--strategy` only print).
//! Scenarios D run over the bench's own single-slot replicas ([`slot`]) in front of the mocks.

mod balance;
mod plot;
mod report;
mod scenario;
mod slot;
mod strategy;
mod upstream;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;
use tailguard_mock::load::{EndReason, LoadConfig};
use tailguard_mock::{MockServer, Outcome, Stats};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::report::{Ms, ScenarioResult, SlotCounts, StrategyResult};
use crate::scenario::{Other, Pacing, Scenario};
use crate::slot::{SlotMode, SlotServer};
use crate::strategy::{Busy, Strategy};
use crate::upstream::{BENCH_ID_HEADER, BoxError, Upstream};

/// One upstream attempt of the measured traffic, as its replica saw it.
#[derive(Debug)]
struct Seen {
    /// The front's request id.
    id: String,
    replica: usize,
    started: Instant,
    /// It failed before any token (scripted status or reset, or interrupted).
    failed: bool,
    cancelled: bool,
}

fn seen_by_mocks(stats: &[Stats]) -> Vec<Seen> {
    let mut out = Vec::new();
    for (replica, r) in stats
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.log.iter().map(move |r| (i, r)))
    {
        if let Some(id) = r.headers.get(BENCH_ID_HEADER).and_then(|v| v.to_str().ok()) {
            out.push(Seen {
                id: id.to_owned(),
                replica,
                started: r.started,
                failed: matches!(r.outcome, Outcome::Status(_) | Outcome::ResetBeforeHeaders),
                cancelled: r.outcome == Outcome::Cancelled,
            });
        }
    }
    out
}

/// The measured attempts and the slot counts, from single-slot replicas' logs.
fn seen_by_slots(slots: &[SlotServer]) -> (Vec<Seen>, SlotCounts) {
    let mut out = Vec::new();
    let mut counts = SlotCounts::default();
    for (replica, r) in slots
        .iter()
        .enumerate()
        .flat_map(|(i, s)| s.log().into_iter().map(move |r| (i, r)))
    {
        match r.id {
            Some(id) => {
                counts.late += u64::from(r.late);
                counts.interrupted += u64::from(r.interrupted);
                out.push(Seen {
                    id,
                    replica,
                    started: r.started,
                    failed: r.interrupted,
                    cancelled: r.cancelled,
                });
            }
            None => {
                counts.others += 1;
                counts.others_late += u64::from(r.late);
                counts.others_interrupted += u64::from(r.interrupted);
            }
        }
    }
    (out, counts)
}

/// Median delay between a client request's first and second upstream attempt, over the
/// requests whose first attempt did not fail outright (so: hedges triggered by the delay).
fn hedges(seen: &[Seen]) -> (u64, Option<Duration>) {
    let mut groups: BTreeMap<&str, Vec<(Instant, bool)>> = BTreeMap::new();
    for s in seen {
        groups
            .entry(s.id.as_str())
            .or_default()
            .push((s.started, s.failed));
    }
    let mut hedged = 0;
    let mut delays = Vec::new();
    for attempts in groups.values_mut() {
        if attempts.len() < 2 {
            continue;
        }
        hedged += 1;
        attempts.sort_by_key(|a| a.0);
        if !attempts[0].1 {
            delays.push(attempts[1].0 - attempts[0].0);
        }
    }
    delays.sort_unstable();
    (hedged, delays.get(delays.len() / 2).copied())
}

/// Per replica: the measured traffic's primaries (each request's first attempt) and all its
/// attempts.
fn per_replica(seen: &[Seen], n: usize) -> (Vec<u64>, Vec<u64>) {
    let mut first: BTreeMap<&str, (Instant, usize)> = BTreeMap::new();
    let mut attempts = vec![0; n];
    for s in seen {
        attempts[s.replica] += 1;
        let e = first.entry(s.id.as_str()).or_insert((s.started, s.replica));
        if s.started < e.0 {
            *e = (s.started, s.replica);
        }
    }
    let mut primaries = vec![0; n];
    for (_, i) in first.values() {
        primaries[*i] += 1;
    }
    (primaries, attempts)
}

/// Another client: sends to `url` on its pacing until `until` after `start`, its requests
/// counted in `busy` while in flight.
async fn other_client(
    other: Other,
    url: String,
    client: upstream::HttpClient,
    busy: Busy,
    start: Instant,
    until: Duration,
) {
    let mut at = other.first;
    while at < until {
        tokio::time::sleep_until(start + at).await;
        let req = http::Request::post(&url)
            .header(tailguard_mock::SCRIPT_HEADER, other.script)
            .header(http::header::CONTENT_TYPE, "application/json")
            .body(upstream::box_body(http_body_util::Full::new(
                bytes::Bytes::from_static(tailguard_mock::load::DEFAULT_BODY.as_bytes()),
            )));
        let Ok(req) = req else {
            return;
        };
        busy.0[other.replica].fetch_add(1, Ordering::Relaxed);
        if let Ok(res) = client.request(req).await {
            let _ = http_body_util::BodyExt::collect(res.into_body()).await;
        }
        busy.0[other.replica].fetch_sub(1, Ordering::Relaxed);
        at = match other.pacing {
            Pacing::Every(d) => at + d,
            Pacing::Think(d) => start.elapsed() + d,
        };
    }
}

/// The replicas of one strategy's run: the mocks, and single-slot servers in front of them.
struct Replicas {
    mocks: Vec<MockServer>,
    slots: Vec<SlotServer>,
}

impl Replicas {
    async fn start(sc: &Scenario, client: &upstream::HttpClient) -> Result<Replicas, BoxError> {
        let mut mocks = Vec::new();
        let mut slots = Vec::new();
        for r in &sc.replicas {
            let m = MockServer::start(r.script.clone()).await?;
            if !r.queue.is_empty() {
                m.push_scripts(r.queue.clone());
            }
            if let Some(mode) = sc.slot_mode {
                slots.push(SlotServer::start(mode, m.url(), client.clone()).await?);
            }
            mocks.push(m);
        }
        Ok(Replicas { mocks, slots })
    }

    fn urls(&self) -> Vec<String> {
        if self.slots.is_empty() {
            self.mocks.iter().map(MockServer::url).collect()
        } else {
            self.slots.iter().map(SlotServer::url).collect()
        }
    }

    /// Waits for the replicas to go idle, stops them; the measured attempts and slot counts.
    async fn finish(self) -> (Vec<Seen>, Option<SlotCounts>) {
        for s in &self.mocks {
            let _ = tokio::time::timeout(Duration::from_secs(5), s.wait_idle()).await;
        }
        let stats: Vec<Stats> = self.mocks.iter().map(MockServer::stats).collect();
        let out = if self.slots.is_empty() {
            (seen_by_mocks(&stats), None)
        } else {
            let (seen, counts) = seen_by_slots(&self.slots);
            (seen, Some(counts))
        };
        drop(self.slots);
        for s in self.mocks {
            s.shutdown().await;
        }
        out
    }
}

async fn run_strategy(sc: Arc<Scenario>, st: Strategy) -> Result<StrategyResult, BoxError> {
    let client = upstream::client();
    let replicas = Replicas::start(&sc, &client).await?;
    let urls = replicas.urls();
    let upstreams = urls
        .iter()
        .map(|u| Upstream::new(client.clone(), u.clone()))
        .collect();
    let busy = Busy::new(urls.len());
    let stack = strategy::build(st, upstreams, sc.fixed_delay, sc.slots, busy.clone());
    let (addr, front) = upstream::serve(stack).await?;
    let expected = Duration::from_secs_f64(sc.requests as f64 / sc.rate);
    let window = expected.mul_f64(1.3) + Duration::from_secs(1);
    let start = Instant::now();
    let mut others = JoinSet::new();
    for o in &sc.others {
        let url = format!("{}/v1/chat/completions", urls[o.replica]);
        let task = other_client(
            o.clone(),
            url,
            client.clone(),
            busy.clone(),
            start,
            expected,
        );
        others.spawn(task);
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
    others.abort_all();
    let (seen, slot_counts) = replicas.finish().await;
    front.abort();
    let sent = report.scheduled - report.count(EndReason::Dropped);
    let upstream = seen.len() as u64;
    let cancelled = seen.iter().filter(|s| s.cancelled).count() as u64;
    let errors = sent - report.count(EndReason::Completed);
    let (hedged, measured_delay) = hedges(&seen);
    let (primaries_per_replica, attempts_per_replica) = per_replica(&seen, urls.len());
    let delay = match st {
        Strategy::NoHedge | Strategy::P2c | Strategy::Oracle | Strategy::TowerHedge => None,
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
        no_token: sent.saturating_sub(report.ttft.len()),
        tokens_missing: (sent * u64::from(sc.tokens)).saturating_sub(report.tokens),
        slot_counts,
        primaries_per_replica,
        attempts_per_replica,
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
        p99_vs_p2c: None,
        target_met: None,
        ttft_hist: report.ttft.clone(),
    })
}

async fn run_scenario(sc: Scenario, only: Option<&str>) -> Result<ScenarioResult, BoxError> {
    let sc = Arc::new(sc);
    let fast_p99_ms = scenario::fast_p99(&sc.fast).as_secs_f64() * 1e3;
    let mut results = Vec::new();
    // `--strategy KEY` runs that strategy, in the scenario's list or not.
    let strategies: Vec<Strategy> = match only {
        Some(k) => Strategy::ALL.into_iter().filter(|s| s.key() == k).collect(),
        None => sc.strategies.to_vec(),
    };
    for st in strategies {
        eprintln!("  {}", st.name());
        results.push(run_strategy(sc.clone(), st).await?);
    }
    report::compare(sc.key, fast_p99_ms, &mut results);
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

#[derive(Serialize)]
struct Output<'a> {
    bench: &'static str,
    quick: bool,
    targets: &'static str,
    scenarios: &'a [ScenarioResult],
    /// When the run started and the machine's load.
    run: tailguard_benches::run::RunInfo,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let run = tailguard_benches::run::RunInfo::start();
    println!("{}", run.summary());
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
            "usage: tail_latency [--quick] [--scenario a|b|c|d|d_slots|d_interrupt] [--strategy {}]",
            keys.join("|")
        );
        return Ok(());
    }
    let scale = |n: u64| if quick { n / 5 } else { n };
    let scenarios = [
        scenario::a(scale(2000)),
        scenario::b(scale(500)),
        scenario::c(scale(1000)),
        scenario::d(scale(500), SlotMode::Fifo, None),
        scenario::d(scale(500), SlotMode::Fifo, Some(1)),
        scenario::d(scale(500), SlotMode::Interrupt, Some(1)),
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
        report::print(&r);
        results.push(r);
    }
    if only.is_some() || only_strategy.is_some() {
        // A partial run must not overwrite the figures of a whole one.
        println!("\n(--scenario / --strategy: nothing written under results/)");
        return Ok(());
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    std::fs::create_dir_all(&dir)?;
    let out = Output {
        bench: "tail_latency",
        quick,
        targets: report::TARGETS,
        scenarios: &results,
        run: run.finish(),
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
