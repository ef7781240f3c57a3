//! In-process upstream for the race tests: scripted streaming bodies on tokio's clock, and a
//! log of every attempt (arrival time, attempt header, whether it was cancelled).
#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use tailguard_core::{EndReason, EndReport, ReplayBody};
use tailguard_hedge::Attempt;
use tokio::time::{Instant, Sleep};
use tower::Service;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

pub const ROLE: &str = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n";
pub const DONE: &str = "data: [DONE]\n\n";

pub fn token(text: &str) -> String {
    format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"{text}\"}}}}]}}\n\n")
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One step of a scripted body.
#[derive(Clone, Debug)]
pub enum Item {
    Wait(Duration),
    Data(Bytes),
    Trailers(HeaderMap),
    /// The body fails: a connection reset.
    Error,
    /// The body fails with a first-token timeout, as an inner `SseIdleTimeout` whose expiry
    /// is a body error fails it.
    Timeout,
}

pub fn data(s: &str) -> Item {
    Item::Data(Bytes::from(s.to_owned()))
}

/// What one attempt answers.
#[derive(Clone, Debug)]
pub struct Plan {
    pub head_delay: Duration,
    pub status: StatusCode,
    pub headers: Vec<(&'static str, String)>,
    pub items: Vec<Item>,
    /// Fail in `call` (a transport error) after `head_delay`.
    pub transport_error: bool,
}

impl Plan {
    /// An OpenAI SSE stream: role chunk at once, first token after `ttft`, three tokens, done.
    pub fn sse(ttft: Duration) -> Self {
        Plan::items(vec![
            data(ROLE),
            Item::Wait(ttft),
            Item::Data(Bytes::from(token("Hel"))),
            Item::Wait(ms(10)),
            Item::Data(Bytes::from(token("lo"))),
            Item::Data(Bytes::from(DONE)),
        ])
    }

    pub fn items(items: Vec<Item>) -> Self {
        Plan {
            head_delay: Duration::ZERO,
            status: StatusCode::OK,
            headers: vec![("content-type", "text/event-stream".into())],
            items,
            transport_error: false,
        }
    }

    pub fn status(status: u16) -> Self {
        Plan {
            status: StatusCode::from_u16(status).unwrap(),
            headers: vec![("content-type", "application/json".into())],
            items: vec![data(&format!("{{\"error\":{{\"code\":{status}}}}}"))],
            ..Plan::items(vec![])
        }
    }

    pub fn transport_error() -> Self {
        Plan {
            transport_error: true,
            ..Plan::items(vec![])
        }
    }

    pub fn head_delay(mut self, d: Duration) -> Self {
        self.head_delay = d;
        self
    }

    pub fn header(mut self, k: &'static str, v: &str) -> Self {
        self.headers.push((k, v.to_owned()));
        self
    }

    /// The data frames this plan's body yields.
    pub fn frames(&self) -> Vec<Bytes> {
        self.items
            .iter()
            .filter_map(|i| match i {
                Item::Data(b) => Some(b.clone()),
                _ => None,
            })
            .collect()
    }

    /// The bytes this plan's body yields.
    pub fn bytes(&self) -> Vec<u8> {
        self.items
            .iter()
            .filter_map(|i| match i {
                Item::Data(b) => Some(b.to_vec()),
                _ => None,
            })
            .flatten()
            .collect()
    }
}

/// One attempt as the upstream saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub attempt_header: Option<String>,
    pub attempt: Option<u8>,
    pub tried: usize,
    pub body: Bytes,
    pub cancelled: bool,
    pub done: bool,
}

#[derive(Default, Debug)]
pub struct Log {
    pub seen: Vec<Seen>,
}

pub type PlanFn = dyn Fn(&HeaderMap, u8) -> Plan + Send + Sync;

/// An in-process upstream: attempt *n* follows `plans[n]` (the last plan repeats), or the
/// plan a `pick` function returns.
#[derive(Clone)]
pub struct Upstream {
    pub plans: Arc<PlanFn>,
    pub log: Arc<Mutex<Log>>,
}

impl Upstream {
    pub fn new(plans: Vec<Plan>) -> Self {
        Upstream::with(move |_, attempt| plans[usize::from(attempt).min(plans.len() - 1)].clone())
    }

    /// `f(request headers, attempt)` gives the plan.
    pub fn with(f: impl Fn(&HeaderMap, u8) -> Plan + Send + Sync + 'static) -> Self {
        Upstream {
            plans: Arc::new(f),
            log: Arc::default(),
        }
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.log.lock().unwrap().seen.clone()
    }

    pub fn cancelled(&self) -> usize {
        self.seen().iter().filter(|s| s.cancelled).count()
    }
}

/// Marks an attempt cancelled if dropped before its body ended.
pub struct Guard {
    log: Arc<Mutex<Log>>,
    index: usize,
    done: bool,
    /// Like an inner layer would: reports how this attempt ended.
    report: Option<EndReport>,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let mut log = self.log.lock().unwrap();
        let s = &mut log.seen[self.index];
        if self.done {
            s.done = true;
        } else {
            s.cancelled = true;
        }
        if let Some(r) = &self.report {
            r.report(if self.done {
                EndReason::Completed
            } else {
                EndReason::ClientDisconnect
            });
        }
    }
}

pub struct ScriptBody {
    items: VecDeque<Item>,
    sleep: Option<Pin<Box<Sleep>>>,
    guard: Option<Guard>,
}

impl ScriptBody {
    pub fn new(items: Vec<Item>, guard: Option<Guard>) -> Self {
        ScriptBody {
            items: items.into(),
            sleep: None,
            guard,
        }
    }
}

impl Body for ScriptBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        loop {
            if let Some(s) = self.sleep.as_mut() {
                if s.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.items.pop_front() {
                None => {
                    if let Some(g) = self.guard.as_mut() {
                        g.done = true;
                    }
                    self.guard = None;
                    return Poll::Ready(None);
                }
                Some(Item::Wait(d)) => self.sleep = Some(Box::pin(tokio::time::sleep(d))),
                Some(Item::Data(b)) => return Poll::Ready(Some(Ok(Frame::data(b)))),
                Some(Item::Trailers(t)) => return Poll::Ready(Some(Ok(Frame::trailers(t)))),
                Some(Item::Error) => {
                    return Poll::Ready(Some(Err(Box::new(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "reset by the scripted upstream",
                    )))));
                }
                Some(Item::Timeout) => {
                    let limit = Duration::from_secs(1);
                    let t = tailguard_core::TimeoutError::new(
                        tailguard_core::Phase::FirstToken,
                        limit,
                        limit,
                    );
                    return Poll::Ready(Some(Err(Box::new(t))));
                }
            }
        }
    }
}

#[derive(Debug)]
pub struct TransportError;

impl std::fmt::Display for TransportError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection refused (scripted)")
    }
}

impl std::error::Error for TransportError {}

impl<B> Service<Request<ReplayBody<B>>> for Upstream
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: std::fmt::Debug,
{
    type Response = Response<ScriptBody>;
    type Error = TransportError;
    type Future =
        Pin<Box<dyn Future<Output = Result<Response<ScriptBody>, TransportError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReplayBody<B>>) -> Self::Future {
        let attempt = req.extensions().get::<Attempt>().cloned();
        let report = req.extensions().get::<EndReport>().cloned();
        let attempt_header = req
            .headers()
            .get("x-tailguard-attempt")
            .map(|v| v.to_str().unwrap().to_owned());
        let n = attempt.as_ref().map_or(0, Attempt::number);
        let log = self.log.clone();
        let index = {
            let mut l = log.lock().unwrap();
            l.seen.push(Seen {
                at: Instant::now(),
                attempt_header,
                attempt: attempt.as_ref().map(Attempt::number),
                tried: attempt.as_ref().map_or(0, |a| a.tried().len()),
                body: Bytes::new(),
                cancelled: false,
                done: false,
            });
            l.seen.len() - 1
        };
        let plan = (self.plans)(req.headers(), n);
        Box::pin(async move {
            let guard = Guard {
                log: log.clone(),
                index,
                done: false,
                report,
            };
            let body = req.into_body().collect().await.unwrap().to_bytes();
            log.lock().unwrap().seen[index].body = body;
            tokio::time::sleep(plan.head_delay).await;
            if plan.transport_error {
                let mut guard = guard;
                guard.done = true;
                guard.report = None;
                return Err(TransportError);
            }
            let mut res = Response::new(ScriptBody::new(plan.items, Some(guard)));
            *res.status_mut() = plan.status;
            for (k, v) in plan.headers {
                res.headers_mut().insert(k, v.parse().unwrap());
            }
            Ok(res)
        })
    }
}

pub fn chat_request() -> Request<Full<Bytes>> {
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        )))
        .unwrap()
}

/// Reads a body frame by frame: (data frames, trailers, error).
pub async fn frames<B>(body: B) -> (Vec<Bytes>, Option<HeaderMap>, bool)
where
    B: Body<Data = Bytes>,
{
    let mut body = std::pin::pin!(body);
    let mut out = Vec::new();
    let mut trailers = None;
    let mut error = false;
    while let Some(f) = body.frame().await {
        match f {
            Ok(f) => match f.into_data() {
                Ok(d) => out.push(d),
                Err(f) => trailers = f.into_trailers().ok(),
            },
            Err(_) => {
                error = true;
                break;
            }
        }
    }
    (out, trailers, error)
}

pub fn concat(frames: &[Bytes]) -> Vec<u8> {
    frames.iter().flat_map(|b| b.to_vec()).collect()
}

pub type Unused = Infallible;
