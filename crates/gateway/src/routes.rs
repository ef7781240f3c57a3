//! The gateway's routes: the hedged LLM routes, `/v1/models`, every other `/v1/*` path
//! proxied un-hedged, `/metrics`, `/healthz`.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::{any, get, post};
use bytes::Bytes;
use http::{Request, Response, StatusCode, header};
use tailguard::core::facts::is_json;
use tailguard::core::render::{ErrorInfo, error_response};
use tower::ServiceExt;

use super::{Replica, Stack, UpstreamBody};

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct App {
    pub(crate) stack: Stack,
    pub(crate) models: Arc<[String]>,
    /// Where `/v1/models` is forwarded when no model is configured.
    pub(crate) models_from: Option<Replica>,
    pub(crate) metrics: metrics_exporter_prometheus::PrometheusHandle,
}

/// The gateway's router over `app`.
pub(crate) fn router(app: App) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(proxy))
        .route("/v1/completions", post(proxy))
        .route("/v1/messages", post(proxy))
        .route("/v1/responses", post(proxy))
        .route("/v1/models", get(models))
        .route("/v1/{*rest}", any(passthrough))
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(healthz))
        .with_state(app)
}

async fn healthz() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "application/json")],
        r#"{"status":"ok"}"#,
    )
}

async fn models(State(app): State<App>) -> Response<Body> {
    if let (true, Some(replica)) = (app.models.is_empty(), app.models_from) {
        // No model configured: the first upstream's own list.
        let req = Request::get("/v1/models")
            .body(UpstreamBody::from_bytes(Bytes::new()))
            .expect("a static request");
        return match replica.oneshot(req).await {
            Ok(res) => res.map(Body::new),
            Err(e) => error(
                StatusCode::BAD_GATEWAY,
                format!("upstream request failed: {e}"),
                "upstream_error",
                "bad_gateway",
            ),
        };
    }
    let data: Vec<_> = app
        .models
        .iter()
        .map(|m| serde_json::json!({"id": m, "object": "model", "created": 0, "owned_by": "tailguard"}))
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

async fn render_metrics(State(app): State<App>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        app.metrics.render(),
    )
}

fn error(
    status: StatusCode,
    message: impl Into<String>,
    kind: &'static str,
    code: &'static str,
) -> Response<Body> {
    error_response(
        &ErrorInfo::new(status, message.into(), kind, code),
        Body::from,
    )
}

/// The LLM routes: a body that says it is something else is refused before it is read (no
/// content type at all is read as JSON); the stack's [`RequestFactsLayer`] reads the JSON.
///
/// [`RequestFactsLayer`]: tailguard::core::RequestFactsLayer
async fn proxy(State(app): State<App>, req: Request<Body>) -> Response<Body> {
    if let Some(ct) = req.headers().get(header::CONTENT_TYPE)
        && !is_json(ct)
    {
        return error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "unsupported content type `{}`: send the request body as application/json",
                String::from_utf8_lossy(ct.as_bytes())
            ),
            "invalid_request_error",
            "unsupported_media_type",
        );
    }
    passthrough(State(app), req).await
}

/// Every other `/v1/*` request: through the stack as it came (the hedge leaves it alone, the
/// recorder labels it `other`).
async fn passthrough(State(app): State<App>, req: Request<Body>) -> Response<Body> {
    match app.stack.oneshot(req).await {
        Ok(res) => res,
        Err(e) => {
            tracing::warn!(error = %e, "upstream request failed");
            error(
                StatusCode::BAD_GATEWAY,
                format!("upstream request failed: {e}"),
                "upstream_error",
                "bad_gateway",
            )
        }
    }
}
