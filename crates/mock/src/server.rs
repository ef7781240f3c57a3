//! The mock replica: a hyper 1 server on loopback that acts out scripts.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::sleep;

use crate::handle::handle;
use crate::options::ReplicaOptions;
use crate::script::Script;
use crate::slots::{FULL_BATCH_GAP_GROWTH, Slots};
use crate::stats::{Shared, Stats};

/// What the connections and requests of one replica share.
#[derive(Debug)]
pub(crate) struct Inner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) script: Mutex<Script>,
    pub(crate) queue: Mutex<VecDeque<Script>>,
    /// The generation slots: one, or K when batching.
    pub(crate) slot: Arc<Slots>,
    pub(crate) options: ReplicaOptions,
    /// Index of the newest generation request (for `interrupt`).
    pub(crate) latest: AtomicU64,
}

impl Inner {
    /// Whether a generation request following `script` takes a slot.
    pub(crate) fn takes_slot(&self, script: &Script) -> bool {
        script.single_slot || self.options.head_after_slot || self.options.batch_slots.is_some()
    }

    /// A decode gap drawn as `gap`, slowed by the batch on a batching replica.
    pub(crate) fn decode_gap(&self, gap: Duration) -> Duration {
        match self.options.batch_slots {
            Some(_) => gap.mul_f64(1.0 + FULL_BATCH_GAP_GROWTH * self.slot.load().min(1.0)),
            None => gap,
        }
    }
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
/// | `POST /v1/responses` | OpenAI Responses API: named `response.*` events (streamed when `"stream": true`), `max_output_tokens` caps tokens |
/// | `GET /v1/models` | a one-model list |
/// | `POST /tailguard.mock.v1.Generator/Generate` | gRPC server streaming (HTTP/2), see [`grpc`](crate::grpc) |
/// | `POST /api/generate`, `POST /api/chat` | Ollama-style NDJSON (`application/x-ndjson`; streamed unless `"stream": false`); `options.num_predict` caps tokens |
///
/// `max_tokens` in a request caps the script's token count (the finish reason is then
/// `"length"`). A chat or Anthropic request ending with an assistant prefill, or a completions
/// prompt ending with the mock's words, is a continuation request: it gets the rest of the
/// answer (see the crate docs, "Continuation requests"). Which script a request follows: the replica's script ([`set_script`]), or the
/// next one queued with [`push_scripts`] (in arrival order), then overridden by the
/// [`SCRIPT_HEADER`](crate::SCRIPT_HEADER) header, then by `x-mock-script-<attempt>`.
///
/// Replica-wide behaviours of real servers (a slot whose head waits, interrupts, an idle
/// keep-alive close, cancelled requests still prefilled) are [`ReplicaOptions`], given to
/// [`start_with`](MockServer::start_with).
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
        Self::start_with(addr, script, ReplicaOptions::new()).await
    }

    /// Starts a replica on `addr` (port 0 picks a free port) that behaves as `options` say.
    pub async fn start_with(
        addr: SocketAddr,
        script: Script,
        options: ReplicaOptions,
    ) -> std::io::Result<MockServer> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Inner {
            shared: Shared::new(),
            script: Mutex::new(script),
            queue: Mutex::new(VecDeque::new()),
            slot: Slots::new(options.batch_slots.unwrap_or(1)),
            options,
            latest: AtomicU64::new(0),
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

    /// Sets the number of generation slots of a [`batching`](ReplicaOptions::batching)
    /// replica (or of the single slot's replica) from now on, as a replica losing or gaining
    /// GPUs: free slots go at once, busy ones when their streams end; new slots take waiting
    /// requests at once.
    pub fn set_slots(&self, slots: u32) {
        self.inner.slot.resize(slots);
    }

    /// The number of generation slots.
    pub fn slots(&self) -> u32 {
        self.inner.slot.size()
    }

    /// The replica's options.
    pub fn options(&self) -> &ReplicaOptions {
        &self.inner.options
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

    /// Resolves when no request is in flight: every body has ended or been dropped (and every
    /// request served late is over). Use it after dropping a client-side response to wait
    /// until the mock has seen the cancellation.
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
                conns.spawn(serve(inner.clone(), stream));
            }
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            _ = stop.changed() => break,
        }
    }
    conns.shutdown().await;
}

async fn serve(inner: Arc<Inner>, stream: TcpStream) {
    let abort = Arc::new(AtomicBool::new(false));
    let io = ConnIo {
        stream,
        abort: abort.clone(),
    };
    let mut builder = auto::Builder::new(TokioExecutor::new());
    if let Some(idle) = inner.options.keep_alive_timeout {
        // hyper's clock for a request head starts at accept and at the end of each response:
        // an idle connection is closed when it runs out, as uvicorn's `timeout_keep_alive`.
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(idle);
    }
    let svc = service_fn(move |req| handle(inner.clone(), abort.clone(), req));
    if let Err(e) = builder.serve_connection(TokioIo::new(io), svc).await {
        tracing::debug!(error = %e, "mock connection ended with an error");
    }
}

/// A connection's socket; closed with a TCP RST (zero linger) when a scripted reset asked for
/// it.
struct ConnIo {
    stream: TcpStream,
    abort: Arc<AtomicBool>,
}

impl Drop for ConnIo {
    fn drop(&mut self) {
        if self.abort.load(Ordering::Relaxed) {
            let _ = self.stream.set_zero_linger();
        }
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}
