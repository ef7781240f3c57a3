//! Help text and units of the set's metrics (listed in the crate docs), for exporters that print
//! them (Prometheus `# HELP`).

use metrics::{Unit, describe_counter};

/// Describes every metric of a set to the recorder in use; each new `ReplicaSet` does.
pub(crate) fn describe() {
    // The name keeps the `hedge` prefix it had when the set lived in `tailguard-hedge`, so
    // dashboards and alerts keep working.
    describe_counter!(
        "tailguard_hedge_ejections_total",
        Unit::Count,
        "Replicas ejected from primary routing, by replica and reason"
    );
    describe_counter!(
        "tailguard_route_interruptions_total",
        Unit::Count,
        "Streams a replica ended just after the set placed a newer attempt on it"
    );
}
