//! The budget's metrics, in a thread-local debugging recorder.

mod common;

use http::StatusCode;
use metrics_util::debugging::DebuggingRecorder;
use metrics_util::debugging::Snapshotter;
use tailguard_core::{RequestFacts, Tenant};
use tailguard_tenant::{Kind, Limit};
use tailguard_test_support::{Value, paused_runtime, read_all, snapshot};
use tower::ServiceExt;

use common::{Plan, budget, chat, limits, request, tokens, usage};

/// Every series so far: a snapshot of the debugging recorder resets what it reads (counters
/// and gauges alike), so the totals add each snapshot to the ones before.
type Labels = Vec<(String, String)>;

#[derive(Default)]
struct Totals(Vec<(String, Labels, f64)>);

impl Totals {
    fn update(&mut self, snapshotter: &Snapshotter) -> &Self {
        for s in snapshot(snapshotter) {
            let v = match s.value {
                Value::Counter(c) => c as f64,
                Value::Gauge(g) => g,
                Value::Histogram(_) => continue,
            };
            match self
                .0
                .iter_mut()
                .find(|(n, l, _)| *n == s.name && *l == s.labels)
            {
                Some(entry) => entry.2 += v,
                None => self.0.push((s.name, s.labels, v)),
            }
        }
        self
    }

    /// The one series named `name` with (at least) `labels`: its labels and total.
    fn get(&self, name: &str, labels: &[(&str, &str)]) -> (Labels, f64) {
        let found: Vec<_> = self
            .0
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.iter().any(|(lk, lv)| lk == k && lv == v))
            })
            .collect();
        assert_eq!(found.len(), 1, "{name} {labels:?}: {:?}", self.0);
        (found[0].1.clone(), found[0].2)
    }

    fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        self.get(name, labels).1
    }
}

#[test]
fn use_reservations_refusals_and_overruns_per_tenant() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        paused_runtime().block_on(async {
            let mut totals = Totals::default();
            let reserved = "tailguard_tenant_reserved_tokens";
            let used = "tailguard_tenant_tokens_total";
            let (svc, _store) = budget(limits([Limit::per_minute(Kind::Output, 100)]));
            let mut steps = tokens(1);
            steps.insert(1, usage(11, 4));
            let res = svc
                .clone()
                .oneshot(chat(80, Plan::sse(steps)))
                .await
                .unwrap();
            let t = totals.update(&snapshotter);
            assert_eq!(t.value(reserved, &[("tenant", "acme")]), 80.0);
            read_all(res.into_body()).await;
            let t = totals.update(&snapshotter);
            assert_eq!(t.value(reserved, &[("tenant", "acme")]), 0.0);
            let acme = |kind| [("tenant", "acme"), ("kind", kind)];
            assert_eq!(t.value(used, &acme("input")), 11.0);
            assert_eq!(t.value(used, &acme("output")), 4.0);

            let res = svc.clone().oneshot(chat(97, Plan::open())).await.unwrap();
            assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
            let t = totals.update(&snapshotter);
            let (labels, n) = t.get("tailguard_tenant_refusals_total", &[]);
            let label = |k: &str, v: &str| (k.to_owned(), v.to_owned());
            assert_eq!(
                labels,
                [
                    label("tenant", "acme"),
                    label("window", "minute"),
                    label("kind", "output")
                ]
            );
            assert_eq!(n, 1.0);

            // 96 held; 10 reserved and 500 used: 86 more are covered, 404 are not. The
            // tenant's label is pooled.
            let mut steps = tokens(1);
            steps.insert(1, usage(0, 500));
            let mut pooled = request(
                None,
                "/v1/chat/completions",
                RequestFacts::new().with_max_tokens(10),
                Plan::sse(steps),
            );
            pooled
                .extensions_mut()
                .insert(Tenant::new("acme").with_label(Tenant::OTHER));
            let res = svc.oneshot(pooled).await.unwrap();
            read_all(res.into_body()).await;
            let t = totals.update(&snapshotter);
            let overrun = [
                ("tenant", "other"),
                ("window", "minute"),
                ("kind", "output"),
            ];
            assert_eq!(
                t.value("tailguard_tenant_overrun_tokens_total", &overrun),
                404.0
            );
            assert_eq!(
                t.value(used, &[("tenant", "other"), ("kind", "output")]),
                500.0
            );
            assert_eq!(t.value(reserved, &[("tenant", "other")]), 0.0);
        });
    });
}
