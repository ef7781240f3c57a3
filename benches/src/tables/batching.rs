//! §11 of `benches/README.md`: `batching_overload`, a batching upstream offered twice what its
//! slots serve (issue 29).

use std::fmt::Write as _;

use serde_json::Value;

use super::{Doc, Error, met, num, run_note, thousands};

/// Issue 29's target for one configuration at 2x: at most twice the slots at the replica
/// (peak), the admitted's p99 TTFT within 3x the unloaded one, and every other request refused
/// with 429 or 503 and a `Retry-After` (none failed otherwise).
pub(super) fn target_met(r: &Value) -> Result<bool, Error> {
    let two = last_step(r)?;
    let refused: f64 = two["statuses"]
        .as_object()
        .map_or(0.0, |s| s.values().filter_map(Value::as_f64).sum());
    let only_429_503 = two["statuses"]
        .as_object()
        .is_some_and(|s| s.keys().all(|k| k == "429" || k == "503"));
    Ok(num(two, &["at_replica_peak_slots"])? <= 2.0
        && r["p99_vs_unloaded"].as_f64().is_some_and(|x| x <= 3.0)
        && refused > 0.0
        && only_429_503
        && num(two, &["other_failures"])? == 0.0
        && num(r, &["probe", "missing_retry_after"])? == 0.0)
}

/// The 2x step of a configuration's result.
pub(super) fn last_step(r: &Value) -> Result<&Value, Error> {
    r["steps"]
        .as_array()
        .and_then(|s| s.last())
        .ok_or_else(|| "batching_overload.json: a result without steps".into())
}

/// A configuration by its name.
pub(super) fn config<'a>(v: &'a Value, name: &str) -> Result<&'a Value, Error> {
    v["results"]
        .as_array()
        .and_then(|r| r.iter().find(|r| r["config"] == name))
        .ok_or_else(|| format!("batching_overload.json: no configuration `{name}`").into())
}

fn ms(v: &Value) -> String {
    v.as_f64()
        .map_or_else(|| "-".to_owned(), |x| format!("{} ms", thousands(x)))
}

/// One row per configuration.
pub(super) fn batching_overload(v: &Value, doc: Doc) -> Result<String, Error> {
    let mut t = run_note(v, "batching_overload.json", doc);
    t += "\n\n| configuration | 0.8x: p99 TTFT, refused | 2x: at the replica, p99 / peak (slots) \
          | p50 / p99 TTFT of the admitted | p99 vs unloaded | completed / capacity | refused \
          (status: count) | probes' `Retry-After` | target |\n";
    t += "|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
    let results = v["results"].as_array().ok_or("no results")?;
    for r in results {
        let steps = r["steps"].as_array().ok_or("no steps")?;
        let busy = steps
            .iter()
            .find(|s| s["step"] == "0.8x")
            .ok_or("no 0.8x step")?;
        let refused = |s: &Value| -> String {
            let list: Vec<String> = s["statuses"]
                .as_object()
                .map(|m| m.iter().map(|(k, n)| format!("{k}: {n}")).collect())
                .unwrap_or_default();
            if list.is_empty() {
                "0".to_owned()
            } else {
                list.join(", ")
            }
        };
        let two = last_step(r)?;
        let p = &r["probe"];
        let retry = match (
            p["retry_after_min_s"].as_u64(),
            p["retry_after_max_s"].as_u64(),
        ) {
            (Some(a), Some(b)) if a == b => format!("{a} s ({} refused)", p["refused"]),
            (Some(a), Some(b)) => format!("{a}–{b} s ({} refused)", p["refused"]),
            _ => "none refused".to_owned(),
        };
        writeln!(
            t,
            "| `{}` | {}, {} | {:.2}x / {:.2}x | {} / {} | {} | {:.2}x | {} | {retry} | {} |",
            r["config"].as_str().ok_or("no config name")?,
            ms(&busy["p99_ttft_ms"]),
            refused(busy),
            num(two, &["at_replica_p99_slots"])?,
            num(two, &["at_replica_peak_slots"])?,
            ms(&two["p50_ttft_ms"]),
            ms(&two["p99_ttft_ms"]),
            r["p99_vs_unloaded"]
                .as_f64()
                .map_or_else(|| "-".to_owned(), |x| format!("{x:.2}x")),
            num(two, &["goodput_vs_capacity"])?,
            refused(two),
            met(target_met(r)?),
        )?;
    }
    Ok(t.trim_end().to_owned())
}
