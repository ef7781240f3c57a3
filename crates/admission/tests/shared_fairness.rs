//! Fair-share counters shared by two gates through one backend: a tenant served at the other
//! gate ranks behind one that is not; a failed exchange leaves each gate ordering by its own
//! counters.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use tailguard_admission::{
    BackendError, BackendFuture, BoundedAdmission, BoundedAdmissionLayer, FairShareBackend,
    ServiceReport, SharedFairness, tenant_key,
};
use tailguard_core::{RequestFacts, Tenant};
use tokio::sync::mpsc::UnboundedReceiver;
use tower::{Layer, ServiceExt};

/// Totals in memory; `down` fails every exchange.
#[derive(Debug, Default)]
struct Mem {
    totals: Mutex<HashMap<String, f64>>,
    down: AtomicBool,
}

impl FairShareBackend for Mem {
    fn exchange(&self, report: ServiceReport) -> BackendFuture<Vec<f64>> {
        if self.down.load(Ordering::Relaxed) {
            return Box::pin(async { Err(BackendError::new("down")) });
        }
        let mut t = self.totals.lock().unwrap();
        for (k, v) in report.served {
            *t.entry(k).or_default() += v;
        }
        let out = report
            .wanted
            .iter()
            .map(|k| t.get(k).copied().unwrap_or(0.0));
        let out: Vec<f64> = out.collect();
        Box::pin(async move { Ok(out) })
    }
}

const PERIOD: Duration = Duration::from_millis(10);

/// A gate of two permits with a long queue, sharing its counters through `mem` when given.
fn gate(
    mem: Option<&Arc<Mem>>,
) -> (
    BoundedAdmission<Upstream>,
    UnboundedReceiver<(String, Feed)>,
) {
    let mut layer = BoundedAdmissionLayer::new(2)
        .with_queue_len(100)
        .with_queue_timeout(Duration::from_secs(600))
        .with_aging(None);
    if let Some(mem) = mem {
        let backend: Arc<dyn FairShareBackend> = mem.clone();
        layer = layer.with_shared_fairness(SharedFairness::new(backend).with_period(PERIOD));
    }
    let (up, ctl) = upstream();
    (layer.layer(up), ctl)
}

/// Request `id` of `tenant` with `prompt` tokens and 10 output tokens expected.
fn req(id: &str, tenant: &Tenant, prompt: u64) -> http::Request<()> {
    let mut r = request(id);
    r.extensions_mut().insert(
        RequestFacts::new()
            .with_prompt_tokens(prompt)
            .with_max_tokens(10),
    );
    r.extensions_mut().insert(tenant.clone());
    r
}

/// Lets the exchange tasks run a few periods.
async fn exchanges() {
    tokio::time::sleep(PERIOD * 5).await;
}

/// At gate A, tenant y holds both permits and both tenants wait: x's waiter is lifted to y's
/// counter and wins the tie (x holds nothing), so when one of y's permits frees, locally x goes
/// next. Meanwhile gate B serves x
/// three long prompts. Shared, A's counter for x grows by exactly B's charges and y goes first;
/// not shared (or with the backend down), x does.
#[tokio::test(start_paused = true)]
async fn service_at_another_gate_counts_here() {
    let (x, y) = (Tenant::new("x"), Tenant::new("y"));
    for (shared, down) in [(true, false), (false, false), (true, true)] {
        let mem = Arc::new(Mem::default());
        mem.down.store(down, Ordering::Relaxed);
        let backend = shared.then_some(&mem);
        let (a, mut a_ctl) = gate(backend);
        let (b, mut b_ctl) = gate(backend);
        let h = a.handle();
        let y0 = a.clone().oneshot(req("y0", &y, 100)).await.unwrap();
        let _y0b = a.clone().oneshot(req("y0b", &y, 100)).await.unwrap();
        let waiting = [
            spawn_call(&a, req("y1", &y, 100)),
            spawn_call(&a, req("x1", &x, 100)),
        ];
        exchanges().await;
        let x_here = h.tenant_service(Some("x")).unwrap();
        // Gate B serves x: three prompts of 4000 tokens.
        for i in 0..3 {
            let res = b.clone().oneshot(req(&format!("b{i}"), &x, 4000));
            drop(res.await.unwrap());
        }
        assert_eq!(arrived(&mut b_ctl).len(), 3);
        exchanges().await;
        let grown = h.tenant_service(Some("x")).unwrap() - x_here;
        let expected = if shared && !down {
            // Each: 4000 prompt × 1 + 10 expected output × 2.
            3.0 * (4000.0 + 20.0)
        } else {
            0.0
        };
        assert_eq!(grown, expected, "shared {shared}, down {down}");
        arrived(&mut a_ctl);
        drop(y0);
        tokio::time::sleep(Duration::from_millis(1)).await;
        let next: Vec<String> = arrived(&mut a_ctl).into_iter().map(|x| x.0).collect();
        let want = if shared && !down { "y1" } else { "x1" };
        assert_eq!(next, [want], "shared {shared}, down {down}");
        for w in waiting {
            w.abort();
        }
    }
}

#[test]
fn tenant_keys_keep_the_anonymous_tenant_apart() {
    assert_eq!(tenant_key(Some("acme")), "t:acme");
    assert_eq!(tenant_key(None), "anonymous");
    assert_ne!(tenant_key(Some("anonymous")), tenant_key(None));
}
