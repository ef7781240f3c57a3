//! Single-slot replicas: a server in front of a `tailguard-mock` replica that generates one
//! stream at a time, as a single-slot llama.cpp server does. It sends the response head at once
//! and forwards the request to the mock only when its slot is free, then streams the mock's
//! frames. While the slot is taken a request waits, first come first served ([`SlotMode::Fifo`]),
//! or ([`SlotMode::Interrupt`], llama-cpp-python's `interrupt_requests`, its default) the running
//! stream ends with `data: [DONE]` after its next frame, so the newest request gets the slot. As
//! there, a stream still processing its prompt cannot be interrupted before its first frame.
//!
//! `tailguard-mock`'s own `single_slot` queues FIFO but cannot interrupt, and does not say which
//! streams waited; this server logs, per request, whether it waited for the slot and whether it
//! was interrupted.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue};
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::upstream::{BENCH_ID_HEADER, BoxBody, box_body, serve_fn};

/// What a single-slot replica does with a request while its slot is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum SlotMode {
    /// Queue it, first come first served.
    Fifo,
    /// End the running stream (`data: [DONE]`) after its next frame.
    Interrupt,
}

/// One request as the single-slot server saw it.
#[derive(Clone, Debug)]
pub(crate) struct Record {
    /// The front's `x-bench-id` (`None`: another client's request).
    pub(crate) id: Option<String>,
    pub(crate) started: Instant,
    /// It got the slot after waiting for it.
    pub(crate) late: bool,
    /// Its stream was ended early for a newer request.
    pub(crate) interrupted: bool,
    /// The client went away before its end (a hedge's loser, mostly).
    pub(crate) cancelled: bool,
}

#[derive(Debug)]
struct State {
    mode: SlotMode,
    /// The mock's `http://127.0.0.1:PORT`.
    inner: String,
    client: Client<HttpConnector, BoxBody>,
    slot: Arc<Semaphore>,
    /// Requests waiting for the slot.
    waiting: AtomicUsize,
    log: Mutex<Vec<Record>>,
}

impl State {
    fn update(&self, i: usize, f: impl FnOnce(&mut Record)) {
        if let Some(r) = self
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get_mut(i)
        {
            f(r);
        }
    }
}

/// A single-slot replica on `127.0.0.1:0` in front of the mock at `inner`. Dropping it stops it.
#[derive(Debug)]
pub(crate) struct SlotServer {
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
}

impl SlotServer {
    pub(crate) async fn start(
        mode: SlotMode,
        inner: String,
        client: Client<HttpConnector, BoxBody>,
    ) -> std::io::Result<SlotServer> {
        let state = Arc::new(State {
            mode,
            inner,
            client,
            slot: Arc::new(Semaphore::new(1)),
            waiting: AtomicUsize::new(0),
            log: Mutex::default(),
        });
        let st = state.clone();
        let (addr, task) = serve_fn(move |req| handle(req, st.clone())).await?;
        Ok(SlotServer { addr, state, task })
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub(crate) fn log(&self) -> Vec<Record> {
        self.state
            .log
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

impl Drop for SlotServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn handle(req: Request<Incoming>, st: Arc<State>) -> Result<Response<BoxBody>, Infallible> {
    let (parts, body) = req.into_parts();
    let body = body
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let id = parts
        .headers
        .get(BENCH_ID_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let i = {
        let mut log = st.log.lock().unwrap_or_else(PoisonError::into_inner);
        log.push(Record {
            id,
            started: Instant::now(),
            late: false,
            interrupted: false,
            cancelled: false,
        });
        log.len() - 1
    };
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(stream(st, i, Request::from_parts(parts, body), tx));
    let mut res = Response::new(box_body(ChannelBody { rx }));
    let h = res.headers_mut();
    h.insert(
        CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    Ok(res)
}

/// Waits for the slot (or for the client to go away), marking the request late if it waited.
async fn take_slot(st: &State, i: usize, tx: &mpsc::Sender<Bytes>) -> Option<OwnedSemaphorePermit> {
    if let Ok(p) = st.slot.clone().try_acquire_owned() {
        return Some(p);
    }
    st.waiting.fetch_add(1, Ordering::SeqCst);
    let permit = tokio::select! {
        p = st.slot.clone().acquire_owned() => p.ok(),
        _ = tx.closed() => None,
    };
    st.waiting.fetch_sub(1, Ordering::SeqCst);
    st.update(i, |r| match permit {
        Some(_) => r.late = true,
        None => r.cancelled = true,
    });
    permit
}

/// Serves request `i` on the slot: the mock's frames, until their end, the client's departure
/// or (interrupting) a newer request waiting.
async fn stream(st: Arc<State>, i: usize, req: Request<Bytes>, tx: mpsc::Sender<Bytes>) {
    let Some(_permit) = take_slot(&st, i, &tx).await else {
        return;
    };
    let (mut parts, body) = req.into_parts();
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("{}{pq}", st.inner).parse() else {
        return;
    };
    parts.uri = uri;
    parts.headers.remove(http::header::HOST);
    let req = Request::from_parts(parts, box_body(Full::new(body)));
    // A failure upstream ends the stream without `[DONE]` (the client sees it truncated).
    let Ok(res) = st.client.request(req).await else {
        return;
    };
    let mut inner = res.into_body();
    loop {
        let frame = tokio::select! {
            f = inner.frame() => f,
            _ = tx.closed() => break,
        };
        // The end, or a failure upstream (without `[DONE]`: the client sees it truncated).
        let Some(Ok(frame)) = frame else {
            return;
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let last = data.windows(6).any(|w| w == b"[DONE]");
        if tx.send(data).await.is_err() {
            break;
        }
        if !last && st.mode == SlotMode::Interrupt && st.waiting.load(Ordering::SeqCst) > 0 {
            let _ = tx.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
            st.update(i, |r| r.interrupted = true);
            return;
        }
    }
    st.update(i, |r| r.cancelled = true);
}

/// A response body fed by the slot's task; dropped, it tells the task the client went away.
struct ChannelBody {
    rx: mpsc::Receiver<Bytes>,
}

impl Body for ChannelBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        self.rx.poll_recv(cx).map(|d| d.map(|d| Ok(Frame::data(d))))
    }
}
