//! The recorder's test support: a recorder layer reporting into a list and a debugging
//! recorder, and SSE responses of scripted bodies.
#![allow(dead_code, unreachable_pub)]

use http::Response;
use metrics_util::debugging::{DebuggingRecorder, Snapshotter};
use tailguard_phases::{LatencyPhaseRecorderLayer, MetricsSink, PhaseReport};
pub use tailguard_test_support::*;

/// A recorder layer reporting into a list and a debugging recorder.
pub fn layer() -> (
    LatencyPhaseRecorderLayer,
    Recorded<PhaseReport>,
    Snapshotter,
) {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let reports = Recorded::default();
    let r = reports.clone();
    let layer = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(MetricsSink::new().with_recorder(rec))
        .with_sink(move |rep: &PhaseReport| r.push(rep.clone()));
    (layer, reports, snap)
}

/// An SSE response with `body`.
pub fn sse(body: ScriptBody) -> Response<ScriptBody> {
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(body)
        .unwrap()
}
