//! The tables of `benches/README.md`, one function per bench's JSON.

use std::fmt::Write as _;

use serde_json::Value;

use super::{Doc, Error, best_static, met, num, run_note, thousands};

/// The stacks of the `overhead` bench, in its order.
const STACKS: [&str; 13] = [
    "bare",
    "first_token_hedge",
    "sse_idle_timeout",
    "bounded_admission",
    "priority_class",
    "latency_phase_recorder",
    "tailguard_full_stack",
    "tower_hedge",
    "tower_timeout",
    "tower_http_response_body_timeout",
    "tower_concurrency_limit",
    "tower_http_trace",
    "tower_analogue_stack",
];

/// §2: every stack per request and per frame, each layer over its analogue, the targets.
pub(super) fn overhead(v: &Value, doc: Doc) -> Result<String, Error> {
    let mut t = run_note(v, "overhead.json", doc);
    t += "\n\n| stack | ns / request | over bare | ns / frame | over bare |\n";
    t += "|---|---:|---:|---:|---:|\n";
    for name in STACKS {
        let s = &v["stacks"][name];
        if s.is_null() {
            continue;
        }
        let n = |k: &str| num(s, &[k]);
        writeln!(
            t,
            "| `{name}` | {} | {} | {:.1} | {:.1} |",
            thousands(n("ns_per_request")?),
            thousands(n("ns_per_request_over_bare")?),
            n("ns_per_frame")?,
            n("ns_per_frame_over_bare")?,
        )?;
    }
    t += "\n| layer / tower analogue | per-frame ratio | per-request ratio | per frame ≤ 1x |\n";
    t += "|---|---:|---:|---:|\n";
    for a in v["analogues"].as_array().ok_or("no analogues")? {
        let frame = num(a, &["per_frame_ratio"])?;
        writeln!(
            t,
            "| `{}` / `{}` | {frame:.2} | {:.2} | {} |",
            a["layer"].as_str().ok_or("no layer")?,
            a["analogue"].as_str().ok_or("no analogue")?,
            num(a, &["per_request_ratio"])?,
            met(frame <= 1.0),
        )?;
    }
    let req = num(v, &["full_stack_over_bare", "ns_per_request"])?;
    let frame = num(v, &["full_stack_over_bare", "ns_per_frame"])?;
    let stack = v["analogues"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["layer"] == "tailguard_full_stack"))
        .ok_or("no full-stack ratio")?;
    write!(
        t,
        "\nAgainst the targets, this run: the full stack over bare **{} ns per request** \
         (≤ 3,000: {}), **{frame:.1} ns per frame** (≤ 150: {}); the whole stack is \
         **{:.2}x** the tower analogue stack per frame (≤ 1x: {}) and {:.2}x per request.",
        thousands(req),
        met(req <= 3_000.0),
        met(frame <= 150.0),
        num(stack, &["per_frame_ratio"])?,
        met(num(stack, &["per_frame_ratio"])? <= 1.0),
        num(stack, &["per_request_ratio"])?,
    )?;
    Ok(t)
}

/// §3: each mode's throughput, latency and memory, and the targets.
pub(super) fn gateway_throughput(v: &Value, doc: Doc) -> Result<String, Error> {
    let mut t = run_note(v, "gateway_throughput.json", doc);
    if v["quick"].as_bool() == Some(true) {
        t += " A `--quick` run.";
    }
    t += "\n\n| mode | events/s | errors | TTFT p50 | TTFT p99 | gap excess p50 | gap excess p99 \
          | RSS per open stream |\n";
    t += "|---|---:|---:|---:|---:|---:|---:|---:|\n";
    let modes = v["modes"].as_array().ok_or("no modes")?;
    let ms = |m: &Value, k: &str| num(m, &[k]).map(|us| format!("{:.2} ms", us / 1e3));
    for m in modes {
        writeln!(
            t,
            "| {} | {} | {} | {} | {} | {} | {} | {:.2} KiB |",
            m["mode"].as_str().ok_or("no mode")?,
            thousands(num(m, &["events_per_sec"])?),
            num(m, &["errors"])? + m["latency_errors"].as_f64().unwrap_or(0.0),
            ms(m, "ttft_p50_us")?,
            ms(m, "ttft_p99_us")?,
            ms(m, "gap_excess_p50_us")?,
            ms(m, "gap_excess_p99_us")?,
            num(m, &["kib_per_open_stream"])?,
        )?;
    }
    let rate = |mode: &str| {
        modes
            .iter()
            .find(|m| m["mode"] == mode)
            .and_then(|m| m["events_per_sec"].as_f64())
            .ok_or_else(|| format!("no {mode} mode"))
    };
    let full = num(v, &["full_over_bare_throughput"])?;
    let ttft = num(v, &["full_added_ttft_p99_us"])? / 1e3;
    let gap = num(v, &["full_added_gap_p99_us"])? / 1e3;
    let heap = num(v, &["stack_heap_bytes_per_open_stream_exact"])?;
    write!(
        t,
        "\nAgainst the targets, this run: the full-stack gateway delivered **{full:.2}x** the \
         no-layer gateway's events/s (≥ 0.9x: {}; the shipped gateway {:.2}x); added p99 \
         latency vs direct: TTFT {ttft:+.2} ms, inter-event gap {gap:+.2} ms (≤ 1 ms: {}); \
         the stack's heap per open stream after its first token **{} B** ({:.2} KiB, exact, in \
         process; ≤ 4 KiB: {}).",
        met(full >= 0.9),
        rate("gateway_shipped")? / rate("gateway_bare")?,
        met(ttft <= 1.0 && gap <= 1.0),
        thousands(heap),
        heap / 1024.0,
        met(heap <= 4096.0),
    )?;
    Ok(t)
}

/// §4: the added latency of a lease, and three gateways sharing a capacity.
pub(super) fn cluster_admission(v: &Value, doc: Doc) -> Result<String, Error> {
    let mut t = run_note(v, "cluster_admission.json", doc);
    t += "\n\n| gate | p50 | p99 | p99.9 | Redis round trips / request | Redis commands / request |\n";
    t += "|---|---:|---:|---:|---:|---:|\n";
    for g in v["latency"].as_array().ok_or("no latency")? {
        writeln!(
            t,
            "| {} | {} µs | {} µs | {} µs | {:.2} | {:.2} |",
            g["gate"].as_str().ok_or("no gate")?,
            num(g, &["p50_us"])?,
            num(g, &["p99_us"])?,
            num(g, &["p999_us"])?,
            num(g, &["redis_round_trips_per_request"])?,
            num(g, &["redis_commands_per_request"])?,
        )?;
    }
    t += "\n| mode | capacity | peak concurrent streams at the replica | 200 / 503 | Redis round \
          trips / request (/ admitted) | commands / request (/ admitted) | TTFT p50 / p99 |\n";
    t += "|---|---|---:|---:|---:|---:|---:|\n";
    for m in v["three_gateways"].as_array().ok_or("no three_gateways")? {
        let status = |s: &str| m["statuses"][s].as_f64().unwrap_or(0.0);
        let per = |k: &str| -> Result<String, Error> {
            let (r, a) = (
                num(m, &[&format!("{k}_per_request")])?,
                num(m, &[&format!("{k}_per_admitted")])?,
            );
            Ok(if r == 0.0 {
                "0".to_owned()
            } else {
                format!("{r:.2} ({a:.2})")
            })
        };
        writeln!(
            t,
            "| {} | {} | {} | {} / {} | {} | {} | {:.1} / {:.1} ms |",
            m["mode"].as_str().ok_or("no mode")?,
            m["capacity"].as_str().ok_or("no capacity")?,
            num(m, &["peak_concurrent_at_replica"])?,
            thousands(status("200")),
            thousands(status("503")),
            per("redis_round_trips")?,
            per("redis_commands")?,
            num(m, &["ttft_p50_ms"])?,
            num(m, &["ttft_p99_ms"])?,
        )?;
    }
    Ok(t.trim_end().to_owned())
}

/// §5: the latest run's p99s per rate and front, the sustained rates, the ratios.
pub(super) fn gateway_nginx(v: &Value, doc: Doc) -> Result<String, Error> {
    let mut t = run_note(v, "gateway_nginx.json", doc);
    let fronts = v["fronts"].as_array().ok_or("no fronts")?;
    fn name(f: &Value) -> &str {
        match f["front"].as_str() {
            Some("direct") => "direct: TTFT p99 / gap p99",
            Some("gateway") => "tailguard gateway",
            Some("bare proxy") => "bare hyper proxy (no layers)",
            Some(other) => other,
            None => "?",
        }
    }
    t += "\n\n| rate |";
    for f in fronts {
        write!(t, " {} |", name(f))?;
    }
    t += "\n|---|";
    t += &"---:|".repeat(fronts.len());
    let rates = fronts[0]["runs"].as_array().ok_or("no runs")?;
    for rate in rates.iter().map(|r| num(r, &["rate"])) {
        let rate = rate?;
        write!(t, "\n| {rate:.0}/s |")?;
        for f in fronts {
            let run = f["runs"]
                .as_array()
                .and_then(|r| r.iter().find(|r| r["rate"].as_f64() == Some(rate)));
            match run {
                Some(r) => write!(
                    t,
                    " {:.1} / {:.1} ms |",
                    num(r, &["ttft_p99_ms"])?,
                    num(r, &["gap_p99_ms"])?
                )?,
                None => t += " - |",
            }
        }
    }
    write!(
        t,
        "\n| sustained (p99 TTFT <= {:.1} ms) |",
        num(v, &["slo_ttft_p99_ms"])?
    )?;
    for f in fronts {
        let at_least = if f["sustained_at_least"].as_bool() == Some(true) {
            ">= "
        } else {
            ""
        };
        write!(t, " {at_least}{:.0}/s |", num(f, &["sustained"])?)?;
    }
    let r = &v["gateway_over_nginx"];
    if r.is_object() {
        let pair = |p: &Value| -> Result<String, Error> {
            let p = p.as_array().ok_or("not a pair")?;
            let x = |i: usize| p.get(i).and_then(Value::as_f64).ok_or("short pair");
            Ok(match p.len() {
                3 => format!("{:.0}/s {:.2}x, {:.2}x", x(0)?, x(1)?, x(2)?),
                _ => format!("{:.0}/s {:.2}x", x(0)?, x(1)?),
            })
        };
        let list = |k: &str| -> Result<String, Error> {
            let items = r[k].as_array().ok_or_else(|| format!("no {k}"))?;
            Ok(items
                .iter()
                .map(pair)
                .collect::<Result<Vec<_>, _>>()?
                .join("; "))
        };
        write!(
            t,
            "\n\nGateway / nginx, this run: TTFT p99, gap p99 per rate {}; the TTFT target reads \
             {}; sustained rate **{:.2}x**. Targets: gap p99 ≤ 1.1x at 100/s and 400/s: {}; \
             TTFT p99 ≤ 1.2x up to nginx's sustained rate: {}; sustained ≥ 0.8x: {}.",
            list("per_rate")?,
            list("ttft_checked")?,
            num(r, &["sustained"])?,
            met(r["gap_target_met"].as_bool() == Some(true)),
            met(r["ttft_target_met"].as_bool() == Some(true)),
            met(r["sustained_target_met"].as_bool() == Some(true)),
        )?;
    }
    if let Some(b) = v["bare_proxy_over_nginx_sustained"].as_f64() {
        write!(t, " The bare hyper proxy sustains {b:.2}x nginx's rate.")?;
    }
    // Issue 29's check of the defaults, in runs that made it.
    if let Some(items) = r["do_no_harm"].as_array() {
        let mut cells = Vec::new();
        for p in items {
            let x = |i: usize| p[i].as_f64().ok_or("short do_no_harm entry");
            cells.push(format!(
                "{:.0}/s: {:.0} not completed, TTFT p99 {:.2}x",
                x(0)?,
                x(1)?,
                x(2)?
            ));
        }
        write!(
            t,
            "\n\nDo no harm (the gateway with every default): {}. Target (every request, TTFT p99 \
             ≤ 1.2x nginx's): {}.",
            cells.join("; "),
            met(r["do_no_harm_met"].as_bool() == Some(true)),
        )?;
    }
    Ok(t)
}

/// Scenario E's verdict on one step: the adaptive limit against the best static one.
#[derive(Clone, Debug, PartialEq)]
pub struct StepVerdict {
    /// The load step, as the bench names it.
    pub step: String,
    /// The best static limit of the step, by [`best_static`].
    pub best_static: String,
    /// Adaptive p99 TTFT over the best static's (target ≤ 1.2).
    pub p99_ratio: Option<f64>,
    /// Adaptive goodput over the best static's (target ≥ 0.95).
    pub goodput_ratio: f64,
}

/// Scenario E's verdicts, recomputed from its results by the bench's rule ([`best_static`]),
/// one per step.
///
/// # Errors
///
/// A field missing, or a verdict the JSON records that the rule does not give.
pub fn adaptive_verdicts(v: &Value) -> Result<Vec<StepVerdict>, Error> {
    let results = v["results"].as_array().ok_or("no results")?;
    let (adaptive, statics) = results.split_last().ok_or("no limits")?;
    let steps = adaptive["steps"].as_array().ok_or("no steps")?;
    let mut out = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let cell = |r: &Value| -> Result<(f64, Option<f64>), Error> {
            let s = &r["steps"][i];
            Ok((num(s, &["goodput"])?, s["p99_ttft_ms"].as_f64()))
        };
        let cands = statics.iter().map(cell).collect::<Result<Vec<_>, _>>()?;
        let Some(b) = best_static(&cands) else {
            continue;
        };
        let (a, best) = (cell(adaptive)?, cands[b]);
        let name = statics[b]["limit"].as_str().ok_or("no limit")?.to_owned();
        let step_name = step["step"].as_str().ok_or("no step")?.to_owned();
        if let Some(rec) = v["verdicts"].as_array().and_then(|vs| vs.get(out.len()))
            && rec["best_static"].as_str() != Some(name.as_str())
        {
            return Err(format!(
                "adaptive_limit.json: step {step_name} records best static {}, the rule gives {name}",
                rec["best_static"]
            )
            .into());
        }
        out.push(StepVerdict {
            step: step_name,
            best_static: name,
            p99_ratio: a.1.zip(best.1).map(|(a, b)| a / b),
            goodput_ratio: a.0 / best.0.max(1e-9),
        });
    }
    Ok(out)
}

/// §6: p99 TTFT and goodput per limit and step, and the verdicts of every step.
pub(super) fn adaptive_limit(v: &Value, doc: Doc) -> Result<String, Error> {
    let mut t = run_note(v, "adaptive_limit.json", doc);
    let results = v["results"].as_array().ok_or("no results")?;
    let steps = results[0]["steps"].as_array().ok_or("no steps")?;
    t += "\n\n| limit |";
    for (i, s) in steps.iter().enumerate() {
        let step = s["step"].as_str().ok_or("no step")?;
        if i == 0 {
            write!(t, " {step}: p99 TTFT / goodput |")?;
        } else {
            write!(t, " {step} |")?;
        }
    }
    t += "\n|---|";
    t += &"---:|".repeat(steps.len());
    for (k, r) in results.iter().enumerate() {
        let adaptive = k + 1 == results.len();
        let bold = |s: String| if adaptive { format!("**{s}**") } else { s };
        write!(
            t,
            "\n| {} |",
            bold(r["limit"].as_str().ok_or("no limit")?.to_owned())
        )?;
        for s in r["steps"].as_array().ok_or("no steps")? {
            let p99 = s["p99_ttft_ms"]
                .as_f64()
                .map_or("-".to_owned(), |p| format!("{} ms", thousands(p)));
            write!(
                t,
                " {} |",
                bold(format!("{p99} / {:.1}/s", num(s, &["goodput"])?))
            )?;
        }
    }
    t += "\n\nAgainst the targets (adaptive vs the best static of each step, by the bench's rule: \
          the highest goodput, and among the limits within 5% of it the lowest p99 TTFT):\n\n";
    t += "| step | best static | p99 TTFT (≤ 1.2x) | goodput (≥ 0.95x) |\n";
    t += "|---|---|---:|---:|\n";
    for StepVerdict {
        step,
        best_static: best,
        p99_ratio: p99,
        goodput_ratio: goodput,
    } in adaptive_verdicts(v)?
    {
        let p99 = p99.map_or("-".to_owned(), |p| {
            if p <= 1.2 {
                format!("**{p:.2}x**")
            } else {
                format!("{p:.2}x: **missed**")
            }
        });
        let goodput = if goodput >= 0.95 {
            format!("**{goodput:.2}x**")
        } else {
            format!("{goodput:.2}x: **missed**")
        };
        writeln!(t, "| {step} | {best} | {p99} | {goodput} |")?;
    }
    match v["recovery_seconds"].as_f64() {
        Some(s) => write!(
            t,
            "\nAfter the drop, every 2 s slice's adaptive p99 TTFT is within 1.2x of the lowest \
             static p99 of that slice from {s:.0} s on."
        )?,
        None => {
            t += "\nAfter the drop, the adaptive p99 TTFT never stays within 1.2x of the best static."
        }
    }
    Ok(t)
}
