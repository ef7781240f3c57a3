//! The exported bucket constants configure real Prometheus histograms; `describe` sets units.

mod common;

use std::convert::Infallible;

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use tailguard_phases::{LatencyPhaseRecorderLayer, MetricNames, MetricsSink, buckets};
use tower::{Layer, ServiceExt, service_fn};

#[tokio::test(start_paused = true)]
async fn buckets_configure_prometheus_histograms() {
    let names = MetricNames::tailguard();
    let mut builder = PrometheusBuilder::new();
    for (name, b) in names.histogram_buckets() {
        builder = builder
            .set_buckets_for_metric(Matcher::Full(name.into()), b)
            .unwrap();
    }
    let recorder = builder.build_recorder();
    let handle = recorder.handle();
    let sink = MetricsSink::new().with_recorder(recorder);
    sink.describe();
    let svc = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(sink)
        .with_models(["gpt-4o"])
        .layer(service_fn(|_req: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(ScriptBody::new([
                        Step::Wait(ms(90)),
                        data(TOKEN),
                        Step::Wait(ms(30)),
                        data(TOKEN),
                        data(DONE),
                    ]))
                    .unwrap(),
            )
        }));
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    res.into_body().collect().await.unwrap();

    let text = handle.render();
    let line = |needle: &str| {
        text.lines()
            .find(|l| l.starts_with(needle))
            .unwrap_or_else(|| panic!("no line {needle} in\n{text}"))
            .to_owned()
    };
    // A real histogram with the recommended boundaries: TTFT 0.09 s is in le=0.1, not le=0.08.
    let ttft = "tailguard_time_to_first_token_seconds_bucket";
    assert!(line(&format!("{ttft}{{")).contains("le=\"0.001\""));
    let bucket = |le: &str| {
        text.lines()
            .find(|l| l.starts_with(ttft) && l.contains(&format!("le=\"{le}\"")))
            .unwrap_or_else(|| panic!("no bucket {le} in\n{text}"))
            .rsplit(' ')
            .next()
            .unwrap()
            .to_owned()
    };
    assert_eq!(bucket("0.08"), "0");
    assert_eq!(bucket("0.1"), "1");
    assert_eq!(bucket("2560"), "1");
    let count = text.lines().filter(|l| l.starts_with(ttft)).count();
    assert_eq!(count, buckets::TIME_TO_FIRST_TOKEN.len() + 1, "+Inf");
    // The gap, 0.03 s, lands in le=0.05 of the inter-token buckets.
    let gap = line("tailguard_inter_token_gap_seconds_bucket{");
    assert!(gap.contains("le=\"0.01\""));
    assert!(text.contains("# HELP tailguard_time_to_first_token_seconds"));
    assert!(text.contains("tailguard_requests_total{"));
}
