//! Overhead of tailguard against tower: every layer alone, the full stack, and the closest
//! tower / tower-http analogues, per request and per frame, in process (no sockets).
//!
//! * `overhead_per_request`: `ready` + `call` + reading the whole body of a short stream (a
//!   role-only chunk, one content chunk, a finish chunk, `[DONE]`: four frames, all ready at
//!   once) through each stack, built once and warmed up (the adaptive hedge delay and
//!   `tower::hedge` have their data points, so both arm a hedge timer on every request).
//! * `overhead_per_frame`: a 1,003-frame OpenAI stream (role chunk, 1,000 content chunks,
//!   finish chunk, `[DONE]`) read to its end through each stack's response body; the response
//!   is built outside the timed section, so this is the body wrappers' cost per frame.
//!
//! Layers as configured in a gateway: `FirstTokenHedge` default (adaptive p90, budget);
//! `SseIdleTimeout` with first-token, idle and total timeouts; `BoundedAdmission` of 1,024;
//! `PriorityClass` default; `LatencyPhaseRecorder` with its default sinks (metrics and
//! tracing) and no recorder or subscriber installed, like `TraceLayer` here. The full stack:
//! recorder → priority → timeouts → admission → hedge. The tower analogue stack: `TraceLayer`
//! → `ConcurrencyLimit` → `tower::timeout` → `ResponseBodyTimeout` → `tower::hedge`.
//!
//! After the run, `benches/results/overhead.json` gets the per-request and per-frame costs over
//! the bare service and the ratios of each layer to its tower analogue (read from criterion's
//! estimates under `target/criterion`), and `benches/results/overhead.svg` draws them as bars.
//! Only estimates written during this run are read (their file times against the run's start),
//! and the JSON is written only when every stack was measured in the run; it records the run's
//! start and the machine's load average (`run`).
//!
//! Run: `cargo bench -p tailguard-benches --bench overhead` (about two minutes).

use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use criterion::{BatchSize, Criterion, Throughput};
use http::{Request, Response};
use http_body_util::Full;
use tailguard::admission::BoundedAdmissionLayer;
use tailguard::hedge::FirstTokenHedgeLayer;
use tailguard::phases::LatencyPhaseRecorderLayer;
use tailguard::priority::PriorityClassLayer;
use tailguard::timeout::SseIdleTimeoutLayer;
use tailguard_benches::run::RunInfo;
use tailguard_benches::{
    CONTENT_CHUNKS, drain, one, openai_stream, request, tower_hedge, upstream,
};
use tower::limit::ConcurrencyLimitLayer;
use tower::timeout::TimeoutLayer;
use tower::{Layer, Service, ServiceBuilder, ServiceExt};
use tower_http::timeout::ResponseBodyTimeoutLayer;
use tower_http::trace::TraceLayer;

fn sse_timeout() -> SseIdleTimeoutLayer {
    SseIdleTimeoutLayer::new()
        .with_first_token_timeout(Duration::from_secs(30))
        .with_idle_timeout(Duration::from_secs(10))
        .with_total_timeout(Duration::from_secs(300))
}

fn recorder() -> LatencyPhaseRecorderLayer {
    LatencyPhaseRecorderLayer::new().with_routes(["/v1/chat/completions"])
}

/// A response from `svc`, for the per-frame benchmark.
fn respond<S, B>(rt: &tokio::runtime::Runtime, svc: &mut S) -> B
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
{
    rt.block_on(async { svc.ready().await.unwrap().call(request()).await.unwrap() })
        .into_body()
}

/// Benchmarks one stack: per request (short stream) and per frame (long stream).
macro_rules! stack {
    ($c:expr, $rt:expr, $name:literal, $make:expr) => {{
        let short = openai_stream(1);
        let short_bytes: usize = short.iter().map(Bytes::len).sum();
        let long = openai_stream(CONTENT_CHUNKS);
        let long_bytes: usize = long.iter().map(Bytes::len).sum();
        #[allow(clippy::redundant_closure_call)]
        let mut svc = ($make)(upstream::<_>(short.clone()));
        #[allow(clippy::redundant_closure_call)]
        let mut svc_long = ($make)(upstream::<_>(long.clone()));
        // Warm up: estimates, histograms, pools.
        $rt.block_on(async {
            for _ in 0..200 {
                assert_eq!(one(&mut svc).await, short_bytes);
            }
        });
        assert_eq!(drain(respond(&$rt, &mut svc_long)), long_bytes);
        $c.benchmark_group("overhead_per_request")
            .throughput(Throughput::Elements(1))
            .bench_function($name, |b| b.iter(|| $rt.block_on(one(&mut svc))));
        $c.benchmark_group("overhead_per_frame")
            .throughput(Throughput::Elements(long.len() as u64))
            .bench_function($name, |b| {
                b.iter_batched(
                    || respond(&$rt, &mut svc_long),
                    drain,
                    BatchSize::PerIteration,
                )
            });
    }};
}

fn bench(c: &mut Criterion, rt: &tokio::runtime::Runtime) {
    stack!(c, rt, "bare", |s| s);

    // tailguard, each layer alone.
    stack!(c, rt, "first_token_hedge", |s| FirstTokenHedgeLayer::new()
        .layer(s));
    stack!(c, rt, "sse_idle_timeout", |s| sse_timeout().layer(s));
    stack!(c, rt, "bounded_admission", |s| BoundedAdmissionLayer::new(
        1024
    )
    .layer(s));
    stack!(c, rt, "priority_class", |s| PriorityClassLayer::new()
        .layer(s));
    stack!(c, rt, "latency_phase_recorder", |s| recorder().layer(s));
    stack!(c, rt, "tailguard_full_stack", |s| ServiceBuilder::new()
        .layer(recorder())
        .layer(PriorityClassLayer::new())
        .layer(sse_timeout())
        .layer(BoundedAdmissionLayer::new(1024))
        .layer(FirstTokenHedgeLayer::new())
        .service(s));

    // tower / tower-http analogues.
    stack!(c, rt, "tower_hedge", tower_hedge);
    stack!(c, rt, "tower_timeout", |s| TimeoutLayer::new(
        Duration::from_secs(30)
    )
    .layer(s));
    stack!(c, rt, "tower_http_response_body_timeout", |s| {
        ResponseBodyTimeoutLayer::new(Duration::from_secs(10)).layer(s)
    });
    stack!(c, rt, "tower_concurrency_limit", |s| {
        ConcurrencyLimitLayer::new(1024).layer(s)
    });
    stack!(c, rt, "tower_http_trace", |s| TraceLayer::new_for_http()
        .layer(s));
    stack!(c, rt, "tower_analogue_stack", |s| ServiceBuilder::new()
        .layer(TraceLayer::new_for_http())
        .layer(ConcurrencyLimitLayer::new(1024))
        .layer(TimeoutLayer::new(Duration::from_secs(30)))
        .layer(ResponseBodyTimeoutLayer::new(Duration::from_secs(10)))
        .service(tower_hedge(s)));
}

/// Criterion's point estimate (mean, ns per iteration) of one benchmark, if this run wrote it
/// (`since`: the run's start); an estimate left in `target/criterion` by an earlier run is
/// not read.
fn estimate(dir: &std::path::Path, group: &str, name: &str, since: SystemTime) -> Option<f64> {
    let path = dir
        .join(group)
        .join(name)
        .join("new")
        .join("estimates.json");
    if std::fs::metadata(&path).ok()?.modified().ok()? < since {
        return None;
    }
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    json["mean"]["point_estimate"].as_f64()
}

/// Writes `benches/results/overhead.json` from the criterion estimates of this run (`run`:
/// when it started), and prints a summary. Writes nothing unless every stack was measured in
/// this run, so the JSON never mixes runs.
fn summarise(run: RunInfo) -> Result<(), Box<dyn std::error::Error>> {
    let since = UNIX_EPOCH + Duration::from_secs(run.started_unix_s);
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| manifest.join("..").join("target"));
    let dir = target.join("criterion");
    let frames = openai_stream(CONTENT_CHUNKS).len() as f64;
    const NAMES: [&str; 13] = [
        "bare",
        "first_token_hedge",
        "sse_idle_timeout",
        "bounded_admission",
        "priority_class",
        "latency_phase_recorder",
        "tailguard_full_stack",
        "tower_hedge",
        "tower_timeout",
        "tower_http_response_body_timeout",
        "tower_concurrency_limit",
        "tower_http_trace",
        "tower_analogue_stack",
    ];
    let req = |n: &str| estimate(&dir, "overhead_per_request", n, since);
    let frame = |n: &str| estimate(&dir, "overhead_per_frame", n, since).map(|v| v / frames);
    let (Some(bare_req), Some(bare_frame)) = (req("bare"), frame("bare")) else {
        eprintln!(
            "no criterion estimates of this run under {}: overhead.json not written",
            dir.display()
        );
        return Ok(());
    };
    let measured = NAMES
        .iter()
        .filter(|&&n| req(n).is_some() && frame(n).is_some())
        .count();
    let mut rows = serde_json::Map::new();
    println!(
        "\n{:<34} {:>12} {:>12} {:>12} {:>12}",
        "stack", "ns/request", "over bare", "ns/frame", "over bare"
    );
    for n in NAMES {
        let (Some(r), Some(f)) = (req(n), frame(n)) else {
            continue;
        };
        println!(
            "{n:<34} {r:>12.0} {:>12.0} {f:>12.1} {:>12.1}",
            r - bare_req,
            f - bare_frame
        );
        rows.insert(
            n.to_owned(),
            serde_json::json!({
                "ns_per_request": r,
                "ns_per_request_over_bare": r - bare_req,
                "ns_per_frame": f,
                "ns_per_frame_over_bare": f - bare_frame,
            }),
        );
    }
    // Each layer against its tower analogue: total per-frame time (bare included) and the
    // overhead over bare per request.
    const PAIRS: [(&str, &str); 6] = [
        ("first_token_hedge", "tower_hedge"),
        ("sse_idle_timeout", "tower_http_response_body_timeout"),
        ("sse_idle_timeout", "tower_timeout"),
        ("bounded_admission", "tower_concurrency_limit"),
        ("latency_phase_recorder", "tower_http_trace"),
        ("tailguard_full_stack", "tower_analogue_stack"),
    ];
    let mut pairs = Vec::new();
    println!(
        "\n{:<50} {:>16} {:>16}",
        "layer / tower analogue", "per-frame ratio", "per-request ratio"
    );
    for (ours, theirs) in PAIRS {
        let (Some(of), Some(tf), Some(or), Some(tr)) =
            (frame(ours), frame(theirs), req(ours), req(theirs))
        else {
            continue;
        };
        println!(
            "{:<50} {:>16.2} {:>16.2}",
            format!("{ours} / {theirs}"),
            of / tf,
            or / tr
        );
        pairs.push(serde_json::json!({
            "layer": ours,
            "analogue": theirs,
            "per_frame_ratio": of / tf,
            "per_request_ratio": or / tr,
        }));
    }
    let full_req = req("tailguard_full_stack").map(|r| r - bare_req);
    let full_frame = frame("tailguard_full_stack").map(|f| f - bare_frame);
    println!(
        "\nfull stack over bare: {:.0} ns/request (target <= 3000), {:.1} ns/frame (target <= 150)",
        full_req.unwrap_or(f64::NAN),
        full_frame.unwrap_or(f64::NAN)
    );
    let mut out = serde_json::json!({
        "bench": "overhead",
        "unit": "nanoseconds (criterion mean)",
        "short_stream_frames": 4,
        "long_stream_frames": frames,
        "targets": "full stack <= 3000 ns/request and <= 150 ns/frame over bare; no layer slower per frame than its tower analogue",
        "stacks": rows,
        "analogues": pairs,
        "full_stack_over_bare": { "ns_per_request": full_req, "ns_per_frame": full_frame },
    });
    if measured < NAMES.len() {
        println!(
            "only {measured} of {} stacks measured in this run (a filtered run?): overhead.json not written",
            NAMES.len()
        );
        return Ok(());
    }
    out["run"] = serde_json::to_value(run.finish())?;
    let results = manifest.join("results");
    std::fs::create_dir_all(&results)?;
    let path = results.join("overhead.json");
    std::fs::write(&path, serde_json::to_string_pretty(&out)?)?;
    println!("wrote {}", path.display());
    let bars: Vec<(&str, f64, f64)> = NAMES
        .iter()
        .filter(|n| **n != "bare")
        .filter_map(|n| Some((*n, req(n)? - bare_req, frame(n)? - bare_frame)))
        .collect();
    let svg = results.join("overhead.svg");
    plot(&svg, &bars)?;
    println!("wrote {}", svg.display());
    Ok(())
}

/// Two bar charts: overhead over the bare service per request and per frame, per stack.
fn plot(
    path: &std::path::Path,
    bars: &[(&str, f64, f64)],
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (1000, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let (upper, lower) = root.split_vertically(450);
    let n = bars.len();
    for (area, per_frame) in [(upper, false), (lower, true)] {
        let value = |b: &(&str, f64, f64)| if per_frame { b.2 } else { b.1 };
        let caption = if per_frame {
            "overhead over the bare service per frame (ns); grey: tower / tower-http"
        } else {
            "overhead over the bare service per request (ns); grey: tower / tower-http"
        };
        let max = bars.iter().map(value).fold(1.0, f64::max) * 1.1;
        let mut chart = ChartBuilder::on(&area)
            .caption(caption, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(30)
            .y_label_area_size(260)
            .build_cartesian_2d(0.0..max, (0..n).into_segmented())?;
        chart
            .configure_mesh()
            .disable_y_mesh()
            .y_labels(n)
            .y_label_formatter(&|y| match y {
                SegmentValue::CenterOf(i) if *i < n => bars[n - 1 - *i].0.to_owned(),
                _ => String::new(),
            })
            .draw()?;
        chart.draw_series(bars.iter().enumerate().map(|(i, b)| {
            let y = n - 1 - i;
            let color = if b.0.starts_with("tower") {
                RGBColor(150, 150, 150)
            } else {
                RGBColor(31, 119, 180)
            };
            Rectangle::new(
                [
                    (0.0, SegmentValue::Exact(y)),
                    (value(b).max(0.0), SegmentValue::Exact(y + 1)),
                ],
                color.filled(),
            )
        }))?;
    }
    root.present()?;
    Ok(())
}

fn main() {
    // Before anything runs: the load of the machine, and the time estimates must be newer than.
    // (`started_unix_s` is truncated to the second: only an estimate written in the second
    // before the start could pass for this run's.)
    let run = RunInfo::start();
    println!("{}", run.summary());
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    bench(&mut c, &rt);
    c.final_summary();
    // `cargo bench --no-run` and `--list` never get here with estimates; a filtered run
    // summarises what it measured.
    if let Err(e) = summarise(run) {
        eprintln!("summary failed: {e}");
    }
}
