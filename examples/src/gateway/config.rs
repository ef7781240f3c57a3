//! The gateway's configuration: defaults, a TOML file, environment variables and flags.
//!
//! Precedence, highest first: a command-line flag, its environment variable, the TOML file
//! (`--config FILE`), the built-in default. Every key of the file has a flag and a variable:
//! `[timeout] idle = "5s"` is `--timeout-idle 5s` and `TAILGUARD_TIMEOUT_IDLE=5s`.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use http::Uri;
use serde::Deserialize;
use tailguard::core::Priority;

use super::cluster::{ClusterArgs, ClusterConfig, ClusterFile};

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
    /// TOML configuration file (see examples/gateway.toml).
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

    /// Attempts per request, the primary included; 1 disables hedging [default: 2].
    #[arg(long, env = "TAILGUARD_HEDGE_MAX_ATTEMPTS", value_name = "N")]
    pub hedge_max_attempts: Option<u8>,
    /// Hedge delay: `adaptive` (p90 of recent TTFTs) or a duration such as `300ms` [default: adaptive].
    #[arg(long, env = "TAILGUARD_HEDGE_DELAY", value_name = "DELAY", value_parser = parse_hedge_delay)]
    pub hedge_delay: Option<HedgeDelaySetting>,
    /// Share of requests that may send an extra attempt [default: 0.1].
    #[arg(long, env = "TAILGUARD_HEDGE_BUDGET_RATIO", value_name = "RATIO")]
    pub hedge_budget_ratio: Option<f64>,

    /// Time allowed until response headers, or `off` [default: 10s].
    #[arg(long, env = "TAILGUARD_TIMEOUT_HEAD", value_name = "DURATION", value_parser = parse_timer)]
    pub timeout_head: Option<Timer>,
    /// Time allowed until the first token, or `off` [default: 30s].
    #[arg(long, env = "TAILGUARD_TIMEOUT_FIRST_TOKEN", value_name = "DURATION", value_parser = parse_timer)]
    pub timeout_first_token: Option<Timer>,
    /// Longest gap between events after the first token (keepalives do not count), or `off` [default: 15s].
    #[arg(long, env = "TAILGUARD_TIMEOUT_IDLE", value_name = "DURATION", value_parser = parse_timer)]
    pub timeout_idle: Option<Timer>,
    /// Deadline for the whole request, body included, or `off` [default: 600s].
    #[arg(long, env = "TAILGUARD_TIMEOUT_TOTAL", value_name = "DURATION", value_parser = parse_timer)]
    pub timeout_total: Option<Timer>,

    /// Concurrent generations (held until each stream ends) [default: 64].
    #[arg(long, env = "TAILGUARD_ADMISSION_CAPACITY", value_name = "N")]
    pub admission_capacity: Option<u32>,
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

/// A timer value: a duration, or `off`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timer(pub Option<Duration>);

/// The hedge delay setting.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HedgeDelaySetting {
    /// The adaptive p90 of recent times to first token.
    Adaptive,
    /// A fixed delay.
    Fixed(Duration),
}

/// Parses `250ms`, `2s`, `1.5s`, `3m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, unit) = match s.find(|c: char| !(c.is_ascii_digit() || c == '.')) {
        Some(i) => s.split_at(i),
        None => {
            return Err(format!(
                "`{s}` has no unit: write e.g. `250ms`, `2s` or `1m`"
            ));
        }
    };
    let n: f64 = num
        .parse()
        .map_err(|_| format!("`{s}` is not a duration: write e.g. `250ms`, `2s` or `1m`"))?;
    let unit = unit.trim();
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("`{s}`: unknown unit `{unit}` (use ms, s, m or h)")),
    };
    Duration::try_from_secs_f64(secs).map_err(|_| format!("`{s}` is out of range"))
}

fn parse_timer(s: &str) -> Result<Timer, String> {
    match s.trim() {
        "off" | "none" => Ok(Timer(None)),
        other => parse_duration(other).map(|d| Timer(Some(d))),
    }
}

fn parse_hedge_delay(s: &str) -> Result<HedgeDelaySetting, String> {
    match s.trim() {
        "adaptive" => Ok(HedgeDelaySetting::Adaptive),
        other => parse_duration(other)
            .map(HedgeDelaySetting::Fixed)
            .map_err(|e| format!("{e}, or `adaptive`")),
    }
}

macro_rules! string_de {
    ($ty:ty, $parse:path) => {
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let s = String::deserialize(d)?;
                $parse(&s).map_err(serde::de::Error::custom)
            }
        }
    };
}

/// A duration in the TOML file (`"250ms"`).
#[derive(Clone, Copy, Debug)]
pub struct Dur(pub Duration);
fn parse_dur(s: &str) -> Result<Dur, String> {
    parse_duration(s).map(Dur)
}
string_de!(Dur, parse_dur);
string_de!(Timer, parse_timer);
string_de!(HedgeDelaySetting, parse_hedge_delay);

/// The TOML file: every key optional, unknown keys refused.
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    /// `listen`
    pub listen: Option<SocketAddr>,
    /// `upstreams`
    pub upstreams: Vec<String>,
    /// `models`
    pub models: Vec<String>,
    /// `shutdown_grace`
    pub shutdown_grace: Option<Dur>,
    /// `max_request_bytes`
    pub max_request_bytes: Option<usize>,
    /// `[hedge]`
    pub hedge: HedgeFile,
    /// `[timeout]`
    pub timeout: TimeoutFile,
    /// `[admission]`
    pub admission: AdmissionFile,
    /// `[priority]`
    pub priority: PriorityFile,
    /// `[mock]`
    pub mock: MockFile,
    /// `[cluster]`
    pub cluster: ClusterFile,
}

/// `[hedge]`
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct HedgeFile {
    /// `max_attempts`
    pub max_attempts: Option<u8>,
    /// `delay`
    pub delay: Option<HedgeDelaySetting>,
    /// `budget_ratio`
    pub budget_ratio: Option<f64>,
}

/// `[timeout]`
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct TimeoutFile {
    /// `head`
    pub head: Option<Timer>,
    /// `first_token`
    pub first_token: Option<Timer>,
    /// `idle`
    pub idle: Option<Timer>,
    /// `total`
    pub total: Option<Timer>,
}

/// `[admission]`
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionFile {
    /// `capacity`
    pub capacity: Option<u32>,
    /// `queue_len`
    pub queue_len: Option<usize>,
    /// `queue_timeout`
    pub queue_timeout: Option<Dur>,
}

/// `[priority]`
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct PriorityFile {
    /// `header`
    pub header: Option<String>,
    /// `default`
    pub default: Option<String>,
    /// `interactive_share`
    pub interactive_share: Option<f64>,
}

/// `[mock]`
#[derive(Deserialize, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct MockFile {
    /// `replicas`
    pub replicas: Option<usize>,
    /// `script`
    pub script: Option<String>,
    /// `congested_script`
    pub congested_script: Option<String>,
}

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
}

/// `SseIdleTimeout` settings (`None`: the timer is off).
#[derive(Clone, Debug)]
pub struct TimeoutConfig {
    /// Until response headers.
    pub head: Option<Duration>,
    /// Until the first token.
    pub first_token: Option<Duration>,
    /// Between progress events after the first token.
    pub idle: Option<Duration>,
    /// The whole request.
    pub total: Option<Duration>,
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
    /// * hedge: **2 attempts**, **adaptive** delay (p90 of recent TTFTs), budget **10%**, the
    ///   layer's own defaults;
    /// * timeouts: head **10 s** (headers come at once from streaming servers), first token
    ///   **30 s** (long prompts take time to prefill), idle **15 s** (a decoding server sends
    ///   tokens every few tens of ms, so 15 s of silence is a stall, not a slow token), total
    ///   **600 s** (long generations);
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
            hedge: HedgeConfig {
                max_attempts: 2,
                delay: HedgeDelaySetting::Adaptive,
                budget_ratio: 0.1,
            },
            timeout: TimeoutConfig {
                head: Some(Duration::from_secs(10)),
                first_token: Some(Duration::from_secs(30)),
                idle: Some(Duration::from_secs(15)),
                total: Some(Duration::from_secs(600)),
            },
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

fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
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
        fn pick<T>(arg: Option<T>, file: Option<T>, default: T) -> T {
            arg.or(file).unwrap_or(default)
        }
        c.listen = pick(args.listen, file.listen, c.listen);
        let upstreams = if args.upstreams.is_empty() {
            file.upstreams
        } else {
            args.upstreams.clone()
        };
        c.upstreams = upstreams
            .iter()
            .map(|u| parse_upstream(u))
            .collect::<Result<_, _>>()?;
        c.models = if args.models.is_empty() {
            file.models
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

        let h = &mut c.hedge;
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

        let t = &mut c.timeout;
        t.head = pick(args.timeout_head, file.timeout.head, Timer(t.head)).0;
        t.first_token = pick(
            args.timeout_first_token,
            file.timeout.first_token,
            Timer(t.first_token),
        )
        .0;
        t.idle = pick(args.timeout_idle, file.timeout.idle, Timer(t.idle)).0;
        t.total = pick(args.timeout_total, file.timeout.total, Timer(t.total)).0;
        for (key, v) in [
            ("timeout.head (--timeout-head)", t.head),
            ("timeout.first_token (--timeout-first-token)", t.first_token),
            ("timeout.idle (--timeout-idle)", t.idle),
            ("timeout.total (--timeout-total)", t.total),
        ] {
            if v == Some(Duration::ZERO) {
                return err(format!("{key} must be longer than 0 (or `off`)"));
            }
        }

        let a = &mut c.admission;
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

        let p = &mut c.priority;
        let header = pick(
            args.priority_header.clone(),
            file.priority.header,
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
        if let Some(d) = args.priority_default.clone().or(file.priority.default) {
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

        let m = &mut c.mock;
        m.replicas = pick(args.mock_replicas, file.mock.replicas, m.replicas);
        m.script = pick(args.mock_script.clone(), file.mock.script, m.script.clone());
        m.congested_script = pick(
            args.mock_congested_script.clone(),
            file.mock.congested_script,
            m.congested_script.clone(),
        );
        if c.upstreams.is_empty() {
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
            if c.models.is_empty() {
                c.models.push(MOCK_MODEL.to_owned());
            }
        }
        c.cluster = ClusterConfig::resolve(file.cluster, &args.cluster)?;
        Ok(c)
    }
}

/// The dotted key (`timeout.idle`) of the `key = value` line holding byte `offset` of `text`.
fn key_at(text: &str, offset: usize) -> Option<String> {
    let before = text.get(..offset)?;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = text[line_start..].lines().next()?;
    let key = line.split_once('=')?.0.trim().trim_matches('"');
    if key.is_empty() || key.starts_with('[') || key.starts_with('#') {
        return None;
    }
    let table = before[..line_start].lines().rev().find_map(|l| {
        let l = l.trim();
        (l.starts_with('[') && !l.starts_with("[[")).then(|| l.trim_matches(['[', ']']).trim())
    });
    Some(match table {
        Some(t) if !t.is_empty() => format!("{t}.{key}"),
        _ => key.to_owned(),
    })
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
}
