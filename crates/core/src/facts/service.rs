//! [`RequestFactsLayer`]: the request body read once, its facts in the extensions.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::request::Parts;
use http::{Request, Response, StatusCode, header};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::answer::AnswerBody;
use crate::error::BoxError;
use crate::ext::RequestFacts;
use crate::facts::{PromptMember, is_json};
use crate::render::{ErrorInfo, error_response};
use crate::replay::{Buffering, DEFAULT_REPLAY_CAP, ReplayBody};

/// Reads the JSON body of each request once, puts its [`RequestFacts`] into the request
/// extensions (see [`RequestFacts::from_json`]) and hands the buffered body on as a replayable
/// [`ReplayBody`], so the layers below (the recorder's labels, the hedge's `stream: false`
/// check, admission's cost) learn the request without parsing it again, and the hedge's
/// attempts replay that one buffer (re-buffering a replayable body shares its bytes).
///
/// Put it outside every other tailguard layer. Answers, in OpenAI's error shape
/// (`{"error":{"message","type":"invalid_request_error","code"}}`) and without calling the
/// inner service:
///
/// * `400` (`invalid_json`) for a body that is not a JSON object, or whose known members have
///   the wrong type;
/// * `413` (`request_too_large`) for a body over the [limit](Self::with_max_body);
/// * `400` (`bad_body`) when the body fails while it is read;
/// * `400` (`missing_required_parameter`) for a request to a path given
///   [`with_required`](Self::with_required) whose body is empty or lacks that prompt member.
///
/// A request whose `content-type` is present and not JSON (`application/json`, or a `+json`
/// type) passes on unread and without facts ([`ReplayBody::passthrough`]), as does an empty
/// body (replayable, empty). Facts already in the extensions are replaced.
///
/// Responses are wrapped in an [`AnswerBody`] (the inner body untouched, or the refusal), which
/// needs only `Data: From<Bytes>` of the inner body: the layer goes over any tailguard stack
/// with no `map_response`. The inner service's error passes through unchanged.
#[derive(Clone, Debug)]
pub struct RequestFactsLayer {
    max_body: usize,
    required: Arc<[(String, PromptMember)]>,
}

impl Default for RequestFactsLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestFactsLayer {
    /// Reads bodies up to [`DEFAULT_REPLAY_CAP`] bytes.
    pub fn new() -> Self {
        RequestFactsLayer {
            max_body: DEFAULT_REPLAY_CAP,
            required: Arc::new([]),
        }
    }

    /// Requires of every JSON request to `path` (matched exactly) the prompt `member` its API
    /// cannot do without (`messages` for chat completions and Anthropic messages, `prompt` for
    /// completions): a request with an empty body, or without that member (or with it `null`),
    /// is answered `400` and never reaches an upstream, which would answer it with an error of
    /// its own, or worse, an empty stream.
    ///
    /// ```
    /// use tailguard_core::RequestFactsLayer;
    /// use tailguard_core::facts::PromptMember;
    ///
    /// let layer = RequestFactsLayer::new()
    ///     .with_required("/v1/chat/completions", PromptMember::Messages)
    ///     .with_required("/v1/completions", PromptMember::Prompt);
    /// # let _ = layer;
    /// ```
    pub fn with_required(mut self, path: impl Into<String>, member: PromptMember) -> Self {
        let mut all = self.required.to_vec();
        all.push((path.into(), member));
        self.required = all.into();
        self
    }

    /// The largest body read; a longer one is answered `413`.
    pub fn with_max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }
}

impl<S> Layer<S> for RequestFactsLayer {
    type Service = RequestFactsService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        RequestFactsService {
            inner,
            max_body: self.max_body,
            required: self.required.clone(),
        }
    }
}

/// The service of [`RequestFactsLayer`].
#[derive(Clone, Debug)]
pub struct RequestFactsService<S> {
    inner: S,
    max_body: usize,
    required: Arc<[(String, PromptMember)]>,
}

impl<S> RequestFactsService<S> {
    /// Wraps `inner` with the configuration of `layer`.
    pub fn new(inner: S, layer: RequestFactsLayer) -> Self {
        layer.layer(inner)
    }

    crate::inner_service_accessors!();
}

impl<S, B, RB> Service<Request<B>> for RequestFactsService<S>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>> + Clone,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
    RB: Body,
    RB::Data: From<Bytes>,
{
    type Response = Response<AnswerBody<RB>>;
    type Error = S::Error;
    type Future = RequestFactsFuture<S, B>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (parts, body) = req.into_parts();
        let required = self
            .required
            .iter()
            .find(|(path, _)| *path == parts.uri.path())
            .map(|(_, m)| *m);
        if parts
            .headers
            .get(header::CONTENT_TYPE)
            .is_some_and(|ct| !is_json(ct))
        {
            let req = Request::from_parts(parts, ReplayBody::passthrough(body));
            return RequestFactsFuture {
                state: State::Calling {
                    future: self.inner.call(req),
                },
            };
        }
        // The ready service waits in the future for the body; a clone stays for the next call.
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        RequestFactsFuture {
            state: State::Reading {
                buffering: ReplayBody::buffer(body, self.max_body),
                parts: Some(parts),
                service: Some(service),
                required,
            },
        }
    }
}

pin_project! {
    /// The response future of [`RequestFactsService`].
    pub struct RequestFactsFuture<S, B>
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
        Reading {
            buffering: Buffering<B>,
            parts: Option<Parts>,
            service: Option<S>,
            required: Option<PromptMember>,
        },
        Calling { #[pin] future: S::Future },
        Done,
    }
}

impl<S, B> fmt::Debug for RequestFactsFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Reading { .. } => "reading the body",
            State::Calling { .. } => "calling the inner service",
            State::Done => "done",
        };
        f.debug_struct("RequestFactsFuture")
            .field("state", &state)
            .finish()
    }
}

fn refusal<RB>(status: StatusCode, message: String, code: &'static str) -> Response<AnswerBody<RB>>
where
    RB: Body,
    RB::Data: From<Bytes>,
{
    let info = ErrorInfo::new(status, message, "invalid_request_error", code);
    error_response(&info, |json| AnswerBody::answer(Some(json.into())))
}

/// The request to send on, with its facts, or the refusal to answer with.
fn read<B, RB>(
    mut parts: Parts,
    read: Result<ReplayBody<B>, B::Error>,
    max_body: usize,
    required: Option<PromptMember>,
) -> Result<Request<ReplayBody<B>>, Response<AnswerBody<RB>>>
where
    B: Body,
    B::Error: Into<BoxError>,
    RB: Body,
    RB::Data: From<Bytes>,
{
    let body = match read {
        Ok(body) => body,
        Err(e) => {
            let e: BoxError = e.into();
            let message = format!("could not read the request body: {e}");
            return Err(refusal(StatusCode::BAD_REQUEST, message, "bad_body"));
        }
    };
    let Some((bytes, body)) = body.contiguous() else {
        let message = format!("request body over {max_body} bytes");
        return Err(refusal(
            StatusCode::PAYLOAD_TOO_LARGE,
            message,
            "request_too_large",
        ));
    };
    let missing = |member: PromptMember| {
        let message = format!(
            "missing required parameter: `{}` ({} {} needs it)",
            member.as_str(),
            parts.method,
            parts.uri.path()
        );
        refusal(
            StatusCode::BAD_REQUEST,
            message,
            "missing_required_parameter",
        )
    };
    if bytes.is_empty() {
        if let Some(member) = required {
            return Err(missing(member));
        }
    } else {
        match RequestFacts::from_json_members(&bytes) {
            Ok((_, present)) if required.is_some_and(|m| !present.has(m)) => {
                return Err(missing(required.expect("checked")));
            }
            Ok((facts, _)) => {
                parts.extensions.insert(facts);
            }
            Err(e) => {
                return Err(refusal(
                    StatusCode::BAD_REQUEST,
                    e.to_string(),
                    "invalid_json",
                ));
            }
        }
    }
    Ok(Request::from_parts(parts, body))
}

impl<S, B, RB> Future for RequestFactsFuture<S, B>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
    RB: Body,
    RB::Data: From<Bytes>,
{
    type Output = Result<Response<AnswerBody<RB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        loop {
            match state.as_mut().project() {
                StateProj::Reading {
                    buffering,
                    parts,
                    service,
                    required,
                } => {
                    let body = ready!(Pin::new(&mut *buffering).poll(cx));
                    let max_body = buffering.cap();
                    let (Some(parts), Some(mut service)) = (parts.take(), service.take()) else {
                        state.set(State::Done);
                        continue;
                    };
                    match read(parts, body, max_body, *required) {
                        Ok(req) => {
                            let future = service.call(req);
                            state.set(State::Calling { future });
                        }
                        Err(res) => {
                            state.set(State::Done);
                            return Poll::Ready(Ok(res));
                        }
                    }
                }
                StateProj::Calling { future } => {
                    let res = ready!(future.poll(cx));
                    state.set(State::Done);
                    return Poll::Ready(res.map(|res| res.map(AnswerBody::inner)));
                }
                // Polled after completion: nothing left to give.
                StateProj::Done => return Poll::Pending,
            }
        }
    }
}
