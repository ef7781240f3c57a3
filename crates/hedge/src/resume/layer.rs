//! `ResumeLayer`: its settings, the service and its response future.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::request::Parts;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body::Body;
use pin_project_lite::pin_project;
use tailguard_core::attempt::Attempt;
use tailguard_core::render;
use tailguard_core::replay::Buffering;
use tailguard_core::{
    BoxError, Deadlines, EndReport, ErrorInfo, HedgeOutcome, ReplayBody, Upstream,
};
use tower::ServiceExt;
use tower_layer::Layer;
use tower_service::Service;

use super::body::{Ctx, ResumeBody, Sender};
use super::plan::Plan;
use crate::budget::{Bucket, HedgeBudget};
use crate::template::Template;

/// The default of [`ResumeLayer::with_max_resumes`].
const MAX_RESUMES: u8 = 2;

/// Resumes a stream that breaks after its first token on another replica: the client gets
/// one stream, with a pause where it broke, never a repeat (issue 33).
///
/// ```
/// use tailguard_hedge::{FirstTokenHedgeLayer, ResumeLayer};
/// use tower::ServiceBuilder;
/// # use bytes::Bytes;
/// # use http::{Request, Response};
/// # use http_body_util::Full;
/// # use tailguard_core::ReplayBody;
/// # let replicas = tower::service_fn(|_req: Request<ReplayBody<ReplayBody<Full<Bytes>>>>| async {
/// #     Ok::<_, std::convert::Infallible>(Response::new(Full::new(Bytes::new())))
/// # });
/// // Over the hedge, under the timeouts (`SseIdleTimeout`'s idle and total limits and the
/// // client's deadline hold across resumes): a continuation is one more attempt of the same
/// // request, which the hedge races and a `ReplicaSet` sends to a replica not tried yet.
/// let client = ServiceBuilder::new()
///     .layer(ResumeLayer::new())
///     .layer(FirstTokenHedgeLayer::new())
///     .service(replicas);
/// # let _ = client;
/// ```
///
/// **What is resumed, and how.** A streamed request to an OpenAI chat completions,
/// completions or Anthropic messages route (by the path's end) whose whole body was buffered
/// (up to [`with_replay_cap`](Self::with_replay_cap)), and whose continuation is well defined:
/// not `n > 1`, not structured output (`response_format` other than text, guided decoding,
/// grammars), no logprobs, no `echo` or `suffix`, no tools the model may call, no Anthropic
/// extended thinking ([`NotResumable`](crate::NotResumable) names each case). The
/// continuation asks the next replica to go on from the text the client already has:
/// completions, the prompt followed by that text; chat, that text as a final assistant message
/// with `continue_final_message: true, add_generation_prompt: false` (vLLM, SGLang; servers
/// that read a trailing assistant message as a prefill do the same); Anthropic, a trailing
/// assistant message (a prefill; trailing whitespace trimmed, as the API requires). The
/// output limit (`max_tokens`, `max_completion_tokens`) is lowered by the content events
/// already sent. A tool call in progress is never resumed.
///
/// **When.** After the first token: the body breaks (a reset, a transport error); it ends
/// without a finish reason (truncated, or half an event); it carries an in-band error event
/// (held back from the client); or it sends a terminal event (`data: [DONE]`,
/// `message_stop`) before any finish reason, as llama-cpp-python does when a newer request
/// interrupts a stream (held back until the body's end says); or, with
/// [`with_stall_after`](Self::with_stall_after), it stalls. At most [`with_max_resumes`](Self::with_max_resumes) per request
/// (2), within a budget across requests ([`with_budget`](Self::with_budget)); otherwise, and
/// when the continuation gets no `2xx` stream, the stream ends as it broke, with what was held
/// back of it. A stream that breaks (other than by an error event) once the client has every
/// token the output limit allows needs no continuation: it ends as the server would have ended
/// it, finish reason `length` (Anthropic: `max_tokens`) and the terminal event.
///
/// **One stream for the client.** Complete events pass on as they come (an event still
/// incomplete is held back, so a break never leaves half an event with the client). A
/// continuation's preamble is dropped (the role-only chunk; `message_start`, the text block's
/// `content_block_start`, `ping`); its chunks carry the first stream's `id`, `created` and
/// `model`, and Anthropic block indices go on from the first stream's; its usage is the first
/// prompt's plus every output token (a continuation's prompt counts the prefix); its finish
/// reason ends the stream. Its events are re-serialized JSON (same members, keys in order).
///
/// **Cost.** With resume on, a resumable stream is read event by event and its request body
/// buffered once more; off ([`with_max_resumes(0)`](Self::with_max_resumes)) the layer passes
/// requests and responses through untouched.
///
/// **Records.** Each break and what came of it goes to the request's
/// [`EndReport`](tailguard_core::EndReport) (a [`Resumption`](tailguard_core::Resumption):
/// why, from which upstream to which), which the recorder's phase report carries.
///
/// **Metrics.** `tailguard_resumes_total{reason, outcome}`: each break after a first token
/// (`reason`: `transport`, `truncated`, `error_event`, `done_without_finish`, `stall`) and
/// what came of it (`resumed`; `failed`: the continuation got no stream; `cancelled`: the
/// client left while it was on its way; `recovered`: a stalled stream went on first;
/// `finished_at_limit`: ended with finish `length`, no tokens left; or why
/// none was sent: `budget`, `max_resumes`, `tool_call`, a
/// [`NotResumable`](crate::NotResumable) label);
/// the budget's `tailguard_hedge_budget_withdrawn_total{budget="resume"}` and
/// `..._exhausted_total`. A `tracing` info event marks each resume.
#[derive(Clone)]
pub struct ResumeLayer {
    settings: Settings,
    shared: Arc<Shared>,
}

#[derive(Clone, Debug)]
struct Settings {
    max_resumes: u8,
    budget: HedgeBudget,
    replay_cap: usize,
    stall_after: Option<Duration>,
}

/// What every service of one layer shares.
pub(crate) struct Shared {
    pub(crate) max_resumes: u8,
    pub(crate) budget: Bucket,
    replay_cap: usize,
    pub(crate) stall_after: Option<Duration>,
}

impl ResumeLayer {
    /// Resume on, with the defaults: at most **2** resumes per request; the budget of
    /// [`HedgeBudget::failover`] (a resume replaces a stream that already broke, as a failover
    /// replaces an attempt that failed: 20% of the requests that could be resumed, a floor of
    /// one per second, a full bucket at start); request bodies of up to 4 MiB buffered to build
    /// the continuation.
    pub fn new() -> Self {
        Settings {
            max_resumes: MAX_RESUMES,
            budget: HedgeBudget::failover(),
            replay_cap: tailguard_core::replay::DEFAULT_REPLAY_CAP,
            stall_after: None,
        }
        .into_layer()
    }

    /// Sets the most resumes of one request (`0`: resume off).
    pub fn with_max_resumes(mut self, n: u8) -> Self {
        self.settings.max_resumes = n;
        self.settings.into_layer()
    }

    /// Sets the budget that bounds resumes across requests (every request the layer could
    /// resume deposits its share).
    pub fn with_budget(mut self, budget: HedgeBudget) -> Self {
        self.settings.budget = budget;
        self.settings.into_layer()
    }

    /// Resumes a stream that stalls: no token for its stall limit (keepalives, pings and other
    /// events that carry no token do not count), which follows the stream's own pace: ten
    /// times its mean gap between tokens, at least 250 ms, at most `limit` (`limit` until the
    /// stream has shown five tokens; for a continuation, counted from its response). The
    /// stalled stream is kept and races the continuation: a token from it before the
    /// continuation's first (the hedge below answers a continuation at its first token), and
    /// the continuation is dropped (outcome `recovered`); and it goes on if the continuation
    /// fails or none may be sent. A stall is the idle timeout's to end, this only gets there
    /// first: set `limit` below the idle timeout, which goes on counting through the pause (the
    /// gateway sets half of it). Off by default.
    pub fn with_stall_after(mut self, limit: Duration) -> Self {
        self.settings.stall_after = Some(limit);
        self.settings.into_layer()
    }

    /// Sets the largest request body buffered to build a continuation from; a larger request
    /// passes through, not resumable.
    pub fn with_replay_cap(mut self, bytes: usize) -> Self {
        self.settings.replay_cap = bytes;
        self.settings.into_layer()
    }
}

impl Settings {
    fn into_layer(self) -> ResumeLayer {
        crate::metrics::describe();
        let shared = Arc::new(Shared {
            max_resumes: self.max_resumes,
            budget: Bucket::new(&self.budget, "resume"),
            replay_cap: self.replay_cap,
            stall_after: self.stall_after,
        });
        ResumeLayer {
            settings: self,
            shared,
        }
    }
}

impl Default for ResumeLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for ResumeLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ResumeLayer")
            .field("max_resumes", &self.settings.max_resumes)
            .field("budget", &self.settings.budget)
            .field("replay_cap", &self.settings.replay_cap)
            .field("stall_after", &self.settings.stall_after)
            .finish()
    }
}

impl<S> Layer<S> for ResumeLayer {
    type Service = Resume<S>;

    fn layer(&self, inner: S) -> Resume<S> {
        Resume {
            inner,
            shared: self.shared.clone(),
        }
    }
}

/// The service of [`ResumeLayer`].
///
/// The inner service takes `Request<ReplayBody<B>>`, as [`FirstTokenHedge`](crate::FirstTokenHedge)
/// does: put the hedge (or a placer that reads core's [`Attempt`]) under it, so that a
/// continuation goes to a replica the broken stream did not come from.
pub struct Resume<S> {
    inner: S,
    shared: Arc<Shared>,
}

impl<S: Clone> Clone for Resume<S> {
    fn clone(&self) -> Self {
        Resume {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<S: fmt::Debug> fmt::Debug for Resume<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Resume")
            .field("inner", &self.inner)
            .field("max_resumes", &self.shared.max_resumes)
            .finish()
    }
}

impl<S> Resume<S> {
    tailguard_core::inner_service_accessors!();
}

impl<S, B, RB> Service<Request<B>> for Resume<S>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Unpin + Send + 'static,
    B::Data: From<Bytes> + Send,
    B::Error: Into<BoxError>,
    RB: Body + Send + 'static,
    RB::Data: From<Bytes>,
    RB::Error: Into<BoxError>,
{
    type Response = Response<ResumeBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (parts, body) = req.into_parts();
        if self.shared.max_resumes == 0 || parts.method != Method::POST {
            let req = Request::from_parts(parts, ReplayBody::passthrough(body));
            return ResponseFuture::direct(self.inner.call(req));
        }
        // The ready service buffers with the request; a clone stays for the next poll_ready.
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        ResponseFuture {
            state: State::Buffering {
                buffering: ReplayBody::buffer(body, self.shared.replay_cap),
                parts: Some(parts),
                service: Some(service),
                shared: self.shared.clone(),
            },
        }
    }
}

pin_project! {
    /// The response future of [`Resume`].
    pub struct ResponseFuture<S, B>
    where
        S: Service<Request<ReplayBody<B>>>,
    {
        #[pin]
        state: State<S, B>,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, B>
    where
        S: Service<Request<ReplayBody<B>>>,
    {
        Buffering {
            #[pin]
            buffering: Buffering<B>,
            parts: Option<Parts>,
            service: Option<S>,
            shared: Arc<Shared>,
        },
        Calling {
            #[pin]
            fut: S::Future,
            // What a continuation is built from; `None`: the request is not resumed.
            resumable: Option<Resumable<S>>,
        },
        Direct {
            #[pin]
            fut: S::Future,
        },
    }
}

/// A request that can be resumed: what its continuations are built from.
struct Resumable<S> {
    plan: Plan,
    template: Template,
    service: S,
    record: Attempt,
    shared: Arc<Shared>,
    report: Option<EndReport>,
}

impl<S, B> ResponseFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>>,
{
    fn direct(fut: S::Future) -> Self {
        ResponseFuture {
            state: State::Direct { fut },
        }
    }
}

impl<S, B> fmt::Debug for ResponseFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("resume::ResponseFuture")
    }
}

impl<S, B, RB> Future for ResponseFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<BoxError>,
    B: Body + Unpin + Send + 'static,
    B::Data: From<Bytes> + Send,
    B::Error: Into<BoxError>,
    RB: Body + Send + 'static,
    RB::Data: From<Bytes>,
    RB::Error: Into<BoxError>,
{
    type Output = Result<Response<ResumeBody<RB>>, S::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let next = match self.as_mut().project().state.project() {
                StateProj::Direct { fut } => {
                    return fut.poll(cx).map_ok(|res| res.map(ResumeBody::direct));
                }
                StateProj::Calling { fut, resumable } => {
                    let res = ready!(fut.poll(cx))?;
                    return Poll::Ready(Ok(match resumable.take() {
                        Some(r) if res.status().is_success() => {
                            let (head, body) = res.into_parts();
                            let ctx = r.into_ctx(&head);
                            Response::from_parts(head, ResumeBody::reading(body, ctx))
                        }
                        _ => res.map(ResumeBody::direct),
                    }));
                }
                StateProj::Buffering {
                    buffering,
                    parts,
                    service,
                    shared,
                } => {
                    let buffered = ready!(buffering.poll(cx));
                    let (Some(parts), Some(mut service)) = (parts.take(), service.take()) else {
                        return Poll::Pending;
                    };
                    let body = match buffered {
                        Ok(body) => body,
                        Err(e) => return Poll::Ready(Ok(body_failed(e.into()))),
                    };
                    let (req, resumable) = match plan(&parts, &body) {
                        Some(plan) => {
                            shared.budget.deposit();
                            let report = parts.extensions.get::<EndReport>().cloned();
                            let r = Resumable {
                                report,
                                plan,
                                template: Template::new(parts),
                                service: service.clone(),
                                record: Attempt::primary(),
                                shared: shared.clone(),
                            };
                            let mut req = r.template.request(body);
                            req.extensions_mut().insert(r.record.clone());
                            (req, Some(r))
                        }
                        None => (Request::from_parts(parts, body), None),
                    };
                    let fut = service.call(req);
                    State::Calling { fut, resumable }
                }
            };
            self.as_mut().project().state.set(next);
        }
    }
}

/// How to continue the request, when it can be resumed: its whole body was buffered, and
/// its [`Plan`] says how.
fn plan<B>(parts: &Parts, body: &ReplayBody<B>) -> Option<Plan> {
    let bytes = body.bytes()?;
    Plan::new(parts.uri.path(), &bytes)
        .inspect_err(|why| {
            tracing::trace!(why = why.as_str(), "tailguard-hedge: request not resumable");
        })
        .ok()
}

impl<S> Resumable<S> {
    /// The context of the response's body: how to send a continuation.
    fn into_ctx<B, RB>(self, head: &http::response::Parts) -> Ctx<RB>
    where
        S: Service<Request<ReplayBody<B>>, Response = Response<RB>> + Clone + Send + 'static,
        S::Future: Send + 'static,
        S::Error: Into<BoxError>,
        B: Body + Send + 'static,
        B::Data: From<Bytes> + Send,
        RB: Body + Send + 'static,
    {
        let Resumable {
            plan,
            template,
            service,
            record,
            shared,
            report,
        } = self;
        let send: Sender<RB> = Box::new(move |body: Bytes, attempt: Attempt| {
            let mut req = template.request(ReplayBody::from_bytes(body.clone()));
            req.headers_mut()
                .insert(header::CONTENT_LENGTH, HeaderValue::from(body.len()));
            req.extensions_mut().insert(attempt);
            // What came of a continuation is this layer's to report (a failed one leaves the
            // stream as it was): the layers below report to nobody.
            req.extensions_mut().remove::<EndReport>();
            // The client has had its first token: only the total deadline still applies.
            if let Some(d) = req.extensions_mut().get_mut::<Deadlines>() {
                d.first_token = None;
            }
            let fut = service.clone().oneshot(req);
            Box::pin(async move { fut.await.map_err(Into::into) })
        });
        let from = head.extensions.get::<Upstream>().cloned();
        Ctx::new(send, plan, record, attempts_of(&head.extensions), shared).reporting(report, from)
    }
}

/// The attempts a response took (the hedge's outcome says; one otherwise).
pub(crate) fn attempts_of(ext: &http::Extensions) -> u8 {
    ext.get::<HedgeOutcome>().map_or(1, |o| o.attempts.max(1))
}

/// The `400` of a request body that failed while it was buffered.
fn body_failed<RB>(e: BoxError) -> Response<ResumeBody<RB>>
where
    RB: Body,
    RB::Data: From<Bytes>,
{
    let info = ErrorInfo::new(
        StatusCode::BAD_REQUEST,
        format!("request body failed while buffered for resume: {e}"),
        "invalid_request_error",
        "request_body_failed",
    );
    render::respond(&info, false, ResumeBody::local)
}
