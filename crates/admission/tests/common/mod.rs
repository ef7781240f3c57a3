//! In-process upstream with fed streaming bodies, for admission tests.
#![allow(dead_code, unreachable_pub)]

use std::io;
use std::task::{Context, Poll};

use http::{Request, Response};
use tailguard_admission::{AdmissionBody, BoundedAdmission};
pub use tailguard_test_support::*;
use tokio::sync::mpsc;
use tower::{Service, ServiceExt};

/// An upstream whose every response streams what the test sends on the announced feed.
/// Header `x-id` names the request; `x-empty` answers with an empty body; `x-fail` errors;
/// `x-sse` answers `content-type: text/event-stream` (a stream the gate reads).
#[derive(Clone)]
pub struct Upstream {
    ctl: mpsc::UnboundedSender<(String, Feed)>,
}

pub fn upstream() -> (Upstream, mpsc::UnboundedReceiver<(String, Feed)>) {
    let (ctl, rx) = mpsc::unbounded_channel();
    (Upstream { ctl }, rx)
}

impl Service<Request<()>> for Upstream {
    type Response = Response<ScriptBody>;
    type Error = io::Error;
    type Future = std::future::Ready<Result<Response<ScriptBody>, io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<()>) -> Self::Future {
        if req.headers().contains_key("x-fail") {
            return std::future::ready(Err(io::Error::other("upstream failed")));
        }
        if req.headers().contains_key("x-empty") {
            return std::future::ready(Ok(Response::new(ScriptBody::new([]))));
        }
        let id = req
            .headers()
            .get("x-id")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        let (body, feed) = ScriptBody::fed();
        let _ = self.ctl.send((id, feed));
        let mut res = Response::new(body);
        if req.headers().contains_key("x-sse") {
            res.headers_mut().insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("text/event-stream"),
            );
        }
        std::future::ready(Ok(res))
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

/// The ids announced to the upstream so far.
pub fn arrived(ctl: &mut mpsc::UnboundedReceiver<(String, Feed)>) -> Vec<(String, Feed)> {
    let mut v = Vec::new();
    while let Ok(x) = ctl.try_recv() {
        v.push(x);
    }
    v
}

pub type Res = Response<AdmissionBody<ScriptBody>>;

/// Calls `svc` in a task of its own (a request that may queue).
pub fn spawn_call(
    svc: &BoundedAdmission<Upstream>,
    req: Request<()>,
) -> tokio::task::JoinHandle<Result<Res, io::Error>> {
    tokio::spawn(svc.clone().oneshot(req))
}
