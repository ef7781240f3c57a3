//! An OpenAI-compatible LLM gateway guarded by every tailguard layer.
//!
//! ```text
//! client ─▶ axum router ─▶ LatencyPhaseRecorder ─▶ PriorityClass
//!        ─▶ BoundedAdmission ─▶ Drain ─▶ SseIdleTimeout ─▶ FirstTokenHedge ─▶ ReplicaSet
//!        ─▶ pooled hyper client ─▶ upstream replicas
//! ```
//!
//! The five tailguard layers in the recommended order, plus a small layer of the gateway's
//! own: [`Drain`] ends in-flight streams in-band when the shutdown grace period
//! is over (and turns the timeout layer's `Chunk<Bytes>` data into the `Bytes` admission's
//! rendered refusals need).
//!
//! Routes: `POST /v1/chat/completions`, `POST /v1/completions` (proxied through the stack),
//! `GET /v1/models`, `GET /metrics` (Prometheus text), `GET /healthz`.
//!
//! The handler parses the request body once (it needs the JSON anyway to answer a malformed
//! request with a 400) and puts what it learnt into core's
//! [`RequestFacts`]: model, `max_tokens`, `stream` and prompt bytes, which the recorder labels
//! by, the hedge reads (a non-streamed request is not hedged) and admission may cost by.

mod config;
mod drain;
mod metrics;
mod upstream;

use std::future::IntoFuture;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::IntoResponse;
use axum::routing::{get, post};
use axum::serve::ListenerExt;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use hyper_util::rt::TokioExecutor;
use tailguard::admission::BoundedAdmissionLayer;
use tailguard::core::render::{ErrorInfo, error_response};
use tailguard::core::{BoxError, ClassPolicy, HedgeOutcome, Priority, RequestFacts};
use tailguard::hedge::{FirstTokenHedgeLayer, HedgeBudget, HedgeDelay};
use tailguard::phases::LatencyPhaseRecorderLayer;
use tailguard::priority::PriorityClassLayer;
use tailguard::timeout::SseIdleTimeoutLayer;
use tailguard_mock::{MockServer, Script};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::util::BoxCloneSyncService;
use tower::{ServiceBuilder, ServiceExt};

pub use config::{
    AdmissionConfig, Args, Config, ConfigError, DEFAULT_CONGESTED_SCRIPT, DEFAULT_MOCK_SCRIPT,
    FileConfig, HedgeConfig, HedgeDelaySetting, MOCK_MODEL, MockConfig, PriorityConfig,
    TimeoutConfig, parse_duration, parse_priority,
};
pub use drain::{Drain, DrainBody, DrainLayer};
pub use metrics::{metrics_handle, prometheus_recorder};
pub use upstream::{HttpClient, Replica, UpstreamBody};

/// The response header that tells the client what the hedge did: `attempts=2; winner=1`.
pub const HEDGE_HEADER: &str = "x-tailguard-hedge";

/// The routes whose requests go through the stack (bounded `route` labels).
pub const PROXIED_ROUTES: [&str; 2] = ["/v1/chat/completions", "/v1/completions"];

/// The whole stack as one cloneable service.
pub type Stack = BoxCloneSyncService<Request<Full<Bytes>>, Response<Body>, BoxError>;

/// Builds the tailguard stack over `replicas`, configured by `config`; in-flight streams end
/// in-band when `drain` turns `true`.
pub fn build_stack(config: &Config, replicas: Vec<Replica>, drain: watch::Receiver<bool>) -> Stack {
    let recorder = LatencyPhaseRecorderLayer::new()
        .with_routes(PROXIED_ROUTES)
        .with_models(config.models.clone())
        .with_upstream("gateway");

    let p = &config.priority;
    let mut priority = PriorityClassLayer::new()
        // Validated when the configuration was loaded; a hand-built invalid name means no header.
        .with_header(
            p.header
                .as_deref()
                .and_then(|h| HeaderName::from_bytes(h.as_bytes()).ok()),
        )
        .with_default(p.default.clone());
    if p.interactive_share > 0.0 {
        priority = priority.with_policy(
            Priority::interactive(),
            ClassPolicy::new().with_reserved_share(p.interactive_share),
        );
    }

    let a = &config.admission;
    let admission = BoundedAdmissionLayer::new(a.capacity)
        .with_queue_len(a.queue_len)
        .with_queue_timeout(a.queue_timeout);

    let t = &config.timeout;
    let mut timeout = SseIdleTimeoutLayer::new();
    if let Some(d) = t.head {
        timeout = timeout.with_head_timeout(d);
    }
    if let Some(d) = t.first_token {
        timeout = timeout.with_first_token_timeout(d);
    }
    if let Some(d) = t.idle {
        timeout = timeout.with_idle_timeout(d);
    }
    if let Some(d) = t.total {
        timeout = timeout.with_total_timeout(d);
    }

    let h = &config.hedge;
    let hedge = FirstTokenHedgeLayer::new()
        .with_max_attempts(h.max_attempts)
        .with_delay(match h.delay {
            HedgeDelaySetting::Adaptive => HedgeDelay::adaptive(),
            HedgeDelaySetting::Fixed(d) => HedgeDelay::fixed(d),
        })
        .with_budget(HedgeBudget::new().with_ratio(h.budget_ratio));
    // Each attempt of a request goes to a replica no earlier attempt went to.
    let hedged = hedge.layer_replicas(replicas);

    let stack = ServiceBuilder::new()
        .map_response(|res: Response<_>| res.map(Body::new))
        .layer(recorder)
        // PriorityClass also copies the class into the response, where the recorder (which
        // runs before classification) reads it for its `priority` label.
        .layer(priority)
        .layer(admission)
        .layer(DrainLayer::new(drain))
        .layer(timeout)
        .service(hedged);
    BoxCloneSyncService::new(stack)
}

#[derive(Clone)]
struct App {
    stack: Stack,
    models: Arc<[String]>,
    /// Where `/v1/models` is forwarded when no model is configured.
    models_from: Option<Replica>,
    max_request_bytes: usize,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
}

/// A running gateway.
#[derive(Debug)]
pub struct Gateway {
    addr: SocketAddr,
    upstreams: Vec<(String, &'static str)>,
    stop: watch::Sender<bool>,
    server: JoinHandle<std::io::Result<()>>,
    mocks: Vec<MockServer>,
    grace: Duration,
}

impl Gateway {
    /// Starts the gateway: the embedded mock replicas when no upstream is configured, the
    /// listener, the stack.
    pub async fn start(config: Config) -> std::io::Result<Gateway> {
        let mut mocks = Vec::new();
        let mut bases = Vec::new();
        if config.upstreams.is_empty() {
            let m = &config.mock;
            for i in 0..m.replicas {
                let congested = m.replicas > 1 && i == m.replicas - 1;
                let script = if congested {
                    &m.congested_script
                } else {
                    &m.script
                };
                let script = Script::new()
                    .apply(script)
                    .map_err(|e| std::io::Error::other(e.to_string()))?
                    .seed(i as u64 + 1);
                let server = MockServer::start(script).await?;
                let kind = if congested {
                    "embedded mock, congested"
                } else {
                    "embedded mock"
                };
                bases.push((server.url(), kind));
                mocks.push(server);
            }
        } else {
            bases = config
                .upstreams
                .iter()
                .map(|u| (u.to_string().trim_end_matches('/').to_owned(), "upstream"))
                .collect();
        }

        // No Nagle delay: each SSE event leaves when written.
        let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
        connector.set_nodelay(true);
        let client: HttpClient = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(connector);
        let replicas = bases
            .iter()
            .enumerate()
            .map(|(i, (url, _))| {
                let uri = url.parse().map_err(std::io::Error::other)?;
                Ok(Replica::new(client.clone(), uri, format!("replica-{i}")))
            })
            .collect::<std::io::Result<Vec<_>>>()?;

        let (stop, stop_rx) = watch::channel(false);
        let (drain_tx, drain_rx) = watch::channel(false);
        let app = App {
            models_from: replicas.first().cloned(),
            stack: build_stack(&config, replicas, drain_rx),
            models: config.models.clone().into(),
            max_request_bytes: config.max_request_bytes,
            metrics: metrics_handle(),
        };
        let router = Router::new()
            .route("/v1/chat/completions", post(proxy))
            .route("/v1/completions", post(proxy))
            .route("/v1/models", get(models))
            .route("/metrics", get(render_metrics))
            .route("/healthz", get(healthz))
            .with_state(app);

        let listener = TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let listener = listener.tap_io(|tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let grace = config.shutdown_grace;
        let mut shutdown_rx = stop_rx.clone();
        let server = tokio::spawn(async move {
            let mut stopped = stop_rx;
            let serve = axum::serve(listener, router).with_graceful_shutdown(async move {
                let _ = stopped.wait_for(|s| *s).await;
                tracing::info!(
                    grace_s = grace.as_secs_f64(),
                    "shutting down: no new connections; in-flight streams may finish"
                );
            });
            let hard_stop = async move {
                let _ = shutdown_rx.wait_for(|s| *s).await;
                tokio::time::sleep(grace).await;
                tracing::warn!("grace period over: ending the remaining streams in-band");
                let _ = drain_tx.send(true);
                // Streams end at their next event boundary; a connection that is still open
                // after this (a client that stopped reading) is abandoned.
                tokio::time::sleep(Duration::from_secs(2)).await;
            };
            tokio::select! {
                r = serve.into_future() => r,
                () = hard_stop => {
                    tracing::warn!("connections still open after the grace period: closing them");
                    Ok(())
                }
            }
        });

        Ok(Gateway {
            addr,
            upstreams: bases,
            stop,
            server,
            mocks,
            grace,
        })
    }

    /// The address the gateway listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The upstream base URLs, with what each is.
    pub fn upstreams(&self) -> &[(String, &'static str)] {
        &self.upstreams
    }

    /// The embedded mock replicas (empty with real upstreams).
    pub fn mocks(&self) -> &[MockServer] {
        &self.mocks
    }

    /// The shutdown grace period.
    pub fn grace(&self) -> Duration {
        self.grace
    }

    /// A ready-to-paste `curl -N` command that streams a chat completion.
    pub fn curl_line(&self, model: &str) -> String {
        format!(
            "curl -N http://{}/v1/chat/completions -H 'content-type: application/json' \
             -d '{{\"model\":\"{model}\",\"stream\":true,\"messages\":[{{\"role\":\"user\",\"content\":\"Hello!\"}}]}}'",
            self.addr
        )
    }

    /// Starts a graceful shutdown and waits for it: no new connections; in-flight streams run
    /// on for the grace period, then end with an in-band error event.
    pub async fn shutdown(self) -> std::io::Result<()> {
        let _ = self.stop.send(true);
        let result = match self.server.await {
            Ok(r) => r,
            Err(e) => Err(std::io::Error::other(e)),
        };
        tracing::info!("every connection closed");
        for m in self.mocks {
            m.shutdown().await;
        }
        tracing::info!("gateway stopped");
        result
    }
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

/// Hop-by-hop headers, which a proxy must not forward.
const HOP_BY_HOP: [HeaderName; 6] = [
    header::CONNECTION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

async fn proxy(State(app): State<App>, req: Request<Body>) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
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
    for h in &HOP_BY_HOP {
        parts.headers.remove(h);
    }
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
