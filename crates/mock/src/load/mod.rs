//! An open-loop load generator for OpenAI-compatible (and Anthropic) streaming endpoints.
//!
//! Arrivals are a Poisson process at [`LoadConfig::rate`]: request *i* is scheduled at a time
//! fixed in advance, and sent then whether or not earlier requests have finished (open loop).
//! Every latency is measured from the request's *scheduled* send time, so a slow server (or a
//! slow load generator) shows up in the numbers instead of quietly lowering the offered load:
//! no coordinated omission. Time to headers, time to first token (the first event carrying
//! output: a role-only chunk is not a token), every gap between two token events, and the
//! total are recorded in HDR histograms (microseconds, 3 significant digits), along with HTTP
//! status and end-reason counts.
//!
//! The run is bounded: no request is scheduled after [`LoadConfig::duration`] nor beyond
//! [`LoadConfig::max_requests`]; each request gives up after
//! [`LoadConfig::request_timeout`]; requests still running [`LoadConfig::drain_timeout`]
//! after the sending window closed are abandoned (counted as `unfinished`). It stops by itself.
//!
//! ```
//! use std::time::Duration;
//! use tailguard_mock::load::{LoadConfig, run};
//! use tailguard_mock::{MockServer, Script};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let server = MockServer::start(Script::new().ttft(Duration::from_millis(2))).await?;
//! let report = run(
//!     LoadConfig::new(server.url())
//!         .rate(200.0)
//!         .duration(Duration::from_millis(100))
//!         .max_requests(50),
//! )
//! .await?;
//! assert!(report.ttft.len() > 0);
//! println!("{report}");
//! let json = report.summary().to_json();
//! assert!(json.contains("\"ttft\""));
//! # Ok(()) }
//! ```

mod report;
mod request;

use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Request, Uri};
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until, timeout};

pub use report::{LoadReport, LoadSummary, Percentiles};

use crate::rng::SplitMix64;
use report::Sample;
use request::{HttpClient, one_request};

/// Highest value the histograms hold: one hour, in microseconds.
const HIST_MAX_US: u64 = 3_600_000_000;
/// The same, as a duration.
const HIST_MAX_DURATION: Duration = Duration::from_secs(3600);

/// The default request body: a streamed chat completion with usage.
pub const DEFAULT_BODY: &str = r#"{"model":"mock-model","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"Say hello"}]}"#;

/// What to send, how fast, for how long.
#[derive(Clone, Debug)]
pub struct LoadConfig {
    url: String,
    path: String,
    rate: f64,
    duration: Duration,
    max_requests: u64,
    max_in_flight: usize,
    request_timeout: Duration,
    drain_timeout: Duration,
    seed: u64,
    body: Bytes,
    headers: Vec<(HeaderName, HeaderValue)>,
    http2: bool,
}

impl LoadConfig {
    /// A run against `base_url` (e.g. `http://127.0.0.1:8080`) with the defaults below.
    ///
    /// | setting | default | why |
    /// |---|---|---|
    /// | path | `/v1/chat/completions` | the endpoint every OpenAI-compatible server has |
    /// | rate | 10 req/s | gentle enough for a laptop and a 2-core CI box |
    /// | duration | 10 s | long enough for a p99 of ~100 samples at the default rate |
    /// | max_requests | 10 000 | a hard bound whatever the rate |
    /// | max_in_flight | 10 000 | protects the generator; a request over it is counted as `dropped`, never delayed (delaying would be coordinated omission) |
    /// | request_timeout | 60 s | a stalled stream is given up and counted as `timeout` |
    /// | drain_timeout | 60 s | bound on the wait for stragglers after the window |
    /// | seed | 1 | arrivals are reproducible |
    /// | body | [`DEFAULT_BODY`] | |
    pub fn new(base_url: impl Into<String>) -> Self {
        LoadConfig {
            url: base_url.into().trim_end_matches('/').to_owned(),
            path: "/v1/chat/completions".to_owned(),
            rate: 10.0,
            duration: Duration::from_secs(10),
            max_requests: 10_000,
            max_in_flight: 10_000,
            request_timeout: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(60),
            seed: 1,
            body: Bytes::from_static(DEFAULT_BODY.as_bytes()),
            headers: Vec::new(),
            http2: false,
        }
    }

    /// Request path (default `/v1/chat/completions`).
    pub fn path(mut self, path: impl Into<String>) -> Self {
        self.path = path.into();
        self
    }

    /// Mean arrival rate in requests per second (default 10).
    pub fn rate(mut self, per_sec: f64) -> Self {
        self.rate = per_sec;
        self
    }

    /// Length of the sending window (default 10 s).
    pub fn duration(mut self, d: Duration) -> Self {
        self.duration = d;
        self
    }

    /// Most requests to send (default 10 000).
    pub fn max_requests(mut self, n: u64) -> Self {
        self.max_requests = n;
        self
    }

    /// Most requests in flight at once; arrivals beyond it are counted as `dropped` (default
    /// 10 000).
    pub fn max_in_flight(mut self, n: usize) -> Self {
        self.max_in_flight = n;
        self
    }

    /// Per-request time limit (default 60 s).
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d;
        self
    }

    /// How long to wait for requests still running after the window (default 60 s).
    pub fn drain_timeout(mut self, d: Duration) -> Self {
        self.drain_timeout = d;
        self
    }

    /// Seed of the arrival process (default 1).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = seed;
        self
    }

    /// The JSON request body (default [`DEFAULT_BODY`]).
    pub fn body(mut self, body: impl Into<Bytes>) -> Self {
        self.body = body.into();
        self
    }

    /// Adds a header to every request (e.g. [`SCRIPT_HEADER`](crate::SCRIPT_HEADER)).
    pub fn header(mut self, name: HeaderName, value: HeaderValue) -> Self {
        self.headers.push((name, value));
        self
    }

    /// Speak HTTP/2 with prior knowledge instead of HTTP/1.1 (default off).
    pub fn http2(mut self, on: bool) -> Self {
        self.http2 = on;
        self
    }
}

/// Why a load run could not start.
#[derive(Debug)]
#[non_exhaustive]
pub enum LoadError {
    /// The URL does not parse.
    Url(String),
    /// The rate is not a positive finite number.
    Rate(f64),
}

impl fmt::Display for LoadError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LoadError::Url(u) => write!(f, "invalid load target url `{u}`"),
            LoadError::Rate(r) => write!(f, "invalid request rate {r}: must be positive"),
        }
    }
}

impl std::error::Error for LoadError {}

/// How one request ended, from the client's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EndReason {
    /// A 2xx response whose stream said it was done (`[DONE]`, `message_stop`), or a
    /// non-streamed 2xx body read to its end.
    Completed,
    /// A 2xx stream that ended without saying it was done.
    Truncated,
    /// An in-band error event.
    ErrorEvent,
    /// A non-2xx status.
    HttpStatus,
    /// Connect, protocol or body error (including resets).
    Transport,
    /// [`LoadConfig::request_timeout`] passed.
    Timeout,
    /// Still running when the drain window closed.
    Unfinished,
    /// Not sent: over [`LoadConfig::max_in_flight`].
    Dropped,
}

impl EndReason {
    fn as_str(self) -> &'static str {
        match self {
            EndReason::Completed => "completed",
            EndReason::Truncated => "truncated",
            EndReason::ErrorEvent => "error_event",
            EndReason::HttpStatus => "http_status",
            EndReason::Transport => "transport",
            EndReason::Timeout => "timeout",
            EndReason::Unfinished => "unfinished",
            EndReason::Dropped => "dropped",
        }
    }
}

/// Runs the load and returns the report. Stops by itself (see the module docs).
pub async fn run(config: LoadConfig) -> Result<LoadReport, LoadError> {
    let uri = target(&config)?;
    if !(config.rate.is_finite() && config.rate > 0.0) {
        return Err(LoadError::Rate(config.rate));
    }
    let client = http_client(config.http2);
    let mut report = LoadReport::new(config.rate);
    let mut tasks: JoinSet<Sample> = JoinSet::new();
    let start = Instant::now();
    let last = send_window(&config, &uri, &client, start, &mut report, &mut tasks).await?;
    report.window = last - start;
    drain(&mut tasks, &mut report, config.drain_timeout).await;
    report.elapsed = start.elapsed();
    Ok(report)
}

/// The URL every request goes to.
fn target(config: &LoadConfig) -> Result<Uri, LoadError> {
    format!("{}{}", config.url, config.path)
        .parse()
        .map_err(|_| LoadError::Url(format!("{}{}", config.url, config.path)))
}

/// The client of a run: no Nagle delay, HTTP/2 with prior knowledge when `http2`.
fn http_client(http2: bool) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    Client::builder(TokioExecutor::new())
        .http2_only(http2)
        .build(connector)
}

/// Schedules the arrivals of the sending window that opens at `start` and sends each at its
/// time (or counts it as dropped), reaping finished requests in between. Returns the time of
/// the last scheduled arrival.
async fn send_window(
    config: &LoadConfig,
    uri: &Uri,
    client: &HttpClient,
    start: Instant,
    report: &mut LoadReport,
    tasks: &mut JoinSet<Sample>,
) -> Result<Instant, LoadError> {
    let mut rng = SplitMix64::new(config.seed);
    // Durations too long for the clock are as good as forever (the count still bounds the run).
    let end_of_window = start
        .checked_add(config.duration)
        .unwrap_or(start + HIST_MAX_DURATION);
    let mut next = start;
    let mut last = start;
    while report.scheduled < config.max_requests {
        let step = rng.next_exp() / config.rate;
        match Duration::try_from_secs_f64(step)
            .ok()
            .and_then(|d| next.checked_add(d))
        {
            Some(n) if n <= end_of_window => next = n,
            _ => break,
        }
        reap_until(tasks, report, next).await;
        report.scheduled += 1;
        last = next;
        if tasks.len() >= config.max_in_flight {
            report.add(Sample::ended(EndReason::Dropped));
            continue;
        }
        let req = request(config, uri)?;
        let (client, limit) = (client.clone(), config.request_timeout);
        tasks.spawn(async move {
            match timeout(limit, one_request(client, req, next)).await {
                Ok(s) => s,
                Err(_) => Sample::ended(EndReason::Timeout),
            }
        });
    }
    Ok(last)
}

/// Adds finished requests to the report until `next`, the time of the next arrival.
async fn reap_until(tasks: &mut JoinSet<Sample>, report: &mut LoadReport, next: Instant) {
    loop {
        tokio::select! {
            biased;
            Some(done) = tasks.join_next(), if !tasks.is_empty() => {
                if let Ok(sample) = done {
                    report.add(sample);
                }
            }
            _ = sleep_until(next) => break,
        }
    }
}

/// One request of the run, with the configured body and headers.
fn request(config: &LoadConfig, uri: &Uri) -> Result<Request<Full<Bytes>>, LoadError> {
    let mut req = Request::post(uri.clone())
        .header(CONTENT_TYPE, "application/json")
        .body(Full::new(config.body.clone()))
        .map_err(|_| LoadError::Url(uri.to_string()))?;
    for (k, v) in &config.headers {
        req.headers_mut().append(k.clone(), v.clone());
    }
    Ok(req)
}

/// Waits at most `drain_timeout` for the requests still running after the window, then
/// abandons the rest (counted as [`EndReason::Unfinished`]).
async fn drain(tasks: &mut JoinSet<Sample>, report: &mut LoadReport, drain_timeout: Duration) {
    let now = Instant::now();
    let drain_deadline = now
        .checked_add(drain_timeout)
        .unwrap_or(now + HIST_MAX_DURATION);
    loop {
        tokio::select! {
            done = tasks.join_next() => match done {
                Some(Ok(sample)) => report.add(sample),
                Some(Err(_)) => {}
                None => break,
            },
            _ = sleep_until(drain_deadline) => {
                let left = tasks.len() as u64;
                tasks.shutdown().await;
                *report.end_reasons.entry(EndReason::Unfinished).or_default() += left;
                break;
            }
        }
    }
}
