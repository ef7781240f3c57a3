//! The mock replica: a hyper 1 server on loopback that acts out scripts.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tailguard_core::render::retry_after_secs;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, mpsc, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, sleep_until};

use crate::body::{Item, MockBody};
use crate::grpc::{GENERATE_PATH, decode_request};
use crate::rng::{SplitMix64, mix};
use crate::script::{Reset, Script};
use crate::stats::{Outcome, RequestGuard, Shared, Stats};
use crate::wire::{self, Api, Ctx};

/// Header whose value (in the [`Script::apply`] syntax) overrides the replica's script for one
/// request.
pub const SCRIPT_HEADER: &str = "x-mock-script";

/// Prefix of per-attempt script headers: `x-mock-script-<attempt>` applies (after
/// [`SCRIPT_HEADER`]) when the request's [`ATTEMPT_HEADER`] equals `<attempt>`, so one request
/// that a hedging layer sends twice can act differently per attempt.
pub const ATTEMPT_SCRIPT_HEADER_PREFIX: &str = "x-mock-script-";

/// Header carrying the attempt number, recorded in [`RequestRecord::attempt`](crate::RequestRecord).
pub const ATTEMPT_HEADER: &str = "x-tailguard-attempt";

/// Largest request body the mock reads (1 MiB).
pub const MAX_REQUEST_BODY: usize = 1 << 20;

#[derive(Debug)]
struct Inner {
    shared: Arc<Shared>,
    script: Mutex<Script>,
    queue: Mutex<VecDeque<Script>>,
    slot: Arc<Semaphore>,
}

/// One mock LLM replica on `127.0.0.1`, serving HTTP/1.1 and HTTP/2 (prior knowledge) on one
/// port.
///
/// Routes:
///
/// | route | dialect |
/// |---|---|
/// | `POST /v1/chat/completions` | OpenAI chat; `"stream": true` streams SSE, `stream_options.include_usage` adds the usage chunk |
/// | `POST /v1/completions` | OpenAI legacy completions (`choices[].text`) |
/// | `POST /v1/messages` (also `/anthropic/v1/messages`) | Anthropic messages SSE (streamed when `"stream": true`) |
/// | `GET /v1/models` | a one-model list |
/// | `POST /tailguard.mock.v1.Generator/Generate` | gRPC server streaming (HTTP/2), see [`grpc`](crate::grpc) |
/// | `POST /api/generate`, `POST /api/chat` | Ollama-style NDJSON (`application/x-ndjson`; streamed unless `"stream": false`); `options.num_predict` caps tokens |
///
/// `max_tokens` in a request caps the script's token count (the finish reason is then
/// `"length"`). Which script a request follows: the replica's script ([`set_script`]), or the
/// next one queued with [`push_scripts`] (in arrival order), then overridden by the
/// [`SCRIPT_HEADER`] header, then by `x-mock-script-<attempt>`.
///
/// Dropping the server stops it (like [`shutdown`](MockServer::shutdown), without waiting).
///
/// [`set_script`]: MockServer::set_script
/// [`push_scripts`]: MockServer::push_scripts
#[derive(Debug)]
pub struct MockServer {
    addr: SocketAddr,
    inner: Arc<Inner>,
    stop: Option<watch::Sender<bool>>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl MockServer {
    /// Starts a replica on `127.0.0.1:0` following `script`.
    pub async fn start(script: Script) -> std::io::Result<MockServer> {
        Self::start_on(SocketAddr::from(([127, 0, 0, 1], 0)), script).await
    }

    /// Starts a replica on `addr` (port 0 picks a free port).
    pub async fn start_on(addr: SocketAddr, script: Script) -> std::io::Result<MockServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            shared: Shared::new(),
            script: Mutex::new(script),
            queue: Mutex::new(VecDeque::new()),
            slot: Arc::new(Semaphore::new(1)),
        });
        let (stop_tx, stop_rx) = watch::channel(false);
        let task = tokio::spawn(accept_loop(listener, inner.clone(), stop_rx));
        Ok(MockServer {
            addr,
            inner,
            stop: Some(stop_tx),
            task: Some(task),
        })
    }

    /// Starts `n` replicas on `127.0.0.1:0`, all following `script`.
    pub async fn start_replicas(n: usize, script: Script) -> std::io::Result<Vec<MockServer>> {
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(Self::start(script.clone()).await?);
        }
        Ok(out)
    }

    /// The address the replica listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://127.0.0.1:PORT` (no trailing slash).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Replaces the replica's script for requests that arrive from now on.
    pub fn set_script(&self, script: Script) {
        *self.inner.script.lock().unwrap_or_else(|e| e.into_inner()) = script;
    }

    /// The replica's current script.
    pub fn script(&self) -> Script {
        self.inner
            .script
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Queues scripts: the next requests to arrive take them in order (one each) instead of
    /// the replica's script; when the queue is empty the replica's script applies again.
    pub fn push_scripts(&self, scripts: impl IntoIterator<Item = Script>) {
        self.inner
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(scripts);
    }

    /// A snapshot of the counters and the request log.
    pub fn stats(&self) -> Stats {
        self.inner.shared.snapshot()
    }

    /// Clears the counters and the log (requests in flight stay counted in `in_flight`).
    pub fn reset_stats(&self) {
        self.inner.shared.reset();
    }

    /// Resolves when no request is in flight: every body has ended or been dropped. Use it
    /// after dropping a client-side response to wait until the mock has seen the cancellation.
    pub async fn wait_idle(&self) {
        let mut rx = self.inner.shared.subscribe();
        // The sender lives as long as `self`.
        let _ = rx.wait_for(|n| *n == 0).await;
    }

    /// Resolves once at least `n` requests have arrived (counted as in [`Stats::requests`]):
    /// e.g. "the hedge sent its backup attempt".
    pub async fn wait_requests(&self, n: u64) {
        let mut rx = self.inner.shared.subscribe_requests();
        let _ = rx.wait_for(|r| *r >= n).await;
    }

    /// Stops accepting, closes every connection (bodies in flight are dropped and recorded as
    /// cancelled) and waits for the accept task to end.
    pub async fn shutdown(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

async fn accept_loop(listener: TcpListener, inner: Arc<Inner>, mut stop: watch::Receiver<bool>) {
    let mut conns = JoinSet::new();
    loop {
        tokio::select! {
            res = listener.accept() => {
                let (stream, _) = match res {
                    Ok(s) => s,
                    Err(e) => {
                        tracing::debug!(error = %e, "mock accept failed");
                        // Out of descriptors and similar: back off instead of spinning.
                        sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                };
                let _ = stream.set_nodelay(true);
                let inner = inner.clone();
                conns.spawn(async move {
                    let svc = service_fn(move |req| handle(inner.clone(), req));
                    let builder = auto::Builder::new(TokioExecutor::new());
                    if let Err(e) = builder.serve_connection(TokioIo::new(stream), svc).await {
                        tracing::debug!(error = %e, "mock connection ended with an error");
                    }
                });
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = stop.changed() => break,
        }
    }
    conns.shutdown().await;
}

/// The error a handler fails with to break the connection before the head.
#[derive(Debug)]
struct ResetBeforeHeaders;

impl std::fmt::Display for ResetBeforeHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("mock upstream reset the connection before headers")
    }
}

impl std::error::Error for ResetBeforeHeaders {}

fn simple(
    status: StatusCode,
    content_type: &'static str,
    body: Bytes,
    outcome: Outcome,
    guard: RequestGuard,
) -> Response<MockBody> {
    guard.headers_sent();
    let mut res = Response::new(MockBody::full(body, outcome, guard));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    res
}

fn bad_request(status: StatusCode, msg: &str, guard: RequestGuard) -> Response<MockBody> {
    let body = serde_json::json!({"error": {"message": msg, "type": "invalid_request_error",
        "param": null, "code": null}});
    simple(
        status,
        "application/json",
        Bytes::from(body.to_string()),
        Outcome::BadRequest(status.as_u16()),
        guard,
    )
}

async fn handle(
    inner: Arc<Inner>,
    req: Request<Incoming>,
) -> Result<Response<MockBody>, ResetBeforeHeaders> {
    let attempt = req
        .headers()
        .get(ATTEMPT_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let guard = inner
        .shared
        .begin(req.uri().path(), attempt.clone(), req.headers().clone());
    let index = guard.index();

    let api = match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/chat/completions") => Api::Chat,
        (&Method::POST, "/v1/completions") => Api::Completions,
        (&Method::POST, "/v1/messages" | "/anthropic/v1/messages") => Api::Anthropic,
        (&Method::POST, GENERATE_PATH) => Api::Grpc,
        (&Method::POST, "/api/generate") => Api::OllamaGenerate,
        (&Method::POST, "/api/chat") => Api::OllamaChat,
        (&Method::GET, "/v1/models") => {
            let body = serde_json::json!({"object": "list", "data": [{"id": "mock-model",
                "object": "model", "created": 1_796_053_661u64, "owned_by": "tailguard-mock"}]});
            return Ok(simple(
                StatusCode::OK,
                "application/json",
                Bytes::from(body.to_string()),
                Outcome::Completed,
                guard,
            ));
        }
        _ => return Ok(bad_request(StatusCode::NOT_FOUND, "no such route", guard)),
    };

    // Which script.
    let base = inner
        .queue
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .pop_front()
        .unwrap_or_else(|| {
            inner
                .script
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .clone()
        });
    let mut script = base;
    let mut overrides = vec![req.headers().get(SCRIPT_HEADER)];
    if let Some(a) = &attempt {
        overrides.push(
            req.headers()
                .get(format!("{ATTEMPT_SCRIPT_HEADER_PREFIX}{a}").as_str()),
        );
    }
    for value in overrides.into_iter().flatten() {
        let parsed = value
            .to_str()
            .map_err(|_| "script header is not ASCII".to_owned())
            .and_then(|v| script.apply(v).map_err(|e| e.to_string()));
        match parsed {
            Ok(s) => script = s,
            Err(e) => return Ok(bad_request(StatusCode::BAD_REQUEST, &e, guard)),
        }
    }

    // The request body.
    let body = match Limited::new(req.into_body(), MAX_REQUEST_BODY)
        .collect()
        .await
    {
        Ok(b) => {
            let b = b.to_bytes();
            guard.set_body(&b);
            b
        }
        Err(_) => {
            return Ok(bad_request(
                StatusCode::PAYLOAD_TOO_LARGE,
                "request body unreadable or over 1 MiB",
                guard,
            ));
        }
    };
    let params = match parse_params(api, &body) {
        Some(p) => p,
        None => {
            if api == Api::Grpc {
                return Ok(grpc_trailers_only(
                    3,
                    "bad GenerateRequest",
                    Outcome::BadRequest(400),
                    guard,
                ));
            }
            return Ok(bad_request(
                StatusCode::BAD_REQUEST,
                "request body is not valid JSON",
                guard,
            ));
        }
    };

    let mut rng = SplitMix64::new(mix(script.seed, index));
    let tokens = match params.max_tokens {
        Some(m) if m < script.tokens => m,
        _ => script.tokens,
    };
    let ctx = Ctx {
        api,
        id: format!(
            "{}-mock-{index}",
            match api {
                Api::Chat => "chatcmpl",
                Api::Completions => "cmpl",
                Api::Anthropic => "msg",
                Api::Grpc | Api::OllamaGenerate | Api::OllamaChat => "gen",
            }
        ),
        model: params.model,
        include_usage: params.include_usage,
        tool_calls: script.tool_calls && api == Api::Chat,
        prompt_tokens: params.prompt_tokens,
        truncated: tokens < script.tokens,
    };

    // Draw everything random up front, in a fixed order, so a request's behaviour depends only
    // on the seed and its index.
    let fail_draw = rng.next_f64();
    let fail = script.status.is_some() && fail_draw < script.status_fraction;
    let ttft = script.ttft.sample(&mut rng);

    if !script.head_delay.is_zero() {
        sleep(script.head_delay).await;
    }
    if script.reset == Reset::BeforeHeaders {
        let mut guard = guard;
        guard.finish(Outcome::ResetBeforeHeaders);
        return Err(ResetBeforeHeaders);
    }
    if let (true, Some(status)) = (fail, script.status) {
        if api == Api::Grpc {
            let code = wire::grpc_code_for(status);
            return Ok(grpc_trailers_only(
                code,
                "mock upstream error status",
                Outcome::Status(status.as_u16()),
                guard,
            ));
        }
        let mut res = simple(
            status,
            "application/json",
            wire::error_body(api, status),
            Outcome::Status(status.as_u16()),
            guard,
        );
        if let Some(after) = script.retry_after {
            res.headers_mut()
                .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
        }
        return Ok(res);
    }

    if !params.stream {
        return non_streamed(&inner, &script, &ctx, tokens, ttft, rng, guard).await;
    }

    let (tx, rx) = mpsc::channel(1);
    let slot = script.single_slot.then(|| inner.slot.clone());
    let producer = Producer {
        tx,
        ctx: ctx.clone(),
        script,
        tokens,
        ttft,
        rng,
        recorder: guard.recorder(),
        keepalive: None,
        next_keepalive: Instant::now(),
        slot,
    };
    let task = tokio::spawn(producer.run()).abort_handle();
    guard.headers_sent();
    let mut res = Response::new(MockBody::stream(rx, task, guard));
    let h = res.headers_mut();
    if api == Api::Grpc {
        h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    } else if api.is_ollama() {
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("application/x-ndjson"),
        );
    } else {
        h.insert(
            CONTENT_TYPE,
            HeaderValue::from_static("text/event-stream; charset=utf-8"),
        );
        h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    }
    Ok(res)
}

fn grpc_trailers_only(
    code: u16,
    message: &'static str,
    outcome: Outcome,
    guard: RequestGuard,
) -> Response<MockBody> {
    guard.headers_sent();
    // A trailers-only response: the status travels in the head, the body is empty.
    let mut res = Response::new(MockBody::full(Bytes::new(), outcome, guard));
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from(code));
    h.insert("grpc-message", HeaderValue::from_static(message));
    res
}

async fn non_streamed(
    inner: &Inner,
    script: &Script,
    ctx: &Ctx,
    tokens: u32,
    ttft: Duration,
    mut rng: SplitMix64,
    guard: RequestGuard,
) -> Result<Response<MockBody>, ResetBeforeHeaders> {
    // The permit is held until the response is built; the handler future owns it, so a client
    // that goes away while waiting releases it.
    let _permit = if script.single_slot {
        inner.slot.clone().acquire_owned().await.ok()
    } else {
        None
    };
    sleep(ttft).await;
    for i in 0..=tokens {
        if i > 0 && i < tokens {
            sleep(script.gap.sample(&mut rng)).await;
        }
        if let Some((n, pause)) = script.stall_after
            && n == i
        {
            match pause {
                Some(p) => sleep(p).await,
                None => std::future::pending::<()>().await,
            }
        }
        if script.reset == Reset::AfterTokens(i) {
            // Breaking a non-streamed response before its head is the only reset it has.
            let mut guard = guard;
            guard.finish(Outcome::ResetAfterTokens(i));
            return Err(ResetBeforeHeaders);
        }
        if script.error_event_after == Some(i) {
            let status = StatusCode::INTERNAL_SERVER_ERROR;
            return Ok(simple(
                status,
                "application/json",
                wire::error_body(ctx.api, status),
                Outcome::ErrorEvent(i),
                guard,
            ));
        }
        if i < tokens {
            guard.recorder().token();
        }
    }
    let content_type = if ctx.api == Api::Grpc {
        "application/grpc"
    } else {
        "application/json"
    };
    Ok(simple(
        StatusCode::OK,
        content_type,
        ctx.non_streamed(tokens),
        Outcome::Completed,
        guard,
    ))
}

struct Params {
    stream: bool,
    include_usage: bool,
    max_tokens: Option<u32>,
    model: String,
    prompt_tokens: u64,
}

fn parse_params(api: Api, body: &[u8]) -> Option<Params> {
    if api == Api::Grpc {
        let r = decode_request(body)?;
        return Some(Params {
            stream: true,
            include_usage: false,
            max_tokens: (r.max_tokens > 0).then_some(r.max_tokens),
            model: if r.model.is_empty() {
                "mock-model".to_owned()
            } else {
                r.model
            },
            prompt_tokens: r.prompt.split_whitespace().count() as u64,
        });
    }
    // An empty body is accepted as `{}` (curl -X POST with no data).
    let v: serde_json::Value = if body.is_empty() {
        serde_json::Value::Object(Default::default())
    } else {
        serde_json::from_slice(body).ok()?
    };
    // Ollama streams unless told not to; OpenAI and Anthropic only when told to.
    let stream = v
        .get("stream")
        .and_then(|s| s.as_bool())
        .unwrap_or(api.is_ollama());
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(|s| s.as_bool())
        .unwrap_or(false);
    let max_tokens = v
        .get("max_tokens")
        .or_else(|| v.get("max_completion_tokens"))
        .or_else(|| v.pointer("/options/num_predict"))
        .and_then(|m| m.as_u64())
        .map(|m| u32::try_from(m).unwrap_or(u32::MAX));
    let model = v
        .get("model")
        .and_then(|m| m.as_str())
        .unwrap_or("mock-model")
        .to_owned();
    let prompt_tokens = prompt_words(&v);
    Some(Params {
        stream,
        include_usage,
        max_tokens,
        model,
        prompt_tokens,
    })
}

/// Counts whitespace-separated words of the prompt / messages as "prompt tokens".
fn prompt_words(v: &serde_json::Value) -> u64 {
    fn words(v: &serde_json::Value) -> u64 {
        match v {
            serde_json::Value::String(s) => s.split_whitespace().count() as u64,
            serde_json::Value::Array(a) => a.iter().map(words).sum(),
            serde_json::Value::Object(o) => o
                .get("content")
                .or_else(|| o.get("text"))
                .map(words)
                .unwrap_or(0),
            _ => 0,
        }
    }
    v.get("messages")
        .or_else(|| v.get("prompt"))
        .map(words)
        .unwrap_or(0)
}

/// Produces one streamed response's items on the script's timeline.
struct Producer {
    tx: mpsc::Sender<Item>,
    ctx: Ctx,
    script: Script,
    tokens: u32,
    ttft: Duration,
    rng: SplitMix64,
    recorder: crate::stats::Recorder,
    keepalive: Option<(Duration, Bytes)>,
    next_keepalive: Instant,
    slot: Option<Arc<Semaphore>>,
}

/// The body is gone: stop producing.
struct Gone;

impl Producer {
    async fn send(&self, item: Item) -> Result<(), Gone> {
        self.tx.send(item).await.map_err(|_| Gone)
    }

    /// Waits for `fut`, sending keepalives on schedule meanwhile.
    async fn during<F: Future>(&mut self, fut: F) -> Result<F::Output, Gone> {
        let mut fut = std::pin::pin!(fut);
        loop {
            let Some((every, frame)) = self.keepalive.clone() else {
                return Ok(fut.await);
            };
            tokio::select! {
                biased;
                out = &mut fut => return Ok(out),
                _ = sleep_until(self.next_keepalive) => {
                    match self.next_keepalive.checked_add(every) {
                        Some(next) => self.next_keepalive = next,
                        // Beyond the end of time: no more keepalives.
                        None => self.keepalive = None,
                    }
                    self.send(Item::Data(frame)).await?;
                }
            }
        }
    }

    async fn wait(&mut self, d: Duration) -> Result<(), Gone> {
        if d.is_zero() {
            return Ok(());
        }
        self.during(sleep(d)).await
    }

    async fn run(mut self) {
        // Every exit is either an end item or the body being gone.
        let _ = self.run_inner().await;
    }

    async fn run_inner(&mut self) -> Result<(), Gone> {
        let start = Instant::now();
        if let (Some(every), Some(frame)) = (self.script.keepalive_every, self.ctx.keepalive()) {
            // A period so long it overflows the clock means "never".
            if let Some(first) = start.checked_add(every) {
                self.keepalive = Some((every, frame));
                self.next_keepalive = first;
            }
        }
        if self.script.early_meta {
            for b in self.ctx.preamble() {
                self.send(Item::Data(b)).await?;
            }
        }
        let _permit = match self.slot.take() {
            Some(slot) => self.during(slot.acquire_owned()).await?.ok(),
            None => None,
        };
        let ttft = self.ttft;
        self.wait(ttft).await?;
        if !self.script.early_meta {
            for b in self.ctx.preamble() {
                self.send(Item::Data(b)).await?;
            }
        }
        let n = self.tokens;
        for i in 0..=n {
            if i > 0 && i < n {
                let gap = self.script.gap.sample(&mut self.rng);
                self.wait(gap).await?;
            }
            if let Some((k, pause)) = self.script.stall_after
                && k == i
            {
                match pause {
                    Some(p) => self.wait(p).await?,
                    None => self.during(std::future::pending::<()>()).await?,
                }
            }
            if self.script.reset == Reset::AfterTokens(i) {
                return self.send(Item::Reset(i)).await;
            }
            if self.script.error_event_after == Some(i) {
                return match self.ctx.error_event() {
                    Some(b) => self.send(Item::Last(b, Outcome::ErrorEvent(i))).await,
                    None => {
                        self.send(Item::Trailers(
                            wire::grpc_error_trailers(),
                            Outcome::ErrorEvent(i),
                        ))
                        .await
                    }
                };
            }
            if i < n {
                let b = self.ctx.token(i);
                self.recorder.token();
                self.send(Item::Data(b)).await?;
            }
        }
        let mut epilogue = self.ctx.epilogue(n);
        let last = if self.ctx.api == Api::Grpc {
            Item::Trailers(wire::grpc_ok_trailers(), Outcome::Completed)
        } else {
            match epilogue.pop() {
                Some(b) => Item::Last(b, Outcome::Completed),
                None => Item::End(Outcome::Completed),
            }
        };
        for b in epilogue {
            self.send(Item::Data(b)).await?;
        }
        self.send(last).await
    }
}
