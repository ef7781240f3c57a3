//! The budget's metrics, labelled `tenant` = [`Tenant::label`] (bounded by whoever identifies
//! tenants). Counted into the recorder in use at each event, as the `metrics` macros do.

use tailguard_core::Tenant;

use crate::limit::{Kind, Limit, Tokens};

/// Tokens used, as reconciled.
pub(crate) const TOKENS: &str = "tailguard_tenant_tokens_total";
/// Tokens reserved by requests in flight.
pub(crate) const RESERVED: &str = "tailguard_tenant_reserved_tokens";
/// Requests refused.
pub(crate) const REFUSALS: &str = "tailguard_tenant_refusals_total";
/// Use a bucket could not cover.
pub(crate) const OVERRUN: &str = "tailguard_tenant_overrun_tokens_total";

/// Help text of every budget metric, for exporters that print it (Prometheus `# HELP`).
pub(crate) fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge};
    describe_counter!(
        TOKENS,
        Unit::Count,
        "Tokens used by a tenant's requests, by kind (input, output), as reconciled when each response ended"
    );
    describe_gauge!(
        RESERVED,
        Unit::Count,
        "Tokens reserved by a tenant's requests in flight (input and output)"
    );
    describe_counter!(
        REFUSALS,
        Unit::Count,
        "Requests refused for a tenant's token budget, by the limit that refused (window, kind)"
    );
    describe_counter!(
        OVERRUN,
        Unit::Count,
        "Tokens used beyond a reservation that a tenant's empty bucket could not cover, by limit"
    );
}

/// `tokens` reserved (`up`) or released (`!up`) by a request in flight.
pub(crate) fn reserved(tenant: &Tenant, tokens: Tokens, up: bool) {
    let g = metrics::gauge!(RESERVED, "tenant" => tenant.shared_label());
    let n = tokens.total() as f64;
    if up { g.increment(n) } else { g.decrement(n) }
}

/// The use of one request, once reconciled.
pub(crate) fn used(tenant: &Tenant, tokens: Tokens) {
    for (kind, n) in [(Kind::Input, tokens.input), (Kind::Output, tokens.output)] {
        if n > 0 {
            metrics::counter!(TOKENS, "tenant" => tenant.shared_label(), "kind" => kind.as_str())
                .increment(n);
        }
    }
}

/// One request refused by `limit`.
pub(crate) fn refused(tenant: &Tenant, limit: &Limit) {
    metrics::counter!(
        REFUSALS,
        "tenant" => tenant.shared_label(),
        "window" => limit.window().label(),
        "kind" => limit.kind().as_str()
    )
    .increment(1);
}

/// `tokens` of use that `limit`'s bucket could not cover.
pub(crate) fn overrun(tenant: &Tenant, limit: &Limit, tokens: u64) {
    metrics::counter!(
        OVERRUN,
        "tenant" => tenant.shared_label(),
        "window" => limit.window().label(),
        "kind" => limit.kind().as_str()
    )
    .increment(tokens);
}
