//! Resolving the configuration: the TOML file, then the environment and the flags (which clap
//! reads together), over the defaults in [`Config::default`]; and the checks of the result.

use http::Uri;

use super::args::Args;
use super::config::{Config, ConfigError, MOCK_MODEL, err, parse_priority};
use super::file::{FileConfig, key_at, parse_fail};

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
        a.adaptive = pick(args.admission_adaptive, file.admission.adaptive, a.adaptive);
        a.min_limit = pick(
            args.admission_min_limit,
            file.admission.min_limit,
            a.min_limit,
        );
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
        if a.min_limit == 0 {
            // Above the capacity it is the capacity (the layer clamps it).
            return err("admission.min_limit (--admission-min-limit) must be at least 1");
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
    use std::time::Duration;

    use super::*;
    use crate::file::{Timer, parse_duration, parse_timer};

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
    fn adaptive_admission_is_on_by_default_and_set_by_file_or_flag() {
        let c = Config::resolve(Config::parse_file("").unwrap(), &Args::default()).unwrap();
        assert!(c.admission.adaptive);
        let text = "[admission]\nadaptive = false\nmin_limit = 2\n";
        let c = Config::resolve(Config::parse_file(text).unwrap(), &Args::default()).unwrap();
        assert_eq!((c.admission.adaptive, c.admission.min_limit), (false, 2));
        let args = Args {
            admission_adaptive: Some(true),
            ..Args::default()
        };
        let c = Config::resolve(Config::parse_file(text).unwrap(), &args).unwrap();
        assert!(c.admission.adaptive);
        let zero = Config::parse_file("[admission]\nmin_limit = 0\n").unwrap();
        let e = Config::resolve(zero, &Args::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("admission.min_limit"), "{e}");
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
