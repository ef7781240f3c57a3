//! When a bench run started and how loaded the machine was: the `run` object every bench writes
//! into its JSON, so that a figure can be told apart from one taken on a busy machine.
//!
//! The READMEs hold their figures to a quiet machine, [`LOAD_BOUND`]; the table renderer
//! ([`crate::tables`]) marks a run whose load at its start was above it.

use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// The load average (1 minute, at the start of a run) up to which the READMEs call the machine
/// quiet. A run above it is marked in the rendered tables.
pub const LOAD_BOUND: f64 = 1.0;

/// The machine's 1, 5 and 15 minute load averages, from `/proc/loadavg` (`None` where there
/// is no such file or it cannot be parsed).
pub fn load_average() -> Option<[f64; 3]> {
    parse_loadavg(&std::fs::read_to_string("/proc/loadavg").ok()?)
}

/// The three load averages at the head of a `/proc/loadavg` line.
pub fn parse_loadavg(line: &str) -> Option<[f64; 3]> {
    let mut it = line.split_whitespace().map(str::parse::<f64>);
    Some([it.next()?.ok()?, it.next()?.ok()?, it.next()?.ok()?])
}

/// The `run` object of a bench's JSON.
#[derive(Clone, Debug, Serialize)]
pub struct RunInfo {
    /// When the run started, seconds since the Unix epoch.
    pub started_unix_s: u64,
    /// Load averages (1, 5, 15 minutes) when the run started, before the bench loads the
    /// machine itself: what else was running.
    pub load_average_start: Option<[f64; 3]>,
    /// Load averages when the run ended (the bench's own load included).
    pub load_average_end: Option<[f64; 3]>,
    /// The bound the READMEs hold runs to ([`LOAD_BOUND`]), and whether the start load kept it.
    pub load_bound: f64,
    /// `load_average_start[0] <= load_bound` (`None`: load not readable).
    pub quiet: Option<bool>,
}

impl RunInfo {
    /// Records the start of a run: the time and the load average now.
    pub fn start() -> Self {
        let load = load_average();
        RunInfo {
            started_unix_s: SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            load_average_start: load,
            load_average_end: None,
            load_bound: LOAD_BOUND,
            quiet: load.map(|l| l[0] <= LOAD_BOUND),
        }
    }

    /// The same, with the load average at the end of the run.
    pub fn finish(mut self) -> Self {
        self.load_average_end = load_average();
        self
    }

    /// One line for the bench's output: when, and whether the machine was quiet.
    pub fn summary(&self) -> String {
        match self.load_average_start {
            Some(l) if l[0] <= LOAD_BOUND => {
                format!(
                    "load average at the start {:.2} (<= {LOAD_BOUND}: quiet)",
                    l[0]
                )
            }
            Some(l) => format!(
                "load average at the start {:.2}: ABOVE the quiet-machine bound {LOAD_BOUND}; the READMEs' tables will mark this run",
                l[0]
            ),
            None => "load average not readable".to_owned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_three_averages_of_a_loadavg_line() {
        assert_eq!(
            parse_loadavg("2.26 2.84 2.58 2/82 18357\n"),
            Some([2.26, 2.84, 2.58])
        );
        assert_eq!(parse_loadavg("0.1 x"), None);
        assert_eq!(parse_loadavg(""), None);
    }
}
