//! Do no harm (issue 29): the gateway binary with its default configuration, over two mock
//! replicas, under a modest open-loop load far below what the replicas and a plain proxy carry
//! on the CI machine, refuses nothing and completes every stream.
//!
//! Real processes on the real clock: the test asserts on counts (statuses and how each stream
//! ended), never on timing; time only bounds how long the run may last.

mod common;

use std::time::Duration;

use common::{GatewayProc, gateway_bin, mock};
use tailguard_mock::load::{EndReason, LoadConfig, run};

/// A first token after 20 ms, then 50 tokens 10 ms apart (the mock replicas).
const REPLICA: &str = "ttft=20ms,tokens=50,gap=10ms";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_gateway_refuses_nothing_at_50_streams_a_second() {
    let replicas = [mock(REPLICA).await, mock(REPLICA).await];
    let mut args = Vec::new();
    for r in &replicas {
        args.extend(["--upstream".to_owned(), r.url()]);
    }
    let mut gw = GatewayProc::start(&gateway_bin(), &args).await;
    let load = LoadConfig::new(format!("http://{}", gw.addr))
        .rate(50.0)
        .duration(Duration::from_secs(5))
        .request_timeout(Duration::from_secs(30))
        .drain_timeout(Duration::from_secs(30));
    let report = run(load).await.expect("the load ran");
    let completed = report.count(EndReason::Completed);
    let log = gw.output();
    gw.kill().await;
    assert!(report.scheduled >= 150, "{} scheduled", report.scheduled);
    assert_eq!(
        (
            completed,
            report.statuses.keys().copied().collect::<Vec<_>>()
        ),
        (report.scheduled, vec![200]),
        "every stream served in full: {:?}, {:?}\n{log}",
        report.statuses,
        report.end_reasons
    );
    let served: u64 = replicas.iter().map(|r| r.stats().completed).sum();
    assert!(
        served >= completed,
        "{served} streams ended at the replicas"
    );
}
