//! The metric handles of one priority class, and of one tenant label, of a gate.
//!
//! Names and labels are listed in the crate docs; the handles are registered once, when the
//! gate first sees the class (the label).

use metrics::{Counter, Gauge, Histogram};
use tailguard_core::OverloadReason;

/// The handles of one class, labelled `priority` = the class name.
pub(crate) struct ClassMetrics {
    pub(crate) in_flight: Gauge,
    pub(crate) queued: Gauge,
    pub(crate) admitted_immediate: Counter,
    pub(crate) admitted_queued: Counter,
    rejected_queue_full: Counter,
    rejected_queue_timeout: Counter,
    rejected_evicted: Counter,
    rejected_deadline: Counter,
    rejected_cluster: Counter,
    pub(crate) queue_wait: Histogram,
}

/// Help text and units of every admission metric, for exporters that print them (Prometheus
/// `# HELP`); sent to the recorder whenever a class registers its handles.
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_gauge!(
        "tailguard_admission_in_flight",
        Unit::Count,
        "Capacity units held by admitted requests"
    );
    describe_gauge!(
        "tailguard_admission_queued",
        Unit::Count,
        "Requests waiting in the admission queue"
    );
    describe_counter!(
        "tailguard_admission_admitted_total",
        Unit::Count,
        "Requests admitted, at once or after queueing"
    );
    describe_counter!(
        "tailguard_admission_rejected_total",
        Unit::Count,
        "Requests refused by admission, by reason"
    );
    describe_histogram!(
        "tailguard_admission_queue_wait_seconds",
        Unit::Seconds,
        "Time admitted requests waited in the admission queue"
    );
    describe_counter!(
        "tailguard_admission_tenant_admitted_total",
        Unit::Count,
        "Requests admitted under fair queueing, by tenant label"
    );
    describe_histogram!(
        "tailguard_admission_tenant_queue_wait_seconds",
        Unit::Seconds,
        "Time admitted requests waited in the admission queue under fair queueing, by tenant label"
    );
    describe_counter!(
        "tailguard_admission_cluster_errors_total",
        Unit::Count,
        "Cluster lease backend errors, by the mode the gate fell back to"
    );
}

impl ClassMetrics {
    pub(crate) fn new(priority: &str) -> Self {
        describe();
        let p = priority.to_owned();
        let admitted = |path: &'static str| {
            metrics::counter!(
                "tailguard_admission_admitted_total",
                "priority" => p.clone(),
                "path" => path
            )
        };
        let rejected = |reason: OverloadReason| {
            metrics::counter!(
                "tailguard_admission_rejected_total",
                "priority" => p.clone(),
                "reason" => reason.as_str()
            )
        };
        ClassMetrics {
            in_flight: metrics::gauge!("tailguard_admission_in_flight", "priority" => p.clone()),
            queued: metrics::gauge!("tailguard_admission_queued", "priority" => p.clone()),
            admitted_immediate: admitted("immediate"),
            admitted_queued: admitted("queued"),
            rejected_queue_full: rejected(OverloadReason::QueueFull),
            rejected_queue_timeout: rejected(OverloadReason::QueueTimeout),
            rejected_evicted: rejected(OverloadReason::Evicted),
            rejected_deadline: rejected(OverloadReason::DeadlineTooShort),
            rejected_cluster: rejected(OverloadReason::ClusterUnavailable),
            queue_wait: metrics::histogram!(
                "tailguard_admission_queue_wait_seconds",
                "priority" => p.clone()
            ),
        }
    }

    /// Counts one refusal. The gate refuses only for these five reasons.
    pub(crate) fn rejected(&self, reason: OverloadReason) {
        match reason {
            OverloadReason::QueueFull => self.rejected_queue_full.increment(1),
            OverloadReason::QueueTimeout => self.rejected_queue_timeout.increment(1),
            OverloadReason::Evicted => self.rejected_evicted.increment(1),
            OverloadReason::DeadlineTooShort => self.rejected_deadline.increment(1),
            OverloadReason::ClusterUnavailable => self.rejected_cluster.increment(1),
            _ => {}
        }
    }
}

/// The handles of one tenant label (fair queueing), labelled `tenant`: the tenant's bounded
/// [`label`](tailguard_core::Tenant::label), so the series stay bounded however many tenants
/// there are.
#[derive(Clone)]
pub(crate) struct TenantMetrics {
    admitted: Counter,
    queue_wait: Histogram,
}

impl TenantMetrics {
    pub(crate) fn new(label: &str) -> Self {
        describe();
        let l = label.to_owned();
        TenantMetrics {
            admitted: metrics::counter!("tailguard_admission_tenant_admitted_total", "tenant" => l.clone()),
            queue_wait: metrics::histogram!(
                "tailguard_admission_tenant_queue_wait_seconds",
                "tenant" => l
            ),
        }
    }

    /// Counts an admission after `waited` in the queue (zero: admitted at once).
    pub(crate) fn admitted(&self, waited: std::time::Duration) {
        self.admitted.increment(1);
        self.queue_wait.record(waited.as_secs_f64());
    }
}
