//! The gateway's routes: the proxied JSON routes, `/v1/models`, `/metrics`, `/healthz`.

use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use tailguard::core::render::{ErrorInfo, error_response};
use tailguard::core::{HedgeOutcome, RequestFacts};
use tower::ServiceExt;

use super::{HEDGE_HEADER, Replica, Stack, UpstreamBody};

/// What the handlers share.
#[derive(Clone)]
pub(crate) struct App {
    pub(crate) stack: Stack,
    pub(crate) models: Arc<[String]>,
    /// Where `/v1/models` is forwarded when no model is configured.
    pub(crate) models_from: Option<Replica>,
    pub(crate) max_request_bytes: usize,
    pub(crate) metrics: metrics_exporter_prometheus::PrometheusHandle,
}

/// The gateway's router over `app`.
pub(crate) fn router(app: App) -> Router {
    Router::new()
        .route("/v1/chat/completions", post(proxy))
        .route("/v1/completions", post(proxy))
        .route("/v1/models", get(models))
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

/// What the gateway learns from the request body.
fn facts(json: &serde_json::Value, body_len: usize) -> RequestFacts {
    let mut f = RequestFacts::new();
    if let Some(m) = json.get("model").and_then(|m| m.as_str()) {
        f = f.with_model(m);
    }
    let max = json
        .get("max_completion_tokens")
        .or_else(|| json.get("max_tokens"))
        .and_then(|v| v.as_u64());
    if let Some(m) = max {
        f = f.with_max_tokens(u32::try_from(m).unwrap_or(u32::MAX));
    }
    f = f.with_stream(
        json.get("stream")
            .and_then(|s| s.as_bool())
            .unwrap_or(false),
    );
    f.with_prompt_bytes(prompt_bytes(json).unwrap_or(body_len as u64))
}

/// Bytes of prompt text: chat message contents (strings or text parts), or `prompt`.
fn prompt_bytes(json: &serde_json::Value) -> Option<u64> {
    fn text_len(v: &serde_json::Value) -> u64 {
        match v {
            serde_json::Value::String(s) => s.len() as u64,
            serde_json::Value::Array(parts) => parts
                .iter()
                .map(|p| match p {
                    serde_json::Value::String(s) => s.len() as u64,
                    other => other.get("text").map_or(0, text_len),
                })
                .sum(),
            _ => 0,
        }
    }
    if let Some(messages) = json.get("messages").and_then(|m| m.as_array()) {
        return Some(
            messages
                .iter()
                .map(|m| m.get("content").map_or(0, text_len))
                .sum(),
        );
    }
    json.get("prompt").map(text_len)
}

/// `application/json`, `application/json; charset=utf-8`, or a `+json` type.
fn is_json(value: &HeaderValue) -> bool {
    let essence = value
        .to_str()
        .unwrap_or("")
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"))
}

async fn proxy(State(app): State<App>, req: Request<Body>) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    // A body that says it is something else is refused before it is read; no content type
    // at all is read as JSON.
    if let Some(ct) = parts.headers.get(header::CONTENT_TYPE)
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
    let bytes = match Limited::new(body, app.max_request_bytes).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                format!("request body over {} bytes", app.max_request_bytes),
                "invalid_request_error",
                "request_too_large",
            );
        }
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("could not read the request body: {e}"),
                "invalid_request_error",
                "bad_body",
            );
        }
    };
    let json: serde_json::Value = match serde_json::from_slice(&bytes) {
        Ok(v @ serde_json::Value::Object(_)) => v,
        Ok(_) => {
            return error(
                StatusCode::BAD_REQUEST,
                "the request body must be a JSON object",
                "invalid_request_error",
                "invalid_json",
            );
        }
        Err(e) => {
            return error(
                StatusCode::BAD_REQUEST,
                format!("the request body is not valid JSON: {e}"),
                "invalid_request_error",
                "invalid_json",
            );
        }
    };
    parts.extensions.insert(facts(&json, bytes.len()));
    let req = Request::from_parts(parts, Full::new(bytes));
    match app.stack.oneshot(req).await {
        Ok(mut res) => {
            if let Some(o) = res.extensions().get::<HedgeOutcome>().cloned()
                && let Ok(v) =
                    HeaderValue::from_str(&format!("attempts={}; winner={}", o.attempts, o.winner))
            {
                res.headers_mut().insert(HEDGE_HEADER, v);
            }
            res
        }
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
