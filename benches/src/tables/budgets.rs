//! §10 of `benches/README.md`: `tenant_budgets`, token budgets shared on Redis (issue 34).

use std::fmt::Write as _;

use serde_json::Value;

use super::{Doc, Error, met, num, run_note, thousands};

/// A signed number of tokens: `+1,234`, `-56`.
fn signed(x: f64) -> String {
    if x.round() > 0.0 {
        format!("+{}", thousands(x))
    } else {
        thousands(x)
    }
}

/// A number field, or `-` when it is null (a phase without Redis).
fn opt(v: &Value, key: &str) -> String {
    v[key].as_f64().map_or_else(|| "-".to_owned(), thousands)
}

/// The three phases, the restart's intervals, and the targets.
pub(super) fn tenant_budgets(v: &Value, doc: Doc) -> Result<String, Error> {
    let mut t = run_note(v, "tenant_budgets.json", doc);
    let reservation = num(v, &["reservation_tokens"])?;
    let phases = v["phases"].as_array().ok_or("no phases")?;
    t += "\n\n| phase | requests | admitted: usage / no usage / disconnected | 429 / 503 \
          | tokens sent (charged) | budget | overshoot (max at any time) | reconciles lost \
          | reservations left | bucket: lowest / negative samples | balance |\n";
    t += "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for p in phases {
        let status = |s: &str| p["statuses"][s].as_f64().unwrap_or(0.0);
        let admitted = |k: &str| p["admitted"][k].as_f64().unwrap_or(0.0);
        let bucket = match p["bucket"].as_object() {
            Some(b) => format!(
                "{} / {} of {}",
                b["lowest_tokens"]
                    .as_f64()
                    .map_or_else(|| "-".to_owned(), |l| format!("{l:.1}")),
                b["negative_or_invalid"],
                b["samples"]
            ),
            None => "-".to_owned(),
        };
        let balance = p["balance_error_tokens"]
            .as_f64()
            .map_or_else(|| "-".to_owned(), |b| format!("{b:+.1}"));
        writeln!(
            t,
            "| {} | {} | {} / {} / {} | {} / {} | {} ({}) | {} | {} ({}) | {} | {} | {bucket} \
             | {balance} |",
            p["name"].as_str().ok_or("no phase name")?,
            thousands(num(p, &["scheduled"])?),
            admitted("usage"),
            admitted("no_usage"),
            admitted("disconnect"),
            thousands(status("429")),
            thousands(status("503")),
            thousands(num(p, &["tokens_sent"])?),
            thousands(num(p, &["tokens_charged"])?),
            thousands(num(p, &["budget"])?),
            signed(num(p, &["overshoot"])?),
            signed(num(p, &["max_overshoot_any_time"])?),
            thousands(num(p, &["reconciles_lost"])?),
            opt(p, "reservations_left"),
        )?;
    }
    let r = &v["restart"];
    t += "\n| Redis restarted: interval | admitted | tokens sent | bound | beyond it | 429 \
          | store errors (fail open) | reconciles lost |\n";
    t += "|---|---:|---:|---:|---:|---:|---:|---:|\n";
    for i in r["intervals"].as_array().ok_or("no intervals")? {
        let tokens = num(i, &["tokens_sent"])?;
        let bound = i["bound"].as_f64();
        writeln!(
            t,
            "| {} ({:.0}–{:.0} s) | {} | {} | {} | {} | {} | {} | {} |",
            i["name"].as_str().ok_or("no interval name")?,
            num(i, &["from_s"])?,
            num(i, &["to_s"])?,
            thousands(num(i, &["admitted"])?),
            thousands(tokens),
            bound.map_or_else(
                || "-".to_owned(),
                |b| format!(
                    "{} ({})",
                    thousands(b),
                    i["bound_is"].as_str().unwrap_or("")
                )
            ),
            bound.map_or_else(|| "-".to_owned(), |b| signed(tokens - b)),
            thousands(num(i, &["refusals"])?),
            thousands(num(i, &["store_errors"])?),
            thousands(num(i, &["reconciles_lost"])?),
        )?;
    }
    let shared = phases
        .iter()
        .find(|p| p["shared"].as_bool() == Some(true))
        .ok_or("no shared phase")?;
    let over = num(shared, &["overshoot"])?.max(num(shared, &["max_overshoot_any_time"])?);
    let lost = num(shared, &["reconciles_lost"])? + num(shared, &["reservations_left"])?;
    let negative: f64 = phases
        .iter()
        .filter_map(|p| p["bucket"]["negative_or_invalid"].as_f64())
        .sum();
    let restarted = phases.last().ok_or("no phases")?;
    let down = &r["intervals"][1];
    let fail_open =
        num(down, &["admitted"])? > 0.0 && restarted["statuses"]["503"].as_f64().is_none();
    let last = &r["intervals"][3];
    let after = num(last, &["tokens_sent"])? - num(last, &["bound"])?;
    let again = r["shared_again_after_ms"]
        .as_f64()
        .map_or_else(|| "never".to_owned(), |ms| format!("{} ms", thousands(ms)));
    write!(
        t,
        "\nAgainst issue 34's targets, this run, shared: tokens beyond the budget **{}** at most \
         (≤ one reservation, {} tokens: {}); reconciliations lost or left **{}** (none: {}); \
         negative bucket samples **{}** over both Redis phases (none: {}). Redis restarted: \
         served on the gateways' own buckets while it was down, no 503 (fail open: {}); the \
         bucket back in Redis {} after the restart, and from {:.0} s on tokens beyond one fresh \
         bucket **{}** (≤ one reservation: {}).",
        signed(over),
        thousands(reservation),
        met(over <= reservation),
        thousands(lost),
        met(lost == 0.0),
        thousands(negative),
        met(negative == 0.0),
        met(fail_open),
        again,
        num(last, &["from_s"])?,
        signed(after),
        met(after <= reservation),
    )?;
    Ok(t)
}
