//! The gateway's command line: one flag (and environment variable) per key of the file.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

use tailguard::admission::FailMode;

use super::file::{
    HedgeDelaySetting, Timer, parse_duration, parse_fail, parse_hedge_delay, parse_timer,
};

/// The gateway's command line (each flag can also come from the environment variable named in
/// its help).
#[derive(Parser, Debug, Default, Clone)]
#[command(
    name = "gateway",
    about = "An OpenAI-compatible LLM gateway guarded by every tailguard layer",
    long_about = "An OpenAI-compatible LLM gateway guarded by every tailguard layer.\n\n\
        Precedence: flag, then environment variable, then the TOML file (--config), then the \
        default. With no --upstream, embedded mock replicas are started (one of them congested)."
)]
pub struct Args {
    /// TOML configuration file (see crates/gateway/gateway.toml).
    #[arg(long, env = "TAILGUARD_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on [default: 127.0.0.1:8080; port 0 picks a free port].
    #[arg(long, env = "TAILGUARD_LISTEN", value_name = "ADDR")]
    pub listen: Option<SocketAddr>,
    /// Upstream replica base URL, repeatable (env: comma-separated) [default: embedded mocks].
    #[arg(
        long = "upstream",
        env = "TAILGUARD_UPSTREAMS",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub upstreams: Vec<String>,
    /// Model names served (bounded `model` metric label; listed by /v1/models), comma-separated.
    #[arg(
        long = "model",
        env = "TAILGUARD_MODELS",
        value_name = "NAME",
        value_delimiter = ','
    )]
    pub models: Vec<String>,
    /// How long in-flight streams may run on after Ctrl-C [default: 10s].
    #[arg(long, env = "TAILGUARD_SHUTDOWN_GRACE", value_name = "DURATION", value_parser = parse_duration)]
    pub shutdown_grace: Option<Duration>,
    /// Largest request body accepted [default: 4194304].
    #[arg(long, env = "TAILGUARD_MAX_REQUEST_BYTES", value_name = "BYTES")]
    pub max_request_bytes: Option<usize>,
    /// Time a client has to send a request head, from accept or from its first byte after an
    /// idle period [default: 10s].
    #[arg(long, env = "TAILGUARD_HEADER_READ_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub header_read_timeout: Option<Duration>,
    /// How long a client connection may stay open with no request in flight [default: 75s].
    #[arg(long, env = "TAILGUARD_KEEP_ALIVE_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub keep_alive_timeout: Option<Duration>,
    /// Most client connections open at once; past it new ones are closed at once [default: 4096].
    #[arg(long, env = "TAILGUARD_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<usize>,

    /// Attempts per request, the primary included; 1 disables hedging [default: 2].
    #[arg(long, env = "TAILGUARD_HEDGE_MAX_ATTEMPTS", value_name = "N")]
    pub hedge_max_attempts: Option<u8>,
    /// Hedge delay: `adaptive` (p90 of recent TTFTs) or a duration such as `300ms` [default: adaptive].
    #[arg(long, env = "TAILGUARD_HEDGE_DELAY", value_name = "DELAY", value_parser = parse_hedge_delay)]
    pub hedge_delay: Option<HedgeDelaySetting>,
    /// Share of requests that may send an extra attempt [default: 0.1].
    #[arg(long, env = "TAILGUARD_HEDGE_BUDGET_RATIO", value_name = "RATIO")]
    pub hedge_budget_ratio: Option<f64>,
    /// Share of requests that may fail over at once after a failure before the first token,
    /// a budget separate from the hedge budget; 0 turns failover off [default: 0.2].
    #[arg(long, env = "TAILGUARD_FAILOVER_BUDGET_RATIO", value_name = "RATIO")]
    pub failover_budget_ratio: Option<f64>,
    /// How primaries are routed: `least-wait` (p2c over expected first-token wait) or
    /// `round-robin` (no load awareness, no ejection) [default: least-wait].
    #[arg(long, env = "TAILGUARD_ROUTING", value_name = "POLICY")]
    pub routing: Option<String>,
    /// Outlier ejection of failing or very slow replicas: `on` or `off` [default: on].
    #[arg(long, env = "TAILGUARD_OUTLIER_EJECTION", value_name = "ON_OFF")]
    pub outlier_ejection: Option<String>,
    /// Most concurrent attempts per replica (e.g. 1 for single-slot llama.cpp); admission's
    /// capacity then defaults to the sum of the slots [default: no limit].
    #[arg(long, env = "TAILGUARD_REPLICA_SLOTS", value_name = "N")]
    pub replica_slots: Option<u32>,

    /// Time allowed until response headers, or `off` [default: 30s, the first-token limit: the hedge holds headers until a first token].
    #[arg(long, env = "TAILGUARD_TIMEOUT_HEAD", value_name = "DURATION", value_parser = parse_timer)]
    pub timeout_head: Option<Timer>,
    /// Time allowed until the first token, or `off` [default: 30s].
    #[arg(long, env = "TAILGUARD_TIMEOUT_FIRST_TOKEN", value_name = "DURATION", value_parser = parse_timer)]
    pub timeout_first_token: Option<Timer>,
    /// Longest gap between events after the first token (keepalives do not count), or `off` [default: 15s].
    #[arg(long, env = "TAILGUARD_TIMEOUT_IDLE", value_name = "DURATION", value_parser = parse_timer)]
    pub timeout_idle: Option<Timer>,
    /// Longest gap in which no bytes at all arrive after the headers (keepalives count), or
    /// `off` [default: off].
    #[arg(long, env = "TAILGUARD_TIMEOUT_LIVENESS", value_name = "DURATION", value_parser = parse_timer)]
    pub timeout_liveness: Option<Timer>,
    /// Header a client's own deadline is read from (seconds, `2.5`, or `1500ms`), or `off`;
    /// gRPC requests use `grpc-timeout` [default: x-request-timeout].
    #[arg(long, env = "TAILGUARD_DEADLINE_HEADER", value_name = "NAME")]
    pub deadline_header: Option<String>,
    /// Send the budget left on upstream in that header: `on` or `off` (`grpc-timeout` always
    /// is) [default: off].
    #[arg(long, env = "TAILGUARD_PROPAGATE_DEADLINE", value_name = "ON_OFF")]
    pub propagate_deadline: Option<String>,
    /// Deadline for the whole request, body included, or `off` [default: 600s].
    #[arg(long, env = "TAILGUARD_TIMEOUT_TOTAL", value_name = "DURATION", value_parser = parse_timer)]
    pub timeout_total: Option<Timer>,

    /// Concurrent generations (held until each stream ends); the ceiling of the adaptive
    /// limit [default: 64].
    #[arg(long, env = "TAILGUARD_ADMISSION_CAPACITY", value_name = "N")]
    pub admission_capacity: Option<u32>,
    /// Adapt the limit to the upstreams' time to first token, under the capacity: `true` or
    /// `false` [default: true].
    #[arg(long, env = "TAILGUARD_ADMISSION_ADAPTIVE", value_name = "BOOL",
        value_parser = clap::builder::BoolishValueParser::new())]
    pub admission_adaptive: Option<bool>,
    /// Lowest adaptive limit; baseline probes run at it [default: 4].
    #[arg(long, env = "TAILGUARD_ADMISSION_MIN_LIMIT", value_name = "N")]
    pub admission_min_limit: Option<u32>,
    /// Requests that may wait for capacity; 0 refuses at once when full [default: 128].
    #[arg(long, env = "TAILGUARD_ADMISSION_QUEUE_LEN", value_name = "N")]
    pub admission_queue_len: Option<usize>,
    /// Longest wait in the queue before a 503 [default: 2s].
    #[arg(long, env = "TAILGUARD_ADMISSION_QUEUE_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub admission_queue_timeout: Option<Duration>,

    /// Header in which clients name their class, or `off` [default: x-priority].
    #[arg(long, env = "TAILGUARD_PRIORITY_HEADER", value_name = "NAME")]
    pub priority_header: Option<String>,
    /// Class of requests nothing classified [default: standard].
    #[arg(long, env = "TAILGUARD_PRIORITY_DEFAULT", value_name = "CLASS")]
    pub priority_default: Option<String>,
    /// Share of capacity reserved for `interactive` under contention, 0 for none [default: 0.5].
    #[arg(
        long,
        env = "TAILGUARD_PRIORITY_INTERACTIVE_SHARE",
        value_name = "SHARE"
    )]
    pub priority_interactive_share: Option<f64>,

    /// Embedded mock replicas started when no upstream is configured [default: 3].
    #[arg(long, env = "TAILGUARD_MOCK_REPLICAS", value_name = "N")]
    pub mock_replicas: Option<usize>,
    /// Script of the healthy embedded replicas (tailguard-mock header syntax).
    #[arg(long, env = "TAILGUARD_MOCK_SCRIPT", value_name = "SCRIPT")]
    pub mock_script: Option<String>,
    /// Script of the congested embedded replica (the last one).
    #[arg(long, env = "TAILGUARD_MOCK_CONGESTED_SCRIPT", value_name = "SCRIPT")]
    pub mock_congested_script: Option<String>,

    /// Cluster mode (`--redis` and friends).
    #[command(flatten)]
    pub cluster: ClusterArgs,
}

/// Cluster-mode flags (`[cluster]` in the file).
#[derive(clap::Args, Debug, Default, Clone)]
pub struct ClusterArgs {
    /// Redis URL (`redis://host:port/db`): turns cluster mode on [default: off].
    #[arg(long, env = "TAILGUARD_REDIS", value_name = "URL")]
    pub redis: Option<String>,
    /// Cluster-wide capacity in units, shared by all gateways [default: the admission capacity].
    #[arg(long, env = "TAILGUARD_CLUSTER_CAPACITY", value_name = "N")]
    pub cluster_capacity: Option<u32>,
    /// Name of the shared pool and budgets (gateways sharing a capacity use the same one)
    /// [default: gateway].
    #[arg(long, env = "TAILGUARD_CLUSTER_NAME", value_name = "NAME")]
    pub cluster_name: Option<String>,
    /// While Redis is unreachable: `open` (local limits) or `closed` (503) [default: open].
    #[arg(long, env = "TAILGUARD_CLUSTER_FAIL", value_name = "MODE", value_parser = parse_fail)]
    pub cluster_fail: Option<FailMode>,
    /// Timeout of each Redis call [default: 50ms].
    #[arg(long, env = "TAILGUARD_REDIS_TIMEOUT", value_name = "DURATION", value_parser = parse_duration)]
    pub redis_timeout: Option<Duration>,
    /// Lifetime of an unrenewed admission lease: the longest a killed gateway's capacity stays
    /// lost (at least 1s; renewed every third of it) [default: 10s].
    #[arg(long, env = "TAILGUARD_CLUSTER_LEASE_TTL", value_name = "DURATION", value_parser = parse_duration)]
    pub cluster_lease_ttl: Option<Duration>,
}
