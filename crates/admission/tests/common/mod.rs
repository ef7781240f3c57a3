//! In-process upstream with hand-made streaming bodies, for admission tests.
#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use tailguard_admission::AdmissionBody;
use tokio::sync::mpsc;
use tower::Service;

pub type Frames = mpsc::UnboundedSender<Result<Bytes, io::Error>>;

/// A body fed by the test through a channel; ends when the sender is dropped.
#[derive(Debug)]
pub struct ChanBody {
    rx: Option<mpsc::UnboundedReceiver<Result<Bytes, io::Error>>>,
    live: Arc<AtomicUsize>,
}

impl ChanBody {
    pub fn empty(live: Arc<AtomicUsize>) -> Self {
        live.fetch_add(1, Ordering::SeqCst);
        ChanBody { rx: None, live }
    }
}

impl Drop for ChanBody {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Body for ChanBody {
    type Data = Bytes;
    type Error = io::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, io::Error>>> {
        let Some(rx) = self.rx.as_mut() else {
            return Poll::Ready(None);
        };
        match rx.poll_recv(cx) {
            Poll::Ready(Some(r)) => Poll::Ready(Some(r.map(Frame::data))),
            Poll::Ready(None) => {
                self.rx = None;
                Poll::Ready(None)
            }
            Poll::Pending => Poll::Pending,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.rx.is_none()
    }
}

/// An upstream whose every response streams what the test sends on the announced channel.
/// Header `x-id` names the request; `x-empty` answers with an empty body; `x-fail` errors.
#[derive(Clone)]
pub struct Upstream {
    ctl: mpsc::UnboundedSender<(String, Frames)>,
    pub live: Arc<AtomicUsize>,
}

pub fn upstream() -> (Upstream, mpsc::UnboundedReceiver<(String, Frames)>) {
    let (ctl, rx) = mpsc::unbounded_channel();
    (
        Upstream {
            ctl,
            live: Arc::new(AtomicUsize::new(0)),
        },
        rx,
    )
}

impl Service<Request<()>> for Upstream {
    type Response = Response<ChanBody>;
    type Error = io::Error;
    type Future = std::future::Ready<Result<Response<ChanBody>, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<()>) -> Self::Future {
        if req.headers().contains_key("x-fail") {
            return std::future::ready(Err(io::Error::other("upstream failed")));
        }
        if req.headers().contains_key("x-empty") {
            return std::future::ready(Ok(Response::new(ChanBody::empty(self.live.clone()))));
        }
        let id = req
            .headers()
            .get("x-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let (tx, rx) = mpsc::unbounded_channel();
        let _ = self.ctl.send((id, tx));
        self.live.fetch_add(1, Ordering::SeqCst);
        std::future::ready(Ok(Response::new(ChanBody {
            rx: Some(rx),
            live: self.live.clone(),
        })))
    }
}

pub fn request(id: &str) -> Request<()> {
    Request::builder().header("x-id", id).body(()).unwrap()
}

pub fn request_of(id: &str, p: tailguard_core::Priority) -> Request<()> {
    let mut r = request(id);
    r.extensions_mut().insert(p);
    r
}

/// Lets spawned tasks run without moving the paused clock.
pub async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

/// Reads a body to its end, returning the bytes.
pub async fn drain<B: Body<Data = Bytes> + Unpin>(body: B) -> Result<Bytes, B::Error> {
    use http_body_util::BodyExt;
    Ok(body.collect().await?.to_bytes())
}

/// The ids announced to the upstream so far.
pub fn arrived(ctl: &mut mpsc::UnboundedReceiver<(String, Frames)>) -> Vec<(String, Frames)> {
    let mut v = Vec::new();
    while let Ok(x) = ctl.try_recv() {
        v.push(x);
    }
    v
}

pub type Res = Response<AdmissionBody<ChanBody>>;

/// A future that never resolves, used by tests that need one.
pub fn pending() -> impl Future<Output = Infallible> {
    std::future::pending()
}
