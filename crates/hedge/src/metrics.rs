//! Help text and units of the hedge's metrics (listed in the crate docs), for exporters that
//! print them (Prometheus `# HELP`).

use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};

/// Describes every hedge metric to the recorder in use; each new `FirstTokenHedge` does.
pub(crate) fn describe() {
    for (name, help) in [
        (
            "tailguard_hedge_sent_total",
            "Extra attempts sent, by trigger (the hedge delay, or a failed attempt)",
        ),
        (
            "tailguard_hedge_won_total",
            "Races won by a backup attempt's first token",
        ),
        (
            "tailguard_hedge_all_failed_total",
            "Requests whose every attempt failed",
        ),
        (
            "tailguard_hedge_budget_withdrawn_total",
            "Extra attempts a budget allowed, by budget",
        ),
        (
            "tailguard_hedge_budget_exhausted_total",
            "Extra attempts a budget refused, by budget",
        ),
        (
            "tailguard_hedge_budget_backend_errors_total",
            "Errors of the shared budget's backend",
        ),
        (
            "tailguard_resumes_total",
            "Streams that broke after their first token, by reason, and what came of it",
        ),
    ] {
        describe_counter!(name, Unit::Count, help);
    }
    describe_gauge!(
        "tailguard_hedge_delay_seconds",
        Unit::Seconds,
        "The hedge delay in force, per estimate key"
    );
    describe_histogram!(
        "tailguard_hedge_delay_used_seconds",
        Unit::Seconds,
        "The hedge delay of each hedge sent"
    );
}
