//! Metrics: gauges per class, counters by reason and class, queue-wait histogram in seconds;
//! admissions and queue wait per tenant label.
//! Its own test binary, because it installs the global recorder.

mod common;

use std::time::Duration;

use common::*;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tailguard_admission::BoundedAdmissionLayer;
use tailguard_core::{Priority, Tenant};
use tokio::time::advance;
use tower::{Layer, ServiceExt};

/// The debugging recorder's snapshot drains (counters, gauges and histograms are swapped out),
/// so values are accumulated here across snapshots.
#[derive(Default)]
struct Acc {
    values: std::collections::HashMap<String, (f64, Vec<f64>)>,
}

fn key_of(name: &str, labels: &[(&str, &str)]) -> String {
    let mut l: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    l.sort();
    format!("{name}{{{}}}", l.join(","))
}

impl Acc {
    fn refresh(&mut self, snap: &Snapshotter) {
        for (k, _, _, v) in snap.snapshot().into_vec() {
            let key = k.key();
            let labels: Vec<(String, String)> = key
                .labels()
                .map(|l| (l.key().to_owned(), l.value().to_owned()))
                .collect();
            let labels: Vec<(&str, &str)> = labels
                .iter()
                .map(|(a, b)| (a.as_str(), b.as_str()))
                .collect();
            let e = self.values.entry(key_of(key.name(), &labels)).or_default();
            match v {
                DebugValue::Counter(c) => e.0 += c as f64,
                DebugValue::Gauge(g) => e.0 += g.into_inner(),
                DebugValue::Histogram(h) => e.1.extend(h.into_iter().map(|x| x.into_inner())),
            }
        }
    }

    fn get(&mut self, snap: &Snapshotter, name: &str, labels: &[(&str, &str)]) -> (f64, Vec<f64>) {
        self.refresh(snap);
        self.values
            .get(&key_of(name, labels))
            .cloned()
            .unwrap_or_else(|| panic!("no {name} {labels:?}"))
    }
}

#[tokio::test(start_paused = true)]
async fn gauges_counters_and_queue_wait() {
    let recorder = DebuggingRecorder::new();
    let snap = recorder.snapshotter();
    let mut acc = Acc::default();
    recorder.install().unwrap();

    let (up, _ctl) = upstream();
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_len(1)
        .with_codel(None)
        .with_queue_timeout(Duration::from_secs(10));
    let svc = layer.layer(up);
    let a = svc
        .clone()
        .oneshot(request_of("a", Priority::interactive()))
        .await
        .unwrap();
    // b is of a tenant (its label is what the series carry); a and c are of none.
    let mut b = request_of("b", Priority::batch());
    b.extensions_mut()
        .insert(Tenant::new("key-1f2e").with_label("acme"));
    let b = tokio::spawn(svc.clone().oneshot(b));
    settle().await;
    let c = svc
        .clone()
        .oneshot(request_of("c", Priority::batch()))
        .await
        .unwrap();
    assert_eq!(c.status(), 429);
    let inflight = "tailguard_admission_in_flight";
    let queued = "tailguard_admission_queued";
    assert_eq!(
        acc.get(&snap, inflight, &[("priority", "interactive")]).0,
        1.0
    );
    assert_eq!(acc.get(&snap, queued, &[("priority", "batch")]).0, 1.0);
    assert_eq!(
        acc.get(
            &snap,
            "tailguard_admission_rejected_total",
            &[("priority", "batch"), ("reason", "queue_full")]
        )
        .0,
        1.0
    );
    advance(Duration::from_millis(250)).await;
    drop(a);
    let b = b.await.unwrap().unwrap();
    assert_eq!(
        acc.get(&snap, inflight, &[("priority", "interactive")]).0,
        0.0
    );
    assert_eq!(acc.get(&snap, inflight, &[("priority", "batch")]).0, 1.0);
    assert_eq!(acc.get(&snap, queued, &[("priority", "batch")]).0, 0.0);
    let admitted = "tailguard_admission_admitted_total";
    assert_eq!(
        acc.get(
            &snap,
            admitted,
            &[("priority", "interactive"), ("path", "immediate")]
        )
        .0,
        1.0
    );
    assert_eq!(
        acc.get(
            &snap,
            admitted,
            &[("priority", "batch"), ("path", "queued")]
        )
        .0,
        1.0
    );
    let (_, waits) = acc.get(
        &snap,
        "tailguard_admission_queue_wait_seconds",
        &[("priority", "batch")],
    );
    assert_eq!(waits, [0.25]);
    let tenant = [("tenant", "acme")];
    let admitted = "tailguard_admission_tenant_admitted_total";
    assert_eq!(acc.get(&snap, admitted, &tenant).0, 1.0);
    let wait = "tailguard_admission_tenant_queue_wait_seconds";
    assert_eq!(acc.get(&snap, wait, &tenant).1, [0.25]);
    let series: Vec<String> = acc.values.keys().cloned().collect();
    assert!(
        !series
            .iter()
            .any(|k| k.contains("tenant") && !k.contains("acme")),
        "requests without a tenant are not counted per tenant: {series:?}"
    );
    drop(b);
    assert_eq!(acc.get(&snap, inflight, &[("priority", "batch")]).0, 0.0);
}
