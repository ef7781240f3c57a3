//! Per-run figures, the comparison with the unbroken run, the JSON file and the table (rendered
//! from that JSON by the same code as the README's).

use std::collections::BTreeMap;

use serde::Serialize;
use tailguard::core::BoxError;
use tailguard_benches::run::RunInfo;

use crate::client::{
    BROKEN_SHARE, CAPPED_SHARE, CAPPED_TOKENS, COMPLETIONS_SHARE, Fault, Record, Spec,
};
use crate::{IDLE_TIMEOUT, Opts, RunResult, SCRIPT, WARMUP};

/// Issue 33's bound on the p99 total time with resume on, over the unbroken run's.
const P99_BOUND: f64 = 1.3;

#[derive(Serialize, Default)]
struct Broken {
    scheduled: usize,
    /// The first attempt sent its `k` tokens and broke (not avoided by a hedge backup).
    fired: usize,
    completed: usize,
    identical: usize,
}

#[derive(Serialize)]
struct FaultRow {
    fault: &'static str,
    #[serde(flatten)]
    counts: Broken,
    /// How the fired ones ended (client side).
    ends: BTreeMap<&'static str, usize>,
    /// Longest total time of the fired ones, ms.
    total_max_ms: f64,
}

#[derive(Serialize)]
struct RunSummary {
    name: &'static str,
    faults: bool,
    resume: bool,
    requests: usize,
    completed: usize,
    completed_pct: f64,
    /// Completed with the same text as the same request in the unbroken run (in the unbroken
    /// run: as the mock's answer to that request's shape, sent straight to a replica).
    identical: usize,
    identical_pct_of_completed: f64,
    /// Completed with a usage count other than the reference's.
    usage_mismatch: usize,
    ends: BTreeMap<&'static str, usize>,
    total_p50_ms: f64,
    total_p99_ms: f64,
    /// The same without the requests scheduled with a stall (in every run the same requests):
    /// what the other faults cost.
    total_p99_ms_without_stalls: f64,
    ttft_p50_ms: f64,
    ttft_p99_ms: f64,
    /// The longest gap between two content events of a request, p99 over requests.
    max_gap_p99_ms: f64,
    broken: Broken,
    by_fault: Vec<FaultRow>,
    /// Requests the replicas received (measured requests only), and continuations among them.
    upstream_requests: usize,
    continuations: usize,
    /// The gateway's `tailguard_resumes_total{outcome="resumed"}` over the run.
    resumed: f64,
    /// The gateway's `tailguard_route_interruptions_total` over the run: streams its
    /// `ReplicaSet` read as a replica interrupting a stream for a newer attempt (each makes
    /// that replica take one attempt at a time for 60 s).
    route_interruptions: f64,
    gateway_counters: BTreeMap<String, f64>,
}

/// A request that did not complete with resume on, with what the replicas saw of it.
#[derive(Serialize)]
struct Failure {
    index: usize,
    fault: Option<&'static str>,
    break_after: Option<u32>,
    end: &'static str,
    chars_received: usize,
    total_ms: f64,
    /// (attempt header, continued from, tokens sent, outcome) per upstream attempt.
    attempts: Vec<String>,
}

#[derive(Serialize)]
struct Output {
    bench: &'static str,
    quick: bool,
    run: RunInfo,
    script: &'static str,
    replicas: usize,
    requests: usize,
    rate: f64,
    seed: u64,
    warmup_requests: usize,
    broken_share: f64,
    faults: &'static str,
    /// The faults of this run's broken requests, in turn.
    fault_kinds: Vec<&'static str>,
    completions_share: f64,
    capped_share: f64,
    capped_max_tokens: u32,
    idle_timeout_s: f64,
    /// The mock's answer is the same from replicas with different seeds (checked first).
    mock_deterministic: bool,
    runs: Vec<RunSummary>,
    p99_total_resume_on_over_unbroken: f64,
    p99_total_resume_off_over_unbroken: f64,
    p99_ttft_resume_on_over_unbroken: f64,
    /// Without the requests scheduled with a stall, in both runs.
    p99_total_resume_on_over_unbroken_without_stalls: f64,
    targets: BTreeMap<&'static str, bool>,
    not_completed_with_resume: Vec<Failure>,
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Nearest-rank percentile of `v` (sorted here), ms.
fn pct(mut v: Vec<f64>, q: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

fn percent(n: usize, of: usize) -> f64 {
    if of == 0 {
        0.0
    } else {
        100.0 * n as f64 / of as f64
    }
}

fn ends<'a>(records: impl Iterator<Item = &'a Record>) -> BTreeMap<&'static str, usize> {
    let mut m = BTreeMap::new();
    for r in records {
        *m.entry(r.end()).or_default() += 1;
    }
    m
}

/// Request `i`'s reference: text, finish reason, completion tokens.
type Reference<'a> = &'a dyn Fn(usize) -> (String, Option<String>, Option<u64>);

fn summarize(specs: &[Spec], run: &RunResult, reference: Reference<'_>) -> RunSummary {
    let recs = &run.records;
    let completed = recs.iter().filter(|r| r.completed()).count();
    let identical_of = |i: usize| {
        let r = &recs[i];
        let (text, finish, _) = reference(i);
        r.completed() && r.text == text && r.finish == finish
    };
    let identical = (0..recs.len()).filter(|&i| identical_of(i)).count();
    let usage_mismatch = (0..recs.len())
        .filter(|&i| recs[i].completed() && recs[i].completion_tokens != reference(i).2)
        .count();
    let broken_specs = |f: Option<Fault>| {
        specs.iter().filter(move |s| {
            run.kind.faults && s.fault.is_some_and(|(g, _)| f.is_none_or(|f| f == g))
        })
    };
    let broken_counts = |f: Option<Fault>| Broken {
        scheduled: broken_specs(f).count(),
        fired: broken_specs(f).filter(|s| run.fired(s)).count(),
        completed: broken_specs(f)
            .filter(|s| recs[s.index].completed())
            .count(),
        identical: broken_specs(f).filter(|s| identical_of(s.index)).count(),
    };
    let by_fault = Fault::ALL
        .iter()
        .filter(|&&f| broken_specs(Some(f)).next().is_some())
        .map(|&f| {
            let fired: Vec<&Record> = broken_specs(Some(f))
                .filter(|s| run.fired(s))
                .map(|s| &recs[s.index])
                .collect();
            FaultRow {
                fault: f.name(),
                counts: broken_counts(Some(f)),
                ends: ends(fired.iter().copied()),
                total_max_ms: fired.iter().map(|r| ms(r.total)).fold(0.0, f64::max),
            }
        })
        .collect();
    let totals = || recs.iter().map(|r| ms(r.total)).collect::<Vec<_>>();
    let ttfts = || {
        recs.iter()
            .filter_map(|r| r.ttft.map(ms))
            .collect::<Vec<_>>()
    };
    let resumed = run
        .counters
        .iter()
        .filter(|(k, _)| {
            k.starts_with("tailguard_resumes_total") && k.contains("outcome=\"resumed\"")
        })
        .fold(0.0, |a, (_, v)| a + v);
    let route_interruptions = run
        .counters
        .iter()
        .filter(|(k, _)| k.starts_with("tailguard_route_interruptions_total"))
        .fold(0.0, |a, (_, v)| a + v);
    RunSummary {
        route_interruptions,
        name: run.kind.name,
        faults: run.kind.faults,
        resume: run.kind.resume,
        requests: recs.len(),
        completed,
        completed_pct: percent(completed, recs.len()),
        identical,
        identical_pct_of_completed: percent(identical, completed),
        usage_mismatch,
        ends: ends(recs.iter()),
        total_p50_ms: pct(totals(), 0.5),
        total_p99_ms: pct(totals(), 0.99),
        total_p99_ms_without_stalls: pct(
            specs
                .iter()
                .filter(|s| !matches!(s.fault, Some((Fault::Stall, _))))
                .map(|s| ms(recs[s.index].total))
                .collect(),
            0.99,
        ),
        ttft_p50_ms: pct(ttfts(), 0.5),
        ttft_p99_ms: pct(ttfts(), 0.99),
        max_gap_p99_ms: pct(recs.iter().map(|r| ms(r.max_gap)).collect(), 0.99),
        broken: broken_counts(None),
        by_fault,
        upstream_requests: run.attempts.iter().map(Vec::len).sum(),
        continuations: run
            .attempts
            .iter()
            .flatten()
            .filter(|a| a.continued_from.is_some())
            .count(),
        resumed,
        gateway_counters: run.counters.clone(),
    }
}

/// Summarizes the runs, writes `benches/results/resume_broken.json` and prints its table.
pub(crate) fn print_and_save(
    specs: &[Spec],
    runs: &[RunResult],
    texts: &BTreeMap<(bool, Option<u32>), String>,
    opts: &Opts,
    run: RunInfo,
) -> Result<(), BoxError> {
    let [unbroken, off, on] = runs else {
        return Err("three runs expected".into());
    };
    let direct = |i: usize| {
        let s = &specs[i];
        let text = texts
            .get(&(s.completions, s.max_tokens))
            .cloned()
            .unwrap_or_default();
        let finish = if s.tokens() < crate::client::TOKENS {
            "length"
        } else {
            "stop"
        };
        (text, Some(finish.to_owned()), Some(u64::from(s.tokens())))
    };
    let from_unbroken = |i: usize| {
        let r = &unbroken.records[i];
        (r.text.clone(), r.finish.clone(), r.completion_tokens)
    };
    let summaries = vec![
        summarize(specs, unbroken, &direct),
        summarize(specs, off, &from_unbroken),
        summarize(specs, on, &from_unbroken),
    ];
    let (u, f, o) = (&summaries[0], &summaries[1], &summaries[2]);
    let not_completed_with_resume = specs
        .iter()
        .filter(|s| !on.records[s.index].completed())
        .take(40)
        .map(|s| {
            let r = &on.records[s.index];
            Failure {
                index: s.index,
                fault: s.fault.map(|(f, _)| f.name()),
                break_after: s.fault.map(|(_, k)| k),
                end: r.end(),
                chars_received: r.text.len(),
                total_ms: ms(r.total),
                attempts: on.attempts[s.index]
                    .iter()
                    .map(|a| {
                        format!(
                            "attempt {} continued_from {:?} tokens {} {:?}",
                            a.attempt.as_deref().unwrap_or("-"),
                            a.continued_from,
                            a.tokens_sent,
                            a.outcome
                        )
                    })
                    .collect(),
            }
        })
        .collect();
    let mut targets = BTreeMap::new();
    targets.insert(
        "resume_on_every_request_completed",
        o.completed == o.requests,
    );
    targets.insert(
        "resume_on_every_completed_text_identical",
        o.identical == o.completed,
    );
    targets.insert(
        "resume_on_p99_total_within_1_3x_unbroken",
        o.total_p99_ms <= P99_BOUND * u.total_p99_ms,
    );
    targets.insert(
        "resume_off_every_fired_fault_ends_in_error",
        f.broken.fired > 0 && f.by_fault.iter().all(|r| !r.ends.contains_key("completed")),
    );
    let out = Output {
        bench: "resume_broken",
        quick: opts.quick,
        run,
        script: SCRIPT,
        replicas: 2,
        requests: opts.requests,
        rate: opts.rate,
        seed: opts.seed,
        warmup_requests: WARMUP,
        broken_share: BROKEN_SHARE,
        fault_kinds: opts.faults.iter().map(|f| f.name()).collect(),
        faults: "the first attempt of a seeded tenth of the requests (x-mock-script-0), in turn: \
                 reset (reset_after=k), stall (stall_after=k, silent), truncation (half_event=k), \
                 interruption (interrupt_after=k: a bare [DONE]); k a random token of the middle \
                 third of the answer",
        completions_share: COMPLETIONS_SHARE,
        capped_share: CAPPED_SHARE,
        capped_max_tokens: CAPPED_TOKENS,
        idle_timeout_s: IDLE_TIMEOUT.as_secs_f64(),
        mock_deterministic: true,
        p99_total_resume_on_over_unbroken: o.total_p99_ms / u.total_p99_ms,
        p99_total_resume_off_over_unbroken: f.total_p99_ms / u.total_p99_ms,
        p99_ttft_resume_on_over_unbroken: o.ttft_p99_ms / u.ttft_p99_ms,
        p99_total_resume_on_over_unbroken_without_stalls: o.total_p99_ms_without_stalls
            / u.total_p99_ms_without_stalls,
        targets,
        not_completed_with_resume,
        runs: summaries,
    };
    let json = serde_json::to_value(&out)?;
    let table = tailguard_benches::tables::resume_broken_table(&json)?;
    println!("\n{table}\n");
    for fail in &out.not_completed_with_resume {
        println!(
            "not completed with resume on: request {} ({:?} after {:?}): {} after {:.0} ms; {}",
            fail.index,
            fail.fault,
            fail.break_after,
            fail.end,
            fail.total_ms,
            fail.attempts.join("; ")
        );
    }
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("results");
    std::fs::create_dir_all(&dir)?;
    let path = dir.join("resume_broken.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json)?)?;
    println!("wrote {}", path.display());
    Ok(())
}
