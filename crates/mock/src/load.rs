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

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use hdrhistogram::Histogram;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep_until, timeout};

use crate::rng::SplitMix64;
use crate::sse::{EventKind, NdjsonReader, SseReader};

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

/// The outcome of one request.
#[derive(Debug, Default)]
struct Sample {
    status: Option<u16>,
    end: Option<EndReason>,
    headers: Option<Duration>,
    ttft: Option<Duration>,
    gaps: Vec<Duration>,
    total: Option<Duration>,
    tokens: u64,
}

/// The result of a run: histograms (microseconds) and counts.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct LoadReport {
    /// Requests scheduled within the window (sent or dropped).
    pub scheduled: u64,
    /// Length of the sending window actually used (to the last scheduled arrival).
    pub window: Duration,
    /// Time from the start to the end of the drain.
    pub elapsed: Duration,
    /// Target rate, requests per second.
    pub target_rate: f64,
    /// Time to response headers, from the scheduled send time.
    pub headers: Histogram<u64>,
    /// Time to first token, from the scheduled send time.
    pub ttft: Histogram<u64>,
    /// Gaps between consecutive token events.
    pub gap: Histogram<u64>,
    /// Total time to the end of the response, from the scheduled send time.
    pub total: Histogram<u64>,
    /// Token events received, over all requests.
    pub tokens: u64,
    /// Count per HTTP status.
    pub statuses: BTreeMap<u16, u64>,
    /// Count per end reason.
    pub end_reasons: BTreeMap<EndReason, u64>,
}

fn histogram() -> Histogram<u64> {
    // Valid bounds: cannot fail.
    Histogram::new_with_max(HIST_MAX_US, 3).expect("valid histogram bounds")
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl LoadReport {
    fn new(target_rate: f64) -> Self {
        LoadReport {
            scheduled: 0,
            window: Duration::ZERO,
            elapsed: Duration::ZERO,
            target_rate,
            headers: histogram(),
            ttft: histogram(),
            gap: histogram(),
            total: histogram(),
            tokens: 0,
            statuses: BTreeMap::new(),
            end_reasons: BTreeMap::new(),
        }
    }

    fn add(&mut self, s: Sample) {
        if let Some(st) = s.status {
            *self.statuses.entry(st).or_default() += 1;
        }
        if let Some(end) = s.end {
            *self.end_reasons.entry(end).or_default() += 1;
        }
        if let Some(d) = s.headers {
            self.headers.saturating_record(us(d));
        }
        if let Some(d) = s.ttft {
            self.ttft.saturating_record(us(d));
        }
        for g in s.gaps {
            self.gap.saturating_record(us(g));
        }
        if let Some(d) = s.total {
            self.total.saturating_record(us(d));
        }
        self.tokens += s.tokens;
    }

    /// Requests that ended with `reason`.
    pub fn count(&self, reason: EndReason) -> u64 {
        self.end_reasons.get(&reason).copied().unwrap_or(0)
    }

    /// The serialisable summary (percentiles in seconds).
    pub fn summary(&self) -> LoadSummary {
        LoadSummary {
            scheduled: self.scheduled,
            target_rate: self.target_rate,
            achieved_rate: if self.window.is_zero() {
                0.0
            } else {
                self.scheduled as f64 / self.window.as_secs_f64()
            },
            window_seconds: self.window.as_secs_f64(),
            elapsed_seconds: self.elapsed.as_secs_f64(),
            tokens: self.tokens,
            statuses: self
                .statuses
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect(),
            end_reasons: self
                .end_reasons
                .iter()
                .map(|(k, v)| (k.as_str().to_owned(), *v))
                .collect(),
            headers: Percentiles::of(&self.headers),
            ttft: Percentiles::of(&self.ttft),
            gap: Percentiles::of(&self.gap),
            total: Percentiles::of(&self.total),
        }
    }
}

/// Percentiles of one histogram, in seconds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Percentiles {
    /// Samples.
    pub count: u64,
    /// Smallest sample.
    pub min: f64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Largest sample.
    pub max: f64,
}

impl Percentiles {
    /// Percentiles of a microsecond histogram.
    pub fn of(h: &Histogram<u64>) -> Self {
        let s = |v: u64| v as f64 / 1e6;
        if h.is_empty() {
            return Percentiles {
                count: 0,
                min: 0.0,
                mean: 0.0,
                p50: 0.0,
                p90: 0.0,
                p99: 0.0,
                p999: 0.0,
                max: 0.0,
            };
        }
        Percentiles {
            count: h.len(),
            min: s(h.min()),
            mean: h.mean() / 1e6,
            p50: s(h.value_at_quantile(0.5)),
            p90: s(h.value_at_quantile(0.9)),
            p99: s(h.value_at_quantile(0.99)),
            p999: s(h.value_at_quantile(0.999)),
            max: s(h.max()),
        }
    }
}

/// The JSON shape of a [`LoadReport`].
#[derive(Clone, Debug, Serialize)]
#[non_exhaustive]
pub struct LoadSummary {
    /// Requests scheduled.
    pub scheduled: u64,
    /// Target rate (req/s).
    pub target_rate: f64,
    /// Scheduled requests over the window (req/s).
    pub achieved_rate: f64,
    /// The sending window (s).
    pub window_seconds: f64,
    /// The whole run (s).
    pub elapsed_seconds: f64,
    /// Token events received.
    pub tokens: u64,
    /// Count per HTTP status.
    pub statuses: BTreeMap<String, u64>,
    /// Count per end reason.
    pub end_reasons: BTreeMap<String, u64>,
    /// Time to headers.
    pub headers: Percentiles,
    /// Time to first token.
    pub ttft: Percentiles,
    /// Inter-token gaps.
    pub gap: Percentiles,
    /// Total time.
    pub total: Percentiles,
}

impl LoadSummary {
    /// Pretty JSON.
    pub fn to_json(&self) -> String {
        // Plain data with string keys: serialisation cannot fail.
        serde_json::to_string_pretty(self).unwrap_or_default()
    }
}

impl fmt::Display for LoadReport {
    /// A human-readable table: percentiles in milliseconds, then the counts.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = self.summary();
        writeln!(
            f,
            "scheduled {} requests in {:.3}s ({:.1} req/s, target {:.1}); run took {:.3}s; {} tokens",
            s.scheduled,
            s.window_seconds,
            s.achieved_rate,
            s.target_rate,
            s.elapsed_seconds,
            s.tokens
        )?;
        writeln!(
            f,
            "{:<8} {:>8} {:>10} {:>10} {:>10} {:>10} {:>10}",
            "ms", "count", "p50", "p90", "p99", "p99.9", "max"
        )?;
        for (name, p) in [
            ("headers", &s.headers),
            ("ttft", &s.ttft),
            ("gap", &s.gap),
            ("total", &s.total),
        ] {
            writeln!(
                f,
                "{:<8} {:>8} {:>10.3} {:>10.3} {:>10.3} {:>10.3} {:>10.3}",
                name,
                p.count,
                p.p50 * 1e3,
                p.p90 * 1e3,
                p.p99 * 1e3,
                p.p999 * 1e3,
                p.max * 1e3
            )?;
        }
        let statuses: Vec<String> = s.statuses.iter().map(|(k, v)| format!("{k}={v}")).collect();
        let ends: Vec<String> = s
            .end_reasons
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        writeln!(f, "status: {}", statuses.join(" "))?;
        write!(f, "end:    {}", ends.join(" "))
    }
}

type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Runs the load and returns the report. Stops by itself (see the module docs).
pub async fn run(config: LoadConfig) -> Result<LoadReport, LoadError> {
    let uri: Uri = format!("{}{}", config.url, config.path)
        .parse()
        .map_err(|_| LoadError::Url(format!("{}{}", config.url, config.path)))?;
    if !(config.rate.is_finite() && config.rate > 0.0) {
        return Err(LoadError::Rate(config.rate));
    }
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: HttpClient = Client::builder(TokioExecutor::new())
        .http2_only(config.http2)
        .build(connector);

    let mut report = LoadReport::new(config.rate);
    let mut rng = SplitMix64::new(config.seed);
    let start = Instant::now();
    // Durations too long for the clock are as good as forever (the count still bounds the run).
    let far = |d: Duration| start.checked_add(d).unwrap_or(start + HIST_MAX_DURATION);
    let end_of_window = far(config.duration);
    let mut next = start;
    let mut tasks: JoinSet<Sample> = JoinSet::new();
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
        // Reap finished requests while waiting for the next arrival.
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
        report.scheduled += 1;
        last = next;
        if tasks.len() >= config.max_in_flight {
            report.add(Sample {
                end: Some(EndReason::Dropped),
                ..Sample::default()
            });
            continue;
        }
        let mut req = Request::post(uri.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(Full::new(config.body.clone()))
            .map_err(|_| LoadError::Url(uri.to_string()))?;
        for (k, v) in &config.headers {
            req.headers_mut().append(k.clone(), v.clone());
        }
        let client = client.clone();
        let scheduled = next;
        let limit = config.request_timeout;
        tasks.spawn(async move {
            match timeout(limit, one_request(client, req, scheduled)).await {
                Ok(s) => s,
                Err(_) => Sample {
                    end: Some(EndReason::Timeout),
                    ..Sample::default()
                },
            }
        });
    }
    report.window = last - start;

    let now = Instant::now();
    let drain_deadline = now
        .checked_add(config.drain_timeout)
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
    report.elapsed = start.elapsed();
    Ok(report)
}

async fn one_request(client: HttpClient, req: Request<Full<Bytes>>, scheduled: Instant) -> Sample {
    let mut s = Sample::default();
    let res = match client.request(req).await {
        Ok(r) => r,
        Err(_) => {
            s.end = Some(EndReason::Transport);
            s.total = Some(scheduled.elapsed());
            return s;
        }
    };
    s.headers = Some(scheduled.elapsed());
    let status = res.status();
    s.status = Some(status.as_u16());
    let content_type = res
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let sse = content_type.starts_with("text/event-stream");
    let ndjson = content_type.starts_with("application/x-ndjson")
        || content_type.starts_with("application/jsonl");
    let streamed = sse || ndjson;
    let mut body = res.into_body();
    let mut reader = SseReader::new();
    let mut lines = NdjsonReader::new();
    let mut last_token: Option<Instant> = None;
    let mut done = false;
    let mut error = false;
    let mut transport = false;
    while let Some(frame) = body.frame().await {
        let frame = match frame {
            Ok(f) => f,
            Err(_) => {
                transport = true;
                break;
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let now = Instant::now();
        if !streamed {
            if !data.is_empty() && s.ttft.is_none() && status.is_success() {
                s.ttft = Some(now - scheduled);
            }
            continue;
        }
        let mut on_event = |kind| match kind {
            EventKind::Token => {
                s.tokens += 1;
                match last_token {
                    None => s.ttft = Some(now - scheduled),
                    Some(prev) => s.gaps.push(now - prev),
                }
                last_token = Some(now);
            }
            EventKind::Done => done = true,
            EventKind::Error => error = true,
            EventKind::Meta | EventKind::Keepalive => {}
        };
        if sse {
            reader.feed(&data, &mut on_event);
        } else {
            lines.feed(&data, &mut on_event);
        }
    }
    if ndjson && !transport {
        lines.finish(|kind| match kind {
            EventKind::Done => done = true,
            EventKind::Error => error = true,
            // A trailing token line without a line end: counted, no gap (its arrival time is
            // the last frame's, already past).
            EventKind::Token => s.tokens += 1,
            EventKind::Meta | EventKind::Keepalive => {}
        });
    }
    s.total = Some(scheduled.elapsed());
    s.end = Some(if transport {
        EndReason::Transport
    } else if !status.is_success() {
        EndReason::HttpStatus
    } else if error {
        EndReason::ErrorEvent
    } else if done || !streamed {
        EndReason::Completed
    } else {
        EndReason::Truncated
    });
    s
}
