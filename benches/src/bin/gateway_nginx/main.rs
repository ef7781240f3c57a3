//! The gateway against nginx, measured as a new user would.
//!
//! ```text
//! cargo run --release -p tailguard-benches --bin gateway_nginx            # ~7 minutes
//! cargo run --release -p tailguard-benches --bin gateway_nginx -- --quick # ~3 minutes
//! cargo run --release -p tailguard-benches --bin gateway_nginx -- --help
//! ```
//!
//! One `tailguard-mock serve` process runs two replicas (first token 20 ms, then 50 tokens
//! 10 ms apart). In front of them, one after the other:
//!
//! * `direct`: no proxy; the load is split between the two replicas (two Poisson streams at
//!   half the rate each: together, one Poisson stream at the rate);
//! * `nginx`: Debian's nginx (installed by `scripts/install-nginx.sh` when missing; the column
//!   is skipped, with the reason, where it cannot be had), 2 workers, `proxy_buffering off`,
//!   a keep-alive upstream pool, access log on;
//! * `gateway`: the gateway's release binary (`--upstream` each replica) with every setting
//!   its default, as a new user starts it (issue 29: at 100/s and 300/s it must complete every
//!   request, with p99 TTFT within 1.2x nginx's); logging at its default level (one line per
//!   request);
//! * `bare proxy`: the smallest hyper proxy in front of the same replicas (round robin,
//!   `TCP_NODELAY`, a pooled client, no layer, no log line: [`bare_proxy`]), run as a child of
//!   this program: what hyper and tokio cost before anything the gateway adds.
//!
//! Each is driven by the load generator of `tailguard-mock load` (open-loop Poisson, HDR
//! histograms, latencies from the scheduled send time) at 100, 300, 400 and 1,000 requests/s for
//! 10 s each (after a 2 s warm-up) and at rates found by bisection for the highest rate it
//! *sustains*: p99 time to first token within 2x the direct path's at 100/s, and at most 0.1%
//! of requests not completed. The bisection runs before the 1,000/s run, so that the search
//! does not start in the wake of the heaviest overload. Every process runs on this machine, on 127.0.0.1, and is killed
//! when the bench ends (each also runs under a one-hour `timeout`, in case the bench is killed
//! outright).
//!
//! Results: a table on stdout and `benches/results/gateway_nginx.json`.

mod bare_proxy;
mod cpu;
mod procs;
mod report;

use std::time::Duration;

use serde::Serialize;
use tailguard::core::BoxError;
use tailguard_mock::load::{EndReason, LoadConfig, LoadReport, run};

/// The replicas' script.
pub(crate) const SCRIPT: &str = "ttft=20ms,tokens=50,gap=10ms";
pub(crate) const REPLICAS: usize = 2;
const RATES: [f64; 4] = [100.0, 300.0, 400.0, 1000.0];
/// A front sustains a rate while its p99 TTFT is within this multiple of the direct path's at
/// the lowest rate.
const SLO_FACTOR: f64 = 2.0;
/// Highest rate probed when a front sustains every fixed rate.
const MAX_PROBE: f64 = 8000.0;
/// `--cpu`'s rate: issue 31's.
const CPU_RATE: f64 = 300.0;

/// One load run.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Run {
    rate: f64,
    scheduled: u64,
    completed: u64,
    not_completed: u64,
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
    gap_p50_ms: f64,
    gap_p99_ms: f64,
    total_p99_ms: f64,
}

/// Everything measured for one front.
#[derive(Debug, Serialize)]
struct FrontResult {
    front: &'static str,
    /// At [`RATES`].
    runs: Vec<Run>,
    /// The bisection's runs.
    probes: Vec<Run>,
    /// Highest rate sustained (requests/s); `sustained_at_least` when even [`MAX_PROBE`] was.
    sustained: f64,
    sustained_at_least: bool,
}

impl FrontResult {
    fn at(&self, rate: f64) -> Option<&Run> {
        self.runs.iter().find(|r| r.rate == rate)
    }

    /// The runs at the fixed rates, then the bisection's.
    fn all_runs(&self) -> impl Iterator<Item = &Run> {
        self.runs.iter().chain(&self.probes)
    }
}

#[derive(Clone, Copy, Debug)]
struct Opts {
    window: Duration,
    bisect_steps: u32,
    /// `--cpu`'s rounds.
    rounds: usize,
}

fn ms(h: &hdrhistogram::Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1e3
}

/// The load generator at `rate`, split evenly over `urls`, for `opts.window`.
pub(crate) async fn measure(urls: &[String], rate: f64, window: Duration) -> Result<Run, BoxError> {
    let share = rate / urls.len() as f64;
    let mut tasks = tokio::task::JoinSet::new();
    for (i, url) in urls.iter().enumerate() {
        let config = LoadConfig::new(url.clone())
            .rate(share)
            .duration(window)
            .max_requests((share * window.as_secs_f64() * 2.0) as u64 + 100)
            .request_timeout(Duration::from_secs(30))
            .drain_timeout(Duration::from_secs(30))
            .seed(1 + i as u64);
        tasks.spawn(run(config));
    }
    let mut all: Option<LoadReport> = None;
    while let Some(r) = tasks.join_next().await {
        let r = r??;
        match &mut all {
            None => all = Some(r),
            Some(a) => {
                a.scheduled += r.scheduled;
                a.ttft.add(&r.ttft)?;
                a.gap.add(&r.gap)?;
                a.total.add(&r.total)?;
                for (k, v) in r.end_reasons {
                    *a.end_reasons.entry(k).or_default() += v;
                }
            }
        }
    }
    let a = all.ok_or("no load run")?;
    let completed = a.count(EndReason::Completed);
    Ok(Run {
        rate,
        scheduled: a.scheduled,
        completed,
        not_completed: a.scheduled.saturating_sub(completed),
        ttft_p50_ms: ms(&a.ttft, 0.5),
        ttft_p99_ms: ms(&a.ttft, 0.99),
        gap_p50_ms: ms(&a.gap, 0.5),
        gap_p99_ms: ms(&a.gap, 0.99),
        total_p99_ms: ms(&a.total, 0.99),
    })
}

/// Within the SLO: p99 TTFT at most `slo_ms`, at most 0.1% of requests not completed.
fn sustains(r: &Run, slo_ms: f64) -> bool {
    r.ttft_p99_ms <= slo_ms && r.not_completed * 1000 <= r.scheduled
}

async fn measure_logged(
    front: &str,
    urls: &[String],
    rate: f64,
    window: Duration,
) -> Result<Run, BoxError> {
    let r = measure(urls, rate, window).await?;
    eprintln!(
        "  {front} {rate:>6.0}/s: TTFT p99 {:>8.1} ms, gap p99 {:>7.1} ms, {} of {} not completed",
        r.ttft_p99_ms, r.gap_p99_ms, r.not_completed, r.scheduled
    );
    // Let sockets and timers settle between runs.
    tokio::time::sleep(Duration::from_millis(500)).await;
    Ok(r)
}

/// The fixed rates, then the bisection for the highest sustained rate; `slo_ms` is `None` for
/// the direct path, which sets it from its first run.
async fn bench_front(
    front: &'static str,
    urls: &[String],
    mut slo_ms: Option<f64>,
    opts: Opts,
) -> Result<(FrontResult, f64), BoxError> {
    eprintln!("{front}: warm-up");
    measure(urls, 50.0, Duration::from_secs(2)).await?;
    // The overload rate (1,000/s) runs last: a probe right after it measured how fast a front
    // recovered from it more than what it sustains (the gateway failed 250/s right after it in
    // every run, and passed 300/s on its own).
    let (overload, steady) = RATES.split_last().ok_or("no rates")?;
    let mut runs = Vec::new();
    for &rate in steady {
        let r = measure_logged(front, urls, rate, opts.window).await?;
        slo_ms.get_or_insert(r.ttft_p99_ms * SLO_FACTOR);
        runs.push(r);
    }
    let slo = slo_ms.ok_or("no run")?;
    // The highest passing rate below the first failing one, and that failing one.
    let first_fail = runs.iter().position(|r| !sustains(r, slo));
    let mut lo = match first_fail {
        Some(0) => 0.0,
        Some(i) => runs[i - 1].rate,
        None => runs.last().map_or(0.0, |r| r.rate),
    };
    let mut hi = first_fail.map(|i| runs[i].rate);
    let mut probes = Vec::new();
    while hi.is_none() && lo < MAX_PROBE {
        let rate = (lo * 2.0).min(MAX_PROBE);
        let r = measure_logged(front, urls, rate, opts.window).await?;
        if sustains(&r, slo) {
            lo = rate
        } else {
            hi = Some(rate)
        }
        probes.push(r);
    }
    if let Some(mut h) = hi {
        for _ in 0..opts.bisect_steps {
            let rate = ((lo + h) / 20.0).round() * 10.0;
            if rate <= lo || rate >= h {
                break;
            }
            let r = measure_logged(front, urls, rate, opts.window).await?;
            if sustains(&r, slo) {
                lo = rate
            } else {
                h = rate
            }
            probes.push(r);
        }
    }
    runs.push(measure_logged(front, urls, *overload, opts.window).await?);
    let result = FrontResult {
        front,
        runs,
        probes,
        sustained: lo,
        sustained_at_least: hi.is_none(),
    };
    Ok((result, slo))
}

/// Runs every front in turn; the processes of each are killed before the next starts.
async fn bench(opts: Opts, dir: &std::path::Path) -> Result<Vec<FrontResult>, BoxError> {
    let (mock_bin, gateway_bin) = procs::build_binaries()?;
    let nginx_bin = procs::nginx_binary();
    let (_mock, replicas) = procs::start_mock(&mock_bin, dir, REPLICAS, SCRIPT)?;
    eprintln!("replicas: {}", replicas.join(", "));
    let mut results = Vec::new();
    let (direct, slo) = bench_front("direct", &replicas, None, opts).await?;
    results.push(direct);
    if let Some(bin) = nginx_bin {
        let (_nginx, url) = procs::start_nginx(&bin, dir, &replicas)?;
        eprintln!("nginx: {url}");
        results.push(bench_front("nginx", &[url], Some(slo), opts).await?.0);
    }
    let (gateway, url) = procs::start_gateway(&gateway_bin, dir, &replicas)?;
    eprintln!("gateway: {url}");
    results.push(bench_front("gateway", &[url], Some(slo), opts).await?.0);
    drop(gateway);
    let (_bare, url) = procs::start_bare_proxy(dir, &replicas, false)?;
    eprintln!("bare proxy: {url}");
    results.push(bench_front("bare proxy", &[url], Some(slo), opts).await?.0);
    Ok(results)
}

fn parse_opts() -> Result<Opts, BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut opts = Opts {
        window: Duration::from_secs(if quick { 3 } else { 10 }),
        bisect_steps: if quick { 2 } else { 4 },
        rounds: 3,
    };
    if let Some(i) = args.iter().position(|a| a == "--rounds") {
        opts.rounds = args.get(i + 1).ok_or("--rounds N")?.parse()?;
    }
    if let Some(i) = args.iter().position(|a| a == "--window") {
        let s: f64 = args.get(i + 1).ok_or("--window SECONDS")?.parse()?;
        opts.window = Duration::try_from_secs_f64(s)?;
    }
    if let Some(a) = args.iter().find(|a| {
        !matches!(a.as_str(), "--quick" | "--window" | "--cpu" | "--rounds") && a.starts_with("--")
    }) {
        return Err(format!(
            "unknown option {a} (options: --quick, --window SECONDS, --cpu, --rounds N)"
        )
        .into());
    }
    Ok(opts)
}

/// What `--help` prints.
const USAGE: &str = "\
gateway_nginx: the gateway against nginx over the same two mock replicas

usage: cargo run --release -p tailguard-benches --bin gateway_nginx -- [OPTIONS]

  --quick            3 s per load run and 2 bisection steps (default: 10 s and 4)
  --window SECONDS   length of each load run
  --cpu              instead: the gateway's CPU per request against the bare hyper proxy's
                     and against the bare proxy reading each stream once (the floor of any
                     token-aware front) at 300/s, in interleaved rounds (issue 31), to
                     results/gateway_cpu.json
  --rounds N         --cpu's rounds (default 3)
  --help             this text

Writes a table to stdout and benches/results/gateway_nginx.json; installs nginx with
scripts/install-nginx.sh when none is installed (the nginx column is skipped where it cannot).";

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let Some(("--bare-proxy", upstreams)) = args.split_first().map(|(a, u)| (a.as_str(), u)) {
        return bare_proxy::main(upstreams);
    }
    if args.iter().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    if cfg!(debug_assertions) {
        return Err("build the bench with --release (cargo run --release ...)".into());
    }
    let cpu = args.iter().any(|a| a == "--cpu");
    let opts = parse_opts()?;
    let dir = std::env::temp_dir().join(format!("gateway_nginx.{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let run = tailguard_benches::run::RunInfo::start();
    println!("{}", run.summary());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Ctrl-C ends the bench, and with it (the guards dropping) every process it started.
    if cpu {
        let res = rt.block_on(async {
            tokio::select! {
                r = cpu::bench(&dir, CPU_RATE, opts.window, opts.rounds) => r,
                _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
            }
        });
        rt.shutdown_timeout(Duration::from_millis(100));
        let res = res.inspect_err(|_| eprintln!("logs of the processes: {}", dir.display()))?;
        let _ = std::fs::remove_dir_all(&dir);
        return cpu::save(res, run.finish());
    }
    let results = rt.block_on(async {
        tokio::select! {
            r = bench(opts, &dir) => r,
            _ = tokio::signal::ctrl_c() => Err("interrupted".into()),
        }
    });
    rt.shutdown_timeout(Duration::from_millis(100));
    let results = results.inspect_err(|_| eprintln!("logs of the processes: {}", dir.display()))?;
    let _ = std::fs::remove_dir_all(&dir);
    report::print_and_save(&results, opts, load_before.trim(), run.finish())
}
