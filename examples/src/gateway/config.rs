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

use super::args::Args;
use super::cluster::ClusterConfig;
use super::file::{FileConfig, HedgeDelaySetting, key_at, parse_fail};
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
    /// Concurrent requests (one unit each), held until the stream ends.
    pub capacity: u32,
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
    /// * admission: capacity **64** (a typical vLLM replica runs tens of sequences), queue
    ///   **128**, queue timeout **2 s** (past that a client is better off retrying elsewhere);
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

impl Config {
    /// Resolves `args` over the file they name (if any) over the defaults.
    pub fn load(args: &Args) -> Result<Config, ConfigError> {
        let file = match &args.config {
            Some(path) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    ConfigError(format!("cannot read config file {}: {e}", path.display()))
                })?;
                Self::parse_file(&text)
                    .map_err(|e| ConfigError(format!("in {}: {}", path.display(), e.0)))?
            }
            None => FileConfig::default(),
        };
        Self::resolve(file, args)
    }

    /// Parses the TOML text of a configuration file.
    pub fn parse_file(text: &str) -> Result<FileConfig, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let key = e.span().and_then(|span| key_at(text, span.start));
            match key {
                Some(key) => ConfigError(format!("invalid configuration, key `{key}`: {e}")),
                None => ConfigError(format!("invalid configuration: {e}")),
            }
        })
    }

    /// Merges `file` and `args` (args win) over the defaults and validates the result.
    pub fn resolve(file: FileConfig, args: &Args) -> Result<Config, ConfigError> {
        let mut c = Config::default();
        c.listen = pick(args.listen, file.listen, c.listen);
        let upstreams = if args.upstreams.is_empty() {
            &file.upstreams
        } else {
            &args.upstreams
        };
        c.upstreams = upstreams
            .iter()
            .map(|u| parse_upstream(u))
            .collect::<Result<_, _>>()?;
        c.models = if args.models.is_empty() {
            file.models.clone()
        } else {
            args.models.clone()
        };
        c.shutdown_grace = pick(
            args.shutdown_grace,
            file.shutdown_grace.map(|d| d.0),
            c.shutdown_grace,
        );
        c.max_request_bytes = pick(
            args.max_request_bytes,
            file.max_request_bytes,
            c.max_request_bytes,
        );
        c.resolve_connections(&file, args)?;
        c.resolve_hedge(&file, args)?;
        c.resolve_timeout(&file, args)?;
        c.resolve_admission(&file, args)?;
        c.resolve_priority(&file, args)?;
        c.resolve_cluster(&file, args)?;
        let capacity_set = args.admission_capacity.is_some() || file.admission.capacity.is_some();
        c.resolve_mock(file, args)?;
        // With slots, admission holds what the slots cannot take: its capacity defaults to
        // their sum, so requests wait in admission's queue, not in an upstream's FIFO.
        if let Some(slots) = c.hedge.replica_slots
            && !capacity_set
        {
            let n = if c.upstreams.is_empty() {
                c.mock.replicas
            } else {
                c.upstreams.len()
            };
            c.admission.capacity = slots.saturating_mul(n.max(1) as u32);
        }
        Ok(c)
    }

    fn resolve_connections(&mut self, file: &FileConfig, args: &Args) -> Result<(), ConfigError> {
        self.header_read_timeout = pick(
            args.header_read_timeout,
            file.header_read_timeout.map(|d| d.0),
            self.header_read_timeout,
        );
        self.keep_alive_timeout = pick(
            args.keep_alive_timeout,
            file.keep_alive_timeout.map(|d| d.0),
            self.keep_alive_timeout,
        );
        self.max_connections = pick(
            args.max_connections,
            file.max_connections,
            self.max_connections,
        );
        for (key, v) in [
            (
                "header_read_timeout (--header-read-timeout)",
                self.header_read_timeout,
            ),
            (
                "keep_alive_timeout (--keep-alive-timeout)",
                self.keep_alive_timeout,
            ),
        ] {
            if v.is_zero() {
                return err(format!("{key} must be longer than 0"));
            }
        }
        if self.max_connections == 0 {
            return err("max_connections (--max-connections) must be at least 1");
        }
        Ok(())
    }

    fn resolve_hedge(&mut self, file: &FileConfig, args: &Args) -> Result<(), ConfigError> {
        let h = &mut self.hedge;
        h.max_attempts = pick(
            args.hedge_max_attempts,
            file.hedge.max_attempts,
            h.max_attempts,
        );
        h.delay = pick(args.hedge_delay, file.hedge.delay, h.delay);
        h.budget_ratio = pick(
            args.hedge_budget_ratio,
            file.hedge.budget_ratio,
            h.budget_ratio,
        );
        h.failover_budget_ratio = pick(
            args.failover_budget_ratio,
            file.hedge.failover_budget_ratio,
            h.failover_budget_ratio,
        );
        if !(0.0..=4.0).contains(&h.failover_budget_ratio) {
            return err(format!(
                "hedge.failover_budget_ratio (--failover-budget-ratio) must be between 0 and 4, not {}",
                h.failover_budget_ratio
            ));
        }
        match args
            .routing
            .clone()
            .or(file.hedge.routing.clone())
            .as_deref()
        {
            None | Some("least-wait") => h.least_wait = true,
            Some("round-robin") => h.least_wait = false,
            Some(other) => {
                return err(format!(
                    "hedge.routing (--routing) must be `least-wait` or `round-robin`, not `{other}`"
                ));
            }
        }
        h.outlier_ejection = match args.outlier_ejection.as_deref() {
            None => file.hedge.outlier_ejection.unwrap_or(h.outlier_ejection),
            Some("on") => true,
            Some("off") => false,
            Some(other) => {
                return err(format!(
                    "hedge.outlier_ejection (--outlier-ejection) must be `on` or `off`, not `{other}`"
                ));
            }
        };
        h.replica_slots = args.replica_slots.or(file.hedge.replica_slots);
        if h.replica_slots == Some(0) {
            return err("hedge.replica_slots (--replica-slots) must be at least 1");
        }
        if !(1..=tailguard::hedge::MAX_ATTEMPTS).contains(&h.max_attempts) {
            return err(format!(
                "hedge.max_attempts (--hedge-max-attempts) must be between 1 and {}, not {}",
                tailguard::hedge::MAX_ATTEMPTS,
                h.max_attempts
            ));
        }
        if !(0.0..=4.0).contains(&h.budget_ratio) {
            return err(format!(
                "hedge.budget_ratio (--hedge-budget-ratio) must be between 0 and 4, not {}",
                h.budget_ratio
            ));
        }
        Ok(())
    }

    fn resolve_admission(&mut self, file: &FileConfig, args: &Args) -> Result<(), ConfigError> {
        let a = &mut self.admission;
        a.capacity = pick(args.admission_capacity, file.admission.capacity, a.capacity);
        a.queue_len = pick(
            args.admission_queue_len,
            file.admission.queue_len,
            a.queue_len,
        );
        a.queue_timeout = pick(
            args.admission_queue_timeout,
            file.admission.queue_timeout.map(|d| d.0),
            a.queue_timeout,
        );
        if a.capacity == 0 {
            return err("admission.capacity (--admission-capacity) must be at least 1");
        }
        Ok(())
    }

    fn resolve_priority(&mut self, file: &FileConfig, args: &Args) -> Result<(), ConfigError> {
        let p = &mut self.priority;
        let header = pick(
            args.priority_header.clone(),
            file.priority.header.clone(),
            p.header.clone().unwrap_or_default(),
        );
        p.header = match header.trim() {
            "" | "off" | "none" => None,
            h => {
                if http::HeaderName::from_bytes(h.as_bytes()).is_err() {
                    return err(format!(
                        "priority.header (--priority-header): `{h}` is not a valid header name"
                    ));
                }
                Some(h.to_ascii_lowercase())
            }
        };
        if let Some(d) = args
            .priority_default
            .clone()
            .or(file.priority.default.clone())
        {
            p.default = parse_priority(&d).ok_or_else(|| {
                ConfigError(format!(
                    "priority.default (--priority-default): unknown class `{d}` (one of \
                     critical, interactive, standard, batch, sheddable)"
                ))
            })?;
        }
        p.interactive_share = pick(
            args.priority_interactive_share,
            file.priority.interactive_share,
            p.interactive_share,
        );
        if !(0.0..=1.0).contains(&p.interactive_share) {
            return err(format!(
                "priority.interactive_share (--priority-interactive-share) must be between 0 and 1, not {}",
                p.interactive_share
            ));
        }
        Ok(())
    }

    fn resolve_cluster(&mut self, file: &FileConfig, args: &Args) -> Result<(), ConfigError> {
        let (a, f, c) = (&args.cluster, &file.cluster, &mut self.cluster);
        c.fail = match (a.cluster_fail, &f.fail) {
            (Some(mode), _) => mode,
            (None, Some(s)) => {
                parse_fail(s).map_err(|e| ConfigError(format!("cluster.fail: {e}")))?
            }
            (None, None) => c.fail,
        };
        c.redis = a.redis.clone().or_else(|| f.redis.clone());
        c.capacity = a.cluster_capacity.or(f.capacity);
        c.name = pick(a.cluster_name.clone(), f.name.clone(), c.name.clone());
        c.timeout = pick(a.redis_timeout, f.timeout.map(|d| d.0), c.timeout);
        c.lease_ttl = pick(a.cluster_lease_ttl, f.lease_ttl.map(|d| d.0), c.lease_ttl);
        if c.capacity == Some(0) {
            return err("cluster.capacity (--cluster-capacity) must be at least 1");
        }
        if let Some(url) = &c.redis
            && let Err(e) = tailguard_redis::check_url(url)
        {
            return err(format!("cluster.redis (--redis): {e}"));
        }
        Ok(())
    }

    fn resolve_mock(&mut self, file: FileConfig, args: &Args) -> Result<(), ConfigError> {
        let m = &mut self.mock;
        m.replicas = pick(args.mock_replicas, file.mock.replicas, m.replicas);
        m.script = pick(args.mock_script.clone(), file.mock.script, m.script.clone());
        m.congested_script = pick(
            args.mock_congested_script.clone(),
            file.mock.congested_script,
            m.congested_script.clone(),
        );
        if !self.upstreams.is_empty() {
            return Ok(());
        }
        if m.replicas == 0 {
            return err(
                "mock.replicas (--mock-replicas) must be at least 1 when no upstream is configured",
            );
        }
        for (key, s) in [
            ("mock.script (--mock-script)", &m.script),
            (
                "mock.congested_script (--mock-congested-script)",
                &m.congested_script,
            ),
        ] {
            if let Err(e) = tailguard_mock::Script::new().apply(s) {
                return err(format!("{key}: {e}"));
            }
        }
        if self.models.is_empty() {
            self.models.push(MOCK_MODEL.to_owned());
        }
        Ok(())
    }
}

/// The flag's value, else the file's, else the default.
pub(super) fn pick<T>(arg: Option<T>, file: Option<T>, default: T) -> T {
    arg.or(file).unwrap_or(default)
}

/// The model name the gateway lists when it runs over embedded mocks.
pub const MOCK_MODEL: &str = "mock-llm";

fn parse_upstream(u: &str) -> Result<Uri, ConfigError> {
    let uri: Uri = u
        .trim()
        .trim_end_matches('/')
        .parse()
        .map_err(|e| ConfigError(format!("upstreams (--upstream): `{u}` is not a URL: {e}")))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some("http"), Some(_)) => {}
        _ => {
            return err(format!(
                "upstreams (--upstream): `{u}` must be an http://host:port URL"
            ));
        }
    }
    if uri.path() != "/" && !uri.path().is_empty() {
        return err(format!(
            "upstreams (--upstream): `{u}` must not have a path (requests keep theirs)"
        ));
    }
    Ok(uri)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gateway::file::{Timer, parse_duration, parse_timer};

    #[test]
    fn durations() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5 parsecs").is_err());
        assert_eq!(parse_duration("5 s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_timer("off"), Ok(Timer(None)));
    }

    #[test]
    fn errors_name_the_dotted_key() {
        let text = "listen = \"127.0.0.1:1\"\n[timeout]\nhead = \"1s\"\nidle = \"5 parsecs\"\n";
        let e = Config::parse_file(text).unwrap_err().to_string();
        assert!(e.contains("key `timeout.idle`"), "{e}");
        let e = Config::parse_file("[hedge]\nmax_attempt = 2\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `hedge.max_attempt`"), "{e}");
        let e = Config::parse_file("listen = 8080\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("key `listen`"), "{e}");
    }

    #[test]
    fn cluster_keys_from_the_file_and_flags() {
        let text = "[cluster]\nredis = \"redis://127.0.0.1:6379/\"\ncapacity = 8\n\
                    fail = \"closed\"\nlease_ttl = \"3s\"\n";
        let mut args = Args::default();
        args.cluster.cluster_lease_ttl = Some(Duration::from_secs(2));
        let c = Config::resolve(Config::parse_file(text).unwrap(), &args).unwrap();
        let cluster = &c.cluster;
        assert_eq!(cluster.redis.as_deref(), Some("redis://127.0.0.1:6379/"));
        assert_eq!(
            (cluster.capacity, cluster.fail),
            (Some(8), tailguard::admission::FailMode::Closed)
        );
        assert_eq!(cluster.lease_ttl, Duration::from_secs(2), "the flag wins");
        let c = Config::resolve(Config::parse_file(text).unwrap(), &Args::default()).unwrap();
        assert_eq!(c.cluster.lease_ttl, Duration::from_secs(3));
        let d = Config::resolve(FileConfig::default(), &Args::default()).unwrap();
        assert_eq!(d.cluster.lease_ttl, Duration::from_secs(10));
        assert_eq!(d.cluster.redis, None);
    }

    #[test]
    fn the_deadline_header_liveness_and_propagation_keys() {
        use clap::Parser;
        let args = Args::parse_from(["gateway"]);
        let c = Config::resolve(FileConfig::default(), &args).unwrap();
        assert_eq!(c.timeout.liveness, None);
        assert_eq!(
            c.timeout.deadline_header.as_ref().map(|h| h.as_str()),
            Some("x-request-timeout")
        );
        assert!(!c.timeout.propagate_deadline);

        let text = "[timeout]\nliveness = \"5s\"\ndeadline_header = \"x-deadline\"\npropagate_deadline = true\n";
        let file = Config::parse_file(text).unwrap();
        let c = Config::resolve(file, &args).unwrap();
        assert_eq!(c.timeout.liveness, Some(Duration::from_secs(5)));
        assert_eq!(c.timeout.client_deadline().header().unwrap(), "x-deadline");
        assert!(c.timeout.propagate_deadline);

        let args = Args::parse_from([
            "gateway",
            "--deadline-header",
            "off",
            "--propagate-deadline",
            "on",
        ]);
        let c = Config::resolve(FileConfig::default(), &args).unwrap();
        assert_eq!(c.timeout.client_deadline().header(), None);
        assert!(c.timeout.propagate_deadline);
        let args = Args::parse_from(["gateway", "--deadline-header", "bad header"]);
        let e = Config::resolve(FileConfig::default(), &args).unwrap_err();
        assert!(e.to_string().contains("timeout.deadline_header"), "{e}");
    }
}
