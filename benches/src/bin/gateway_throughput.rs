//! Gateway throughput: the gateway's full tailguard stack vs. the same gateway with no
//! layers vs. straight to the mock, with 1,000 concurrent streams.
//!
//! ```text
//! cargo run --release -p tailguard-benches --bin gateway_throughput            # ~1 minute
//! cargo run --release -p tailguard-benches --bin gateway_throughput -- --quick # ~40 seconds
//! ```
//!
//! Each mode runs in a child process of its own (so one mode's freed memory does not hide the
//! next one's growth), with one `tailguard-mock` replica, the gateway (when there is one) and
//! the client in that process, on `127.0.0.1:0`:
//!
//! * `direct`: the client talks to the mock;
//! * `gateway_bare`: the gateway's request handler (`tailguard_gateway`'s
//!   proxy: body read, JSON parsed into `RequestFacts`, hop-by-hop headers dropped) over a bare
//!   `ReplicaSet` of the gateway's `Replica`s, served by axum (the gateway has no
//!   layer-less mode, so this handler is a copy of its `proxy` function);
//! * `gateway_full`: the same handler over the gateway's own
//!   `tailguard_gateway::build_stack` (recorder → priority → admission → drain →
//!   timeouts → FirstTokenHedge → ReplicaSet), with the gateway's Prometheus recorder installed;
//! * `gateway_shipped`: the gateway itself (`Gateway::start`) pointed at the mock.
//!
//! Phases, all with 1,000 concurrent streams over HTTP/1.1 keep-alive connections:
//!
//! 1. warm-up (connections, pools, estimates);
//! 2. throughput: 1,000 closed-loop clients, each streaming 100-token completions with no gap
//!    between tokens, back to back, for a fixed time; SSE events received per second (mock,
//!    gateway and client share the process's two cores, so the ratio understates the
//!    gateway's own slowdown);
//! 3. latency and memory: 1,000 streams of 30 tokens 100 ms apart opened over one second; the
//!    client records time to first token and every inter-event gap (HDR, µs); once every stream
//!    has its first token the process's RSS (`/proc/self/status` `VmRSS`) is sampled, and the
//!    increase over the RSS before the phase, divided by the open streams, is the memory per
//!    open stream. The added latency of a gateway mode is its p99 (TTFT, gap) minus the
//!    direct mode's; the stack's own memory per stream is `gateway_full − gateway_bare`.
//!
//! Results: a table on stdout and `benches/results/gateway_throughput.json`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::routing::post;
use bytes::Bytes;
use hdrhistogram::Histogram;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tailguard::core::{BoxError, ReplayBody, RequestFacts};
use tailguard::route::ReplicaSet;
use tailguard_gateway::{Args, Config, Gateway, HttpClient, Replica, build_stack, metrics_handle};
use tailguard_mock::sse::{EventKind, SseReader};
use tailguard_mock::{MockServer, SCRIPT_HEADER, Script};
use tokio::net::TcpListener;
use tokio::time::Instant;
use tower::util::BoxCloneSyncService;
use tower::{Layer, ServiceBuilder, ServiceExt};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

const STREAMS: usize = 1_000;
const MODES: [&str; 4] = ["direct", "gateway_bare", "gateway_full", "gateway_shipped"];
const BODY: &str =
    r#"{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"Say hello"}]}"#;
/// Phase 2: as fast as the pipeline goes.
const THROUGHPUT_SCRIPT: &str = "ttft=0ms,tokens=100,gap=0ms";
/// Phase 3: long-lived streams.
const LATENCY_SCRIPT: &str = "ttft=20ms,tokens=30,gap=100ms";
const LATENCY_GAP: Duration = Duration::from_millis(100);

type Stack = BoxCloneSyncService<Request<Body>, Response<Body>, BoxError>;

/// What one mode measured (a child process prints it as JSON).
#[derive(Debug, Serialize, Deserialize)]
struct ModeResult {
    mode: String,
    /// Phase 2.
    events: u64,
    seconds: f64,
    events_per_sec: f64,
    streams_completed: u64,
    errors: u64,
    /// Phase 3, microseconds.
    ttft_p50_us: u64,
    ttft_p99_us: u64,
    /// Inter-event gaps minus the scripted 100 ms, microseconds (p50, p99, max).
    gap_excess_p50_us: i64,
    gap_excess_p99_us: i64,
    gap_excess_max_us: i64,
    open_streams: usize,
    rss_before_kib: u64,
    rss_open_kib: u64,
    kib_per_open_stream: f64,
    /// Net heap growth (bytes allocated minus freed, counting allocator) from the baseline to
    /// every stream open, per open stream, KiB: the same figure without allocator slack.
    heap_kib_per_open_stream: f64,
    latency_errors: u64,
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse().ok())
        })
        .unwrap_or(0)
}

fn count_events(b: &[u8]) -> u64 {
    b.windows(6).filter(|w| w == b"data: ").count() as u64
}

// ---- the gateway's handler, over either stack ------------------------------------------------

#[derive(Clone)]
struct App {
    stack: Stack,
}

/// A copy of the gateway's `proxy` handler (body read, JSON parsed into facts,
/// hop-by-hop headers dropped, the stack called, errors as 502).
async fn proxy(State(app): State<App>, req: Request<Body>) -> Response<Body> {
    // The stack's RequestFactsLayer reads the body (facts, 400 on malformed JSON).
    let (mut parts, body) = req.into_parts();
    for h in [
        http::header::CONNECTION,
        http::header::TE,
        http::header::TRAILER,
        http::header::TRANSFER_ENCODING,
        http::header::UPGRADE,
        http::header::PROXY_AUTHORIZATION,
    ] {
        parts.headers.remove(h);
    }
    match app.stack.oneshot(Request::from_parts(parts, body)).await {
        Ok(res) => res,
        Err(_) => status(StatusCode::BAD_GATEWAY),
    }
}

fn status(s: StatusCode) -> Response<Body> {
    let mut r = Response::new(Body::empty());
    *r.status_mut() = s;
    r
}

fn config(upstream: &str) -> Result<Config, BoxError> {
    let mut config = Config::resolve(Default::default(), &Args::default())?;
    config.listen = "127.0.0.1:0".parse()?;
    config.upstreams = vec![upstream.parse()?];
    // Room for every stream: admission must not queue or refuse them.
    config.admission.capacity = 4 * STREAMS as u32;
    config.admission.adaptive = false;
    config.admission.queue_len = 4 * STREAMS;
    Ok(config)
}

async fn serve_handler(stack: Stack) -> Result<SocketAddr, BoxError> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let router = Router::new()
        .route("/v1/chat/completions", post(proxy))
        .with_state(App { stack });
    tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Ok(addr)
}

/// Starts the mode's front; returns the URL the client talks to (and what keeps it alive).
async fn front(
    mode: &str,
    mock: &MockServer,
) -> Result<
    (
        String,
        Option<Gateway>,
        Option<tokio::sync::watch::Sender<bool>>,
    ),
    BoxError,
> {
    let upstream_client = || -> HttpClient {
        Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build_http()
    };
    let replicas = || {
        vec![
            Replica::new(
                upstream_client(),
                &mock.url().parse().expect("mock url"),
                "replica-0",
            )
            .expect("the mock's URL has a scheme and an authority"),
        ]
    };
    match mode {
        "direct" => Ok((mock.url(), None, None)),
        "gateway_bare" => {
            let bare = ServiceBuilder::new()
                .map_response(
                    |res: Response<tailguard::route::ReplicaBody<hyper::body::Incoming>>| {
                        res.map(Body::new)
                    },
                )
                .map_request(|req: Request<Body>| {
                    req.map(|b| {
                        ReplayBody::passthrough(ReplayBody::passthrough(ReplayBody::passthrough(b)))
                    })
                })
                .service(ReplicaSet::round_robin(replicas()));
            let addr = serve_handler(BoxCloneSyncService::new(bare)).await?;
            Ok((format!("http://{addr}"), None, None))
        }
        "gateway_full" => {
            let _ = metrics_handle();
            let (drain, drain_rx) = tokio::sync::watch::channel(false);
            let stack = build_stack(&config(&mock.url())?, replicas(), drain_rx);
            let addr = serve_handler(stack).await?;
            Ok((format!("http://{addr}"), None, Some(drain)))
        }
        "gateway_shipped" => {
            let gw = Gateway::start(config(&mock.url())?).await?;
            Ok((format!("http://{}", gw.addr()), Some(gw), None))
        }
        other => Err(format!("unknown mode {other}").into()),
    }
}

// ---- the client ----------------------------------------------------------------------------

fn client() -> Client<HttpConnector, Full<Bytes>> {
    let mut c = HttpConnector::new();
    c.set_nodelay(true);
    Client::builder(TokioExecutor::new()).build(c)
}

fn request(url: &str, script: &'static str) -> Result<Request<Full<Bytes>>, http::Error> {
    Request::post(format!("{url}/v1/chat/completions"))
        .header("content-type", "application/json")
        .header(SCRIPT_HEADER, script)
        .body(Full::new(Bytes::from_static(BODY.as_bytes())))
}

/// Streams one completion, adding the SSE events to `events` as they arrive; `None` on any
/// error.
async fn stream_once(
    client: &Client<HttpConnector, Full<Bytes>>,
    url: &str,
    script: &'static str,
    events: &AtomicU64,
) -> Option<()> {
    let res = client.request(request(url, script).ok()?).await.ok()?;
    if !res.status().is_success() {
        return None;
    }
    let mut body = res.into_body();
    while let Some(frame) = body.frame().await {
        if let Some(d) = frame.ok()?.data_ref() {
            events.fetch_add(count_events(d), Ordering::Relaxed);
        }
    }
    Some(())
}

/// Phase 2: `STREAMS` closed-loop clients for `d`.
async fn throughput(url: &str, d: Duration) -> (u64, f64, u64, u64) {
    let client = client();
    let events = Arc::new(AtomicU64::new(0));
    let done = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let deadline = start + d;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..STREAMS {
        let (client, url) = (client.clone(), url.to_owned());
        let (events, done, errors) = (events.clone(), done.clone(), errors.clone());
        tasks.spawn(async move {
            while Instant::now() < deadline {
                match stream_once(&client, &url, THROUGHPUT_SCRIPT, &events).await {
                    Some(()) => {
                        done.fetch_add(1, Ordering::Relaxed);
                    }
                    None => {
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
    }
    // Count what completed within the window; then let the streams in flight finish (aborting
    // them would close their connections, and the next phase would open new ones).
    // Every client starts at once: the first second (at most half the window) is not counted.
    let counted_from = start + Duration::from_secs(1).min(d / 2);
    tokio::time::sleep_until(counted_from).await;
    let base = events.load(Ordering::Relaxed);
    tokio::time::sleep_until(deadline).await;
    let n = events.load(Ordering::Relaxed) - base;
    let secs = (Instant::now() - counted_from).as_secs_f64();
    while tasks.join_next().await.is_some() {}
    (
        n,
        secs,
        done.load(Ordering::Relaxed),
        errors.load(Ordering::Relaxed),
    )
}

struct Latency {
    ttft: Histogram<u64>,
    gap_excess: Vec<i64>,
    open: usize,
    rss_before: u64,
    rss_open: u64,
    heap_open: i64,
    errors: u64,
}

/// Phase 3: `STREAMS` long streams opened over one second.
async fn latency(url: &str) -> Latency {
    let client = client();
    // Connections for every stream exist before the baseline is taken.
    let mut warm = tokio::task::JoinSet::new();
    for _ in 0..STREAMS {
        let (client, url) = (client.clone(), url.to_owned());
        warm.spawn(async move {
            stream_once(&client, &url, "ttft=0ms,tokens=1", &AtomicU64::new(0)).await
        });
    }
    while warm.join_next().await.is_some() {}
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_before = rss_kib();
    let heap = Region::new(GLOBAL);
    let first_tokens = Arc::new(AtomicUsize::new(0));
    let all_open = Arc::new(tokio::sync::Notify::new());
    let errors = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..STREAMS {
        let (client, url) = (client.clone(), url.to_owned());
        let (first_tokens, all_open, errors) =
            (first_tokens.clone(), all_open.clone(), errors.clone());
        let at = start + Duration::from_secs(1).mul_f64(i as f64 / STREAMS as f64);
        tasks.spawn(async move {
            tokio::time::sleep_until(at).await;
            let mut ttft = None;
            let mut gaps = Vec::new();
            let Ok(req) = request(&url, LATENCY_SCRIPT) else {
                errors.fetch_add(1, Ordering::Relaxed);
                return (ttft, gaps);
            };
            let Ok(res) = client.request(req).await else {
                errors.fetch_add(1, Ordering::Relaxed);
                return (ttft, gaps);
            };
            let mut body = res.into_body();
            let mut last: Option<Instant> = None;
            let mut reader = SseReader::new();
            while let Some(frame) = body.frame().await {
                let Ok(frame) = frame else {
                    errors.fetch_add(1, Ordering::Relaxed);
                    break;
                };
                let Some(d) = frame.data_ref() else { continue };
                // Token events only: role-only, finish, usage and [DONE] are not tokens.
                let mut tokens = 0;
                reader.feed(d, |kind| tokens += usize::from(kind == EventKind::Token));
                if tokens == 0 {
                    continue;
                }
                let now = Instant::now();
                match last {
                    None => {
                        ttft = Some(now - at);
                        if first_tokens.fetch_add(1, Ordering::AcqRel) + 1 == STREAMS {
                            all_open.notify_one();
                        }
                    }
                    Some(prev) => gaps.push(now - prev),
                }
                last = Some(now);
            }
            (ttft, gaps)
        });
    }
    // Sample RSS once every stream has its first token (or after 5 s), for 300 ms.
    let _ = tokio::time::timeout(Duration::from_secs(5), all_open.notified()).await;
    let open = first_tokens.load(Ordering::Acquire);
    let change = heap.change();
    let heap_open = change.bytes_allocated as i64 - change.bytes_deallocated as i64;
    let mut rss_open = 0;
    for _ in 0..6 {
        rss_open = rss_open.max(rss_kib());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut ttft = Histogram::<u64>::new_with_max(60_000_000, 3).expect("bounds");
    let mut gap_excess = Vec::new();
    while let Some(r) = tasks.join_next().await {
        if let Ok((t, gaps)) = r {
            if let Some(t) = t {
                ttft.saturating_record(t.as_micros() as u64);
            }
            gap_excess.extend(
                gaps.iter()
                    .map(|g| g.as_micros() as i64 - LATENCY_GAP.as_micros() as i64),
            );
        }
    }
    gap_excess.sort_unstable();
    Latency {
        ttft,
        gap_excess,
        open,
        rss_before,
        rss_open,
        heap_open,
        errors: errors.load(Ordering::Relaxed),
    }
}

fn pct(v: &[i64], p: f64) -> i64 {
    if v.is_empty() {
        return 0;
    }
    v[((v.len() - 1) as f64 * p).round() as usize]
}

async fn child(mode: &str, quick: bool) -> Result<ModeResult, BoxError> {
    let mock = MockServer::start(Script::new()).await?;
    let (url, gateway, drain) = front(mode, &mock).await?;
    // 1. Warm-up.
    throughput(&url, Duration::from_secs(1)).await;
    // 2. Throughput.
    let window = Duration::from_secs(if quick { 2 } else { 5 });
    let (events, seconds, completed, errors) = throughput(&url, window).await;
    // Let the aborted streams' upstream requests end.
    let _ = tokio::time::timeout(Duration::from_secs(5), mock.wait_idle()).await;
    // 3. Latency and memory.
    let lat = latency(&url).await;
    let result = ModeResult {
        mode: mode.to_owned(),
        events,
        seconds,
        events_per_sec: events as f64 / seconds,
        streams_completed: completed,
        errors,
        ttft_p50_us: lat.ttft.value_at_quantile(0.5),
        ttft_p99_us: lat.ttft.value_at_quantile(0.99),
        gap_excess_p50_us: pct(&lat.gap_excess, 0.5),
        gap_excess_p99_us: pct(&lat.gap_excess, 0.99),
        gap_excess_max_us: lat.gap_excess.last().copied().unwrap_or(0),
        open_streams: lat.open,
        rss_before_kib: lat.rss_before,
        rss_open_kib: lat.rss_open,
        kib_per_open_stream: if lat.open == 0 {
            0.0
        } else {
            lat.rss_open.saturating_sub(lat.rss_before) as f64 / lat.open as f64
        },
        heap_kib_per_open_stream: if lat.open == 0 {
            0.0
        } else {
            lat.heap_open as f64 / 1024.0 / lat.open as f64
        },
        latency_errors: lat.errors,
    };
    drop(drain);
    if let Some(gw) = gateway {
        let _ = tokio::time::timeout(Duration::from_secs(5), gw.shutdown()).await;
    }
    Ok(result)
}

// ---- the stack's own memory per open stream, exactly ----------------------------------------

/// An upstream body that sends a role-only chunk and one token, then stays open.
struct OpenStream {
    sent: u8,
}

impl http_body::Body for OpenStream {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        _cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        const FRAMES: [&[u8]; 2] = [
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
            b"data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
        ];
        let i = usize::from(self.sent);
        match FRAMES.get(i) {
            Some(f) => {
                self.sent += 1;
                std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(f)))))
            }
            None => std::task::Poll::Pending,
        }
    }
}

fn open_upstream<B>() -> impl tower::Service<
    Request<B>,
    Response = Response<OpenStream>,
    Error = std::convert::Infallible,
    Future: Send,
> + Clone
+ Send {
    tower::service_fn(|_req: Request<B>| async {
        Ok(Response::builder()
            .header("content-type", "text/event-stream")
            .body(OpenStream { sent: 0 })
            .expect("valid response"))
    })
}

/// Opens `n` streams through `svc` up to their first token and holds them; returns the net
/// heap growth per stream, bytes.
async fn heap_per_open_stream<S, B>(svc: &mut S, n: usize) -> f64
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: http_body::Body,
    B::Error: std::fmt::Debug,
{
    let req = || {
        let mut r = Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(BODY.as_bytes())))
            .expect("valid request");
        r.extensions_mut().insert(
            RequestFacts::new()
                .with_model("mock-llm")
                .with_stream(true)
                .with_prompt_bytes(9),
        );
        r
    };
    let mut open = Vec::with_capacity(n);
    // Warm-up: estimates, metric handles, budgets; then the measured streams.
    for round in 0..2 {
        open.clear();
        open.shrink_to_fit();
        open.reserve(n);
        let heap = Region::new(GLOBAL);
        for _ in 0..n {
            let res = ServiceExt::ready(&mut *svc)
                .await
                .expect("ready")
                .call(req())
                .await
                .expect("response");
            // Boxed, as a server holds it (its size counts: the stream's state lives in it).
            let mut body = Box::pin(res.into_body());
            // Role chunk and first token: the stream is committed.
            let mut frames = 0;
            while frames < 2 {
                match futures_poll_frame(&mut body).await {
                    Some(_) => frames += 1,
                    None => break,
                }
            }
            open.push(body);
        }
        let c = heap.change();
        if round == 1 {
            return (c.bytes_allocated as f64 - c.bytes_deallocated as f64) / n as f64;
        }
    }
    unreachable!("two rounds")
}

/// The next frame of `body`, or `None` at its end or when it is pending.
async fn futures_poll_frame<B: http_body::Body>(
    body: &mut std::pin::Pin<Box<B>>,
) -> Option<http_body::Frame<B::Data>> {
    std::future::poll_fn(|cx| match body.as_mut().poll_frame(cx) {
        std::task::Poll::Ready(Some(Ok(f))) => std::task::Poll::Ready(Some(f)),
        std::task::Poll::Ready(_) => std::task::Poll::Ready(None),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

/// The tailguard stack's own heap per open stream (the gateway's layers, in its order, over an
/// in-memory upstream), and the bare service's, in bytes.
fn stack_memory() -> Result<(f64, f64), BoxError> {
    use tailguard::admission::BoundedAdmissionLayer;
    use tailguard::hedge::FirstTokenHedgeLayer;
    use tailguard::phases::LatencyPhaseRecorderLayer;
    use tailguard::priority::PriorityClassLayer;
    use tailguard::timeout::SseIdleTimeoutLayer;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(async {
        let _ = metrics_handle();
        let mut bare = open_upstream::<Full<Bytes>>();
        let bare_bytes = heap_per_open_stream(&mut bare, STREAMS).await;
        let mut full = ServiceBuilder::new()
            .layer(LatencyPhaseRecorderLayer::new().with_routes(["/v1/chat/completions"]))
            .layer(PriorityClassLayer::new())
            .layer(BoundedAdmissionLayer::new(4 * STREAMS as u32))
            .layer(
                SseIdleTimeoutLayer::new()
                    .with_head_timeout(Duration::from_secs(10))
                    .with_first_token_timeout(Duration::from_secs(30))
                    .with_idle_timeout(Duration::from_secs(15))
                    .with_total_timeout(Duration::from_secs(600)),
            )
            .service(FirstTokenHedgeLayer::new().layer(open_upstream()));
        let full_bytes = heap_per_open_stream(&mut full, STREAMS).await;
        Ok((full_bytes, bare_bytes))
    })
}

fn run_child(mode: &str, quick: bool) -> Result<ModeResult, BoxError> {
    let exe = std::env::current_exe()?;
    let mut cmd = std::process::Command::new(exe);
    cmd.arg("--child").arg(mode);
    if quick {
        cmd.arg("--quick");
    }
    let out = cmd.stderr(std::process::Stdio::inherit()).output()?;
    if !out.status.success() {
        return Err(format!("mode {mode} failed: {}", out.status).into());
    }
    let line = String::from_utf8_lossy(&out.stdout);
    let json = line
        .lines()
        .rev()
        .find(|l| l.starts_with('{'))
        .ok_or("no result from the child")?;
    Ok(serde_json::from_str(json)?)
}

#[derive(Serialize)]
struct Output<'a> {
    bench: &'static str,
    quick: bool,
    streams: usize,
    throughput_script: &'static str,
    latency_script: &'static str,
    targets: &'static str,
    modes: &'a [ModeResult],
    full_over_bare_throughput: Option<f64>,
    full_added_ttft_p99_us: Option<i64>,
    full_added_gap_p99_us: Option<i64>,
    stack_kib_per_open_stream: Option<f64>,
    stack_heap_kib_per_open_stream: Option<f64>,
    /// The stack's own heap per open stream after the first token, from an in-process run over
    /// an in-memory upstream (bytes, counting allocator; the bare service's subtracted).
    stack_heap_bytes_per_open_stream_exact: f64,
    /// When the run started and the machine's load.
    run: tailguard_benches::run::RunInfo,
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    if let Some(i) = args.iter().position(|a| a == "--child") {
        let mode = args.get(i + 1).ok_or("--child MODE")?.clone();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()?;
        let r = rt.block_on(child(&mode, quick))?;
        println!("{}", serde_json::to_string(&r)?);
        // Connections and tasks die with the process.
        rt.shutdown_timeout(Duration::from_millis(100));
        return Ok(());
    }
    let run = tailguard_benches::run::RunInfo::start();
    println!("{}", run.summary());
    let mut results = Vec::new();
    for mode in MODES {
        eprintln!("running {mode}...");
        results.push(run_child(mode, quick)?);
    }
    let (stack_bytes, bare_bytes) = stack_memory()?;
    let get = |m: &str| results.iter().find(|r| r.mode == m);
    let (direct, bare, full) = (get("direct"), get("gateway_bare"), get("gateway_full"));
    println!(
        "\n{:<16} {:>12} {:>8} {:>10} {:>10} {:>12} {:>12} {:>8} {:>12} {:>12}",
        "mode",
        "events/s",
        "errors",
        "TTFT p50",
        "TTFT p99",
        "gap+ p50 µs",
        "gap+ p99 µs",
        "open",
        "RSS KiB/str",
        "heap KiB/str"
    );
    for r in &results {
        println!(
            "{:<16} {:>12.0} {:>8} {:>8.1}ms {:>8.1}ms {:>12} {:>12} {:>8} {:>12.2} {:>12.2}",
            r.mode,
            r.events_per_sec,
            r.errors + r.latency_errors,
            r.ttft_p50_us as f64 / 1e3,
            r.ttft_p99_us as f64 / 1e3,
            r.gap_excess_p50_us,
            r.gap_excess_p99_us,
            r.open_streams,
            r.kib_per_open_stream,
            r.heap_kib_per_open_stream
        );
    }
    let ratio = bare
        .zip(full)
        .map(|(b, f)| f.events_per_sec / b.events_per_sec);
    let added_ttft = direct
        .zip(full)
        .map(|(d, f)| f.ttft_p99_us as i64 - d.ttft_p99_us as i64);
    let added_gap = direct
        .zip(full)
        .map(|(d, f)| f.gap_excess_p99_us - d.gap_excess_p99_us);
    let stack_mem = bare
        .zip(full)
        .map(|(b, f)| f.kib_per_open_stream - b.kib_per_open_stream);
    let stack_heap = bare
        .zip(full)
        .map(|(b, f)| f.heap_kib_per_open_stream - b.heap_kib_per_open_stream);
    println!(
        "\nfull stack vs no-layer gateway: throughput {:.2}x (target >= 0.9x); added p99 vs direct: TTFT {} µs, inter-event gap {} µs (target <= 1000 µs); stack memory per open stream {:.2} KiB RSS, {:.2} KiB heap (target <= 4 KiB)",
        ratio.unwrap_or(f64::NAN),
        added_ttft.unwrap_or(0),
        added_gap.unwrap_or(0),
        stack_mem.unwrap_or(f64::NAN),
        stack_heap.unwrap_or(f64::NAN)
    );
    println!(
        "in process, exact: the tailguard stack holds {:.2} KiB of heap per open stream after its first token (the bare service {:.2} KiB; target <= 4 KiB)",
        (stack_bytes - bare_bytes) / 1024.0,
        bare_bytes / 1024.0
    );
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    std::fs::create_dir_all(&dir)?;
    let out = Output {
        stack_heap_bytes_per_open_stream_exact: stack_bytes - bare_bytes,
        bench: "gateway_throughput",
        quick,
        streams: STREAMS,
        throughput_script: THROUGHPUT_SCRIPT,
        latency_script: LATENCY_SCRIPT,
        targets: "full stack >= 0.9x the no-layer gateway's events/s; added p99 per-event latency <= 1 ms; <= 4 KiB per open stream after the first token",
        modes: &results,
        full_over_bare_throughput: ratio,
        full_added_ttft_p99_us: added_ttft,
        full_added_gap_p99_us: added_gap,
        stack_kib_per_open_stream: stack_mem,
        stack_heap_kib_per_open_stream: stack_heap,
        run: run.finish(),
    };
    let path = dir.join("gateway_throughput.json");
    std::fs::write(&path, serde_json::to_string_pretty(&out)?)?;
    println!("wrote {}", path.display());
    Ok(())
}
