//! The figures of a run, the targets they are held to, and the table on stdout.

use std::collections::BTreeMap;

use hdrhistogram::Histogram;
use serde::Serialize;
use tailguard_mock::load::Percentiles;

use crate::strategy::Strategy;

/// The targets, as written into the JSON.
pub(crate) const TARGETS: &str = "A, B: first-token strategies p99 TTFT <= 0.25x no hedge and tower::hedge, <= 1.3x floor, extra load <= 10%; C: first-token strategies client errors <= 0.5%; D, D-slots: FirstTokenHedge adaptive (the default) p99 TTFT <= 0.25x no hedge (round robin) and <= 0.7x tower p2c, extra load <= 10%, no client errors, no request without a token";

/// Milliseconds percentiles.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Ms {
    pub(crate) count: u64,
    pub(crate) p50: f64,
    pub(crate) p90: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) max: f64,
}

impl Ms {
    pub(crate) fn of(h: &Histogram<u64>) -> Self {
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

/// What single-slot replicas did to streams (the bench's own replicas only).
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub(crate) struct SlotCounts {
    /// Measured-traffic streams served after waiting for the slot.
    pub(crate) late: u64,
    /// Measured-traffic streams ended early for a newer request.
    pub(crate) interrupted: u64,
    /// The same for the other clients' streams.
    pub(crate) others_late: u64,
    pub(crate) others_interrupted: u64,
    /// The other clients' requests.
    pub(crate) others: u64,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct StrategyResult {
    #[serde(skip)]
    pub(crate) strategy: Strategy,
    pub(crate) key: &'static str,
    pub(crate) name: &'static str,
    /// Requests sent by the load generator.
    pub(crate) sent: u64,
    pub(crate) ttft_ms: Ms,
    pub(crate) total_ms: Ms,
    /// Requests the replicas received beyond one per client request, % of requests sent.
    pub(crate) extra_upstream_pct: f64,
    /// Client requests that used more than one upstream attempt.
    pub(crate) hedged: u64,
    /// Upstream requests the replicas saw cancelled by the client (losers, mostly).
    pub(crate) cancelled_upstream: u64,
    /// Client-visible errors (anything but a completed stream), % of requests sent.
    pub(crate) error_pct: f64,
    /// Requests whose response carried no token (they have no TTFT; a stream interrupted
    /// before its first token ends with `[DONE]`, so it counts as completed).
    pub(crate) no_token: u64,
    /// Tokens short of every request's complete answer (streams cut by an interruption).
    pub(crate) tokens_missing: u64,
    pub(crate) slot_counts: Option<SlotCounts>,
    /// Per replica: the measured requests' first attempts, and all their attempts.
    pub(crate) primaries_per_replica: Vec<u64>,
    pub(crate) attempts_per_replica: Vec<u64>,
    /// End reasons as the load generator saw them.
    pub(crate) end_reasons: BTreeMap<String, u64>,
    /// The hedge delay: configured (fixed), else the median of the delays measured between
    /// a primary's and its backup's arrival at the replicas (delay-triggered hedges only).
    pub(crate) hedge_delay_ms: Option<f64>,
    /// Hedge delay + the fast replica's p99 TTFT.
    pub(crate) floor_ms: Option<f64>,
    /// p99 TTFT / floor.
    pub(crate) p99_over_floor: Option<f64>,
    /// p99 TTFT / no-hedge p99 TTFT.
    pub(crate) p99_vs_no_hedge: Option<f64>,
    /// p99 TTFT / tower::hedge p99 TTFT.
    pub(crate) p99_vs_tower_hedge: Option<f64>,
    /// p99 TTFT / tower p2c p99 TTFT.
    pub(crate) p99_vs_p2c: Option<f64>,
    /// Whether the scenario's targets for this strategy are met (`None`: no target).
    pub(crate) target_met: Option<bool>,
    #[serde(skip)]
    pub(crate) ttft_hist: Histogram<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub(crate) struct ScenarioResult {
    pub(crate) key: &'static str,
    pub(crate) title: &'static str,
    pub(crate) description: &'static str,
    pub(crate) rate: f64,
    pub(crate) requests: u64,
    pub(crate) fixed_delay_ms: f64,
    pub(crate) fast_replica_p99_ttft_ms: f64,
    pub(crate) strategies: Vec<StrategyResult>,
}

/// Fills in each strategy's ratios to the baselines, its floor and its verdict.
pub(crate) fn compare(scenario: &str, fast_p99_ms: f64, results: &mut [StrategyResult]) {
    let p99_of = |s: Strategy| {
        results
            .iter()
            .find(|r| r.strategy == s)
            .map(|r| r.ttft_ms.p99)
            .filter(|p| *p > 0.0)
    };
    let no_hedge = p99_of(Strategy::NoHedge);
    let tower = p99_of(Strategy::TowerHedge);
    let p2c = p99_of(Strategy::P2c);
    for r in results.iter_mut() {
        let p99 = r.ttft_ms.p99;
        r.floor_ms = r.hedge_delay_ms.map(|d| d + fast_p99_ms);
        r.p99_over_floor = r.floor_ms.map(|f| p99 / f);
        r.p99_vs_no_hedge = no_hedge.map(|b| p99 / b);
        r.p99_vs_tower_hedge = tower.map(|b| p99 / b);
        r.p99_vs_p2c = p2c.map(|b| p99 / b);
        r.target_met = verdict(scenario, r);
    }
}

fn verdict(scenario: &str, r: &StrategyResult) -> Option<bool> {
    let le = |v: Option<f64>, x: f64| v.is_some_and(|v| v <= x);
    match scenario {
        "a" | "b" if r.strategy.first_token() => Some(
            le(r.p99_vs_no_hedge, 0.25)
                && le(r.p99_vs_tower_hedge, 0.25)
                && le(r.p99_over_floor, 1.3)
                && r.extra_upstream_pct <= 10.0,
        ),
        "c" if r.strategy.first_token() => Some(r.error_pct <= 0.5),
        "d" | "d_slots" | "d_interrupt" if r.strategy == Strategy::Adaptive => Some(
            le(r.p99_vs_no_hedge, 0.25)
                && le(r.p99_vs_p2c, 0.7)
                && r.extra_upstream_pct <= 10.0
                && r.error_pct == 0.0
                && r.no_token == 0,
        ),
        _ => None,
    }
}

fn opt(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
}

fn split(v: &[u64]) -> String {
    v.iter().map(u64::to_string).collect::<Vec<_>>().join("/")
}

fn count(v: Option<u64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| v.to_string())
}

fn header() {
    println!(
        "{:<29} {:>49} | {:>39} | {:>6} {:>5} {:>5} {:>5} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>5} {:>5} {:>11} {:>9} {:>9} {:>6}",
        "",
        "TTFT ms: p50 / p90 / p99 / p99.9 / max",
        "total ms: p50 / p90 / p99 / max",
        "extra%",
        "cncl",
        "err%",
        "notok",
        "delay",
        "floor",
        "/floor",
        "/none",
        "/tower",
        "/p2c",
        "late",
        "intr",
        "others l/i",
        "primaries",
        "attempts",
        "",
    );
}

pub(crate) fn print(sc: &ScenarioResult) {
    println!("\n== {} ({} requests)", sc.title, sc.requests);
    println!("   {}", sc.description);
    println!(
        "   fast replica p99 TTFT {:.1} ms; fixed delay {:.0} ms",
        sc.fast_replica_p99_ttft_ms, sc.fixed_delay_ms
    );
    header();
    for r in &sc.strategies {
        let t = &r.ttft_ms;
        let o = &r.total_ms;
        let pass = match r.target_met {
            Some(true) => "met",
            Some(false) => "missed",
            None => "",
        };
        let slots = r.slot_counts;
        println!(
            "{:<29} {:>9.1} {:>9.1} {:>9.1} {:>9.1} {:>9.1} | {:>9.1} {:>9.1} {:>9.1} {:>9.1} | {:>6.1} {:>5} {:>5.1} {:>5} {:>6} {:>6} {:>6} {:>6} {:>6} {:>6} {:>5} {:>5} {:>11} {:>9} {:>9} {:>6}",
            r.name,
            t.p50,
            t.p90,
            t.p99,
            t.p999,
            t.max,
            o.p50,
            o.p90,
            o.p99,
            o.max,
            r.extra_upstream_pct,
            r.cancelled_upstream,
            r.error_pct,
            r.no_token,
            opt(r.hedge_delay_ms, 1),
            opt(r.floor_ms, 1),
            opt(r.p99_over_floor, 2),
            opt(r.p99_vs_no_hedge, 2),
            opt(r.p99_vs_tower_hedge, 2),
            opt(r.p99_vs_p2c, 2),
            count(slots.map(|s| s.late)),
            count(slots.map(|s| s.interrupted)),
            slots.map_or_else(
                || "-".to_owned(),
                |s| format!("{}/{}", s.others_late, s.others_interrupted)
            ),
            split(&r.primaries_per_replica),
            split(&r.attempts_per_replica),
            pass,
        );
    }
}
