//! Fair queueing across tenants (issue 34, item 2): an interactive tenant's time to first token
//! while another tenant floods the gate, with fair queueing on and off.
//!
//! ```text
//! cargo run --release -p tailguard-benches --bin tenant_fairness            # ~1.5 minutes
//! cargo run --release -p tailguard-benches --bin tenant_fairness -- --quick  # a third, prints only
//! ```
//!
//! One `tailguard-mock` batching replica ([`SLOTS`] slots, prefill by prompt size) behind an
//! in-process front: hyper HTTP/1.1, then the request's facts read from its JSON body
//! (`RequestFacts::from_json`) and its tenant from `x-tenant` (what an identity layer does),
//! then `BoundedAdmission` ([`CAPACITY`] = the replica's slots, so the gate is where requests
//! wait; queue [`QUEUE_LEN`], deadline 2 s), then `SseIdleTimeout` with no timer set (the
//! stream's reader, as in the usual stack, so the gate corrects each charge with the real
//! output), then a pooled hyper client to the replica.
//!
//! Tenant A sends short interactive requests (a 40-word prompt, 16 tokens out) at [`A_RATE`];
//! tenant B sends long ones (a 2,000-word prompt, 32 tokens out) at five times its share of
//! the gate: half of its capacity in streams per second ([`B_RATE`]). Both are open-loop
//! Poisson loads from the mock's generator, which measures TTFT from each request's scheduled
//! send time. Three phases, each on a fresh replica and gate: A alone; A with B's flood (B
//! starts [`WARMUP`] earlier, so the queue stands), fair queueing on (the default); the same
//! with fair queueing off (one FIFO per class). Results: a markdown table on stdout and
//! `benches/results/tenant_fairness.json`; the issue's target is A's p99 TTFT under the flood,
//! fair queueing on, within 1.2x of its p99 alone.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CONTENT_TYPE, HeaderName, HeaderValue};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::Serialize;
use tailguard::admission::{AdmissionBody, BoundedAdmission, BoundedAdmissionLayer};
use tailguard::core::{RequestFacts, Tenant};
use tailguard::timeout::{SseIdleTimeout, SseIdleTimeoutBody, SseIdleTimeoutLayer};
use tailguard_mock::load::{EndReason, LoadConfig, LoadReport};
use tailguard_mock::{MockServer, ReplicaOptions, Script};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tower::{Layer, Service, ServiceExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// The gate over the stream reader (no timer set) over the proxy, as in the usual stack.
type Gate = BoundedAdmission<SseIdleTimeout<Proxy>>;

/// The replica's generation slots, and the gate's capacity.
const SLOTS: u32 = 48;
const CAPACITY: u32 = SLOTS;
/// The gate's queue: long enough that B's flood (its waiters time out after 2 s) never fills it,
/// since a full queue refuses any tenant's arrival (fair queueing reorders, it does not refuse).
const QUEUE_LEN: usize = 1024;
/// The replica: 300 ms to the first token (lognormal, σ 0.25) plus 0.1 ms per prompt word, then
/// tokens 20 ms apart (25% slower at a full batch), as many as the request's `max_tokens`.
const SCRIPT: &str = "ttft=lognormal(300ms,0.25),prefill_per_token=100us,tokens=256,gap=20ms";
/// Tenant A: prompt words, `max_tokens`, requests per second.
const A_PROMPT: usize = 40;
const A_MAX_TOKENS: u32 = 16;
const A_RATE: f64 = 6.0;
/// Tenant B: prompt words, `max_tokens`.
const B_PROMPT: usize = 2000;
const B_MAX_TOKENS: u32 = 32;
/// B's stream: 300 ms + 200 ms of prefill + 32 tokens × 20 ms × ~1.2 ≈ 1.27 s, so the gate
/// serves about `CAPACITY / 1.27` streams a second; B's share is half of that, and it sends
/// five times its share.
const B_HOLD_S: f64 = 1.27;
const B_RATE: f64 = 5.0 * 0.5 * CAPACITY as f64 / B_HOLD_S;
/// A's measured window, and B's head start.
const WINDOW: Duration = Duration::from_secs(24);
const WARMUP: Duration = Duration::from_secs(4);
/// The issue's target: A's p99 TTFT with the flood, fair queueing on, over its p99 alone.
const TARGET: f64 = 1.2;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Alone,
    FloodFair,
    FloodFifo,
}

impl Phase {
    fn name(self) -> &'static str {
        match self {
            Phase::Alone => "A alone",
            Phase::FloodFair => "B floods, fair queueing on",
            Phase::FloodFifo => "B floods, fair queueing off",
        }
    }
}

/// Forwards a request to the replica.
#[derive(Clone)]
struct Proxy {
    client: Client<HttpConnector, Full<Bytes>>,
    upstream: String,
}

impl Service<Request<Bytes>> for Proxy {
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Incoming>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Bytes>) -> Self::Future {
        let client = self.client.clone();
        let uri = format!("{}{}", self.upstream, req.uri().path());
        Box::pin(async move {
            let up = Request::post(uri)
                .header(CONTENT_TYPE, "application/json")
                .body(Full::new(req.into_body()))?;
            Ok(client.request(up).await?)
        })
    }
}

/// Starts the front on 127.0.0.1:0 (facts and tenant into the extensions, then `gate`): its
/// URL and its accept loop.
async fn front(gate: Gate) -> Result<(String, JoinHandle<Result<(), Infallible>>), BoxError> {
    let listener = TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], 0))).await?;
    let addr = listener.local_addr()?;
    let accept = tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let _ = stream.set_nodelay(true);
            let gate = gate.clone();
            let svc = hyper::service::service_fn(move |req| handle(gate.clone(), req));
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
        Ok::<_, Infallible>(())
    });
    Ok((format!("http://{addr}"), accept))
}

/// One request at the front: its facts and tenant into the extensions, then the gate.
async fn handle(
    gate: Gate,
    req: Request<Incoming>,
) -> Result<Response<AdmissionBody<SseIdleTimeoutBody<Incoming>>>, BoxError> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let mut req = Request::from_parts(parts, body);
    if let Ok(facts) = RequestFacts::from_json(req.body()) {
        req.extensions_mut().insert(facts);
    }
    let tenant = req.headers().get("x-tenant").and_then(|v| v.to_str().ok());
    if let Some(t) = tenant.map(|t| Tenant::new(t.to_owned())) {
        req.extensions_mut().insert(t);
    }
    gate.oneshot(req).await
}

/// A streamed chat request of `words` prompt words and `max_tokens`.
fn body(words: usize, max_tokens: u32) -> String {
    let prompt = vec!["word"; words].join(" ");
    format!(
        r#"{{"model":"mock-model","stream":true,"max_tokens":{max_tokens},"messages":[{{"role":"user","content":"{prompt}"}}]}}"#
    )
}

fn load(url: &str, tenant: &'static str, body: String, rate: f64, window: Duration) -> LoadConfig {
    LoadConfig::new(url)
        .rate(rate)
        .duration(window)
        .seed(if tenant == "a" { 11 } else { 23 })
        .body(body)
        .header(
            HeaderName::from_static("x-tenant"),
            HeaderValue::from_static(tenant),
        )
        .request_timeout(Duration::from_secs(30))
        .drain_timeout(Duration::from_secs(30))
}

/// One tenant's figures in one phase.
#[derive(Clone, Debug, Serialize)]
struct TenantFigures {
    scheduled: u64,
    completed: u64,
    /// Refused by the gate (429 queue full, 503 queue timeout).
    refused: u64,
    p50_ttft_ms: Option<f64>,
    p99_ttft_ms: Option<f64>,
}

impl TenantFigures {
    fn of(r: &LoadReport) -> Self {
        let ms = |q: f64| (!r.ttft.is_empty()).then(|| r.ttft.value_at_quantile(q) as f64 / 1e3);
        TenantFigures {
            scheduled: r.scheduled,
            completed: r.count(EndReason::Completed),
            refused: r.count(EndReason::HttpStatus),
            p50_ttft_ms: ms(0.5),
            p99_ttft_ms: ms(0.99),
        }
    }
}

#[derive(Debug, Serialize)]
struct PhaseResult {
    phase: &'static str,
    fair_queueing: bool,
    a: TenantFigures,
    b: Option<TenantFigures>,
    /// A's p99 TTFT over its p99 alone (same run).
    a_p99_vs_alone: Option<f64>,
}

async fn run_phase(phase: Phase, scale: u32) -> Result<(LoadReport, Option<LoadReport>), BoxError> {
    let addr = SocketAddr::from(([127, 0, 0, 1], 0));
    let script: Script = SCRIPT.parse()?;
    let mock = MockServer::start_with(addr, script, ReplicaOptions::new().batching(SLOTS)).await?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let proxy = Proxy {
        client: Client::builder(TokioExecutor::new()).build(connector),
        upstream: mock.url(),
    };
    let layer = BoundedAdmissionLayer::new(CAPACITY)
        .with_queue_len(QUEUE_LEN)
        .with_tenant_fairness(phase != Phase::FloodFifo);
    let reader = SseIdleTimeoutLayer::new().layer(proxy);
    let (url, accept) = front(layer.layer(reader)).await?;
    let (window, warmup) = (WINDOW / scale, WARMUP / scale);
    let flood = (phase != Phase::Alone).then(|| {
        let b = load(
            &url,
            "b",
            body(B_PROMPT, B_MAX_TOKENS),
            B_RATE,
            warmup + window,
        );
        tokio::spawn(tailguard_mock::load::run(b))
    });
    if flood.is_some() {
        tokio::time::sleep(warmup).await;
    }
    let a = load(&url, "a", body(A_PROMPT, A_MAX_TOKENS), A_RATE, window);
    let a = tailguard_mock::load::run(a).await?;
    let b = match flood {
        Some(f) => Some(f.await??),
        None => None,
    };
    accept.abort();
    drop(mock);
    Ok((a, b))
}

fn fmt_ms(v: Option<f64>) -> String {
    v.map_or("-".to_owned(), |v| format!("{v:.0} ms"))
}

fn table(results: &[PhaseResult]) -> String {
    let mut s = String::from(
        "| phase | A p50 TTFT | A p99 TTFT | A p99 vs alone | A completed / refused | B completed / refused |\n|---|---|---|---|---|---|\n",
    );
    for r in results {
        let b = r.b.as_ref().map_or("-".to_owned(), |b| {
            format!("{} / {}", b.completed, b.refused)
        });
        s.push_str(&format!(
            "| {} | {} | {} | {} | {} / {} | {} |\n",
            r.phase,
            fmt_ms(r.a.p50_ttft_ms),
            fmt_ms(r.a.p99_ttft_ms),
            r.a_p99_vs_alone
                .map_or("-".to_owned(), |x| format!("{x:.2}x")),
            r.a.completed,
            r.a.refused,
            b
        ));
    }
    s
}

/// What a tenant sends.
#[derive(Serialize)]
struct Load {
    prompt_words: usize,
    max_tokens: u32,
    rate_per_s: f64,
}

#[derive(Serialize)]
struct Output<'a> {
    run: tailguard_benches::run::RunInfo,
    capacity: u32,
    replica_slots: u32,
    queue_len: usize,
    script: &'static str,
    a: Load,
    b: Load,
    window_seconds: f64,
    warmup_seconds: f64,
    target_ratio: f64,
    /// A's p99 TTFT, flood and fair queueing on, over alone: within the target?
    met: Option<bool>,
    phases: &'a [PhaseResult],
}

fn main() -> Result<(), BoxError> {
    let quick = std::env::args().any(|a| a == "--quick");
    let scale = if quick { 3 } else { 1 };
    let run = tailguard_benches::run::RunInfo::start();
    println!("{}", run.summary());
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let mut results: Vec<PhaseResult> = Vec::new();
    let mut alone_p99 = None;
    for phase in [Phase::Alone, Phase::FloodFair, Phase::FloodFifo] {
        eprintln!("running {} ...", phase.name());
        let (a, b) = rt.block_on(run_phase(phase, scale))?;
        let a = TenantFigures::of(&a);
        if phase == Phase::Alone {
            alone_p99 = a.p99_ttft_ms;
        }
        let ratio = a.p99_ttft_ms.zip(alone_p99).map(|(p, base)| p / base);
        results.push(PhaseResult {
            phase: phase.name(),
            fair_queueing: phase != Phase::FloodFifo,
            a,
            b: b.as_ref().map(TenantFigures::of),
            a_p99_vs_alone: ratio,
        });
    }
    print!("{}", table(&results));
    let met = results[1].a_p99_vs_alone.map(|r| r <= TARGET);
    println!(
        "target: A's p99 TTFT under the flood with fair queueing within {TARGET}x of alone: {}",
        match met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "no figure",
        }
    );
    if quick {
        return Ok(());
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    std::fs::create_dir_all(&dir)?;
    let out = Output {
        run: run.finish(),
        capacity: CAPACITY,
        replica_slots: SLOTS,
        queue_len: QUEUE_LEN,
        script: SCRIPT,
        a: Load {
            prompt_words: A_PROMPT,
            max_tokens: A_MAX_TOKENS,
            rate_per_s: A_RATE,
        },
        b: Load {
            prompt_words: B_PROMPT,
            max_tokens: B_MAX_TOKENS,
            rate_per_s: B_RATE,
        },
        window_seconds: WINDOW.as_secs_f64(),
        warmup_seconds: WARMUP.as_secs_f64(),
        target_ratio: TARGET,
        met,
        phases: &results,
    };
    std::fs::write(
        dir.join("tenant_fairness.json"),
        serde_json::to_string_pretty(&out)?,
    )?;
    Ok(())
}
