//! Metrics and extreme configurations.

mod common;

use std::time::Duration;

use common::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tailguard_core::HedgeOutcome;
use tailguard_hedge::{AdaptiveDelay, FirstTokenHedgeLayer, HedgeBudget};
use tower::{Layer, ServiceExt};

/// A metric: name, labels, value.
type Entry = (String, Vec<(String, String)>, DebugValue);

fn counter(snapshot: &[Entry], name: &str) -> u64 {
    snapshot
        .iter()
        .filter(|(n, _, _)| n == name)
        .map(|(_, _, v)| match v {
            DebugValue::Counter(c) => *c,
            _ => 0,
        })
        .sum()
}

#[test]
fn counters_for_hedges_sent_won_and_refused() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        paused_runtime().block_on(async {
            // One token in the bucket: the first slow request is hedged (and the backup
            // wins); the second is refused twice, and its third ask, its primary stuck seven
            // delays, borrows the one token of debt the bucket allows; the third is refused
            // every time.
            let up = Upstream::new(vec![Plan::sse(ms(10_000)), Plan::sse(ms(10))]);
            let svc = FirstTokenHedgeLayer::new()
                .with_delay(ms(100))
                .with_budget(
                    HedgeBudget::new()
                        .with_ratio(0.0)
                        .with_floor(0.0)
                        .with_max_balance(1.0)
                        .with_initial_balance(1.0),
                )
                .layer(up);
            let res = svc.clone().oneshot(chat_request()).await.unwrap();
            assert_eq!(
                outcome_without_costs(&res),
                Some(HedgeOutcome::new(2, 1, Some(ms(100))))
            );
            let start = tokio::time::Instant::now();
            let res = svc.clone().oneshot(chat_request()).await.unwrap();
            assert_eq!(
                outcome_without_costs(&res),
                Some(HedgeOutcome::new(2, 1, Some(ms(100))).with_budget_exhausted(true))
            );
            assert_eq!(
                start.elapsed(),
                ms(710),
                "borrowed at the third ask, at 700 ms"
            );
            let fut = svc.oneshot(chat_request());
            let res = tokio::time::timeout(ms(20_000), fut)
                .await
                .unwrap()
                .unwrap();
            assert_eq!(
                res.extensions().get::<HedgeOutcome>(),
                Some(&HedgeOutcome::new(1, 0, Some(ms(100))).with_budget_exhausted(true))
            );
        });
    });
    let snapshot: Vec<Entry> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .map(|(k, _, _, v)| {
            let (_, key) = k.into_parts();
            let labels = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            (key.name().to_owned(), labels, v)
        })
        .collect();
    assert_eq!(counter(&snapshot, "tailguard_hedge_sent_total"), 2);
    assert_eq!(counter(&snapshot, "tailguard_hedge_won_total"), 2);
    // The second request is refused at 100 and 300 ms; the third asks at 100 ms and again at
    // 300, 700, 1,500, 3,100 and 6,300 ms (doubling intervals) before its primary's first
    // token at 10 s: eight refusals.
    assert_eq!(
        counter(&snapshot, "tailguard_hedge_budget_exhausted_total"),
        8
    );
    let sent = snapshot
        .iter()
        .find(|(n, _, _)| n == "tailguard_hedge_sent_total")
        .unwrap();
    assert_eq!(sent.1, vec![("trigger".to_owned(), "delay".to_owned())]);
    assert!(
        snapshot
            .iter()
            .any(|(n, _, _)| n == "tailguard_hedge_delay_used_seconds")
    );
}

#[tokio::test(start_paused = true)]
async fn extreme_delays_do_not_panic() {
    let up = Upstream::new(vec![Plan::sse(ms(10))]);
    let res = FirstTokenHedgeLayer::new()
        .with_delay(Duration::MAX)
        .layer(up.clone())
        .oneshot(chat_request())
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<HedgeOutcome>().unwrap().attempts, 1);
    let res = FirstTokenHedgeLayer::new()
        .with_delay(
            AdaptiveDelay::new()
                .with_window(Duration::MAX)
                .with_min_samples(0)
                .with_bounds(Duration::ZERO, Duration::MAX),
        )
        .layer(up)
        .oneshot(chat_request())
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<HedgeOutcome>().unwrap().attempts, 1);
}
