//! The Prometheus exporter, with the recorder's bucket constants so histograms are histograms.

use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::{
    Matcher, PrometheusBuilder, PrometheusHandle, PrometheusRecorder,
};
use tailguard::phases::{MetricNames, MetricsSink, buckets};

/// A Prometheus recorder whose histograms use the buckets `tailguard-phases` recommends (and
/// the same for admission's queue wait and the hedge delay), rendered as real Prometheus
/// histograms rather than summaries.
pub fn prometheus_recorder() -> PrometheusRecorder {
    let mut builder = PrometheusBuilder::new();
    let extra: [(&str, &[f64]); 2] = [
        (
            "tailguard_admission_queue_wait_seconds",
            buckets::QUEUE_WAIT,
        ),
        (
            "tailguard_hedge_delay_used_seconds",
            buckets::TIME_TO_FIRST_TOKEN,
        ),
    ];
    for (name, b) in MetricNames::tailguard()
        .histogram_buckets()
        .into_iter()
        .chain(extra)
    {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.to_owned()), b)
            .expect("the bucket constants are not empty");
    }
    builder.build_recorder()
}

/// The process-wide recorder: its handle, and the recorder itself when it is the `metrics`
/// facade's global recorder (installed on first use, so every layer's metrics reach it).
struct Installed {
    handle: PrometheusHandle,
    global: Option<&'static PrometheusRecorder>,
}

fn installed() -> &'static Installed {
    static INSTALLED: OnceLock<Installed> = OnceLock::new();
    INSTALLED.get_or_init(|| {
        // Leaked once, so that the global recorder and the phases' sink share it.
        let recorder: &'static PrometheusRecorder = Box::leak(Box::new(prometheus_recorder()));
        let handle = recorder.handle();
        let global = metrics::set_global_recorder(recorder)
            .is_ok()
            .then_some(recorder);
        if global.is_some() {
            MetricsSink::new().describe();
            let upkeep = handle.clone();
            // Histogram samples are folded into buckets on render and on upkeep; run it now
            // and then so an unscraped gateway does not accumulate samples.
            std::thread::Builder::new()
                .name("metrics-upkeep".into())
                .spawn(move || {
                    loop {
                        std::thread::sleep(std::time::Duration::from_secs(5));
                        upkeep.run_upkeep();
                    }
                })
                .ok();
        }
        Installed { handle, global }
    })
}

/// The handle of the process-wide recorder, installed on first use (as the `metrics` facade's
/// global recorder, so every layer's metrics reach it).
pub fn metrics_handle() -> PrometheusHandle {
    installed().handle.clone()
}

/// The request recorder's metrics sink: straight into the process-wide recorder when it is the
/// global one, so the sink keeps the handles it registers (see `MetricsSink`'s caching); through
/// the facade when another program installed its own recorder first.
pub(crate) fn metrics_sink() -> MetricsSink {
    match installed().global {
        Some(recorder) => MetricsSink::new().with_shared_recorder(Arc::new(recorder)),
        None => MetricsSink::new(),
    }
}
