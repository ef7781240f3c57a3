//! The READMEs' benchmark tables, rendered from the committed `benches/results/*.json`.
//!
//! Each table sits in a README between two marker comments,
//! `<!-- tables:NAME -->` and `<!-- /tables:NAME -->`; [`render_all`] renders every one from
//! the JSON, [`splice`] writes one between its markers and [`between`] reads what is there.
//! `cargo run -p tailguard-benches --bin render_tables` rewrites the READMEs; the test
//! `committed_tables_match_their_json` (in `benches/tests/tables.rs`) fails when a committed
//! table is not what its JSON renders to.
//!
//! Every table opens with the run it comes from: its JSON file and the machine's load average
//! when the run started ([`crate::run`]); a run above [`LOAD_BOUND`] is marked, and a JSON
//! written before benches recorded their load says "load not recorded".

mod batching;
mod budgets;
mod render;
mod resume;
mod summary;

use std::path::{Path, PathBuf};

pub use render::{StepVerdict, adaptive_verdicts};
use serde_json::Value;

use crate::run::{LOAD_BOUND, parse_loadavg};

/// An error of the renderer: a JSON field missing, a file unreadable, a marker absent.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The README a table belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Doc {
    /// `benches/README.md`.
    Benches,
    /// The workspace's `README.md`.
    Root,
}

impl Doc {
    /// The README's path, from the benches crate's manifest directory.
    pub fn path(self, benches_dir: &Path) -> PathBuf {
        match self {
            Doc::Benches => benches_dir.join("README.md"),
            Doc::Root => benches_dir.join("..").join("README.md"),
        }
    }

    /// How the README links to `benches/results/` (relative to itself).
    fn results_link(self) -> &'static str {
        match self {
            Doc::Benches => "results/",
            Doc::Root => "benches/results/",
        }
    }
}

/// One rendered table (with the lines around it that state its run and verdicts).
#[derive(Clone, Debug)]
pub struct Table {
    /// The README it goes into.
    pub doc: Doc,
    /// The marker name: the table sits between `<!-- tables:NAME -->` and
    /// `<!-- /tables:NAME -->`.
    pub name: &'static str,
    /// The markdown between the markers.
    pub body: String,
}

/// Every table, rendered from the JSON files in `results` (`benches/results`).
///
/// # Errors
///
/// A JSON file unreadable or missing a field a table shows.
pub fn render_all(results: &Path) -> Result<Vec<Table>, Error> {
    let json = |file: &str| -> Result<Value, Error> {
        let path = results.join(file);
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?)
    };
    let overhead = json("overhead.json")?;
    let throughput = json("gateway_throughput.json")?;
    let cluster = json("cluster_admission.json")?;
    let nginx = json("gateway_nginx.json")?;
    let cpu = json("gateway_cpu.json")?;
    let instructions = json("instructions.json")?;
    let adaptive = json("adaptive_limit.json")?;
    let tail = json("tail_latency.json")?;
    let resume = json("resume_broken.json")?;
    let budgets = json("tenant_budgets.json")?;
    let fairness = json("tenant_fairness.json")?;
    let batching = json("batching_overload.json")?;
    let b = Doc::Benches;
    let table = |name, body| Table { doc: b, name, body };
    Ok(vec![
        table("overhead", render::overhead(&overhead, b)?),
        table(
            "gateway_throughput",
            render::gateway_throughput(&throughput, b)?,
        ),
        table("cluster_admission", render::cluster_admission(&cluster, b)?),
        table("gateway_nginx", render::gateway_nginx(&nginx, b)?),
        table("adaptive_limit", render::adaptive_limit(&adaptive, b)?),
        table("resume_broken", resume::resume_broken(&resume, b)?),
        table("tenant_budgets", budgets::tenant_budgets(&budgets, b)?),
        table(
            "batching_overload",
            batching::batching_overload(&batching, b)?,
        ),
        Table {
            doc: Doc::Root,
            name: "summary",
            body: summary::summary(
                &summary::Runs {
                    tail: &tail,
                    overhead: &overhead,
                    throughput: &throughput,
                    cluster: &cluster,
                    nginx: &nginx,
                    cpu: &cpu,
                    instructions: &instructions,
                    adaptive: &adaptive,
                    resume: &resume,
                    fairness: &fairness,
                    budgets: &budgets,
                    batching: &batching,
                },
                Doc::Root,
            )?,
        },
    ])
}

/// The `resume_broken` table from that bench's JSON, as `benches/README.md` shows it (the
/// bench prints it too).
///
/// # Errors
///
/// A field the table shows is missing.
pub fn resume_broken_table(json: &Value) -> Result<String, Error> {
    resume::resume_broken(json, Doc::Benches)
}

/// The `tenant_budgets` table from that bench's JSON, as `benches/README.md` shows it (the
/// bench prints it too).
///
/// # Errors
///
/// A field the table shows is missing.
pub fn tenant_budgets_table(json: &Value) -> Result<String, Error> {
    budgets::tenant_budgets(json, Doc::Benches)
}

fn markers(name: &str) -> (String, String) {
    (
        format!("<!-- tables:{name} -->"),
        format!("<!-- /tables:{name} -->"),
    )
}

/// What `doc` holds between the markers of table `name`, without the newlines next to the
/// markers (`None`: no such markers).
pub fn between<'a>(doc: &'a str, name: &str) -> Option<&'a str> {
    let (open, close) = markers(name);
    let start = doc.find(&open)? + open.len();
    let end = start + doc[start..].find(&close)?;
    Some(doc[start..end].trim_matches('\n'))
}

/// `doc` with `body` between the markers of table `name`.
///
/// # Errors
///
/// The markers are missing, or in the wrong order.
pub fn splice(doc: &str, name: &str, body: &str) -> Result<String, Error> {
    let (open, close) = markers(name);
    let start = doc.find(&open).ok_or_else(|| format!("no {open} marker"))? + open.len();
    let end = start
        + doc[start..]
            .find(&close)
            .ok_or_else(|| format!("no {close} marker after {open}"))?;
    Ok(format!("{}\n{body}\n{}", &doc[..start], &doc[end..]))
}

/// The best static limit of one step of scenario E, by `adaptive_limit`'s rule: the highest
/// goodput, and among the limits within 5% of it the lowest p99 TTFT (a missing p99 counts
/// as infinite). `candidates` are (goodput, p99 TTFT) per static limit; the answer is an
/// index into them (`None`: no candidate).
pub fn best_static(candidates: &[(f64, Option<f64>)]) -> Option<usize> {
    let top = candidates.iter().map(|c| c.0).fold(0.0, f64::max);
    candidates
        .iter()
        .enumerate()
        .filter(|(_, c)| c.0 >= 0.95 * top)
        .min_by(|(_, a), (_, b)| {
            let p = |c: &(f64, Option<f64>)| c.1.unwrap_or(f64::INFINITY);
            p(a).total_cmp(&p(b))
        })
        .map(|(i, _)| i)
}

/// The load average (1 minute) when the run of `json` started: its `run` object, or the
/// older `loadavg_before` line of `gateway_nginx` (`None`: not recorded).
pub fn start_load(json: &Value) -> Option<f64> {
    if let Some(l) = json["run"]["load_average_start"][0].as_f64() {
        return Some(l);
    }
    json["loadavg_before"]
        .as_str()
        .and_then(parse_loadavg)
        .map(|l| l[0])
}

/// The line that opens a table: where its figures come from, and how loaded the machine was.
fn run_note(json: &Value, file: &str, doc: Doc) -> String {
    let link = format!("[`{0}{file}`]({0}{file})", doc.results_link());
    let when = json["run"]["started_unix_s"]
        .as_u64()
        .map(|s| format!(", run started {} UTC", date(s)))
        .unwrap_or_default();
    format!(
        "*Rendered by `render_tables` from {link}{when}; {}.*",
        load_note(json, false)
    )
}

/// The load part of a run's note: the figure, and a mark when it is above [`LOAD_BOUND`].
fn load_note(json: &Value, short: bool) -> String {
    match start_load(json) {
        None => "load not recorded".to_owned(),
        Some(l) if l <= LOAD_BOUND => format!("load average {l:.2} at the start (quiet)"),
        Some(l) if short => format!("load {l:.2}: **above {LOAD_BOUND}**"),
        Some(l) => format!(
            "load average {l:.2} at the start: **above the quiet-machine bound of {LOAD_BOUND}, \
             taken on a loaded machine**"
        ),
    }
}

/// `YYYY-MM-DD HH:MM` of a Unix time (UTC).
fn date(unix_s: u64) -> String {
    let days = (unix_s / 86_400) as i64;
    let secs = unix_s % 86_400;
    // Days to a civil date (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        secs / 3_600,
        secs % 3_600 / 60
    )
}

/// A number field of `v` (`path` is a list of keys), or an error naming it.
fn num(v: &Value, path: &[&str]) -> Result<f64, Error> {
    path.iter()
        .fold(v, |v, k| &v[*k])
        .as_f64()
        .ok_or_else(|| format!("no number at {}", path.join(".")).into())
}

/// `x` rounded to an integer, with thousands separators.
fn thousands(x: f64) -> String {
    let n = x.round() as i64;
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    if n < 0 { format!("-{out}") } else { out }
}

/// A verdict cell: `met`, or `**missed**`.
fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "**missed**" }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splice_replaces_only_what_is_between_the_markers() {
        let doc = "a\n<!-- tables:x -->\nold\n<!-- /tables:x -->\nb\n";
        let new = splice(doc, "x", "new\ntable").unwrap();
        assert_eq!(
            new,
            "a\n<!-- tables:x -->\nnew\ntable\n<!-- /tables:x -->\nb\n"
        );
        assert_eq!(between(&new, "x"), Some("new\ntable"));
        assert!(splice(doc, "y", "t").is_err());
        assert_eq!(between(doc, "y"), None);
    }

    #[test]
    fn best_static_takes_the_lowest_p99_within_5_percent_of_the_top_goodput() {
        // Scenario E's capacity drop: static 128 has the goodput, nothing else is within 5%.
        let drop = [
            (8.2, Some(912.0)),
            (15.75, Some(2800.0)),
            (20.75, Some(15753.0)),
        ];
        assert_eq!(best_static(&drop), Some(2));
        // 0.5x: 32 and 128 tie on goodput, 32 has the lower p99.
        let light = [(7.5, Some(778.0)), (14.1, Some(123.1)), (14.1, Some(123.8))];
        assert_eq!(best_static(&light), Some(1));
        assert_eq!(best_static(&[]), None);
    }

    #[test]
    fn a_run_above_the_bound_is_marked_and_an_old_one_says_not_recorded() {
        let loaded = serde_json::json!({ "loadavg_before": "2.26 2.84 2.58 2/82 18357" });
        assert!(load_note(&loaded, false).contains("above the quiet-machine bound"));
        let quiet = serde_json::json!({ "run": { "load_average_start": [0.4, 0.5, 0.6] } });
        assert!(load_note(&quiet, false).contains("quiet"));
        assert_eq!(
            load_note(&serde_json::json!({}), false),
            "load not recorded"
        );
    }

    #[test]
    fn formats_dates_and_thousands() {
        assert_eq!(date(0), "1970-01-01 00:00");
        assert_eq!(date(1_796_053_661), "2026-11-30 15:47");
        assert_eq!(thousands(17_379.6), "17,380");
        assert_eq!(thousands(954.5), "955");
        assert_eq!(thousands(-1_234.0), "-1,234");
    }
}
