//! §8 of `benches/README.md`: `resume_broken`, mid-stream resume (issue 33).

use std::fmt::Write as _;

use serde_json::Value;

use super::{Doc, Error, met, num, run_note, thousands};

/// `n ms` with thousands separators.
fn ms(x: f64) -> String {
    format!("{} ms", thousands(x))
}

/// `label n, label n` of an `ends` object.
fn ends(v: &Value) -> String {
    let Some(m) = v.as_object() else {
        return "-".to_owned();
    };
    let parts: Vec<String> = m
        .iter()
        .map(|(k, n)| format!("{} {}", k.replace('_', " "), n))
        .collect();
    if parts.is_empty() {
        "-".to_owned()
    } else {
        parts.join(", ")
    }
}

/// The three runs, the four faults, and the targets.
pub(super) fn resume_broken(v: &Value, doc: Doc) -> Result<String, Error> {
    let mut t = run_note(v, "resume_broken.json", doc);
    if v["quick"].as_bool() == Some(true) {
        t += " A `--quick` run.";
    }
    let runs = v["runs"].as_array().ok_or("no runs")?;
    let [unbroken, off, on] = runs.as_slice() else {
        return Err("three runs expected".into());
    };
    let base = num(unbroken, &["total_p99_ms"])?;
    t += "\n\n| run | completed | identical text (of completed) | broken: fired / completed / \
          identical | total p50 | total p99 | TTFT p99 | total p99 / unbroken | upstream \
          requests (continuations) | resumed | streams read as interruptions |\n";
    t += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for r in runs {
        let broken = match r["faults"].as_bool() {
            Some(true) => format!(
                "{} / {} / {}",
                num(r, &["broken", "fired"])?,
                num(r, &["broken", "completed"])?,
                num(r, &["broken", "identical"])?
            ),
            _ => "-".to_owned(),
        };
        writeln!(
            t,
            "| {} | {:.1}% ({} of {}) | {:.1}% | {broken} | {} | {} | {} | {:.2}x | {} ({}) | {} | {} |",
            r["name"].as_str().ok_or("no run name")?,
            num(r, &["completed_pct"])?,
            num(r, &["completed"])?,
            num(r, &["requests"])?,
            num(r, &["identical_pct_of_completed"])?,
            ms(num(r, &["total_p50_ms"])?),
            ms(num(r, &["total_p99_ms"])?),
            ms(num(r, &["ttft_p99_ms"])?),
            num(r, &["total_p99_ms"])? / base,
            thousands(num(r, &["upstream_requests"])?),
            num(r, &["continuations"])?,
            num(r, &["resumed"])?,
            num(r, &["route_interruptions"])?,
        )?;
    }
    t += "\n| fault (first attempt) | broken | fired (off / on) | resume off: how the fired ended \
          | resume on: completed | identical | how the fired ended | longest total |\n";
    t += "|---|---:|---:|---|---:|---:|---|---:|\n";
    let faults = |r: &Value| r["by_fault"].as_array().cloned().unwrap_or_default();
    for (f, o) in faults(off).iter().zip(faults(on).iter()) {
        writeln!(
            t,
            "| {} | {} | {} / {} | {} | {} | {} | {} | {} |",
            o["fault"].as_str().ok_or("no fault")?,
            num(o, &["scheduled"])?,
            num(f, &["fired"])?,
            num(o, &["fired"])?,
            ends(&f["ends"]),
            num(o, &["completed"])?,
            num(o, &["identical"])?,
            ends(&o["ends"]),
            ms(num(o, &["total_max_ms"])?),
        )?;
    }
    let ratio = num(v, &["p99_total_resume_on_over_unbroken"])?;
    let (fired, off_completed) = off["by_fault"]
        .as_array()
        .ok_or("no by_fault")?
        .iter()
        .fold((0.0, 0.0), |(a, b), r| {
            (
                a + r["fired"].as_f64().unwrap_or(0.0),
                b + r["ends"]["completed"].as_f64().unwrap_or(0.0),
            )
        });
    let completed = num(on, &["completed_pct"])?;
    let identical = num(on, &["identical_pct_of_completed"])?;
    write!(
        t,
        "\nAgainst issue 33's targets, this run: with resume on **{completed:.1}%** of the \
         requests completed (100%: {}), **{identical:.1}%** of those with the unbroken run's \
         text (100%: {}), p99 total time **{ratio:.2}x** the unbroken run's (≤ 1.3x: {}; \
         {:.2}x without the requests given a stall); without resume **{} of {fired}** fired \
         faults ended in error (all: {}).",
        met(completed >= 100.0),
        met(identical >= 100.0),
        met(ratio <= 1.3),
        num(v, &["p99_total_resume_on_over_unbroken_without_stalls"])?,
        fired - off_completed,
        met(fired > 0.0 && off_completed == 0.0),
    )?;
    Ok(t)
}
