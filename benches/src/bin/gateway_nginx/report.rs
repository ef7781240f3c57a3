//! The table, the ratios against the targets, and the JSON file.

use serde::Serialize;
use tailguard::core::BoxError;

use crate::{FrontResult, Opts, RATES, REPLICAS, SCRIPT, SLO_FACTOR};

const TARGETS: &str = "gateway/nginx: gap p99 <= 1.1x at 100/s and 400/s; TTFT p99 <= 1.2x at every rate up to the highest nginx sustains; sustained rate >= 0.8x; do no harm: with its defaults the gateway completes every request at 100/s and 300/s, TTFT p99 <= 1.2x nginx's";

/// The rates of issue 29's do-no-harm target.
const DO_NO_HARM_RATES: [f64; 2] = [100.0, 300.0];

/// The gateway's figures over nginx's, in this run.
#[derive(Debug, Serialize)]
struct Ratios {
    /// Per fixed rate: (rate, TTFT p99 ratio, gap p99 ratio).
    per_rate: Vec<(f64, f64, f64)>,
    /// What the TTFT target reads: every rate both fronts ran, a fixed rate or a bisection
    /// probe, up to nginx's sustained rate: (rate, TTFT p99 ratio).
    ttft_checked: Vec<(f64, f64)>,
    sustained: f64,
    /// At [`DO_NO_HARM_RATES`]: (rate, requests the gateway did not complete, TTFT p99 ratio).
    do_no_harm: Vec<(f64, u64, f64)>,
    /// Each target, met or not.
    gap_target_met: bool,
    ttft_target_met: bool,
    sustained_target_met: bool,
    do_no_harm_met: bool,
}

#[derive(Serialize)]
struct Output<'a> {
    bench: &'static str,
    script: &'static str,
    replicas: usize,
    window_seconds: f64,
    slo_ttft_p99_ms: f64,
    slo: String,
    targets: &'static str,
    loadavg_before: &'a str,
    /// When the run started and the machine's load (`loadavg_before` is its raw line).
    run: tailguard_benches::run::RunInfo,
    fronts: &'a [FrontResult],
    gateway_over_nginx: Option<Ratios>,
    /// The layer-less hyper proxy's sustained rate over nginx's.
    bare_proxy_over_nginx_sustained: Option<f64>,
    /// The gateway's sustained rate over the layer-less hyper proxy's: what the layers cost,
    /// with hyper and tokio on both sides.
    gateway_over_bare_proxy_sustained: Option<f64>,
}

fn ratios(nginx: &FrontResult, gateway: &FrontResult) -> Ratios {
    let per_rate: Vec<(f64, f64, f64)> = RATES
        .iter()
        .filter_map(|&rate| {
            let (n, g) = (nginx.at(rate)?, gateway.at(rate)?);
            Some((
                rate,
                g.ttft_p99_ms / n.ttft_p99_ms,
                g.gap_p99_ms / n.gap_p99_ms,
            ))
        })
        .collect();
    let gap_target_met = per_rate
        .iter()
        .filter(|(rate, ..)| *rate <= 400.0)
        .all(|(_, _, gap)| *gap <= 1.1);
    let mut ttft_checked: Vec<(f64, f64)> = nginx
        .all_runs()
        .filter(|n| n.rate <= nginx.sustained)
        .filter_map(|n| {
            let g = gateway.all_runs().find(|g| g.rate == n.rate)?;
            Some((n.rate, g.ttft_p99_ms / n.ttft_p99_ms))
        })
        .collect();
    ttft_checked.sort_by(|a, b| a.0.total_cmp(&b.0));
    ttft_checked.dedup_by(|a, b| a.0 == b.0);
    let ttft_target_met = ttft_checked.iter().all(|(_, ttft)| *ttft <= 1.2);
    let sustained = gateway.sustained / nginx.sustained;
    let do_no_harm: Vec<(f64, u64, f64)> = DO_NO_HARM_RATES
        .iter()
        .filter_map(|&rate| {
            let (n, g) = (nginx.at(rate)?, gateway.at(rate)?);
            Some((rate, g.not_completed, g.ttft_p99_ms / n.ttft_p99_ms))
        })
        .collect();
    let do_no_harm_met = do_no_harm.len() == DO_NO_HARM_RATES.len()
        && do_no_harm
            .iter()
            .all(|(_, lost, ttft)| *lost == 0 && *ttft <= 1.2);
    Ratios {
        per_rate,
        ttft_checked,
        sustained,
        do_no_harm,
        gap_target_met,
        ttft_target_met,
        sustained_target_met: sustained >= 0.8,
        do_no_harm_met,
    }
}

fn sustained_cell(f: &FrontResult) -> String {
    format!(
        "{}{:.0}/s",
        if f.sustained_at_least { ">= " } else { "" },
        f.sustained
    )
}

fn table(fronts: &[FrontResult], slo: f64) -> String {
    let name = |f: &FrontResult| match f.front {
        "direct" => "direct: TTFT p99 / gap p99",
        "gateway" => "tailguard gateway",
        "bare proxy" => "bare hyper proxy (no layers)",
        other => other,
    };
    let mut t = String::from("| rate |");
    for f in fronts {
        t += &format!(" {} |", name(f));
    }
    t += "\n|---|";
    t += &"---:|".repeat(fronts.len());
    for rate in RATES {
        t += &format!("\n| {rate:.0}/s |");
        for f in fronts {
            match f.at(rate) {
                Some(r) => t += &format!(" {:.1} / {:.1} ms |", r.ttft_p99_ms, r.gap_p99_ms),
                None => t += " - |",
            }
        }
    }
    t += &format!("\n| sustained (p99 TTFT <= {slo:.1} ms) |");
    for f in fronts {
        t += &format!(" {} |", sustained_cell(f));
    }
    t
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "missed" }
}

fn print_ratios(r: &Ratios) {
    println!("\ngateway / nginx, this run:");
    for (rate, ttft, gap) in &r.per_rate {
        println!("  {rate:>6.0}/s: TTFT p99 {ttft:.2}x, gap p99 {gap:.2}x");
    }
    let checked: Vec<String> = r
        .ttft_checked
        .iter()
        .map(|(rate, ttft)| format!("{rate:.0}/s {ttft:.2}x"))
        .collect();
    println!(
        "  TTFT p99 at every rate both ran up to nginx's sustained: {}",
        checked.join(", ")
    );
    println!("  sustained rate {:.2}x", r.sustained);
    for (rate, lost, ttft) in &r.do_no_harm {
        println!("  do no harm at {rate:.0}/s: {lost} not completed, TTFT p99 {ttft:.2}x");
    }
    println!(
        "targets: gap p99 <= 1.1x at 100/s and 400/s: {}; TTFT p99 <= 1.2x at every rate both ran up to nginx's sustained rate: {}; sustained >= 0.8x: {}",
        verdict(r.gap_target_met),
        verdict(r.ttft_target_met),
        verdict(r.sustained_target_met)
    );
    println!(
        "do no harm (defaults, 100/s and 300/s: every request, TTFT p99 <= 1.2x): {}",
        verdict(r.do_no_harm_met)
    );
}

/// Prints the table and the ratios; writes `benches/results/gateway_nginx.json`.
pub(crate) fn print_and_save(
    fronts: &[FrontResult],
    opts: Opts,
    loadavg_before: &str,
    run: tailguard_benches::run::RunInfo,
) -> Result<(), BoxError> {
    let direct = fronts
        .iter()
        .find(|f| f.front == "direct")
        .ok_or("no direct run")?;
    let slo = direct.runs.first().ok_or("no direct run")?.ttft_p99_ms * SLO_FACTOR;
    println!("\n{}", table(fronts, slo));
    let get = |name: &str| fronts.iter().find(|f| f.front == name);
    let ratios = get("nginx").zip(get("gateway")).map(|(n, g)| ratios(n, g));
    match &ratios {
        Some(r) => print_ratios(r),
        None => println!("\nno nginx run: no ratios"),
    }
    // `front`'s sustained rate over `base`'s, when both ran.
    let sustained_over = |front: &str, base: &str| {
        get(front)
            .zip(get(base))
            .map(|(f, b)| f.sustained / b.sustained)
    };
    let bare_over_nginx = sustained_over("bare proxy", "nginx");
    if let Some(r) = bare_over_nginx {
        println!(
            "bare hyper proxy / nginx, sustained rate: {r:.2}x (hyper and tokio with no layer, same run)"
        );
    }
    let gateway_over_bare = sustained_over("gateway", "bare proxy");
    if let Some(r) = gateway_over_bare {
        println!("gateway / bare hyper proxy, sustained rate: {r:.2}x (what the layers cost)");
    }
    let out = Output {
        bench: "gateway_nginx",
        script: SCRIPT,
        replicas: REPLICAS,
        window_seconds: opts.window.as_secs_f64(),
        slo_ttft_p99_ms: slo,
        slo: format!(
            "p99 TTFT <= {SLO_FACTOR}x the direct path's at {:.0}/s, <= 0.1% not completed",
            RATES[0]
        ),
        targets: TARGETS,
        loadavg_before,
        run,
        fronts,
        gateway_over_nginx: ratios,
        bare_proxy_over_nginx_sustained: bare_over_nginx,
        gateway_over_bare_proxy_sustained: gateway_over_bare,
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("gateway_nginx.json");
    std::fs::write(&path, serde_json::to_string_pretty(&out)?)?;
    println!("wrote {}", path.display());
    Ok(())
}
