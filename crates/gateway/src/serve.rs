//! The gateway's HTTP server: accepts connections (with `TCP_NODELAY`, up to a cap), serves
//! each with hyper (HTTP/1.1 and HTTP/2), and closes those that are slow to send a request
//! head or idle too long.
//!
//! A connection is in one of three phases: awaiting a request head (from accept, or from the
//! first byte that arrives on an idle HTTP/1.1 connection), busy (requests in flight, until
//! their response bodies are dropped), or idle. Awaiting a head longer than the header-read
//! timeout closes it at once (a slowloris client trickling a head); idle longer than the
//! keep-alive timeout shuts it down gracefully (HTTP/2: `GOAWAY`). Busy connections have no
//! limit here: the stack's own timeouts bound the requests.
//!
//! The phase is a plain value the connection's requests and socket update; a watchdog task
//! looks at it when its deadline comes, and at least once per header-read timeout, rather
//! than being woken at each change (see [`ConnState::check`]).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use bytes::Bytes;
use http::{Request, Version};
use http_body::{Frame, SizeHint};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use pin_project_lite::pin_project;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot, watch};
use tokio::task::JoinSet;
use tokio::time::{Instant, sleep, sleep_until};
use tower::ServiceExt;

use super::Config;

/// The server's connection limits (see [`Config`] for the defaults and why).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Time a client has to send a request head.
    pub header_read_timeout: Duration,
    /// Longest time a connection stays open with no request in flight.
    pub keep_alive_timeout: Duration,
    /// Most connections open at once; past it new ones are closed at once.
    pub max_connections: usize,
}

impl From<&Config> for Limits {
    fn from(c: &Config) -> Self {
        Limits {
            header_read_timeout: c.header_read_timeout,
            keep_alive_timeout: c.keep_alive_timeout,
            max_connections: c.max_connections,
        }
    }
}

/// Serves `router` on `listener` within `limits` until `stop` turns `true`; then stops
/// accepting (new connections are refused), shuts every connection down gracefully and
/// returns once they are all closed.
pub async fn serve(
    listener: TcpListener,
    router: Router,
    limits: Limits,
    stop: watch::Receiver<bool>,
) -> io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut conns = JoinSet::new();
    let mut stopping = stop.clone();
    let mut at_cap = false;
    loop {
        tokio::select! {
            res = accept(&listener) => match res {
                Ok(stream) => match permits.clone().try_acquire_owned() {
                    Ok(permit) => {
                        at_cap = false;
                        let conn = connection(stream, router.clone(), limits, stop.clone(), permit);
                        conns.spawn(conn);
                    }
                    Err(_) => {
                        if !std::mem::replace(&mut at_cap, true) {
                            tracing::warn!(max = limits.max_connections,
                                "connection cap reached: closing new connections until one ends");
                        }
                        drop(stream);
                    }
                },
                Err(e) if is_connection_error(&e) => {}
                Err(e) => {
                    // Out of file descriptors and the like: wait instead of spinning.
                    tracing::error!(error = %e, "accept failed");
                    sleep(Duration::from_secs(1)).await;
                }
            },
            Some(_) = conns.join_next(), if !conns.is_empty() => {}
            () = stopped(&mut stopping) => break,
        }
    }
    drop(listener);
    while conns.join_next().await.is_some() {}
    Ok(())
}

/// The next connection, with `TCP_NODELAY` set: the gateway writes one small frame per token
/// and must not wait for the client's ACK of the previous one (Nagle) before sending it.
pub(crate) async fn accept(listener: &TcpListener) -> io::Result<TcpStream> {
    let (stream, _) = listener.accept().await?;
    stream.set_nodelay(true)?;
    Ok(stream)
}

/// Resolves once `stop` is `true` (or its sender is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

async fn connection(
    stream: TcpStream,
    router: Router,
    limits: Limits,
    stop: watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
) {
    let state = Arc::new(ConnState {
        phase: Mutex::new(Phase::AwaitingHead(Instant::now())),
        h2: AtomicBool::new(false),
    });
    let io = TokioIo::new(Watched {
        stream,
        state: state.clone(),
    });
    let svc_state = state.clone();
    let svc = service_fn(move |req: Request<Incoming>| {
        let busy = svc_state.begin(req.version());
        let router = router.clone();
        async move {
            // Dot segments and doubled slashes are resolved before routing (issue 30).
            let res = router.oneshot(crate::path::normalized(req)).await;
            // The connection is busy until hyper drops the response body.
            res.map(|res| res.map(|body| Held { body, _busy: busy }))
        }
    });
    // The timers and the stop signal are watched by a task of their own, which wakes only at
    // their deadlines. This task is woken for every frame of every response: polling two
    // watch channels each time cost ~2% of the gateway's CPU under load; two oneshot
    // receivers are an atomic load each.
    let (graceful_tx, mut graceful) = oneshot::channel();
    let (close_tx, mut close) = oneshot::channel();
    tokio::spawn(watchdog(state, limits, stop, graceful_tx, close_tx));
    let builder = auto::Builder::new(TokioExecutor::new());
    let mut conn = std::pin::pin!(builder.serve_connection(io, svc));
    let (mut graceful_open, mut close_open) = (true, true);
    loop {
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            r = &mut close, if close_open => {
                close_open = false;
                if r.is_ok() {
                    tracing::debug!("no request head within the header read timeout: closing");
                    return;
                }
            }
            r = &mut graceful, if graceful_open => {
                graceful_open = false;
                if r.is_ok() {
                    conn.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Tells the connection to shut down gracefully (idle too long, or the server stops) and to
/// close (no request head in time); ends with the connection.
async fn watchdog(
    state: Arc<ConnState>,
    limits: Limits,
    mut stop: watch::Receiver<bool>,
    graceful: oneshot::Sender<()>,
    mut close: oneshot::Sender<()>,
) {
    let mut graceful = Some(graceful);
    loop {
        tokio::select! {
            expiry = state.expired(limits) => if let Expiry::HeaderRead = expiry {
                let _ = close.send(());
                return;
            },
            () = stopped(&mut stop), if graceful.is_some() => {}
            () = close.closed() => return,
        }
        // Idle too long, or the server stops.
        if let Some(g) = graceful.take() {
            let _ = g.send(());
        }
    }
}

pin_project! {
    /// A response body that keeps its connection busy until hyper drops it. Frames pass
    /// through untouched (no second boxing of the router's body).
    struct Held {
        #[pin]
        body: Body,
        _busy: Busy,
    }
}

impl http_body::Body for Held {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        self.project().body.poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Since this instant, a request head is due.
    AwaitingHead(Instant),
    /// This many requests in flight.
    Busy(usize),
    /// Nothing in flight and nothing arrived since this instant.
    Idle(Instant),
}

enum Expiry {
    HeaderRead,
    Idle,
}

/// One connection's phase, shared by its socket, its service and its watchdog.
struct ConnState {
    phase: Mutex<Phase>,
    /// HTTP/2 (seen on a request): bytes that arrive while idle are pings and window
    /// updates, not a request head.
    h2: AtomicBool,
}

impl ConnState {
    fn phase(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Bytes arrived: on an idle HTTP/1.1 connection, a request head has begun.
    fn on_read(&self) {
        if self.h2.load(Ordering::Relaxed) {
            return;
        }
        let mut phase = self.phase();
        if let Phase::Idle(_) = *phase {
            *phase = Phase::AwaitingHead(Instant::now());
        }
    }

    /// A request head was read: busy until the returned guard is dropped.
    fn begin(self: &Arc<Self>, version: Version) -> Busy {
        if version == Version::HTTP_2 {
            self.h2.store(true, Ordering::Relaxed);
        }
        let mut phase = self.phase();
        *phase = Phase::Busy(match *phase {
            Phase::Busy(n) => n + 1,
            _ => 1,
        });
        Busy(self.clone())
    }

    /// The phase at `now`: `Ok` once it has run out of time, else `Err` with when to look
    /// again. That is its deadline, or sooner, one header-read or keep-alive timeout from now
    /// (the earliest a deadline of a phase that begins after `now` can fall), so that the
    /// watchdog need not be woken when the phase changes: under load that was three wake-ups
    /// of another task, and two timers set and cancelled, per request.
    ///
    /// After an idle expiry the connection is given one header-read timeout to close (or to
    /// bring a request that raced in).
    fn check(&self, limits: Limits, now: Instant) -> Result<Expiry, Instant> {
        let soonest = limits.header_read_timeout.min(limits.keep_alive_timeout);
        let recheck = now.checked_add(soonest).unwrap_or(now);
        let mut phase = self.phase();
        let (deadline, expiry) = match *phase {
            Phase::AwaitingHead(since) => (since + limits.header_read_timeout, Expiry::HeaderRead),
            Phase::Idle(since) => (since + limits.keep_alive_timeout, Expiry::Idle),
            Phase::Busy(_) => return Err(recheck),
        };
        if now < deadline {
            return Err(deadline.min(recheck));
        }
        if let Expiry::Idle = expiry {
            *phase = Phase::AwaitingHead(now);
        }
        Ok(expiry)
    }

    /// Resolves when the current phase runs out of time (see [`check`](Self::check)).
    async fn expired(&self, limits: Limits) -> Expiry {
        loop {
            match self.check(limits, Instant::now()) {
                Ok(expiry) => return expiry,
                Err(at) => sleep_until(at).await,
            }
        }
    }
}

/// A request in flight on its connection.
struct Busy(Arc<ConnState>);

impl Drop for Busy {
    fn drop(&mut self) {
        let mut phase = self.0.phase();
        *phase = match *phase {
            Phase::Busy(n) if n > 1 => Phase::Busy(n - 1),
            _ => Phase::Idle(Instant::now()),
        };
    }
}

/// The socket, telling its connection's state when bytes arrive.
struct Watched {
    stream: TcpStream,
    state: Arc<ConnState>,
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        ready!(Pin::new(&mut this.stream).poll_read(cx, buf))?;
        if buf.filled().len() > before {
            this.state.on_read();
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Watched {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn accepted_connections_have_nodelay() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), accept(&listener));
        let _client = client.unwrap();
        assert!(accepted.unwrap().nodelay().unwrap());
    }
}
