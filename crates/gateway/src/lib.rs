//! An OpenAI-compatible LLM gateway guarded by every tailguard layer: the library behind the
//! `tailguard-gateway` binary, so that tests and benches can start it in-process.
//!
//! ```text
//! cargo run --release -p tailguard-gateway                  # over embedded mock replicas
//! cargo install --path crates/gateway && tailguard-gateway --help
//! ```
//!
//! [`build_stack`] is the recommended tailguard stack in one `ServiceBuilder`, over any set of
//! replicas:
//!
//! ```
//! use http::Request;
//! use axum::body::Body;
//! use http_body_util::BodyExt;
//! use hyper_util::rt::TokioExecutor;
//! use tailguard_gateway::{Args, Config, HttpClient, Replica, build_stack};
//! use tailguard_mock::{MockServer, Script};
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let mock = MockServer::start(Script::new().tokens(3)).await?;
//! let config = Config::resolve(Default::default(), &Args::default())?;
//! let client: HttpClient =
//!     hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http();
//! let replicas = vec![Replica::new(client, &mock.url().parse()?, "replica-0")?];
//! let (_drain, drain_signal) = tokio::sync::watch::channel(false);
//! let stack = build_stack(&config, replicas, drain_signal);
//!
//! let body = r#"{"model":"mock-llm","stream":true,"messages":[]}"#;
//! let req = Request::post("/v1/chat/completions").body(Body::from(body))?;
//! let res = stack.oneshot(req).await?;
//! assert!(res.headers().contains_key("x-request-id"));
//! let text = res.into_body().collect().await?.to_bytes();
//! assert!(text.ends_with(b"data: [DONE]\n\n"));
//! # mock.shutdown().await;
//! # Ok(())
//! # }
//! ```
//!
//! The stack:
//!
//! ```text
//! client ─▶ axum router ─▶ RequestFacts ─▶ LatencyPhaseRecorder ─▶ PriorityClass
//!        ─▶ BoundedAdmission ─▶ SseIdleTimeout ─▶ Resume (off by default)
//!        ─▶ FirstTokenHedge ─▶ ReplicaSet
//!        ─▶ pooled hyper client ─▶ upstream replicas
//! ```
//!
//! The five tailguard layers in the recommended order. When the shutdown grace period is
//! over, `SseIdleTimeout` ends the streams still running in-band
//! ([`SseIdleTimeoutLayer::with_shutdown`]).
//!
//! Routes ([`HEDGED_ROUTES`]): OpenAI's `POST /v1/chat/completions`, `POST /v1/completions`
//! and `POST /v1/responses`, and Anthropic's `POST /v1/messages`, proxied through the stack
//! and hedged (a non-JSON content type is a 415); `GET /v1/models`; every other `/v1/*`
//! request (any method) proxied through the same stack un-hedged, with the route label
//! `other`; `GET /metrics` (Prometheus text), `GET /healthz`. Hop-by-hop headers are dropped
//! both ways ([`strip_hop_by_hop`]).
//!
//! The server is hyper's, driven by [`serve`]: `TCP_NODELAY` on every accepted connection
//! (and on the upstream pool's, [`upstream_client`]), a connection cap, a header-read timeout
//! against slowloris clients and an idle keep-alive timeout.
//!
//! Core's [`RequestFactsLayer`] reads each JSON request body once (answering a malformed one
//! with a 400) and puts what it learnt into [`RequestFacts`]: model, `max_tokens`, `stream` and
//! prompt bytes, which the recorder labels by, the hedge reads (a non-streamed request is not
//! hedged) and admission may cost by; the hedge replays that one buffer.

mod cluster;
mod config;
mod metrics;
mod path;
mod routes;
mod serve;
mod upstream;

use std::net::SocketAddr;
use std::time::Duration;

use axum::body::Body;
use http::{HeaderName, Request, Response};
use tailguard::admission::{AdaptiveLimit, BoundedAdmissionLayer};
use tailguard::core::facts::PromptMember;
use tailguard::core::{BoxError, ClassPolicy, Priority, RequestFacts, RequestFactsLayer};
use tailguard::hedge::{FirstTokenHedgeLayer, HedgeBudget, HedgeDelay, ResumeLayer};
use tailguard::phases::{LatencyPhaseRecorderLayer, TracingSink};
use tailguard::priority::PriorityClassLayer;
use tailguard::route::{Ejection, ReplicaSet, Routing};
use tailguard::timeout::SseIdleTimeoutLayer;
use tailguard_mock::{MockServer, Script};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tower::ServiceBuilder;
use tower::util::BoxCloneSyncService;

pub use cluster::Shared;
pub use config::{
    AdmissionArgs, AdmissionConfig, Args, ClusterArgs, ClusterConfig, Config, ConfigError, Dur,
    FileConfig, HedgeArgs, HedgeConfig, HedgeDelaySetting, MOCK_MODEL, MockArgs, MockConfig, OnOff,
    PriorityArgs, PriorityConfig, Setting, TenantArgs, TenantConfig, TenantSpec, TimeoutArgs,
    TimeoutConfig, Timer, parse_duration, parse_priority,
};
pub use metrics::{metrics_handle, prometheus_recorder};
pub use serve::{Limits, serve};
pub use upstream::{
    HttpClient, Replica, UpstreamBody, strip_hop_by_hop, upstream_client, upstream_connector,
};

/// The response header that tells the client what the hedge did: `attempts=2; winner=1`
/// (`winner=none` when every attempt failed).
pub const HEDGE_HEADER: &str = "x-tailguard-hedge";

/// The LLM routes the hedge races (bounded `route` labels; any other path is `other`).
pub const HEDGED_ROUTES: [&str; 4] = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
];

/// The whole stack as one cloneable service.
pub type Stack = BoxCloneSyncService<Request<Body>, Response<Body>, BoxError>;

/// The hedge's eligibility: a `POST` to one of the [`HEDGED_ROUTES`] that did not ask for a
/// non-streamed answer.
fn hedged(parts: &http::request::Parts) -> bool {
    parts.method == http::Method::POST
        && HEDGED_ROUTES.contains(&parts.uri.path())
        && parts
            .extensions
            .get::<RequestFacts>()
            .is_none_or(|f| f.stream != Some(false))
}

/// Builds the tailguard stack over `replicas`, configured by `config`; in-flight streams end
/// in-band when `drain` turns `true`.
pub fn build_stack(config: &Config, replicas: Vec<Replica>, drain: watch::Receiver<bool>) -> Stack {
    let recorder = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(metrics::metrics_sink())
        .with_sink(TracingSink::new())
        .with_routes(HEDGED_ROUTES)
        .with_models(config.models.clone())
        .with_upstream("gateway");

    let p = &config.priority;
    let mut priority = PriorityClassLayer::new()
        .with_header(p.header.clone())
        .with_default(p.default.clone());
    if p.interactive_share > 0.0 {
        priority = priority.with_policy(
            Priority::interactive(),
            ClassPolicy::new().with_reserved_share(p.interactive_share),
        );
    }

    let a = &config.admission;
    let t = &config.timeout;
    let adaptive = a
        .adaptive
        .then(|| AdaptiveLimit::new().with_min(a.min_limit));
    let admission = BoundedAdmissionLayer::new(a.capacity)
        .with_adaptive_limit(adaptive)
        .with_queue_len(a.queue_len)
        .with_queue_timeout(a.queue_timeout)
        .with_client_deadline(t.client_deadline())
        .with_tenant_fairness(config.tenant.fairness);
    let h = &config.hedge;
    let shared = config.cluster.apply(
        Shared {
            admission,
            hedge: budget(HedgeBudget::new(), h.budget_ratio),
            failover: budget(HedgeBudget::failover(), h.failover_budget_ratio),
        },
        a.capacity,
    );

    let mut timeout = SseIdleTimeoutLayer::new()
        .with_client_deadline(t.client_deadline())
        .with_shutdown(drain);
    if !t.require_finish {
        timeout = timeout.with_require_terminal_event(false);
    }
    if let Some(d) = t.head {
        timeout = timeout.with_head_timeout(d);
    }
    if let Some(d) = t.first_token {
        timeout = timeout.with_first_token_timeout(d);
    }
    if let Some(d) = t.idle {
        timeout = timeout.with_idle_timeout(d);
    }
    if let Some(d) = t.liveness {
        timeout = timeout.with_liveness_timeout(d);
    }
    if let Some(d) = t.total {
        timeout = timeout.with_total_timeout(d);
    }

    let hedge = FirstTokenHedgeLayer::new()
        .with_max_attempts(h.max_attempts)
        .with_delay(match h.delay {
            HedgeDelaySetting::Adaptive => HedgeDelay::adaptive(),
            HedgeDelaySetting::Fixed(d) => HedgeDelay::fixed(d),
        })
        .with_budget(shared.hedge)
        .with_failover_budget(shared.failover)
        .with_outcome_header(Some(HeaderName::from_static(HEDGE_HEADER)))
        .with_predicate(hedged);
    // Each attempt of a request goes to a replica no earlier attempt went to; primaries to the
    // replica with the shortest expected wait for a first token.
    let ejection = if h.outlier_ejection {
        Ejection::new()
    } else {
        Ejection::disabled()
    };
    let set = ReplicaSet::new(replicas)
        .with_routing(h.routing)
        .with_ejection(ejection)
        .with_slots(h.replica_slots);
    let hedged = tower::Layer::layer(&hedge, set);

    // Off: a pass-through (no resume, no reading, no buffering). On, a stall resumes at half
    // the idle timeout, so the continuation has the other half for its first token.
    let mut resume = ResumeLayer::new().with_max_resumes(if h.resume { 2 } else { 0 });
    if let Some(idle) = t.idle {
        resume = resume.with_stall_after(idle / 2);
    }
    let stack = ServiceBuilder::new()
        // The boxed `Stack`'s one body type.
        .map_response(|res: Response<_>| res.map(Body::new))
        .layer(
            RequestFactsLayer::new()
                .with_max_body(config.max_request_bytes)
                // What each API cannot do without (the Responses API may omit `input`).
                .with_required("/v1/chat/completions", PromptMember::Messages)
                .with_required("/v1/completions", PromptMember::Prompt)
                .with_required("/v1/messages", PromptMember::Messages),
        )
        .layer(recorder)
        // PriorityClass also copies the class into the response, where the recorder (which
        // runs before classification) reads it for its `priority` label.
        .layer(priority)
        // Who each request is for, then its tenant's token budget: a request refused for its
        // budget takes no admission slot.
        .layer(config.tenant.identity())
        .layer(config.cluster.budgets(config.tenant.budgets()))
        .layer(shared.admission)
        .layer(timeout)
        .layer(resume)
        .service(hedged);
    BoxCloneSyncService::new(stack)
}

/// `defaults` with `ratio`, or, for a ratio of 0, no budget at all: `0` turns that kind of
/// extra attempt off (no floor, no initial balance), as the configuration documents.
fn budget(defaults: HedgeBudget, ratio: f64) -> HedgeBudget {
    if ratio == 0.0 {
        HedgeBudget::none()
    } else {
        defaults.with_ratio(ratio)
    }
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
        let (bases, mocks) = upstream_bases(&config).await?;
        let client = upstream_client();
        let replicas = bases
            .iter()
            .enumerate()
            .map(|(i, (url, _))| {
                let uri = url.parse().map_err(std::io::Error::other)?;
                Replica::new(client.clone(), &uri, format!("replica-{i}"))
                    .map_err(std::io::Error::other)
            })
            .collect::<std::io::Result<Vec<_>>>()?;

        let (stop, stop_rx) = watch::channel(false);
        let (drain_tx, drain_rx) = watch::channel(false);
        // The recorder first: the layers describe their metrics to it as they are built.
        let metrics = metrics_handle();
        let router = routes::router(routes::App {
            models_from: replicas.first().cloned(),
            stack: build_stack(&config, replicas, drain_rx),
            models: config.models.clone().into(),
            metrics,
        });
        let listener = TcpListener::bind(config.listen).await?;
        let addr = listener.local_addr()?;
        let grace = config.shutdown_grace;
        let limits = Limits::from(&config);
        let mut shutdown_rx = stop_rx.clone();
        let server = tokio::spawn(async move {
            let hard_stop = async move {
                let _ = shutdown_rx.wait_for(|s| *s).await;
                tracing::info!(
                    grace_s = grace.as_secs_f64(),
                    "shutting down: no new connections; in-flight streams may finish"
                );
                tokio::time::sleep(grace).await;
                tracing::warn!("grace period over: ending the remaining streams in-band");
                let _ = drain_tx.send(true);
                // Streams end at their next event boundary; a connection that is still open
                // after this (a client that stopped reading) is abandoned.
                tokio::time::sleep(Duration::from_secs(2)).await;
            };
            tokio::select! {
                r = serve(listener, router, limits, stop_rx) => r,
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

/// The upstream base URLs with what each is, and the embedded mocks started for them when no
/// upstream is configured.
async fn upstream_bases(
    config: &Config,
) -> std::io::Result<(Vec<(String, &'static str)>, Vec<MockServer>)> {
    if !config.upstreams.is_empty() {
        let bases = config
            .upstreams
            .iter()
            .map(|u| (u.to_string().trim_end_matches('/').to_owned(), "upstream"))
            .collect();
        return Ok((bases, Vec::new()));
    }
    let m = &config.mock;
    let mut bases = Vec::new();
    let mut mocks = Vec::new();
    for i in 0..m.replicas {
        let congested = m.replicas > 1 && i == m.replicas - 1;
        let (script, kind) = match congested {
            true => (&m.congested_script, "embedded mock, congested"),
            false => (&m.script, "embedded mock"),
        };
        let script = Script::new()
            .apply(script)
            .map_err(|e| std::io::Error::other(e.to_string()))?
            .seed(i as u64 + 1);
        let server = MockServer::start(script).await?;
        bases.push((server.url(), kind));
        mocks.push(server);
    }
    Ok((bases, mocks))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 35: a budget ratio of 0 is off (no floor, no initial balance), as documented.
    #[test]
    fn a_zero_budget_ratio_is_no_budget() {
        assert_eq!(budget(HedgeBudget::failover(), 0.0), HedgeBudget::none());
        assert_eq!(
            budget(HedgeBudget::failover(), 0.5),
            HedgeBudget::failover().with_ratio(0.5)
        );
    }
}
