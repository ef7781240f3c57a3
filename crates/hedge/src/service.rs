//! `FirstTokenHedge`: the service.

use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use tailguard_core::{BoxError, Mode, ReplayBody, Respond};
use tower_service::Service;

use crate::body::HedgeBody;
use crate::future::ResponseFuture;
use crate::race::Race;
use crate::state::HedgeState;

/// Hedges LLM streaming calls on the first *token*, not on response headers.
///
/// For an eligible request (see
/// [`FirstTokenHedgeLayer::new`](crate::FirstTokenHedgeLayer::new)) the service buffers the
/// request body (up to the replay cap), sends the primary attempt and reads its response body through
/// a [`StreamTracker`](tailguard_core::StreamTracker). If no token arrives within the hedge
/// delay it sends a backup attempt and keeps both; the first attempt to produce a token wins,
/// the frames it sent before that token are replayed to the client byte for byte and its body
/// continues live, and every other attempt is dropped at once (which cancels its upstream
/// request). An attempt that fails before its first token makes the next one go out at once.
///
/// Before its first token an attempt fails when its response is a retryable status, breaks,
/// ends, completes without a token, carries an in-band error, or sends junk its dialect cannot
/// carry (see [`Class::Malformed`](tailguard_core::Class::Malformed): for OpenAI and Anthropic
/// SSE, data that is not a JSON object; junk in the frame of the first token counts too, as
/// nothing of the attempt reached the client yet); and, for a request whose
/// [`RequestFacts`](tailguard_core::RequestFacts) say `stream: true`, when a `2xx` answer's
/// `content-type` names no stream (a whole JSON completion or error document from a server
/// that ignored `stream`: the client's stream would read nothing). Once committed, the
/// winner's frames pass on as they come: ending a stream for junk after its first token is
/// [`SseIdleTimeout`](https://docs.rs/tailguard-timeout)'s work (it reads every frame anyway),
/// not a second reader's here.
///
/// **The response future resolves, and the client gets response headers, only when a winner is
/// committed (its first token arrived) or every attempt has failed.** Headers that arrive
/// early from an upstream are held until then.
///
/// A raced response carries a [`HedgeOutcome`](tailguard_core::HedgeOutcome) in its
/// extensions (attempts sent, the winner, the delay in force, whether the budget refused a
/// hedge); a request that was not eligible passes straight through and carries none.
///
/// # The inner service
///
/// `S: Clone`: for an eligible request the service that `poll_ready` made ready goes into the
/// race and a clone stays behind for the next call (as in tower's `Oneshot` and linkerd's
/// retries); a backup polls that same service ready again before it is sent, so a balancer
/// sees ordinary readiness and calls. Clients, balancers and `Buffer`s clone cheaply.
///
/// # Request body
///
/// The inner service takes `Request<ReplayBody<B>>` (as linkerd's retry middleware does): for
/// a raced request each attempt gets a fresh replay of the buffered body; for everything else
/// the body passes through [`ReplayBody::passthrough`] untouched. Its data type is `B::Data`;
/// a client that takes one body type only adds a `map_request` (for tonic:
/// `tonic::body::Body::new`).
///
/// # When every attempt fails
///
/// The most informative failure decides, ties going to the later attempt:
/// 1. a stream that carried a complete in-band error event (or a retryable gRPC status): the
///    upstream's own words, in its own dialect, replayed as they were sent;
/// 2. a retryable error status (429, 5xx) with its headers (`Retry-After`) and body, replayed;
/// 3. a `2xx` stream that broke, ended (half an event), completed or sent junk before its
///    first token, or a `2xx` answer that is no stream to a streaming request: not an answer,
///    so never replayed. The client gets a `502` rendered by core (an
///    OpenAI JSON error body, `type: "upstream_error"`; for a gRPC request a trailers-only
///    response with `grpc-status: 14`), or a `504` (`grpc-status: 4`) when that stream's body
///    error was an inner layer's [`TimeoutError`](tailguard_core::TimeoutError);
/// 4. the inner service's error (no response at all, e.g. connection refused), as the
///    response future's error, exactly as an unhedged request returns it: the stack's error
///    handler renders it as it renders any other (a gateway's `502`).
///
/// In error mode ([`with_error_mode`](crate::FirstTokenHedgeLayer::with_error_mode)) the
/// future resolves to an [`UpstreamError`](tailguard_core::UpstreamError) of that failure's kind
/// instead, whichever it is.
///
/// An [`EndReport`](tailguard_core::EndReport) in the request extensions receives the reason
/// (first writer wins): for 1, 2 and 4 an inner layer's own reason for that attempt if it
/// reported one, else `EndReason::UpstreamError` of the failure's kind; for 3 the reason of
/// the rendered answer, `UpstreamError` of `Transport` (it broke), `Truncated` (it ended
/// short of its terminal event) or `Protocol` (it completed with no token, code
/// `upstream_no_token`; it sent junk, `upstream_malformed`; it was no stream,
/// `upstream_not_a_stream`), or the timeout's phase for a `504`. The response's status is the one the client gets.
///
/// # Bounds
///
/// The request and response bodies' data must be `From<Bytes>` (the replayed request bytes,
/// the rendered error's bytes; every hyper, axum and tonic body has this) and their errors
/// `Into<BoxError>` (to find a timeout in them).
///
/// # Errors
///
/// In response mode ([`Respond`], the default) the error type is the inner service's: the
/// only error is the inner service's own (when no attempt got a response at all); a request
/// body that fails while it is buffered is answered with a `400`. In error mode ([`Fail`](tailguard_core::Fail)) the
/// error type is [`BoxError`]: the inner service's error, an
/// [`UpstreamError`](tailguard_core::UpstreamError) when every attempt failed, or a
/// [`RequestBodyError`](crate::error::RequestBodyError).
pub struct FirstTokenHedge<S, M = Respond> {
    inner: S,
    pub(crate) shared: Arc<HedgeState>,
    _mode: PhantomData<fn() -> M>,
}

impl<S, M> FirstTokenHedge<S, M> {
    pub(crate) fn from_shared(inner: S, shared: Arc<HedgeState>) -> Self {
        FirstTokenHedge {
            inner,
            shared,
            _mode: PhantomData,
        }
    }

    tailguard_core::inner_service_accessors!();
}

impl<S: Clone, M> Clone for FirstTokenHedge<S, M> {
    fn clone(&self) -> Self {
        FirstTokenHedge {
            inner: self.inner.clone(),
            shared: self.shared.clone(),
            _mode: PhantomData,
        }
    }
}

impl<S: fmt::Debug, M> fmt::Debug for FirstTokenHedge<S, M> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FirstTokenHedge")
            .field("inner", &self.inner)
            .field("config", &self.shared.config)
            .finish()
    }
}

impl<S, B, RB, M> Service<Request<B>> for FirstTokenHedge<S, M>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>> + Clone,
    S::Error: Into<BoxError>,
    B: Body + Unpin,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
    RB: Body,
    RB::Data: From<Bytes>,
    RB::Error: Into<BoxError>,
    M: Mode<S::Error>,
{
    type Response = Response<HedgeBody<RB>>;
    type Error = M::Error;
    type Future = ResponseFuture<S, B, RB, M>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(M::inner)
    }

    // Races an eligible request; passes anything else straight through.
    fn call(&mut self, req: Request<B>) -> Self::Future {
        let (parts, body) = req.into_parts();
        if !self.shared.eligible(&parts, &body) {
            let req = Request::from_parts(parts, ReplayBody::passthrough(body));
            return ResponseFuture::direct(self.inner.call(req));
        }
        // The ready service goes into the race; a fresh clone stays for the next poll_ready.
        let clone = self.inner.clone();
        let service = std::mem::replace(&mut self.inner, clone);
        ResponseFuture::hedged(Race::new(self.shared.clone(), service, parts, body))
    }
}
