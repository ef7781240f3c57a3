//! The gateway's configuration: flags, environment variables, a TOML file and defaults.
//!
//! Precedence, highest first: a command-line flag, its environment variable, the TOML file
//! (`--config FILE`), the default. Every key of the file has a flag and a variable:
//! `[timeout] idle = "5s"` is `--timeout-idle 5s` and `TAILGUARD_TIMEOUT_IDLE=5s`.
//!
//! Each setting is declared once, in `sections`: one struct per section whose fields are all
//! `Option`s ([`Args`], [`HedgeArgs`], ...), parsed by clap from the command line and by serde
//! from the file. Resolving is `flags.or(file).or(Args::defaults())`, then each value is checked
//! and turned into the [`Config`] the gateway runs on.

#[macro_use]
mod macros;
mod sections;
mod tenants;
#[cfg(test)]
mod tests;
mod values;

use std::fmt;

use clap::{CommandFactory, FromArgMatches};
use tailguard::core::ClientDeadline;

pub use sections::*;
pub use tenants::TenantSpec;
pub use values::{Dur, HedgeDelaySetting, OnOff, Timer, parse_duration, parse_priority};

/// The model name the gateway lists when it runs over embedded mocks.
pub const MOCK_MODEL: &str = "mock-llm";

/// The TOML file: the same keys as the flags (`[timeout] idle` is `--timeout-idle`).
pub type FileConfig = Args;

/// A configuration error: names the key (or flag) at fault.
#[derive(Debug)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// One setting, as [`Args::settings`] lists them.
#[derive(Clone, Copy, Debug)]
pub struct Setting {
    /// The key in the file (`timeout.idle`).
    pub key: &'static str,
    /// The flag, without `--` (also its clap id).
    pub flag: &'static str,
    /// The environment variable.
    pub env: &'static str,
    /// The default, in the syntax of the flag (`None`: unset unless given).
    pub default: Option<&'static str>,
}

impl Args {
    /// Every setting, in declaration order.
    pub fn settings() -> Vec<Setting> {
        let mut all = Vec::new();
        Args::collect_settings(&mut all);
        all
    }

    /// The command line: the flags of [`Args`], each default at the end of its help.
    pub fn command_with_defaults() -> clap::Command {
        let all = Args::settings();
        Args::command().mut_args(|arg| {
            let Some(d) = all
                .iter()
                .find(|s| arg.get_id() == s.flag)
                .and_then(|s| s.default)
            else {
                return arg;
            };
            let with_default = |h: &clap::builder::StyledStr| format!("{h} [default: {d}]");
            let long = arg.get_long_help().map(with_default);
            let arg = match arg.get_help().map(with_default) {
                Some(help) => arg.help(help),
                None => arg,
            };
            match long {
                Some(long) => arg.long_help(long),
                None => arg,
            }
        })
    }

    /// Parses the command line and the environment; prints the error and exits (code 2) on a
    /// bad flag or value, as clap does.
    pub fn from_command_line() -> Args {
        let matches = Args::command_with_defaults().get_matches();
        Args::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
    }
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

    /// Parses the TOML text of a configuration file (unknown keys and malformed values are
    /// refused here, naming the key; the checks of the values are in [`Config::resolve`]).
    pub fn parse_file(text: &str) -> Result<FileConfig, ConfigError> {
        toml::from_str(text).map_err(
            |e| match e.span().and_then(|span| key_at(text, span.start)) {
                Some(key) => ConfigError(format!("invalid configuration, key `{key}`: {e}")),
                None => ConfigError(format!("invalid configuration: {e}")),
            },
        )
    }

    /// `args` over `file` over the defaults, each value checked.
    pub fn resolve(file: FileConfig, args: &Args) -> Result<Config, ConfigError> {
        let given = args.clone().or(file);
        let capacity_given = given.admission.capacity.is_some();
        let mut c = given.or(Args::defaults()).into_config()?;
        if c.upstreams.is_empty() {
            let m = &c.mock;
            if m.replicas == 0 {
                return Err(ConfigError(
                    "mock.replicas (--mock-replicas) must be at least 1 when no upstream is \
                     configured"
                        .into(),
                ));
            }
            for (key, s) in [
                ("script", &m.script),
                ("congested_script", &m.congested_script),
            ] {
                if let Err(e) = tailguard_mock::Script::new().apply(s) {
                    let flag = key.replace('_', "-");
                    return Err(ConfigError(format!("mock.{key} (--mock-{flag}): {e}")));
                }
            }
            if c.models.is_empty() {
                c.models.push(MOCK_MODEL.to_owned());
            }
        }
        // With slots, admission holds what the slots cannot take: its capacity defaults to
        // their sum, so requests wait in admission's queue, not in an upstream's FIFO.
        if let Some(slots) = c.hedge.replica_slots
            && !capacity_given
        {
            let n = match c.upstreams.len() {
                0 => c.mock.replicas,
                n => n,
            };
            c.admission.capacity = slots.saturating_mul(n.max(1) as u32);
        }
        Ok(c)
    }
}

impl Default for Config {
    /// The defaults (see each setting in `--help`, or [`Args`]).
    fn default() -> Self {
        Config::resolve(FileConfig::default(), &Args::default()).expect("the defaults are valid")
    }
}

impl TimeoutConfig {
    /// How the layers read, and send on, a client's deadline.
    pub fn client_deadline(&self) -> ClientDeadline {
        let cd = ClientDeadline::new().with_propagation(self.propagate_deadline);
        match &self.deadline_header {
            Some(name) => cd.with_header(name.clone()),
            None => cd.without_header(),
        }
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
