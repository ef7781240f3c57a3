//! `tailguard-mock`: run mock LLM replicas, or drive an endpoint with open-loop load.
//!
//! ```text
//! tailguard-mock serve --replicas 3 --script "ttft=lognormal(200ms,0.5),tokens=50,gap=20ms"
//! tailguard-mock serve --port 8080 --script "ttft=50ms" --replica-script 1="stall_after=3"
//! tailguard-mock serve --script "single_slot=true,ttft=2s" --interrupt --keep-alive-timeout 5s
//! tailguard-mock load --url http://127.0.0.1:8080 --rate 50 --duration 30s --json out.json
//! tailguard-mock bench --script "ttft=mix(0.05,50ms,500ms)" --rate 100 --duration 10s
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use http::{HeaderName, HeaderValue};
use tailguard_mock::load::{LoadConfig, LoadReport, run};
use tailguard_mock::{MockServer, ReplicaOptions, SCRIPT_HEADER, Script, parse_duration};

#[derive(Parser, Debug)]
#[command(
    name = "tailguard-mock",
    version,
    about = "Scriptable mock LLM upstream and open-loop load generator"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run N mock replicas on 127.0.0.1 until Ctrl-C (or --for).
    Serve(ServeArgs),
    /// Drive an OpenAI-compatible endpoint with open-loop Poisson load and report percentiles.
    Load(LoadArgs),
    /// Start one replica with a script and run the load generator against it.
    Bench {
        /// Script of the replica (header syntax, see `Script::apply`).
        #[arg(long, default_value = "")]
        script: String,
        #[command(flatten)]
        load: LoadOpts,
    },
}

#[derive(Args, Debug)]
struct ServeArgs {
    /// Number of replicas.
    #[arg(long, default_value_t = 1)]
    replicas: u16,
    /// Port of the first replica (the others take the next ports); 0 picks free ports.
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// Script of every replica, e.g. "ttft=200ms,tokens=20,gap=10ms".
    #[arg(long, default_value = "")]
    script: String,
    /// Overrides for one replica: INDEX=SCRIPT (applied on top of --script). Repeatable.
    #[arg(long = "replica-script", value_name = "INDEX=SCRIPT")]
    replica_script: Vec<String>,
    /// Stop after this long (e.g. 60s) instead of waiting for Ctrl-C.
    #[arg(long = "for", value_parser = parse_duration)]
    run_for: Option<Duration>,
    /// Every request takes the one slot and gets its response head only once it holds it
    /// (llama-cpp-python). With `--script single_slot=true` instead, heads come at once and
    /// first tokens when the slot frees.
    #[arg(long)]
    head_after_slot: bool,
    /// A newer request interrupts the running stream: a bare `data: [DONE]`, then the
    /// connection closes without the terminating chunk (llama.cpp-style).
    #[arg(long)]
    interrupt: bool,
    /// Close idle HTTP/1.1 connections after this long (uvicorn: 5s) [default: never].
    #[arg(long, value_parser = parse_duration)]
    keep_alive_timeout: Option<Duration>,
    /// A request cancelled before its first token still takes the slot for its prefill (and
    /// is counted as served late).
    #[arg(long)]
    prefill_cancelled: bool,
    /// A batching server with this many concurrent slots: every request takes one, first come
    /// first served; decode gaps grow mildly with the batch.
    #[arg(long, value_name = "SLOTS")]
    batching: Option<u32>,
}

impl ServeArgs {
    fn options(&self) -> ReplicaOptions {
        let options = ReplicaOptions::new()
            .head_after_slot(self.head_after_slot)
            .interrupt(self.interrupt)
            .keep_alive_timeout(self.keep_alive_timeout)
            .prefill_cancelled(self.prefill_cancelled);
        match self.batching {
            Some(k) => options.batching(k),
            None => options,
        }
    }
}

#[derive(Args, Debug)]
struct LoadArgs {
    /// Base URL of the endpoint, e.g. http://127.0.0.1:8080.
    #[arg(long)]
    url: String,
    #[command(flatten)]
    load: LoadOpts,
}

#[derive(Args, Debug)]
struct LoadOpts {
    /// Request path.
    #[arg(long, default_value = "/v1/chat/completions")]
    path: String,
    /// Mean arrival rate (requests per second, Poisson).
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// Sending window.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    duration: Duration,
    /// Most requests to send.
    #[arg(long, default_value_t = 10_000)]
    max_requests: u64,
    /// Per-request time limit.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    timeout: Duration,
    /// Wait at most this long for stragglers after the window.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    drain: Duration,
    /// Seed of the arrival process.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// JSON request body (default: a streamed chat completion with usage).
    #[arg(long)]
    body: Option<String>,
    /// Extra header NAME:VALUE. Repeatable.
    #[arg(long = "header", value_name = "NAME:VALUE")]
    headers: Vec<String>,
    /// Send this per-request mock script in the x-mock-script header.
    #[arg(long = "request-script")]
    request_script: Option<String>,
    /// Use HTTP/2 (prior knowledge).
    #[arg(long)]
    http2: bool,
    /// Write the JSON summary here.
    #[arg(long)]
    json: Option<PathBuf>,
}

impl LoadOpts {
    fn config(&self, url: String) -> Result<LoadConfig, String> {
        let mut c = LoadConfig::new(url)
            .path(self.path.clone())
            .rate(self.rate)
            .duration(self.duration)
            .max_requests(self.max_requests)
            .request_timeout(self.timeout)
            .drain_timeout(self.drain)
            .seed(self.seed)
            .http2(self.http2);
        if let Some(b) = &self.body {
            c = c.body(b.clone());
        }
        for h in &self.headers {
            let (k, v) = h
                .split_once(':')
                .ok_or_else(|| format!("header `{h}` is not NAME:VALUE"))?;
            let k = HeaderName::try_from(k.trim()).map_err(|e| format!("header name: {e}"))?;
            let v = HeaderValue::try_from(v.trim()).map_err(|e| format!("header value: {e}"))?;
            c = c.header(k, v);
        }
        if let Some(s) = &self.request_script {
            s.parse::<Script>().map_err(|e| e.to_string())?;
            let v = HeaderValue::try_from(s.as_str()).map_err(|e| format!("script: {e}"))?;
            c = c.header(HeaderName::from_static(SCRIPT_HEADER), v);
        }
        Ok(c)
    }

    fn finish(&self, report: &LoadReport) -> Result<(), String> {
        println!("{report}");
        if let Some(path) = &self.json {
            std::fs::write(path, report.summary().to_json())
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("tailguard-mock: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(real_main(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("tailguard-mock: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn real_main(cli: Cli) -> Result<(), String> {
    match cli.command {
        Command::Serve(args) => serve(args).await,
        Command::Load(args) => {
            let report = run(args.load.config(args.url)?)
                .await
                .map_err(|e| e.to_string())?;
            args.load.finish(&report)
        }
        Command::Bench { script, load } => {
            let script: Script = script
                .parse()
                .map_err(|e: tailguard_mock::ParseError| e.to_string())?;
            let server = MockServer::start(script).await.map_err(|e| e.to_string())?;
            let report = run(load.config(server.url())?)
                .await
                .map_err(|e| e.to_string())?;
            load.finish(&report)?;
            print_stats(0, &server);
            server.shutdown().await;
            Ok(())
        }
    }
}

async fn serve(args: ServeArgs) -> Result<(), String> {
    let base: Script = args
        .script
        .parse()
        .map_err(|e: tailguard_mock::ParseError| e.to_string())?;
    let mut servers = Vec::new();
    for i in 0..args.replicas {
        let mut script = base.clone();
        for o in &args.replica_script {
            let (idx, s) = o
                .split_once('=')
                .ok_or_else(|| format!("--replica-script `{o}` is not INDEX=SCRIPT"))?;
            let idx: u16 = idx
                .trim()
                .parse()
                .map_err(|_| format!("bad replica index in `{o}`"))?;
            if idx == i {
                script = script.apply(s).map_err(|e| e.to_string())?;
            }
        }
        let port = if args.port == 0 {
            0
        } else {
            args.port.checked_add(i).ok_or("port overflow")?
        };
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let server = MockServer::start_with(addr, script.clone(), args.options())
            .await
            .map_err(|e| format!("binding {addr}: {e}"))?;
        println!(
            "replica {i}: {} script: {script} options: {}",
            server.url(),
            server.options()
        );
        servers.push(server);
    }
    match args.run_for {
        Some(d) => tokio::time::sleep(d).await,
        None => {
            tokio::signal::ctrl_c().await.map_err(|e| e.to_string())?;
        }
    }
    for (i, s) in servers.iter().enumerate() {
        print_stats(i, s);
    }
    for s in servers {
        s.shutdown().await;
    }
    Ok(())
}

fn print_stats(i: usize, server: &MockServer) {
    let s = server.stats();
    println!(
        "replica {i}: requests={} completed={} cancelled={} status_errors={} resets={} error_events={} \
         interrupted={} truncated={} served_late={} peak_concurrent={} continuations={}",
        s.requests,
        s.completed,
        s.cancelled,
        s.status_errors,
        s.resets,
        s.error_events,
        s.interrupted,
        s.truncated,
        s.served_late,
        s.peak_concurrent,
        s.continuations
    );
}
