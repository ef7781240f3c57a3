//! Mid-stream resume (issue 33): 10% of streams break mid-way, with and without resume.
//!
//! ```text
//! cargo run --release -p tailguard-benches --bin resume_broken            # ~2 minutes
//! cargo run --release -p tailguard-benches --bin resume_broken -- --quick # ~45 seconds
//! cargo run --release -p tailguard-benches --bin resume_broken -- --help
//! ```
//!
//! Two `tailguard-mock` replicas in this process (script [`SCRIPT`]: a first token after
//! ~50 ms, then 60 tokens ~20 ms apart; the answer is the mock's deterministic text) behind the
//! gateway itself (`Gateway::start`: `build_stack` and its hyper server, every setting its
//! default but `timeout.idle = 2s` and `hedge.resume`). Three runs, each with fresh replicas
//! and a fresh gateway, over the same seeded open-loop Poisson schedule (streamed chat
//! completions, a fifth to `/v1/completions`, a quarter with `max_tokens`):
//!
//! * `unbroken`: resume on, no faults;
//! * `broken, resume off`: a seeded tenth of the requests carry `x-mock-script-0` (the first
//!   attempt only), the four faults in turn: reset (`reset_after=k`), stall (`stall_after=k`,
//!   silent), truncation (`half_event=k`) and interruption (`interrupt_after=k`, a bare
//!   `[DONE]`), `k` a random token of the middle third of the answer;
//! * `broken, resume on`: the same requests and faults, `hedge.resume = true`.
//!
//! Every request: completed or not (a finish reason and `[DONE]`, no in-band error), its text
//! (the deltas concatenated), TTFT and total time from its *scheduled* send time (no
//! coordinated omission), compared with the same request in the unbroken run. The replicas'
//! logs say which faults fired (a hedge backup that wins before the first token avoids one)
//! and how many continuations they served; the gateway's `tailguard_resumes_total` what it
//! resumed. Results: a table on stdout and `benches/results/resume_broken.json`.

mod client;
mod report;

use std::collections::BTreeMap;
use std::time::Duration;

use client::{BENCH_ID, Fault, Record, Spec};
use tailguard::core::BoxError;
use tailguard_gateway::{Args, Config, Gateway, metrics_handle};
use tailguard_mock::{MockServer, Outcome, Script};
use tokio::time::Instant;

/// The replicas' script.
const SCRIPT: &str = "ttft=lognormal(50ms,0.25),tokens=60,gap=lognormal(20ms,0.25)";
/// The gateway's idle timeout in every run (the stall trigger is half of it).
const IDLE_TIMEOUT: Duration = Duration::from_secs(2);
/// Unmeasured requests before each run (connections, the hedge's first-token estimate).
const WARMUP: usize = 20;
/// The gateway counters each run records (deltas).
const COUNTERS: [&str; 4] = [
    "tailguard_resumes_total",
    "tailguard_requests_total",
    "tailguard_hedge_sent_total",
    "tailguard_route_interruptions_total",
];

#[derive(Clone, Debug)]
struct Opts {
    requests: usize,
    rate: f64,
    seed: u64,
    quick: bool,
    /// The faults of the broken runs, in turn.
    faults: Vec<Fault>,
}

/// One of the three runs.
#[derive(Clone, Copy, Debug)]
struct RunKind {
    name: &'static str,
    faults: bool,
    resume: bool,
}

const RUNS: [RunKind; 3] = [
    RunKind {
        name: "unbroken",
        faults: false,
        resume: true,
    },
    RunKind {
        name: "broken, resume off",
        faults: true,
        resume: false,
    },
    RunKind {
        name: "broken, resume on",
        faults: true,
        resume: true,
    },
];

/// One upstream attempt of a measured request, from a replica's log.
#[derive(Clone, Debug)]
struct Attempt {
    attempt: Option<String>,
    continued_from: Option<u32>,
    tokens_sent: u32,
    outcome: Outcome,
}

/// What one run measured.
struct RunResult {
    kind: RunKind,
    records: Vec<Record>,
    /// Per request, its attempts at the replicas.
    attempts: Vec<Vec<Attempt>>,
    /// The gateway's counters over the run (deltas; zero ones left out).
    counters: BTreeMap<String, f64>,
}

impl RunResult {
    /// The request's fault fired: its first attempt sent the `k` tokens and broke.
    fn fired(&self, spec: &Spec) -> bool {
        let Some((_, k)) = spec.fault.filter(|_| self.kind.faults) else {
            return false;
        };
        self.attempts[spec.index].iter().any(|a| {
            a.attempt.as_deref() == Some("0")
                && a.tokens_sent == k
                && a.outcome != Outcome::Completed
        })
    }
}

/// The watched counters of a Prometheus text.
fn counters(text: &str) -> BTreeMap<String, f64> {
    text.lines()
        .filter(|l| COUNTERS.iter().any(|c| l.starts_with(c)))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

fn gateway_config(urls: &[String], resume: bool) -> Result<Config, BoxError> {
    let mut config = Config::resolve(Default::default(), &Args::default())?;
    config.listen = "127.0.0.1:0".parse()?;
    config.upstreams = urls.iter().map(|u| u.parse()).collect::<Result<_, _>>()?;
    config.hedge.resume = resume;
    config.timeout.idle = Some(IDLE_TIMEOUT);
    // Nothing is in flight at the end of a run; do not wait for idle keep-alive connections.
    config.shutdown_grace = Duration::from_millis(500);
    Ok(config)
}

/// One run: fresh replicas and gateway, a warm-up, the schedule, the replicas' logs.
async fn run(kind: RunKind, specs: &[Spec], opts: &Opts) -> Result<RunResult, BoxError> {
    let script = Script::new().apply(SCRIPT)?;
    let mut mocks = Vec::new();
    for seed in [1, 2] {
        mocks.push(MockServer::start(script.clone().seed(seed)).await?);
    }
    let urls: Vec<String> = mocks.iter().map(MockServer::url).collect();
    let gateway = Gateway::start(gateway_config(&urls, kind.resume)?).await?;
    let base = format!("http://{}", gateway.addr());
    let client = client::client();
    // Warm-up: unbroken, unmeasured, without a bench id (the replicas' logs skip them).
    let start = Instant::now();
    let warm: Vec<_> = (0..WARMUP)
        .map(|i| {
            let spec = Spec {
                index: specs.len() + i,
                at: Duration::from_secs_f64(i as f64 / opts.rate),
                completions: i % 5 == 4,
                max_tokens: None,
                fault: None,
            };
            tokio::spawn(client::send(
                client.clone(),
                base.clone(),
                spec,
                false,
                start,
            ))
        })
        .collect();
    for w in warm {
        w.await?;
    }
    let before = counters(&metrics_handle().render());
    let started = Instant::now();
    let start = Instant::now() + Duration::from_millis(50);
    let tasks: Vec<_> = specs
        .iter()
        .map(|s| {
            let (client, base) = (client.clone(), base.clone());
            tokio::spawn(client::send(client, base, s.clone(), kind.faults, start))
        })
        .collect();
    let mut records = Vec::with_capacity(specs.len());
    for t in tasks {
        records.push(t.await?);
    }
    let after = counters(&metrics_handle().render());
    let counters: BTreeMap<String, f64> = after
        .into_iter()
        .map(|(k, v)| {
            let d = v - before.get(&k).copied().unwrap_or(0.0);
            (k, d)
        })
        .filter(|(_, d)| *d != 0.0)
        .collect();
    drop(client);
    let mut attempts = vec![Vec::new(); specs.len()];
    for m in mocks {
        tokio::time::timeout(Duration::from_secs(5), m.wait_idle())
            .await
            .map_err(|_| "a replica still has requests in flight")?;
        for r in m.stats().log {
            let id = r.headers.get(BENCH_ID).and_then(|v| v.to_str().ok());
            // Warm-up requests carry an id past the schedule's.
            if let Some(a) = id
                .and_then(|v| v.parse::<usize>().ok())
                .and_then(|i| attempts.get_mut(i))
            {
                a.push(Attempt {
                    attempt: r.attempt,
                    continued_from: r.continued_from,
                    tokens_sent: r.tokens_sent,
                    outcome: r.outcome,
                });
            }
        }
        m.shutdown().await;
    }
    gateway.shutdown().await?;
    eprintln!(
        "  {}: {} of {} completed, {:.1} s",
        kind.name,
        records.iter().filter(|r| r.completed()).count(),
        records.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(RunResult {
        kind,
        records,
        attempts,
        counters,
    })
}

/// The mock's text is the same whatever the replica's seed: each request shape, straight to
/// two replicas with different seeds. Returns the texts by (completions, max_tokens).
async fn mock_texts() -> Result<BTreeMap<(bool, Option<u32>), String>, BoxError> {
    let script = Script::new().apply(SCRIPT)?;
    let a = MockServer::start(script.clone().seed(11)).await?;
    let b = MockServer::start(script.seed(12)).await?;
    let client = client::client();
    let mut texts = BTreeMap::new();
    for (completions, max_tokens) in [
        (false, None),
        (false, Some(45)),
        (true, None),
        (true, Some(45)),
    ] {
        let spec = Spec {
            index: 0,
            at: Duration::ZERO,
            completions,
            max_tokens,
            fault: None,
        };
        let start = Instant::now();
        let ra = client::send(client.clone(), a.url(), spec.clone(), false, start).await;
        let rb = client::send(client.clone(), b.url(), spec.clone(), false, start).await;
        if !ra.completed() || ra.text != rb.text || ra.finish != rb.finish {
            return Err("the mock's answer differs between replicas (or did not complete)".into());
        }
        if ra.text.is_empty() || ra.completion_tokens != Some(u64::from(spec.tokens())) {
            return Err(format!("unexpected mock answer: {ra:?}").into());
        }
        texts.insert((completions, max_tokens), ra.text);
    }
    a.shutdown().await;
    b.shutdown().await;
    Ok(texts)
}

fn parse_opts() -> Result<Opts, BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut opts = Opts {
        requests: if quick { 150 } else { 600 },
        rate: 20.0,
        seed: 33,
        quick,
        faults: Fault::ALL.to_vec(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or(format!("{a} needs a value"));
        match a.as_str() {
            "--quick" => {}
            "--requests" => opts.requests = value()?.parse()?,
            "--rate" => opts.rate = value()?.parse()?,
            "--seed" => opts.seed = value()?.parse()?,
            "--faults" => {
                opts.faults = value()?
                    .split(',')
                    .map(|f| Fault::parse(f.trim()).ok_or(format!("unknown fault {f}")))
                    .collect::<Result<_, _>>()?
            }
            other => return Err(format!("unknown option {other} (see --help)").into()),
        }
    }
    if !(opts.rate.is_finite() && opts.rate > 0.0) || opts.requests < 10 {
        return Err("--rate must be positive and --requests at least 10".into());
    }
    Ok(opts)
}

/// What `--help` prints.
const USAGE: &str = "\
resume_broken: 10% of streams break mid-way (reset, stall, truncation, interruption), through
the gateway with resume off and on, against the same schedule unbroken

usage: cargo run --release -p tailguard-benches --bin resume_broken -- [OPTIONS]

  --quick            150 requests per run (default 600)
  --requests N       requests per run
  --rate R           mean arrival rate, requests/s (default 20)
  --seed S           seed of the schedule and of the faults (default 33)
  --faults LIST      the faults of the broken runs, in turn, comma-separated (default
                     reset,stall,truncation,interruption)
  --help             this text

Writes a table to stdout and benches/results/resume_broken.json.";

fn main() -> Result<(), BoxError> {
    if std::env::args().any(|a| a == "--help" || a == "-h") {
        println!("{USAGE}");
        return Ok(());
    }
    if cfg!(debug_assertions) {
        return Err("build the bench with --release (cargo run --release ...)".into());
    }
    let opts = parse_opts()?;
    let run_info = tailguard_benches::run::RunInfo::start();
    println!("{}", run_info.summary());
    let specs = client::schedule(opts.requests, opts.rate, opts.seed, &opts.faults);
    eprintln!(
        "{} requests at {}/s per run (~{:.0} s each), {} broken in the broken runs",
        specs.len(),
        opts.rate,
        specs.last().map_or(0.0, |s| s.at.as_secs_f64()),
        specs.iter().filter(|s| s.fault.is_some()).count()
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let (texts, runs) = rt.block_on(async {
        let texts = mock_texts().await?;
        let mut runs = Vec::new();
        for kind in RUNS {
            runs.push(run(kind, &specs, &opts).await?);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        Ok::<_, BoxError>((texts, runs))
    })?;
    rt.shutdown_timeout(Duration::from_millis(100));
    report::print_and_save(&specs, &runs, &texts, &opts, run_info.finish())
}
