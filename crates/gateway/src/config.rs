//! The gateway's configuration: defaults, a TOML file, environment variables and flags.
//!
//! Precedence, highest first: a command-line flag, its environment variable, the TOML file
//! (`--config FILE`), the built-in default. Every key of the file has a flag and a variable:
//! `[timeout] idle = "5s"` is `--timeout-idle 5s` and `TAILGUARD_TIMEOUT_IDLE=5s`.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use http::Uri;
use tailguard::core::Priority;

use super::cluster::ClusterConfig;
use super::file::HedgeDelaySetting;
pub use super::timeout_config::TimeoutConfig;

/// The resolved configuration.
#[derive(Clone, Debug)]
pub struct Config {
    /// Listen address.
    pub listen: SocketAddr,
    /// Upstream base URLs (scheme and authority); empty: embedded mock replicas.
    pub upstreams: Vec<Uri>,
    /// Model names (bounded metric labels, and what /v1/models lists).
    pub models: Vec<String>,
    /// Grace period for in-flight streams at shutdown.
    pub shutdown_grace: Duration,
    /// Largest request body accepted.
    pub max_request_bytes: usize,
    /// Time a client has to send a request head, counted from accept, or from the first byte
    /// that arrives on a connection with no request in flight.
    pub header_read_timeout: Duration,
    /// How long a client connection may stay open with no request in flight.
    pub keep_alive_timeout: Duration,
    /// Most client connections open at once.
    pub max_connections: usize,
    /// `FirstTokenHedge` settings.
    pub hedge: HedgeConfig,
    /// `SseIdleTimeout` settings.
    pub timeout: TimeoutConfig,
    /// `BoundedAdmission` settings.
    pub admission: AdmissionConfig,
    /// `PriorityClass` settings.
    pub priority: PriorityConfig,
    /// Embedded mock replicas (used when `upstreams` is empty).
    pub mock: MockConfig,
    /// Cluster mode (Redis).
    pub cluster: ClusterConfig,
}

/// `FirstTokenHedge` settings.
#[derive(Clone, Debug)]
pub struct HedgeConfig {
    /// Attempts per request, the primary included.
    pub max_attempts: u8,
    /// The hedge delay.
    pub delay: HedgeDelaySetting,
    /// Share of requests that may send an extra attempt.
    pub budget_ratio: f64,
    /// Share of requests that may fail over (a budget of its own).
    pub failover_budget_ratio: f64,
    /// Load-aware primaries (`false`: round robin).
    pub least_wait: bool,
    /// Outlier ejection.
    pub outlier_ejection: bool,
    /// Most concurrent attempts per replica (`None`: no limit).
    pub replica_slots: Option<u32>,
}

/// `BoundedAdmission` settings.
#[derive(Clone, Debug)]
pub struct AdmissionConfig {
    /// Concurrent requests (one unit each), held until the stream ends; the ceiling of the
    /// adaptive limit.
    pub capacity: u32,
    /// The limit adapts to the upstreams' time to first token (`false`: `capacity` is fixed).
    pub adaptive: bool,
    /// Lowest adaptive limit.
    pub min_limit: u32,
    /// Requests that may wait.
    pub queue_len: usize,
    /// Longest wait in the queue.
    pub queue_timeout: Duration,
}

/// `PriorityClass` settings.
#[derive(Clone, Debug)]
pub struct PriorityConfig {
    /// Header clients name their class in (`None`: clients have no say).
    pub header: Option<String>,
    /// Class of unclassified requests.
    pub default: Priority,
    /// Capacity share reserved for `interactive` under contention (`0`: none).
    pub interactive_share: f64,
}

/// Embedded mock replicas.
#[derive(Clone, Debug)]
pub struct MockConfig {
    /// How many (the last one is congested when there are at least two).
    pub replicas: usize,
    /// Script of the healthy replicas.
    pub script: String,
    /// Script of the congested replica.
    pub congested_script: String,
}

impl Default for Config {
    /// The defaults, and why:
    ///
    /// * listen `127.0.0.1:8080`: loopback only, a demo must not open a port to the network;
    /// * shutdown grace **10 s**: most answers finish well within it, and an orchestrator's
    ///   kill timeout (30 s in Kubernetes) leaves room for the rest of shutdown;
    /// * max request body **4 MiB**: the hedge's replay cap, so every accepted body can be hedged;
    /// * header read timeout **10 s**: a client sends its request head in one go right after
    ///   connecting, so 10 s covers a slow mobile link and still bounds a slowloris client that
    ///   trickles a head to hold a connection;
    /// * keep-alive timeout **75 s**: longer than the 60 s idle timeout of common load
    ///   balancers (the AWS ALB default), so the balancer, not the gateway, closes idle
    ///   connections and never sends a request onto one the gateway is closing (nginx's
    ///   default too);
    /// * max connections **4096**: far more than the generations admission lets run at once
    ///   (64) plus idle keep-alive clients, and under a typical 65536 file-descriptor limit
    ///   (keep `ulimit -n` above it);
    /// * hedge: **2 attempts**, **adaptive** delay (p90 of recent TTFTs), budget **10%**, the
    ///   layer's own defaults;
    /// * hedge routing: load-aware primaries, outlier ejection, failover budget **20%**, no
    ///   slot limit (the layers' own defaults);
    /// * timeouts and the client's deadline: see [`TimeoutConfig::default`];
    /// * admission: capacity **64** (a typical vLLM replica runs tens of sequences), adaptive
    ///   limit **on** under it (nobody knows an upstream's knee in advance) with the layer's
    ///   minimum ([`DEFAULT_MIN_LIMIT`](tailguard::admission::adaptive::DEFAULT_MIN_LIMIT)),
    ///   queue **128**, queue timeout **2 s** (past that a client is better off retrying
    ///   elsewhere);
    /// * priority: header `x-priority`, default class `standard`, `interactive` keeps **50%** of
    ///   capacity under contention;
    /// * mocks: **3** replicas, the last congested.
    fn default() -> Self {
        Config {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            upstreams: Vec::new(),
            models: Vec::new(),
            shutdown_grace: Duration::from_secs(10),
            max_request_bytes: tailguard::core::DEFAULT_REPLAY_CAP,
            header_read_timeout: Duration::from_secs(10),
            keep_alive_timeout: Duration::from_secs(75),
            max_connections: 4096,
            hedge: HedgeConfig {
                max_attempts: 2,
                delay: HedgeDelaySetting::Adaptive,
                budget_ratio: 0.1,
                failover_budget_ratio: 0.2,
                least_wait: true,
                outlier_ejection: true,
                replica_slots: None,
            },
            timeout: TimeoutConfig::default(),
            admission: AdmissionConfig {
                capacity: 64,
                adaptive: true,
                min_limit: tailguard::admission::adaptive::DEFAULT_MIN_LIMIT,
                queue_len: 128,
                queue_timeout: Duration::from_secs(2),
            },
            priority: PriorityConfig {
                header: Some(tailguard::priority::DEFAULT_HEADER.to_owned()),
                default: Priority::standard(),
                interactive_share: 0.5,
            },
            mock: MockConfig {
                replicas: 3,
                script: DEFAULT_MOCK_SCRIPT.to_owned(),
                congested_script: DEFAULT_CONGESTED_SCRIPT.to_owned(),
            },
            cluster: ClusterConfig::default(),
        }
    }
}

/// Script of the healthy embedded replicas: a first token after about 150 ms, 24 tokens about
/// 20 ms apart.
pub const DEFAULT_MOCK_SCRIPT: &str = "ttft=lognormal(150ms,0.3),tokens=24,gap=lognormal(20ms,0.3)";
/// Script of the congested embedded replica: half of its first tokens take 4 s (keepalives
/// meanwhile), which the hedge routes around.
pub const DEFAULT_CONGESTED_SCRIPT: &str =
    "ttft=mix(0.5,150ms,4s),tokens=24,gap=lognormal(20ms,0.3),keepalive=1s";

/// A configuration error: names the key (or flag) at fault.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

pub(super) fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// Parses a class name of the standard set.
pub fn parse_priority(s: &str) -> Option<Priority> {
    Priority::standard_set()
        .into_iter()
        .find(|p| p.name().eq_ignore_ascii_case(s.trim()))
}

/// The model name the gateway lists when it runs over embedded mocks.
pub const MOCK_MODEL: &str = "mock-llm";
