//! `--cpu`: the gateway's CPU per request against the bare hyper proxy's (issue 31's target:
//! at most 1.15x), in interleaved rounds at one rate over the same two mock replicas.
//!
//! A third front, the reading proxy (the bare proxy reading each stream once with core's
//! progress record, as the gateway's innermost reading layer does), measures the floor of
//! what reading tokens costs at all: the gateway's ratio to it is what the layers add beyond
//! the one reading.
//!
//! The fronts run at once, each in its own process group; a round drives one after the other
//! (the order rotating), each for the window at the rate after a warm-up, and reads the
//! front's CPU ticks from `/proc` before and after. Per request = ticks over requests
//! completed. Ratios within a round, then the median over rounds.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;
use tailguard::core::BoxError;

use crate::procs::{self, Proc};
use crate::{REPLICAS, Run, SCRIPT, measure};

/// One front's run in one round.
#[derive(Debug, Serialize)]
struct CpuRun {
    front: &'static str,
    round: usize,
    /// CPU per completed request, in milliseconds.
    cpu_ms_per_request: f64,
    run: Run,
}

/// What `--cpu` writes to `results/gateway_cpu.json`.
#[derive(Debug, Serialize)]
pub(crate) struct CpuResult {
    bench: &'static str,
    script: &'static str,
    /// When the run started and the machine's load.
    run: Option<tailguard_benches::run::RunInfo>,
    rate: f64,
    window_s: f64,
    rounds: Vec<CpuRun>,
    /// The gateway's CPU per request over the bare proxy's, by round.
    ratios: Vec<f64>,
    median_ratio: f64,
    /// The reading proxy's over the bare proxy's, by round.
    reading_ratios: Vec<f64>,
    median_reading_ratio: f64,
    /// The gateway's over the reading proxy's, by round.
    over_reading_ratios: Vec<f64>,
    median_over_reading_ratio: f64,
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux when it cannot be read).
fn clk_tck() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(100.0)
}

async fn one(
    front: &'static str,
    p: &Proc,
    url: &str,
    rate: f64,
    window: Duration,
) -> Result<(f64, Run), BoxError> {
    let before = p.cpu_ticks()?;
    let run = measure(&[url.to_owned()], rate, window).await?;
    let used = p.cpu_ticks()? - before;
    let per = used as f64 / clk_tck() * 1e3 / run.completed.max(1) as f64;
    eprintln!(
        "  {front:>10} {rate}/s: {per:.3} ms CPU a request, TTFT p99 {:.1} ms, {} of {} not completed",
        run.ttft_p99_ms, run.not_completed, run.scheduled
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok((per, run))
}

/// `rounds` interleaved rounds at `rate`, `window` each.
pub(crate) async fn bench(
    dir: &Path,
    rate: f64,
    window: Duration,
    rounds: usize,
) -> Result<CpuResult, BoxError> {
    let (mock_bin, gateway_bin) = procs::build_binaries()?;
    let (_mock, replicas) = procs::start_mock(&mock_bin, dir, REPLICAS, SCRIPT)?;
    let (gateway, gateway_url) = procs::start_gateway(&gateway_bin, dir, &replicas)?;
    let (bare, bare_url) = procs::start_bare_proxy(dir, &replicas, false)?;
    let (reading, reading_url) = procs::start_bare_proxy(dir, &replicas, true)?;
    let fronts: [(&'static str, &Proc, &str); 3] = [
        ("bare proxy", &bare, &bare_url),
        ("reading proxy", &reading, &reading_url),
        ("gateway", &gateway, &gateway_url),
    ];
    for (front, _, url) in fronts {
        eprintln!("{front}: warm-up");
        measure(&[url.to_owned()], rate, Duration::from_secs(2)).await?;
    }
    let mut runs = Vec::new();
    let (mut ratios, mut reading_ratios, mut over_reading_ratios) =
        (Vec::new(), Vec::new(), Vec::new());
    for round in 0..rounds {
        let mut per = [0.0; 3];
        for k in 0..3 {
            // Rotate which front goes first.
            let i = (k + round) % 3;
            let (front, p, url) = fronts[i];
            let (cpu, run) = one(front, p, url, rate, window).await?;
            per[i] = cpu;
            runs.push(CpuRun {
                front,
                round,
                cpu_ms_per_request: cpu,
                run,
            });
        }
        ratios.push(per[2] / per[0]);
        reading_ratios.push(per[1] / per[0]);
        over_reading_ratios.push(per[2] / per[1]);
        eprintln!(
            "round {round}: gateway / bare proxy = {:.2}x, reading proxy / bare proxy = {:.2}x",
            per[2] / per[0],
            per[1] / per[0]
        );
    }
    Ok(CpuResult {
        bench: "gateway_cpu",
        script: SCRIPT,
        run: None,
        rate,
        window_s: window.as_secs_f64(),
        rounds: runs,
        median_ratio: median(ratios.clone()),
        ratios,
        median_reading_ratio: median(reading_ratios.clone()),
        reading_ratios,
        median_over_reading_ratio: median(over_reading_ratios.clone()),
        over_reading_ratios,
    })
}

/// Prints the medians; writes `benches/results/gateway_cpu.json`.
pub(crate) fn save(
    mut res: CpuResult,
    run: tailguard_benches::run::RunInfo,
) -> Result<(), BoxError> {
    res.run = Some(run);
    println!(
        "gateway CPU per request / bare hyper proxy's at {}/s: rounds {}; median {:.2}x (target <= 1.15x)",
        res.rate,
        res.ratios
            .iter()
            .map(|r| format!("{r:.2}x"))
            .collect::<Vec<_>>()
            .join(", "),
        res.median_ratio
    );
    println!(
        "reading proxy (one reading of each stream) / bare proxy: median {:.2}x; gateway / reading proxy: median {:.2}x",
        res.median_reading_ratio, res.median_over_reading_ratio
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("gateway_cpu.json");
    std::fs::write(&path, serde_json::to_string_pretty(&res)?)?;
    println!("wrote {}", path.display());
    Ok(())
}
