//! In-process upstream for the race tests: scripted streaming bodies on tokio's clock, and a
//! log of every attempt (arrival time, attempt header, whether it was cancelled).
#![allow(dead_code, unreachable_pub)]

pub mod loopback;

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use http_body::{Body, Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use tailguard_core::attempt::Attempt;
use tailguard_core::{EndReason, EndReport, Phase, ReplayBody, TimeoutError};
use tailguard_hedge::{FirstTokenHedgeLayer, HedgeBudget};
pub use tailguard_test_support::*;
use tokio::time::Instant;
use tower::Service;

/// What one attempt answers.
#[derive(Clone, Debug)]
pub struct Plan {
    pub head_delay: Duration,
    pub status: StatusCode,
    pub headers: Vec<(&'static str, String)>,
    pub items: Vec<Step>,
    /// Fail in `call` (a transport error) after `head_delay`.
    pub transport_error: bool,
    /// After its steps, the body fails with a first-token [`TimeoutError`], as an inner
    /// `SseIdleTimeout` whose expiry is a body error fails it.
    pub timeout: bool,
}

impl Plan {
    /// An OpenAI SSE stream: role chunk at once, first token after `ttft`, three tokens, done.
    pub fn sse(ttft: Duration) -> Self {
        Plan::items(vec![
            data(ROLE),
            Step::Wait(ttft),
            data(token("Hel")),
            Step::Wait(ms(10)),
            data(token("lo")),
            data(DONE),
        ])
    }

    pub fn items(items: Vec<Step>) -> Self {
        Plan {
            head_delay: Duration::ZERO,
            status: StatusCode::OK,
            headers: vec![("content-type", "text/event-stream".into())],
            items,
            transport_error: false,
            timeout: false,
        }
    }

    pub fn status(status: u16) -> Self {
        Plan {
            status: StatusCode::from_u16(status).unwrap(),
            headers: vec![("content-type", "application/json".into())],
            items: vec![data(format!("{{\"error\":{{\"code\":{status}}}}}"))],
            ..Plan::items(vec![])
        }
    }

    pub fn transport_error() -> Self {
        Plan {
            transport_error: true,
            ..Plan::items(vec![])
        }
    }

    /// This plan with its body failing with a first-token timeout after its steps.
    pub fn timing_out(mut self) -> Self {
        self.timeout = true;
        self
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
                Step::Data(b) => Some(b.clone()),
                _ => None,
            })
            .collect()
    }

    /// The bytes this plan's body yields.
    pub fn bytes(&self) -> Vec<u8> {
        concat(&self.frames())
    }

    /// The response this plan answers with.
    pub fn response(self, script: ScriptBody) -> Response<AttemptBody> {
        let mut res = Response::new(AttemptBody {
            script,
            timeout: self.timeout,
        });
        *res.status_mut() = self.status;
        for (k, v) in self.headers {
            res.headers_mut().insert(k, v.parse().unwrap());
        }
        res
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

pub type PlanFn = dyn Fn(&HeaderMap, u8) -> Plan + Send + Sync;

/// An in-process upstream: attempt *n* follows `plans[n]` (the last plan repeats), or the
/// plan a `pick` function returns.
#[derive(Clone)]
pub struct Upstream {
    pub plans: Arc<PlanFn>,
    pub log: Arc<Mutex<Vec<Seen>>>,
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
        self.log.lock().unwrap().clone()
    }
}

/// Marks an attempt cancelled if dropped before its body ended, and reports how it ended like
/// an inner layer would.
struct Guard {
    log: Arc<Mutex<Vec<Seen>>>,
    index: usize,
    done: bool,
    report: Option<EndReport>,
}

impl Guard {
    fn set_done(&mut self, done: bool) {
        self.done = done;
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        let s = &mut self.log.lock().unwrap()[self.index];
        s.done = self.done;
        s.cancelled = !self.done;
        if let Some(r) = &self.report {
            r.report(if self.done {
                EndReason::Completed
            } else {
                EndReason::ClientDisconnect
            });
        }
    }
}

impl<B> Service<Request<ReplayBody<B>>> for Upstream
where
    B: Body + Send + 'static,
    B::Data: From<Bytes> + Send,
    B::Error: std::fmt::Debug,
{
    type Response = Response<AttemptBody>;
    type Error = TransportError;
    type Future =
        Pin<Box<dyn Future<Output = Result<Response<AttemptBody>, TransportError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<ReplayBody<B>>) -> Self::Future {
        let attempt = req.extensions().get::<Attempt>().cloned();
        let log = self.log.clone();
        let index = {
            let mut l = log.lock().unwrap();
            l.push(Seen {
                at: Instant::now(),
                attempt_header: req
                    .headers()
                    .get("x-tailguard-attempt")
                    .map(|v| v.to_str().unwrap().to_owned()),
                attempt: attempt.as_ref().map(Attempt::number),
                tried: attempt.as_ref().map_or(0, |a| a.tried().len()),
                body: Bytes::new(),
                cancelled: false,
                done: false,
            });
            l.len() - 1
        };
        let report = req.extensions().get::<EndReport>().cloned();
        let plan = (self.plans)(req.headers(), attempt.as_ref().map_or(0, Attempt::number));
        Box::pin(async move {
            let mut guard = Guard {
                log: log.clone(),
                index,
                done: false,
                report,
            };
            let body = req.into_body().collect().await.unwrap().to_bytes();
            log.lock().unwrap()[index].body = body;
            tokio::time::sleep(plan.head_delay).await;
            if plan.transport_error {
                guard.report = None;
                guard.set_done(true);
                return Err(TransportError);
            }
            // A body that times out did not end well, however far its script played.
            let timeout = plan.timeout;
            let body = ScriptBody::new(plan.items.clone())
                .on_drop(move |ended| guard.set_done(ended && !timeout));
            Ok(plan.response(body))
        })
    }
}

/// What the in-process upstream answers with: the plan's [`ScriptBody`], then, for a plan
/// [`timing_out`](Plan::timing_out), a first-token [`TimeoutError`] (which the shared script
/// cannot produce: it knows no tailguard type).
#[derive(Debug)]
pub struct AttemptBody {
    script: ScriptBody,
    timeout: bool,
}

impl Body for AttemptBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        Poll::Ready(match ready!(Pin::new(&mut this.script).poll_frame(cx)) {
            Some(frame) => Some(frame.map_err(Into::into)),
            None if std::mem::take(&mut this.timeout) => {
                let limit = Duration::from_secs(1);
                let t = TimeoutError::new(Phase::FirstToken, limit, limit);
                Some(Err(Box::new(t)))
            }
            None => None,
        })
    }

    fn is_end_stream(&self) -> bool {
        !self.timeout && self.script.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.script.size_hint()
    }
}

/// The hedge the race tests use: a 500 ms delay, no budget limit.
pub fn layer() -> FirstTokenHedgeLayer {
    FirstTokenHedgeLayer::new()
        .with_delay(ms(500))
        .with_budget(HedgeBudget::unlimited())
}

pub fn chat_request() -> Request<Full<Bytes>> {
    post(
        "/v1/chat/completions",
        r#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
        &[],
    )
}

/// The hedge outcome of `res` without its cost fields (how long losers ran, the prompt they
/// were sent), which depend on timing the race tests check on their own.
pub fn outcome_without_costs<B>(res: &http::Response<B>) -> Option<tailguard_core::HedgeOutcome> {
    let mut o = res
        .extensions()
        .get::<tailguard_core::HedgeOutcome>()
        .cloned()?;
    o.losers.clear();
    o.wasted_prompt_bytes = 0;
    o.wasted_prompt_tokens = None;
    Some(o)
}
