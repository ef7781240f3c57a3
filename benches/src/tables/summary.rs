//! The root README's table: each bench's headline figures, from the same JSON as
//! `benches/README.md`'s tables.

use std::fmt::Write as _;

use serde_json::Value;

use super::batching;
use super::render::{StepVerdict, adaptive_verdicts};
use super::{Doc, Error, load_note, met, num, thousands};

/// The JSON of every bench the summary reads.
pub(super) struct Runs<'a> {
    pub(super) tail: &'a Value,
    pub(super) overhead: &'a Value,
    pub(super) throughput: &'a Value,
    pub(super) cluster: &'a Value,
    pub(super) nginx: &'a Value,
    pub(super) cpu: &'a Value,
    pub(super) instructions: &'a Value,
    pub(super) adaptive: &'a Value,
    pub(super) resume: &'a Value,
    pub(super) fairness: &'a Value,
    pub(super) budgets: &'a Value,
    pub(super) batching: &'a Value,
}

/// A strategy of a `tail_latency` scenario.
fn strategy<'a>(tail: &'a Value, scenario: &str, key: &str) -> Result<&'a Value, Error> {
    tail["scenarios"]
        .as_array()
        .and_then(|s| s.iter().find(|s| s["key"] == scenario))
        .and_then(|s| s["strategies"].as_array())
        .and_then(|s| s.iter().find(|s| s["key"] == key))
        .ok_or_else(|| format!("tail_latency.json: no {key} in scenario {scenario}").into())
}

fn x(v: f64) -> String {
    format!("{v:.2}x")
}

/// The table: benchmark, figure, target and verdict, run (JSON file and load).
pub(super) fn summary(r: &Runs<'_>, doc: Doc) -> Result<String, Error> {
    let link = |file: &str| format!("[`{file}`]({}{file})", doc.results_link());
    let run = |v: &Value, file: &str| format!("{}; {}", link(file), load_note(v, true));
    let mut t =
        String::from("| benchmark | figure (this run) | target | run |\n|---|---|---|---|\n");
    let mut row = |bench: &str, figure: String, target: String, run: &str| {
        writeln!(t, "| {bench} | {figure} | {target} | {run} |")
    };

    // Tail latency, the adaptive default against the baselines.
    let tail = run(r.tail, "tail_latency.json");
    let ad = |sc: &str| strategy(r.tail, sc, "first_token_hedge_adaptive");
    let verdict = |s: &Value| met(s["target_met"].as_bool() == Some(true));
    let a = ad("a")?;
    row(
        "tail latency A, congested replica (`--bin tail_latency`): the default's p99 TTFT vs no hedge; vs the floor; extra upstream requests",
        format!(
            "{}; {}; {:.1}%",
            x(num(a, &["p99_vs_no_hedge"])?),
            x(num(a, &["p99_over_floor"])?),
            num(a, &["extra_upstream_pct"])?
        ),
        format!("≤ 0.25x, ≤ 1.3x, ≤ 10%: {}", verdict(a)),
        &tail,
    )?;
    let b = ad("b")?;
    row(
        "B, head-of-line blocking: the same",
        format!(
            "{}; {}; {:.1}%",
            x(num(b, &["p99_vs_no_hedge"])?),
            x(num(b, &["p99_over_floor"])?),
            num(b, &["extra_upstream_pct"])?
        ),
        format!("≤ 0.25x, ≤ 1.3x, ≤ 10%: {}", verdict(b)),
        &tail,
    )?;
    let c = ad("c")?;
    row(
        "C, flaky replica: client errors, no hedge → the default",
        format!(
            "{:.1}% → {:.1}%",
            num(strategy(r.tail, "c", "no_hedge")?, &["error_pct"])?,
            num(c, &["error_pct"])?
        ),
        format!("≤ 0.5%: {}", verdict(c)),
        &tail,
    )?;
    for (sc, name) in [
        ("d", "D, hidden congestion"),
        ("d_slots", "D-slots, 1 slot per replica, FIFO"),
        ("d_interrupt", "D-slots, interrupting"),
    ] {
        let d = ad(sc)?;
        row(
            &format!(
                "{name}: the default's p99 TTFT vs round robin; vs tower p2c; extra upstream; client errors"
            ),
            format!(
                "{}; {}; {:.1}%; {:.1}%",
                x(num(d, &["p99_vs_no_hedge"])?),
                x(num(d, &["p99_vs_p2c"])?),
                num(d, &["extra_upstream_pct"])?,
                num(d, &["error_pct"])?
            ),
            format!("≤ 0.25x, ≤ 0.7x, ≤ 10%, 0: {}", verdict(d)),
            &tail,
        )?;
    }

    // Overhead in process.
    let o = r.overhead;
    let req = num(o, &["full_stack_over_bare", "ns_per_request"])?;
    let frame = num(o, &["full_stack_over_bare", "ns_per_frame"])?;
    let stack = o["analogues"]
        .as_array()
        .and_then(|a| a.iter().find(|a| a["layer"] == "tailguard_full_stack"))
        .ok_or("overhead.json: no full-stack ratio")?;
    let (sf, sr) = (
        num(stack, &["per_frame_ratio"])?,
        num(stack, &["per_request_ratio"])?,
    );
    row(
        "the full stack's cost over the bare service, per request; per frame (`--bench overhead`)",
        format!("**{} ns**; **{frame:.1} ns**", thousands(req)),
        format!(
            "≤ 3,000 ns: {}; ≤ 150 ns: {}",
            met(req <= 3_000.0),
            met(frame <= 150.0)
        ),
        &run(o, "overhead.json"),
    )?;
    row(
        "the whole stack vs the tower/tower-http analogue stack, per frame (per request)",
        format!("**{}** ({})", x(sf), x(sr)),
        format!("≤ 1x per frame: {}", met(sf <= 1.0)),
        &run(o, "overhead.json"),
    )?;

    // Gateway throughput.
    let g = r.throughput;
    let full = num(g, &["full_over_bare_throughput"])?;
    let heap = num(g, &["stack_heap_bytes_per_open_stream_exact"])?;
    let (ttft, gap) = (
        num(g, &["full_added_ttft_p99_us"])? / 1e3,
        num(g, &["full_added_gap_p99_us"])? / 1e3,
    );
    row(
        "gateway, 1,000 concurrent streams (`--bin gateway_throughput`): full stack vs no-layer gateway, events/s; added p99 TTFT, gap vs direct; the stack's heap per open stream",
        format!(
            "**{}**; {ttft:+.2} ms, {gap:+.2} ms; **{} B**",
            x(full),
            thousands(heap)
        ),
        format!(
            "≥ 0.9x: {}; ≤ 1 ms: {}; ≤ 4 KiB: {}",
            met(full >= 0.9),
            met(ttft <= 1.0 && gap <= 1.0),
            met(heap <= 4096.0)
        ),
        &run(g, "gateway_throughput.json"),
    )?;

    // Cluster admission.
    let cl = r.cluster;
    let gate = |name: &str| {
        cl["latency"]
            .as_array()
            .and_then(|l| l.iter().find(|g| g["gate"] == name))
            .ok_or_else(|| format!("cluster_admission.json: no {name} gate"))
    };
    let mode = |name: &str| {
        cl["three_gateways"]
            .as_array()
            .and_then(|l| l.iter().find(|g| g["mode"] == name))
            .ok_or_else(|| format!("cluster_admission.json: no {name} mode"))
    };
    let (local, cluster) = (gate("local")?, gate("cluster")?);
    let shared = mode("cluster")?;
    let peak = num(shared, &["peak_concurrent_at_replica"])?;
    row(
        "cluster mode on Redis (`--bin cluster_admission`): added latency per admitted request (p50, p99); three gateways sharing 64 at 1,000 requests/s: peak streams at the replica (local limits), Redis round trips per admitted request",
        format!(
            "+{:.0} µs, +{:.0} µs; **{peak:.0}** ({:.0}), {:.2}",
            num(cluster, &["p50_us"])? - num(local, &["p50_us"])?,
            num(cluster, &["p99_us"])? - num(local, &["p99_us"])?,
            num(mode("local")?, &["peak_concurrent_at_replica"])?,
            num(shared, &["redis_round_trips_per_admitted"])?,
        ),
        format!("limit held: {}", met(peak <= 64.0)),
        &run(cl, "cluster_admission.json"),
    )?;

    // The gateway against nginx.
    let n = &r.nginx["gateway_over_nginx"];
    let pairs = |k: &str| -> Result<String, Error> {
        let items = n[k].as_array().ok_or_else(|| format!("no {k}"))?;
        let mut cells = Vec::new();
        for p in items {
            let v = |i: usize| p[i].as_f64().ok_or("short pair");
            cells.push(match k {
                "per_rate" => format!("{:.0}/s {}", v(0)?, x(v(2)?)),
                _ => format!("{:.0}/s {}", v(0)?, x(v(1)?)),
            });
        }
        Ok(cells.join(", "))
    };
    let flag = |k: &str| met(n[k].as_bool() == Some(true));
    row(
        "the gateway vs nginx over the same mocks (`--bin gateway_nginx`): gap p99 per rate; TTFT p99 up to nginx's sustained rate; highest rate sustained",
        format!(
            "{}; {}; **{}**",
            pairs("per_rate")?,
            pairs("ttft_checked")?,
            x(num(n, &["sustained"])?)
        ),
        format!(
            "≤ 1.1x at 100, 400/s: {}; ≤ 1.2x: {}; ≥ 0.8x: {}",
            flag("gap_target_met"),
            flag("ttft_target_met"),
            flag("sustained_target_met")
        ),
        &run(r.nginx, "gateway_nginx.json"),
    )?;

    // Issue 31: CPU per request against the bare proxy and against the reading floor.
    let c = r.cpu;
    let rounds = |k: &str| -> Result<String, Error> {
        let v = c[k]
            .as_array()
            .ok_or_else(|| format!("gateway_cpu.json: no {k}"))?;
        Ok(v.iter()
            .filter_map(Value::as_f64)
            .map(x)
            .collect::<Vec<_>>()
            .join(", "))
    };
    let median = num(c, &["median_ratio"])?;
    row(
        "CPU per request at 300 streams/s (`--bin gateway_nginx -- --cpu`), medians of interleaved rounds: gateway / bare hyper proxy; reading proxy (the bare proxy reading each stream once) / bare; gateway / reading proxy",
        format!(
            "**{}** ({}); {}; {}",
            x(median),
            rounds("ratios")?,
            x(num(c, &["median_reading_ratio"])?),
            x(num(c, &["median_over_reading_ratio"])?)
        ),
        format!("≤ 1.15x: {}", met(median <= 1.15)),
        &run(c, "gateway_cpu.json"),
    )?;

    // Issue 31, the user-space part of the CPU row, counted rather than timed.
    let i = r.instructions;
    let per = |front: &str| num(i, &["fronts", front, "per_request"]);
    let ratio = |k: &str| num(i, &["ratios", k]);
    row(
        "user-space instructions per request under callgrind, same fronts and mocks at 20 streams/s (`benches/instructions/instructions.py`): gateway / bare hyper proxy; reading proxy / bare; gateway / reading proxy",
        format!(
            "**{}** ({:.0}k against {:.0}k); {}; {}",
            x(ratio("gateway / bare proxy")?),
            per("gateway")? / 1e3,
            per("bare proxy")? / 1e3,
            x(ratio("reading proxy / bare proxy")?),
            x(ratio("gateway / reading proxy")?)
        ),
        "none (the CPU row's user-space part, without its noise)".to_owned(),
        &run(i, "instructions.json"),
    )?;

    // Scenario E, every step by the bench's own rule.
    let verdicts = adaptive_verdicts(r.adaptive)?;
    let cells =
        |f: &dyn Fn(&StepVerdict) -> String| verdicts.iter().map(f).collect::<Vec<_>>().join("; ");
    let ad_run = run(r.adaptive, "adaptive_limit.json");
    row(
        "scenario E (`--bin adaptive_limit`): adaptive limit vs the best static (8, 32, 128) of each load step, by the bench's rule, p99 TTFT",
        cells(&|v| {
            format!(
                "{} {} (vs {})",
                v.step,
                v.p99_ratio.map_or("-".to_owned(), x),
                v.best_static
            )
        }),
        format!(
            "≤ 1.2x: {}",
            met(verdicts
                .iter()
                .all(|v| v.p99_ratio.is_none_or(|p| p <= 1.2)))
        ),
        &ad_run,
    )?;
    row(
        "the same, goodput (completed streams/s)",
        cells(&|v| format!("{} {}", v.step, x(v.goodput_ratio))),
        format!(
            "≥ 0.95x: {}",
            met(verdicts.iter().all(|v| v.goodput_ratio >= 0.95))
        ),
        &ad_run,
    )?;

    // Issue 29: a batching upstream offered twice its slots.
    let bo = r.batching;
    let cell = |name: &str| -> Result<(String, bool), Error> {
        let c = batching::config(bo, name)?;
        let two = batching::last_step(c)?;
        Ok((
            format!(
                "{:.2}x, {}, {:.2}x",
                num(two, &["at_replica_peak_slots"])?,
                x(num(c, &["p99_vs_unloaded"])?),
                num(two, &["goodput_vs_capacity"])?
            ),
            batching::target_met(c)?,
        ))
    };
    let configs = [
        "--replica-slots 8 --admission-queue-timeout 250ms",
        "--admission-adaptive true --admission-queue-timeout 250ms",
        "--admission-adaptive true --admission-queue-timeout 100ms",
    ];
    let mut figures = Vec::new();
    let mut verdicts = Vec::new();
    for name in configs {
        let (figure, ok) = cell(name)?;
        figures.push(if ok { format!("**{figure}**") } else { figure });
        verdicts.push(met(ok));
    }
    row(
        "a batching upstream (8 slots, its own queue) offered 2x its capacity (`--bin batching_overload`): streams at the replica at most (slots); the admitted's p99 TTFT vs unloaded; completed vs capacity. Told the slots (`--replica-slots 8`) with `--admission-queue-timeout 250ms`; the adaptive limit with 250 ms; with 100 ms",
        figures.join("; "),
        format!(
            "≤ 2x, ≤ 3x, refusals 429/503 with `Retry-After`: {}",
            verdicts.join("; ")
        ),
        &run(bo, "batching_overload.json"),
    )?;

    // Issue 33: mid-stream resume, one stream in ten broken.
    let rb = r.resume;
    let runs = rb["runs"].as_array().ok_or("resume_broken.json: no runs")?;
    let on = runs
        .iter()
        .find(|x| x["name"] == "broken, resume on")
        .ok_or("resume_broken.json: no resume-on run")?;
    let targets = &rb["targets"];
    let all_met = [
        "resume_on_every_request_completed",
        "resume_on_every_completed_text_identical",
        "resume_on_p99_total_within_1_3x_unbroken",
    ]
    .iter()
    .all(|k| targets[k].as_bool() == Some(true));
    row(
        "mid-stream resume, one stream in ten broken (`--bin resume_broken`): with resume on, completed; identical text; p99 total vs the unbroken run",
        format!(
            "{:.1}%; {:.1}%; {}",
            num(on, &["completed_pct"])?,
            num(on, &["identical_pct_of_completed"])?,
            x(num(rb, &["p99_total_resume_on_over_unbroken"])?)
        ),
        format!("100%, 100%, ≤ 1.3x: {}", met(all_met)),
        &run(rb, "resume_broken.json"),
    )?;

    // Issue 34: fair queueing across tenants, token budgets across gateways.
    let f = r.fairness;
    let phases = f["phases"]
        .as_array()
        .ok_or("tenant_fairness.json: no phases")?;
    let vs_alone = |fair: bool| -> Result<f64, Error> {
        let p = phases
            .iter()
            .find(|p| p["b"].is_object() && p["fair_queueing"].as_bool() == Some(fair))
            .ok_or("tenant_fairness.json: no flood phase")?;
        num(p, &["a_p99_vs_alone"])
    };
    row(
        "tenants (`--bin tenant_fairness`): a tenant's p99 TTFT while another floods at 5x its share, vs alone; with fair queueing, without",
        format!("**{}**; {}", x(vs_alone(true)?), x(vs_alone(false)?)),
        format!("≤ 1.2x: {}", met(f["met"].as_bool() == Some(true))),
        &run(f, "tenant_fairness.json"),
    )?;
    let b = r.budgets;
    let shared = b["phases"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "shared (Redis)"))
        .ok_or("tenant_budgets.json: no shared phase")?;
    let over = num(shared, &["max_overshoot_any_time"])?;
    let reservation = num(b, &["reservation_tokens"])?;
    let lost = num(shared, &["reconciles_lost"])?;
    row(
        "token budgets, three gateways on one Redis (`--bin tenant_budgets`): tokens admitted beyond the budget at worst (one reservation); reconciliations lost",
        format!("{over:.0} ({reservation:.0}); {lost:.0}"),
        format!(
            "≤ one reservation, none lost: {}",
            met(over <= reservation && lost == 0.0)
        ),
        &run(b, "tenant_budgets.json"),
    )?;
    Ok(t.trim_end().to_owned())
}
