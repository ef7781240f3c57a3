//! Scenario E (issue 17): the adaptive admission limit against static limits, over batching
//! replicas whose capacity nobody told the gateway.
//!
//! ```text
//! cargo run --release -p tailguard-benches --bin adaptive_limit           # ~5 minutes
//! cargo run --release -p tailguard-benches --bin adaptive_limit -- --quick
//! ```
//!
//! Two `tailguard-mock` batching replicas (16 slots each, prefill by prompt size, decode gaps
//! 25% slower at a full batch) behind the gateway (hedging off, so only admission
//! differs; every other setting, the queue included, the gateway's default). The mock's
//! open-loop Poisson load steps through 0.5x, 1x, 1.5x and 2x of the replicas' capacity, then
//! goes back to 1x as one replica drops to 8 slots. Each limit gets fresh replicas and a fresh
//! gateway: static 8, 32 (the true capacity) and 128, then the adaptive limit with 128 as its
//! ceiling. Load runs in 2 s slices, so every slice has its own p99 time to first token (from
//! the scheduled send time) and completed streams; the limit is sampled every 250 ms (the
//! adaptive one from the gateway's `/metrics` gauge). Results: a table per step on stdout,
//! `benches/results/adaptive_limit.json` and `adaptive_limit.svg` (limit and p99 TTFT over
//! time), and the issue's verdicts.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use hdrhistogram::Histogram;
use plotters::coord::ranged1d::ValueFormatter;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;
use serde::Serialize;
use tailguard_benches::batching::{SCRIPT, adaptive_limit, body, ms};
use tailguard_gateway::{Args, Config, Gateway, metrics_handle};
use tailguard_mock::load::{EndReason, LoadConfig, LoadReport};
use tailguard_mock::{MockServer, Outcome, ReplicaOptions, Script};
use tokio::time::{Instant, sleep, sleep_until};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Slots per replica.
const SLOTS: u32 = 16;
/// Slots of the first replica after the drop.
const SLOTS_AFTER_DROP: u32 = 8;
/// The two replicas' capacity in streams per second: 32 slots over a stream of about
/// 80 ms + 31 × 25 ms × 1.25 (a full batch) ≈ 1.05 s.
const CAPACITY: f64 = 2.0 * SLOTS as f64 / 1.05;
/// Load slices.
const SLICE: Duration = Duration::from_secs(2);

/// One step of the offered load.
struct Step {
    name: &'static str,
    /// Offered load, in multiples of [`CAPACITY`].
    load: f64,
    slices: u32,
    /// Slots of the first replica during this step.
    slots: u32,
}

const STEPS: [Step; 5] = [
    Step {
        name: "0.5x",
        load: 0.5,
        slices: 5,
        slots: SLOTS,
    },
    Step {
        name: "1x",
        load: 1.0,
        slices: 5,
        slots: SLOTS,
    },
    Step {
        name: "1.5x",
        load: 1.5,
        slices: 5,
        slots: SLOTS,
    },
    Step {
        name: "2x",
        load: 2.0,
        slices: 5,
        slots: SLOTS,
    },
    Step {
        name: "1x, 8 slots on one",
        load: 1.0,
        slices: 10,
        slots: SLOTS_AFTER_DROP,
    },
];

#[derive(Clone, Copy, Debug)]
enum Limit {
    Static(u32),
    Adaptive { ceiling: u32 },
}

impl Limit {
    fn name(self) -> String {
        match self {
            Limit::Static(n) => format!("static {n}"),
            Limit::Adaptive { ceiling } => format!("adaptive (≤ {ceiling})"),
        }
    }
}

const LIMITS: [Limit; 4] = [
    Limit::Static(8),
    Limit::Static(32),
    Limit::Static(128),
    Limit::Adaptive { ceiling: 128 },
];

/// One 2 s slice of one limit's run.
#[derive(Serialize)]
struct Slice {
    /// Seconds from the start of the run to the slice's start.
    t: f64,
    p99_ttft_ms: Option<f64>,
    /// Streams that ended completed during the slice.
    completed: u64,
    refused: u64,
}

#[derive(Serialize)]
struct StepResult {
    step: &'static str,
    offered_rps: f64,
    p50_ttft_ms: Option<f64>,
    p99_ttft_ms: Option<f64>,
    /// Streams completed per second during the step (by the time they ended at the replica).
    goodput: f64,
    refused: u64,
    /// Requests scheduled in the step that ended neither completed nor refused.
    other_failures: u64,
}

#[derive(Serialize)]
struct LimitResult {
    limit: String,
    steps: Vec<StepResult>,
    slices: Vec<Slice>,
    /// `(seconds, limit)` every 250 ms.
    limit_series: Vec<(f64, f64)>,
}

fn gateway_config(limit: Limit, upstreams: &[String]) -> Result<Config, BoxError> {
    let mut c = Config::resolve(Default::default(), &Args::default())?;
    c.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    c.upstreams = upstreams
        .iter()
        .map(|u| u.parse())
        .collect::<Result<_, _>>()?;
    c.hedge.max_attempts = 1;
    match limit {
        Limit::Static(n) => {
            c.admission.capacity = n;
            c.admission.adaptive = false;
        }
        Limit::Adaptive { ceiling } => {
            c.admission.capacity = ceiling;
            c.admission.adaptive = true;
        }
    }
    Ok(c)
}

async fn run_limit(limit: Limit, scale: u32) -> Result<LimitResult, BoxError> {
    let script: Script = SCRIPT.parse()?;
    let mut mocks = Vec::new();
    for _ in 0..2 {
        let addr = SocketAddr::from(([127, 0, 0, 1], 0));
        let options = ReplicaOptions::new().batching(SLOTS);
        mocks.push(MockServer::start_with(addr, script.clone(), options).await?);
    }
    let urls: Vec<String> = mocks.iter().map(MockServer::url).collect();
    let gw = Gateway::start(gateway_config(limit, &urls)?).await?;
    let url = format!("http://{}", gw.addr());
    let slice = SLICE / scale;
    let start = Instant::now();

    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let sampler = tokio::spawn(async move {
        let mut series = Vec::new();
        loop {
            let value = match limit {
                Limit::Static(n) => Some(f64::from(n)),
                Limit::Adaptive { .. } => adaptive_limit(),
            };
            if let Some(v) = value {
                series.push((start.elapsed().as_secs_f64(), v));
            }
            tokio::select! {
                () = sleep(Duration::from_millis(250)) => {}
                _ = stopped.changed() => return series,
            }
        }
    });

    let mut runs = Vec::new();
    let mut at = start;
    let mut seed = 1;
    for step in &STEPS {
        for _ in 0..step.slices {
            let cfg = LoadConfig::new(url.clone())
                .rate(step.load * CAPACITY)
                .duration(slice)
                .seed(seed)
                .body(body())
                .request_timeout(Duration::from_secs(60))
                .drain_timeout(Duration::from_secs(60));
            seed += 1;
            sleep_until(at).await;
            if mocks[0].slots() != step.slots {
                mocks[0].set_slots(step.slots);
            }
            let t = at.duration_since(start).as_secs_f64();
            runs.push((t, tokio::spawn(tailguard_mock::load::run(cfg))));
            at += slice;
        }
    }
    let mut reports: Vec<(f64, LoadReport)> = Vec::new();
    for (t, run) in runs {
        reports.push((t, run.await??));
    }
    let _ = stop.send(true);
    let limit_series = sampler.await?;
    gw.shutdown().await?;
    // When each completed stream ended, as its replica saw it, in seconds from the start.
    let ends: Vec<f64> = mocks
        .iter()
        .flat_map(|m| m.stats().log)
        .filter(|r| r.outcome == Outcome::Completed)
        .filter_map(|r| Some(r.ended?.duration_since(start).as_secs_f64()))
        .collect();
    Ok(summarise(limit, &reports, &ends, slice, limit_series))
}

/// Streams that ended within `[from, from + len)`.
fn ended_within(ends: &[f64], from: f64, len: f64) -> u64 {
    ends.iter()
        .filter(|&&t| t >= from && t < from + len)
        .count() as u64
}

fn summarise(
    limit: Limit,
    reports: &[(f64, LoadReport)],
    ends: &[f64],
    slice: Duration,
    series: Vec<(f64, f64)>,
) -> LimitResult {
    let len = slice.as_secs_f64();
    let slices = reports
        .iter()
        .map(|(t, r)| Slice {
            t: *t,
            p99_ttft_ms: ms(&r.ttft, 0.99),
            completed: ended_within(ends, *t, len),
            refused: r.count(EndReason::HttpStatus),
        })
        .collect();
    let mut steps = Vec::new();
    let mut i = 0;
    for step in &STEPS {
        let part = &reports[i..i + step.slices as usize];
        i += step.slices as usize;
        let mut ttft = Histogram::<u64>::new(3).expect("valid histogram");
        let (mut completed, mut refused, mut scheduled) = (0, 0, 0);
        for (_, r) in part {
            let _ = ttft.add(&r.ttft);
            completed += r.count(EndReason::Completed);
            refused += r.count(EndReason::HttpStatus);
            scheduled += r.scheduled;
        }
        let from = part.first().map_or(0.0, |p| p.0);
        let secs = len * part.len() as f64;
        steps.push(StepResult {
            step: step.name,
            offered_rps: step.load * CAPACITY,
            p50_ttft_ms: ms(&ttft, 0.5),
            p99_ttft_ms: ms(&ttft, 0.99),
            goodput: ended_within(ends, from, secs) as f64 / secs.max(1e-9),
            refused,
            other_failures: scheduled.saturating_sub(completed + refused),
        });
    }
    LimitResult {
        limit: limit.name(),
        steps,
        slices,
        limit_series: series,
    }
}

/// The issue's verdicts for the adaptive limit (the last result) against the best static
/// limit at each step: the one an operator who knew the step's load would pick, i.e. the
/// highest goodput, and among the limits within 5% of it the lowest p99 TTFT.
#[derive(Serialize)]
struct Verdict {
    step: &'static str,
    best_static: String,
    /// Adaptive p99 TTFT over the best static's (target ≤ 1.2).
    p99_ratio: Option<f64>,
    /// Adaptive goodput over the best static's (target ≥ 0.95).
    goodput_ratio: f64,
}

/// The best static limit at step `i` (see [`Verdict`]), by the rule the READMEs' tables
/// re-apply to the JSON ([`tailguard_benches::tables::best_static`]).
fn best_static(statics: &[LimitResult], i: usize) -> Option<&LimitResult> {
    let cands: Vec<(f64, Option<f64>)> = statics
        .iter()
        .map(|r| (r.steps[i].goodput, r.steps[i].p99_ttft_ms))
        .collect();
    tailguard_benches::tables::best_static(&cands).map(|k| &statics[k])
}

fn verdicts(results: &[LimitResult]) -> (Vec<Verdict>, Option<f64>) {
    let Some((adaptive, statics)) = results.split_last() else {
        return (Vec::new(), None);
    };
    let mut out = Vec::new();
    for (i, step) in STEPS.iter().enumerate() {
        let Some(best) = best_static(statics, i) else {
            continue;
        };
        let (a, b) = (&adaptive.steps[i], &best.steps[i]);
        out.push(Verdict {
            step: step.name,
            best_static: best.limit.clone(),
            p99_ratio: a.p99_ttft_ms.zip(b.p99_ttft_ms).map(|(a, b)| a / b),
            goodput_ratio: a.goodput / b.goodput.max(1e-9),
        });
    }
    (out, recovery(adaptive, statics))
}

/// Seconds from the capacity drop to the start of the first slice from which every slice's
/// adaptive p99 TTFT is within 1.2x of the lowest static p99 of that slice (`None`: never).
fn recovery(adaptive: &LimitResult, statics: &[LimitResult]) -> Option<f64> {
    let first = STEPS[..STEPS.len() - 1]
        .iter()
        .map(|s| s.slices as usize)
        .sum::<usize>();
    let drop_t = adaptive.slices.get(first)?.t;
    let within = |i: usize| {
        let best = statics
            .iter()
            .filter_map(|r| r.slices[i].p99_ttft_ms)
            .fold(f64::INFINITY, f64::min);
        match adaptive.slices[i].p99_ttft_ms {
            Some(a) => a <= 1.2 * best,
            None => true,
        }
    };
    let n = adaptive.slices.len();
    (first..n)
        .find(|&k| (k..n).all(within))
        .map(|k| adaptive.slices[k].t - drop_t)
}

fn plot(path: &Path, results: &[LimitResult]) -> Result<(), BoxError> {
    let end = results
        .iter()
        .flat_map(|r| r.slices.last())
        .map(|s| s.t + SLICE.as_secs_f64())
        .fold(1.0, f64::max);
    let top = results
        .iter()
        .flat_map(|r| r.limit_series.iter().map(|p| p.1))
        .fold(1.0, f64::max);
    let p99s = || {
        results
            .iter()
            .flat_map(|r| r.slices.iter().filter_map(|s| s.p99_ttft_ms))
    };
    let (lo, hi) = (
        p99s().fold(f64::INFINITY, f64::min),
        p99s().fold(1.0, f64::max),
    );
    let root = SVGBackend::new(path, (1000, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(400);
    let mut chart =
        panel(&upper, "admission limit over time").build_cartesian_2d(0.0..end, 0.0..top * 1.1)?;
    let limits = results.iter().map(|r| r.limit_series.clone());
    lines(&mut chart, "limit", results, limits)?;
    let lo = if lo.is_finite() { lo * 0.8 } else { 1.0 };
    let mut chart = panel(&lower, "p99 time to first token per 2 s slice")
        .build_cartesian_2d(0.0..end, (lo..hi * 1.25).log_scale())?;
    let p99s = results.iter().map(|r| {
        r.slices
            .iter()
            .filter_map(|s| Some((s.t, s.p99_ttft_ms?)))
            .collect()
    });
    lines(&mut chart, "ms (log scale)", results, p99s)?;
    root.present()?;
    Ok(())
}

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn panel<'a, 'b>(area: &'a Area<'b>, caption: &str) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut b = ChartBuilder::on(area);
    b.caption(caption, ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(55);
    b
}

/// One line per limit over seconds, with the mesh and the legend.
fn lines<'a, Y: Ranged<ValueType = f64> + ValueFormatter<f64>>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, Cartesian2d<RangedCoordf64, Y>>,
    y_desc: &str,
    results: &[LimitResult],
    series: impl Iterator<Item = Vec<(f64, f64)>>,
) -> Result<(), BoxError> {
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc(y_desc)
        .draw()?;
    for (i, (r, pts)) in results.iter().zip(series).enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))?
            .label(r.limit.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.9))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}

fn print(results: &[LimitResult]) {
    println!(
        "{:<22} {:<20} {:>8} {:>10} {:>10} {:>9} {:>8} {:>7}",
        "limit", "step", "offered", "p50 ttft", "p99 ttft", "goodput", "refused", "failed"
    );
    let f = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.0} ms"));
    for r in results {
        for s in &r.steps {
            println!(
                "{:<22} {:<20} {:>6.1}/s {:>10} {:>10} {:>7.1}/s {:>8} {:>7}",
                r.limit,
                s.step,
                s.offered_rps,
                f(s.p50_ttft_ms),
                f(s.p99_ttft_ms),
                s.goodput,
                s.refused,
                s.other_failures
            );
        }
    }
}

#[derive(Serialize)]
struct Output<'a> {
    capacity_rps: f64,
    script: &'static str,
    slice_seconds: f64,
    results: &'a [LimitResult],
    verdicts: Vec<Verdict>,
    recovery_seconds: Option<f64>,
    /// When the run started and the machine's load.
    run: tailguard_benches::run::RunInfo,
}

fn main() -> Result<(), BoxError> {
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick { 4 } else { 1 };
    let run = tailguard_benches::run::RunInfo::start();
    println!("{}", run.summary());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let _ = metrics_handle();
    let mut results = Vec::new();
    for limit in LIMITS {
        eprintln!("running {} ...", limit.name());
        results.push(rt.block_on(run_limit(limit, scale))?);
    }
    print(&results);
    let (verdicts, recovery_seconds) = verdicts(&results);
    for v in &verdicts {
        println!(
            "{:<20} best static: {:<12} adaptive p99 TTFT {} of its, goodput {:.2}x",
            v.step,
            v.best_static,
            v.p99_ratio.map_or("-".to_owned(), |r| format!("{r:.2}x")),
            v.goodput_ratio
        );
    }
    match recovery_seconds {
        Some(s) => println!("after the drop: within 1.2x of the best static p99 from {s:.0} s on"),
        None => println!("after the drop: never within 1.2x of the best static p99"),
    }
    if quick {
        return Ok(());
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    std::fs::create_dir_all(&dir)?;
    let out = Output {
        capacity_rps: CAPACITY,
        script: SCRIPT,
        slice_seconds: SLICE.as_secs_f64(),
        results: &results,
        verdicts,
        recovery_seconds,
        run: run.finish(),
    };
    std::fs::write(
        dir.join("adaptive_limit.json"),
        serde_json::to_string_pretty(&out)?,
    )?;
    plot(&dir.join("adaptive_limit.svg"), &results)?;
    Ok(())
}
