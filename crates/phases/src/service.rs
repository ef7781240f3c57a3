//! [`LatencyPhaseRecorder`]: the service.

use std::sync::Arc;
use std::task::{Context, Poll};

use http::request::Parts;
use http::{Request, Response};
use tailguard_core::progress::StreamProgress;
use tailguard_core::{EndReport, Priority, RequestFacts};
use tokio::time::Instant;
use tower_service::Service;
use tracing::Span;
use tracing::field::Empty;

use crate::body::LatencyPhaseRecorderBody;
use crate::future::ResponseFuture;
use crate::labels::Route;
use crate::layer::{Config, LatencyPhaseRecorderLayer};
use crate::recording::Recording;
use crate::request_id::RequestId;

/// Records every phase of every request to the configured sinks; see the
/// [crate documentation](crate) and [`LatencyPhaseRecorderLayer`].
///
/// In `call` it starts the clock, takes or generates the request id (and sets it on the
/// request sent inward), inserts a fresh [`EndReport`] and the [`RequestId`] into the request
/// extensions, and opens the request's span. Everything else happens in the response future and
/// the body.
#[derive(Clone, Debug)]
pub struct LatencyPhaseRecorder<S> {
    inner: S,
    layer: LatencyPhaseRecorderLayer,
}

impl<S> LatencyPhaseRecorder<S> {
    /// Wraps `inner` with the configuration of `layer`, sharing its sink (the same as
    /// `layer.layer(inner)`).
    pub fn new(inner: S, layer: &LatencyPhaseRecorderLayer) -> Self {
        LatencyPhaseRecorder {
            inner,
            layer: layer.clone(),
        }
    }

    tailguard_core::inner_service_accessors!();
}

impl<S, ReqB, ResB> Service<Request<ReqB>> for LatencyPhaseRecorder<S>
where
    S: Service<Request<ReqB>, Response = Response<ResB>>,
    ResB: http_body::Body,
{
    type Response = Response<LatencyPhaseRecorderBody<ResB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<ReqB>) -> Self::Future {
        let start = Instant::now();
        let cfg = &self.layer.cfg;
        let (mut parts, body) = req.into_parts();

        let request_id = cfg.request_id_header.as_ref().map(|h| {
            match parts.headers.get(h).and_then(RequestId::from_header) {
                Some(id) => id,
                None => {
                    let id = RequestId::generate();
                    parts.headers.insert(h.clone(), id.header_value().clone());
                    id
                }
            }
        });
        let route = route(cfg, &parts);

        let end_report = EndReport::new();
        parts.extensions.insert(end_report.clone());
        if let Some(id) = &request_id {
            parts.extensions.insert(id.clone());
        }
        let priority = parts.extensions.get::<Priority>().cloned();
        let facts = parts.extensions.get::<RequestFacts>().cloned();
        // The stream is read once, by the innermost layer that reads it; usage is asked of it.
        let progress = StreamProgress::of(&mut parts.extensions);
        if cfg.usage {
            progress.want_usage();
        }
        // A terminal event with no finish reason before it ends an answer cut short.
        progress.want_finish();

        let span = if cfg.span {
            request_span(request_id.as_ref(), &route, facts.as_ref())
        } else {
            Span::none()
        };

        let rec = Recording::new(
            cfg.clone(),
            start,
            request_id,
            end_report,
            route,
            priority,
            facts,
            progress,
        );
        let req = Request::from_parts(parts, body);
        let inner = {
            let _enter = span.enter();
            self.inner.call(req)
        };
        ResponseFuture::new(inner, span, rec)
    }
}

/// The route label: a [`Route`] extension, else the route function's, else a configured route,
/// else `other`.
fn route(cfg: &Config, parts: &Parts) -> Arc<str> {
    parts
        .extensions
        .get::<Route>()
        .cloned()
        .or_else(|| cfg.route_fn.as_ref().and_then(|f| f(parts)))
        .map(Route::into_arc)
        .or_else(|| cfg.routes.find(parts.uri.path()).cloned())
        .unwrap_or_else(|| cfg.other.clone())
}

/// The request's span, with every field the [`TracingSink`](crate::TracingSink) fills in later.
fn request_span(id: Option<&RequestId>, route: &str, facts: Option<&RequestFacts>) -> Span {
    tracing::info_span!(
        target: "tailguard_phases",
        "llm_request",
        request_id = id.map(RequestId::as_str),
        route = route,
        model = Empty,
        requested_model = facts.and_then(|f| f.model.as_deref()),
        priority = Empty,
        upstream = Empty,
        streamed = Empty,
        status = Empty,
        end_reason = Empty,
        queue_wait_s = Empty,
        time_to_headers_s = Empty,
        ttft_s = Empty,
        tpot_s = Empty,
        total_s = Empty,
        output_events = Empty,
        events = Empty,
        gaps = Empty,
        max_gap_s = Empty,
        prompt_tokens = Empty,
        completion_tokens = Empty,
        max_tokens = Empty,
        prompt_bytes = Empty,
        hedge_attempts = Empty,
        hedge_winner = Empty,
        hedge_losers_ran_s = Empty,
        hedge_wasted_prompt_bytes = Empty,
        hedge_wasted_prompt_tokens = Empty,
        hedge_deadline_skipped = Empty,
        resumes = Empty,
    )
}
