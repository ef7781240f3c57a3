//! Every setting of the gateway, once: its file key, flag, environment variable, help, default
//! and the reason for it, and its check. The doc comment of a setting is its `--help` text.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use http::{HeaderName, Uri};
use tailguard::admission::FailMode;
use tailguard::core::Priority;

use super::tenants::{TenantSpec, tenant_specs};
use super::values::*;
use crate::Routing;

settings! {
    /// The gateway's configuration as written: flags, environment variables or the TOML file
    /// (every field unset unless given; see [`Config::resolve`](crate::Config::resolve)).
    #[derive(clap::Parser)]
    #[command(
        name = "gateway",
        about = "An OpenAI-compatible LLM gateway guarded by every tailguard layer",
        long_about = "An OpenAI-compatible LLM gateway guarded by every tailguard layer.\n\n\
            Precedence: flag, then environment variable, then the TOML file (--config), then the \
            default. With no --upstream, embedded mock replicas are started (one of them congested)."
    )]
    pub struct Args => Config, keys "" {
        /// TOML configuration file (see crates/gateway/gateway.toml).
        #[arg(long = "config", env = "TAILGUARD_CONFIG", value_name = "FILE")]
        #[serde(skip)]
        config: PathBuf => Option<PathBuf>;
        /// Address to listen on (port 0 picks a free port); loopback, so a demo opens no port to
        /// the network.
        #[arg(long = "listen", env = "TAILGUARD_LISTEN", value_name = "ADDR")]
        listen: SocketAddr = "127.0.0.1:8080";
        /// Upstream replica base URL, repeatable (env: comma-separated); none: embedded mocks.
        #[arg(long = "upstream", env = "TAILGUARD_UPSTREAMS", value_name = "URL", value_delimiter = ',')]
        upstreams: Vec<String> => Vec<Uri>, check upstreams;
        /// Model names served (bounded `model` metric label; listed by /v1/models),
        /// comma-separated; none: `mock-llm` over mocks, else the first upstream's list.
        #[arg(long = "model", env = "TAILGUARD_MODELS", value_name = "NAME", value_delimiter = ',')]
        models: Vec<String>;
        /// How long in-flight streams may run on after Ctrl-C: most answers finish within it, and
        /// an orchestrator's kill timeout (30s in Kubernetes) leaves room for the rest.
        #[arg(long = "shutdown-grace", env = "TAILGUARD_SHUTDOWN_GRACE", value_name = "DURATION")]
        shutdown_grace: Dur => Duration = "10s";
        /// Largest request body accepted: the hedge's replay cap, so every body can be hedged.
        #[arg(long = "max-request-bytes", env = "TAILGUARD_MAX_REQUEST_BYTES", value_name = "BYTES")]
        max_request_bytes: usize = "4194304";
        /// Time a client has to send a request head, from accept or from its first byte after an
        /// idle period: covers a slow mobile link, still bounds a slowloris client.
        #[arg(long = "header-read-timeout", env = "TAILGUARD_HEADER_READ_TIMEOUT", value_name = "DURATION")]
        header_read_timeout: Dur => Duration = "10s", check positive;
        /// How long a client connection may stay open with no request in flight: above the 60s
        /// idle timeout of common load balancers, so the balancer closes idle connections.
        #[arg(long = "keep-alive-timeout", env = "TAILGUARD_KEEP_ALIVE_TIMEOUT", value_name = "DURATION")]
        keep_alive_timeout: Dur => Duration = "75s", check positive;
        /// Most client connections open at once; past it new ones are closed at once. Far above
        /// the generations admission runs plus idle clients; keep `ulimit -n` above it.
        #[arg(long = "max-connections", env = "TAILGUARD_MAX_CONNECTIONS", value_name = "N")]
        max_connections: usize = "4096", check at_least_1;
        [hedge]: HedgeArgs => HedgeConfig;
        [timeout]: TimeoutArgs => TimeoutConfig;
        [admission]: AdmissionArgs => AdmissionConfig;
        [priority]: PriorityArgs => PriorityConfig;
        [tenant]: TenantArgs => TenantConfig;
        [mock]: MockArgs => MockConfig;
        [cluster]: ClusterArgs => ClusterConfig;
    }
}

settings! {
    /// `[hedge]`: `FirstTokenHedge` and the `ReplicaSet` under it (the layers' own defaults).
    #[derive(clap::Args)]
    pub struct HedgeArgs => HedgeConfig, keys "hedge." {
        /// Attempts per request, the primary included; 1 disables hedging.
        #[arg(long = "hedge-max-attempts", env = "TAILGUARD_HEDGE_MAX_ATTEMPTS", value_name = "N")]
        max_attempts: u8 = "2", check attempts;
        /// Hedge delay: `adaptive` (p90 of recent TTFTs) or a duration such as `300ms`.
        #[arg(long = "hedge-delay", env = "TAILGUARD_HEDGE_DELAY", value_name = "DELAY")]
        delay: HedgeDelaySetting = "adaptive";
        /// Share of requests that may send an extra attempt after a slow first token; 0 turns
        /// such hedges off.
        #[arg(long = "hedge-budget-ratio", env = "TAILGUARD_HEDGE_BUDGET_RATIO", value_name = "RATIO")]
        budget_ratio: f64 = "0.1", check budget_ratio;
        /// Share of requests that may fail over at once after a failure before the first token,
        /// a budget separate from the hedge budget; 0 turns failover off.
        #[arg(long = "failover-budget-ratio", env = "TAILGUARD_FAILOVER_BUDGET_RATIO", value_name = "RATIO")]
        failover_budget_ratio: f64 = "0.2", check budget_ratio;
        /// How primaries are routed: `least-wait` (p2c over expected first-token wait) or
        /// `round-robin` (no load awareness, no ejection).
        #[arg(long = "routing", env = "TAILGUARD_ROUTING", value_name = "POLICY")]
        routing: String => Routing = "least-wait", check routing;
        /// Outlier ejection of failing replicas, for a growing period and never below half of
        /// them: `on` or `off` (`true` or `false` in the file).
        #[arg(long = "outlier-ejection", env = "TAILGUARD_OUTLIER_EJECTION", value_name = "ON_OFF")]
        outlier_ejection: OnOff => bool = "on";
        /// Most concurrent attempts per replica (e.g. 1 for single-slot llama.cpp); admission's
        /// capacity then defaults to the sum of the slots; none: no limit.
        #[arg(long = "replica-slots", env = "TAILGUARD_REPLICA_SLOTS", value_name = "N")]
        replica_slots: u32 => Option<u32>, check at_least_1;
        /// Resume a stream that breaks after its first token (reset, truncation, an in-band
        /// error, a bare `[DONE]` with no finish reason) on another replica, as one stream for
        /// the client (OpenAI chat and completions, Anthropic messages): `on` or `off`.
        #[arg(long = "resume", env = "TAILGUARD_RESUME", value_name = "ON_OFF")]
        resume: OnOff => bool = "off";
    }
}

settings! {
    /// `[timeout]`: `SseIdleTimeout`'s timers (`None`: off) and how a client's deadline is read.
    #[derive(clap::Args)]
    pub struct TimeoutArgs => TimeoutConfig, keys "timeout." {
        /// Time allowed until response headers, or `off`: the first-token limit, since the hedge
        /// holds headers until a first token (and some servers send them only when a slot frees).
        #[arg(long = "timeout-head", env = "TAILGUARD_TIMEOUT_HEAD", value_name = "DURATION")]
        head: Timer => Option<Duration> = "30s", check timer;
        /// Time allowed until the first token, or `off` (long prompts take time to prefill).
        #[arg(long = "timeout-first-token", env = "TAILGUARD_TIMEOUT_FIRST_TOKEN", value_name = "DURATION")]
        first_token: Timer => Option<Duration> = "30s", check timer;
        /// Longest gap between events after the first token (keepalives do not count), or `off`:
        /// a decoding server sends tokens tens of ms apart, so 15s of silence is a stall.
        #[arg(long = "timeout-idle", env = "TAILGUARD_TIMEOUT_IDLE", value_name = "DURATION")]
        idle: Timer => Option<Duration> = "15s", check timer;
        /// Longest gap in which no bytes at all arrive after the headers (keepalives count), or
        /// `off`: the right limit sits above the upstream's keepalive interval, unknown here.
        #[arg(long = "timeout-liveness", env = "TAILGUARD_TIMEOUT_LIVENESS", value_name = "DURATION")]
        liveness: Timer => Option<Duration> = "off", check timer;
        /// Deadline for the whole request, body included, or `off` (long generations).
        #[arg(long = "timeout-total", env = "TAILGUARD_TIMEOUT_TOTAL", value_name = "DURATION")]
        total: Timer => Option<Duration> = "600s", check timer;
        /// Header a client's own deadline is read from (seconds, `2.5`, or `1500ms`; it can only
        /// shorten its own request), or `off`; gRPC requests use `grpc-timeout`.
        #[arg(long = "deadline-header", env = "TAILGUARD_DEADLINE_HEADER", value_name = "NAME")]
        deadline_header: String => Option<HeaderName> = "x-request-timeout", check deadline_header;
        /// Send the budget left on upstream in that header: `on` or `off` (`grpc-timeout` always
        /// is); off, as upstreams do not know the header.
        #[arg(long = "propagate-deadline", env = "TAILGUARD_PROPAGATE_DEADLINE", value_name = "ON_OFF")]
        propagate_deadline: OnOff => bool = "off";
        /// A stream must say how it ended, `on` or `off`: its terminal event (`[DONE]`,
        /// `message_stop`), after a finish reason. One that does not was cut short (a closed
        /// connection, an interrupting server's bare `[DONE]`) and ends with an in-band error
        /// instead of passing as whole. Off only for an upstream known to end otherwise.
        #[arg(long = "require-finish", env = "TAILGUARD_REQUIRE_FINISH", value_name = "ON_OFF")]
        require_finish: OnOff => bool = "on";
    }
}

settings! {
    /// `[admission]`: `BoundedAdmission`.
    #[derive(clap::Args)]
    pub struct AdmissionArgs => AdmissionConfig, keys "admission." {
        /// Concurrent generations (held until each stream ends); the ceiling of the adaptive
        /// limit. With `--replica-slots` it defaults to the slots' sum (what the replicas take);
        /// otherwise to the connection cap's default: the gateway knows no replica's capacity,
        /// and a ceiling of its own would refuse what a plain proxy serves (do no harm).
        #[arg(long = "admission-capacity", env = "TAILGUARD_ADMISSION_CAPACITY", value_name = "N")]
        capacity: u32 = "4096", check at_least_1;
        /// Adapt the limit to the upstreams' time to first token, under the capacity: `true` or
        /// `false`. Off: first tokens also slow for load the gateway cannot see (other clients
        /// of a replica), and the limit then refused what the replicas served.
        #[arg(long = "admission-adaptive", env = "TAILGUARD_ADMISSION_ADAPTIVE", value_name = "BOOL",
            value_parser = clap::builder::BoolishValueParser::new())]
        adaptive: bool = "false";
        /// Lowest adaptive limit; baseline probes run at it (the layer's own default).
        #[arg(long = "admission-min-limit", env = "TAILGUARD_ADMISSION_MIN_LIMIT", value_name = "N")]
        min_limit: u32 = "4", check at_least_1;
        /// Requests that may wait for capacity; 0 refuses at once when full.
        #[arg(long = "admission-queue-len", env = "TAILGUARD_ADMISSION_QUEUE_LEN", value_name = "N")]
        queue_len: usize = "128";
        /// Longest wait in the queue before a 503: the first-token limit's default, so a
        /// request the replicas would start within that limit is never refused for waiting.
        #[arg(long = "admission-queue-timeout", env = "TAILGUARD_ADMISSION_QUEUE_TIMEOUT", value_name = "DURATION")]
        queue_timeout: Dur => Duration = "30s";
    }
}

settings! {
    /// `[priority]`: `PriorityClass`.
    #[derive(clap::Args)]
    pub struct PriorityArgs => PriorityConfig, keys "priority." {
        /// Header in which clients name their class, or `off` (clients have no say).
        #[arg(long = "priority-header", env = "TAILGUARD_PRIORITY_HEADER", value_name = "NAME")]
        header: String => Option<HeaderName> = "x-priority", check priority_header;
        /// Class of requests nothing classified.
        #[arg(long = "priority-default", env = "TAILGUARD_PRIORITY_DEFAULT", value_name = "CLASS")]
        default: String => Priority = "standard", check priority_class;
        /// Share of capacity reserved for `interactive` under contention, 0 for none.
        #[arg(long = "priority-interactive-share", env = "TAILGUARD_PRIORITY_INTERACTIVE_SHARE", value_name = "SHARE")]
        interactive_share: f64 = "0.5", check share;
    }
}

settings! {
    /// `[tenant]`: who each request is for (a header, else a hash of its API key), and the
    /// tenants' token budgets (none by default).
    #[derive(clap::Args)]
    pub struct TenantArgs => TenantConfig, keys "tenant." {
        /// Header naming the tenant, or `off` (API keys decide). Trust it only where clients
        /// cannot set it (an authenticating proxy in front sets it).
        #[arg(long = "tenant-header", env = "TAILGUARD_TENANT_HEADER", value_name = "NAME")]
        header: String => Option<HeaderName> = "x-tenant", check priority_header;
        /// A request the header names no tenant for is the tenant of its API key (a hash of
        /// it, never the key): `on` or `off`.
        #[arg(long = "tenant-api-key", env = "TAILGUARD_TENANT_API_KEY", value_name = "ON_OFF")]
        api_key: OnOff => bool = "on";
        /// Fair queueing across tenants by tokens in admission (`on` or `off`): waiters of a
        /// class are served least-served tenant first; it reorders, never refuses.
        #[arg(long = "tenant-fairness", env = "TAILGUARD_TENANT_FAIRNESS", value_name = "ON_OFF")]
        fairness: OnOff => bool = "on";
        /// Unnamed tenants labelled by their own id in metrics (the first seen); the rest share
        /// the label `other`, so the label set stays bounded.
        #[arg(long = "tenant-label-limit", env = "TAILGUARD_TENANT_LABEL_LIMIT", value_name = "N")]
        label_limit: usize = "0";
        /// Output tokens a budget reserves for a request that sets no output limit.
        #[arg(long = "tenant-default-max-tokens", env = "TAILGUARD_TENANT_DEFAULT_MAX_TOKENS", value_name = "N")]
        default_max_tokens: u32 = "1024", check at_least_1;
        /// Every tenant's budget of prompt tokens per minute; none: no limit.
        #[arg(long = "tenant-input-tokens-per-minute", env = "TAILGUARD_TENANT_INPUT_TOKENS_PER_MINUTE", value_name = "N")]
        input_tokens_per_minute: u64 => Option<u64>;
        /// Every tenant's budget of output tokens per minute; none: no limit.
        #[arg(long = "tenant-output-tokens-per-minute", env = "TAILGUARD_TENANT_OUTPUT_TOKENS_PER_MINUTE", value_name = "N")]
        output_tokens_per_minute: u64 => Option<u64>;
        /// Every tenant's budget of prompt and output tokens per minute; none: no limit.
        #[arg(long = "tenant-total-tokens-per-minute", env = "TAILGUARD_TENANT_TOTAL_TOKENS_PER_MINUTE", value_name = "N")]
        total_tokens_per_minute: u64 => Option<u64>;
        /// Every tenant's budget of prompt tokens per day; none: no limit.
        #[arg(long = "tenant-input-tokens-per-day", env = "TAILGUARD_TENANT_INPUT_TOKENS_PER_DAY", value_name = "N")]
        input_tokens_per_day: u64 => Option<u64>;
        /// Every tenant's budget of output tokens per day; none: no limit.
        #[arg(long = "tenant-output-tokens-per-day", env = "TAILGUARD_TENANT_OUTPUT_TOKENS_PER_DAY", value_name = "N")]
        output_tokens_per_day: u64 => Option<u64>;
        /// Every tenant's budget of prompt and output tokens per day; none: no limit.
        #[arg(long = "tenant-total-tokens-per-day", env = "TAILGUARD_TENANT_TOTAL_TOKENS_PER_DAY", value_name = "N")]
        total_tokens_per_day: u64 => Option<u64>;
        /// Named tenants (repeatable; env: `;`-separated): `NAME:weight=2,output_tokens_per_minute=1000`;
        /// a weight is a share of contended capacity, named limits replace the defaults.
        #[arg(long = "tenant", env = "TAILGUARD_TENANTS", value_name = "SPEC", value_delimiter = ';')]
        named: Vec<String> => Vec<TenantSpec>, check tenant_specs;
    }
}

settings! {
    /// `[mock]`: the embedded mock replicas, started when no upstream is configured.
    #[derive(clap::Args)]
    pub struct MockArgs => MockConfig, keys "mock." {
        /// Embedded mock replicas started when no upstream is configured; the last is congested.
        #[arg(long = "mock-replicas", env = "TAILGUARD_MOCK_REPLICAS", value_name = "N")]
        replicas: usize = "3";
        /// Script of the healthy embedded replicas (tailguard-mock header syntax): a first token
        /// after about 150ms, 24 tokens about 20ms apart.
        #[arg(long = "mock-script", env = "TAILGUARD_MOCK_SCRIPT", value_name = "SCRIPT")]
        script: String = "ttft=lognormal(150ms,0.3),tokens=24,gap=lognormal(20ms,0.3)";
        /// Script of the congested embedded replica (the last one): half of its first tokens
        /// take 4s (keepalives meanwhile), which the hedge routes around.
        #[arg(long = "mock-congested-script", env = "TAILGUARD_MOCK_CONGESTED_SCRIPT", value_name = "SCRIPT")]
        congested_script: String = "ttft=mix(0.5,150ms,4s),tokens=24,gap=lognormal(20ms,0.3),keepalive=1s";
    }
}

settings! {
    /// `[cluster]`: cluster mode (Redis), see [`ClusterConfig::apply`].
    #[derive(clap::Args)]
    pub struct ClusterArgs => ClusterConfig, keys "cluster." {
        /// Redis URL (`redis://host:port/db`): turns cluster mode on; none: off.
        #[arg(long = "redis", env = "TAILGUARD_REDIS", value_name = "URL")]
        redis: String => Option<String>, check redis_url;
        /// Cluster-wide capacity in units, shared by all gateways; none: the admission capacity.
        #[arg(long = "cluster-capacity", env = "TAILGUARD_CLUSTER_CAPACITY", value_name = "N")]
        capacity: u32 => Option<u32>, check at_least_1;
        /// Name of the shared pool and budgets (gateways sharing a capacity use the same one).
        #[arg(long = "cluster-name", env = "TAILGUARD_CLUSTER_NAME", value_name = "NAME")]
        name: String = "gateway";
        /// While Redis is unreachable: `open` (local limits) or `closed` (503).
        #[arg(long = "cluster-fail", env = "TAILGUARD_CLUSTER_FAIL", value_name = "MODE")]
        fail: String => FailMode = "open", check fail_mode;
        /// Timeout of each Redis call (a same-datacenter round trip is well under 1ms).
        #[arg(long = "redis-timeout", env = "TAILGUARD_REDIS_TIMEOUT", value_name = "DURATION")]
        timeout: Dur => Duration = "50ms";
        /// Lifetime of an unrenewed admission lease: the longest a killed gateway's capacity stays
        /// lost (at least 1s; renewed every third of it).
        #[arg(long = "cluster-lease-ttl", env = "TAILGUARD_CLUSTER_LEASE_TTL", value_name = "DURATION")]
        lease_ttl: Dur => Duration = "10s";
    }
}
