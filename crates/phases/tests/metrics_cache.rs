//! `MetricsSink` caches keys (and, with a recorder of its own, handles) per label set: metrics
//! still land in the recorder current at each request (facade), counts add up, and the cache is
//! bounded.

mod common;

use std::convert::Infallible;

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use metrics_util::debugging::DebuggingRecorder;
use tailguard_phases::{LatencyPhaseRecorderLayer, MAX_CACHED_LABEL_SETS, MetricsSink, Route};
use tower::{Layer, Service, ServiceExt, service_fn};

fn upstream()
-> impl Service<Request<Empty<Bytes>>, Response = Response<ScriptBody>, Error = Infallible, Future: Send>
+ Clone {
    service_fn(|_req: Request<Empty<Bytes>>| async {
        Ok::<_, Infallible>(sse(ScriptBody::new([
            data(ROLE),
            Step::Wait(ms(10)),
            data(TOKEN),
            Step::Wait(ms(10)),
            data(TOKEN),
            data(END),
        ])))
    })
}

async fn request<S>(svc: &S, route: Option<&str>)
where
    S: Service<
            Request<Empty<Bytes>>,
            Response = Response<tailguard_phases::LatencyPhaseRecorderBody<ScriptBody>>,
            Error = Infallible,
        > + Clone,
{
    let mut req = Request::new(Empty::new());
    if let Some(route) = route {
        req.extensions_mut().insert(Route::new(route));
    }
    let res = svc.clone().oneshot(req).await.unwrap();
    drain(res.into_body()).await.unwrap();
}

/// `tailguard_requests_total` by route. (A snapshot drains the debugging recorder's
/// histograms: take one, then read everything from it.)
fn requests_total(all: &[Series]) -> Vec<(String, u64)> {
    let mut v: Vec<_> = all
        .iter()
        .filter(|s| s.name == "tailguard_requests_total")
        .map(|s| (s.label("route").unwrap().to_owned(), s.counter()))
        .collect();
    v.sort();
    v
}

/// With the facade, keys are cached but handles are not: each request lands in the recorder
/// current when it runs, whether installed before or after the label set was first seen, and a
/// recorder replaced by another (possibly at the same address) never receives the other's.
#[tokio::test(start_paused = true)]
async fn facade_uses_the_recorder_current_at_each_request() {
    let sink = MetricsSink::new();
    let svc = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(sink.clone())
        .layer(upstream());

    // No recorder: the label set is cached, nothing is recorded anywhere.
    request(&svc, Some("/a")).await;
    assert_eq!(
        sink.cached_label_sets(),
        2,
        "the report's set and the gap set"
    );

    for round in 1..=3u64 {
        let rec = DebuggingRecorder::new();
        let snap = rec.snapshotter();
        let guard = metrics::set_default_local_recorder(&rec);
        for _ in 0..round {
            request(&svc, Some("/a")).await;
        }
        drop(guard);
        let all = snapshot(&snap);
        assert_eq!(requests_total(&all), [("/a".to_owned(), round)]);
        let gaps = metric(&all, "tailguard_inter_token_gap_seconds").hist();
        assert_eq!(gaps.len() as u64, round, "one gap per request, live");
        // After the scope, nothing more lands in this recorder (its snapshot drained it).
        request(&svc, Some("/a")).await;
        assert!(
            requests_total(&snapshot(&snap))
                .iter()
                .all(|(_, n)| *n == 0)
        );
    }
    assert_eq!(sink.cached_label_sets(), 2);
}

/// With a recorder of its own, handles are registered once per label set and reused: counts and
/// histograms add up across requests and label sets.
#[tokio::test(start_paused = true)]
async fn own_recorder_handles_are_reused() {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let sink = MetricsSink::new().with_recorder(rec);
    let svc = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(sink.clone())
        .layer(upstream());
    for i in 0..60 {
        request(&svc, Some(if i % 3 == 0 { "/b" } else { "/a" })).await;
    }
    let all = snapshot(&snap);
    assert_eq!(
        requests_total(&all),
        [("/a".to_owned(), 40), ("/b".to_owned(), 20)]
    );
    let durations: usize = all
        .iter()
        .filter(|s| s.name == "tailguard_request_duration_seconds")
        .map(|s| s.hist().len())
        .sum();
    assert_eq!(durations, 60);
    let gaps: usize = all
        .iter()
        .filter(|s| s.name == "tailguard_inter_token_gap_seconds")
        .map(|s| s.hist().len())
        .sum();
    assert_eq!(gaps, 60);
    assert_eq!(sink.cached_label_sets(), 4);
    // A sink configured anew starts with an empty cache of its own.
    assert_eq!(
        MetricsSink::new()
            .with_recorder(DebuggingRecorder::new())
            .cached_label_sets(),
        0
    );
}

/// A recorder that counts registrations, recording nowhere.
#[derive(Default)]
struct Registrations(std::sync::atomic::AtomicUsize);

impl Registrations {
    fn count(&self) -> usize {
        self.0.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn one(&self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl metrics::Recorder for Registrations {
    fn describe_counter(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_gauge(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn describe_histogram(
        &self,
        _: metrics::KeyName,
        _: Option<metrics::Unit>,
        _: metrics::SharedString,
    ) {
    }
    fn register_counter(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Counter {
        self.one();
        metrics::Counter::noop()
    }
    fn register_gauge(&self, _: &metrics::Key, _: &metrics::Metadata<'_>) -> metrics::Gauge {
        self.one();
        metrics::Gauge::noop()
    }
    fn register_histogram(
        &self,
        _: &metrics::Key,
        _: &metrics::Metadata<'_>,
    ) -> metrics::Histogram {
        self.one();
        metrics::Histogram::noop()
    }
}

/// With a recorder of its own, the sink registers each metric of a label set once, however many
/// requests it records; through the facade, once per request, as the `metrics` macros do.
#[tokio::test(start_paused = true)]
async fn own_recorder_registers_once_per_label_set() {
    let rec = std::sync::Arc::new(Registrations::default());
    let sink = MetricsSink::new().with_shared_recorder(rec.clone());
    let svc = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(sink)
        .layer(upstream());
    request(&svc, Some("/a")).await;
    let first = rec.count();
    assert!(first > 0);
    for _ in 0..20 {
        request(&svc, Some("/a")).await;
    }
    assert_eq!(rec.count(), first);

    let facade = Registrations::default();
    let svc = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(MetricsSink::new())
        .layer(upstream());
    let guard = metrics::set_default_local_recorder(&facade);
    for _ in 0..3 {
        request(&svc, Some("/a")).await;
    }
    drop(guard);
    assert_eq!(facade.count(), 3 * first);
}

/// A route function that (wrongly) produces unbounded labels cannot grow the cache past its
/// cap; the label sets beyond it are still recorded, and still add up.
#[tokio::test(start_paused = true)]
async fn cache_is_bounded_and_sets_beyond_it_still_record() {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let sink = MetricsSink::new().with_recorder(rec);
    let svc = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(sink.clone())
        .layer(upstream());
    let routes = MAX_CACHED_LABEL_SETS / 2 + 8;
    for i in 0..routes {
        request(&svc, Some(&format!("/r{i}"))).await;
    }
    assert_eq!(sink.cached_label_sets(), MAX_CACHED_LABEL_SETS);
    // The last routes were not cached: requested again, they still count.
    let last = format!("/r{}", routes - 1);
    request(&svc, Some(&last)).await;
    let totals = requests_total(&snapshot(&snap));
    assert_eq!(totals.len(), routes);
    assert!(
        totals
            .iter()
            .all(|(r, n)| *n == if *r == last { 2 } else { 1 })
    );
    assert_eq!(sink.cached_label_sets(), MAX_CACHED_LABEL_SETS);
}

/// The recorder's fast path for a `MetricsSink` (one label-set lookup per streamed request; the
/// report series of each end reason found from the gap series) emits exactly what the sink does
/// through the plain `PhaseSink` trait, for every end reason and label set, with the facade and
/// with a recorder of its own.
#[tokio::test(start_paused = true)]
async fn fast_path_matches_the_trait_path() {
    use std::sync::Arc;
    use tailguard_phases::PhaseSink;

    async fn scenario<S>(svc: &S)
    where
        S: Service<
                Request<Empty<Bytes>>,
                Response = Response<tailguard_phases::LatencyPhaseRecorderBody<ScriptBody>>,
                Error = Infallible,
            > + Clone,
    {
        for i in 0..12 {
            let route = ["/a", "/b", "/a"][i % 3];
            let mut req = Request::new(Empty::new());
            req.extensions_mut().insert(Route::new(route));
            let res = svc.clone().oneshot(req).await.unwrap();
            if i % 4 == 1 {
                // A client disconnect after the first frame: another end reason, same labels.
                let mut body = std::pin::pin!(res.into_body());
                let _ = body.frame().await;
            } else {
                drain(res.into_body()).await.unwrap();
            }
        }
    }

    // Sorted, comparable views of what a recorder saw.
    fn view(all: &[Series]) -> Vec<String> {
        let mut v: Vec<String> = all.iter().map(|s| format!("{s:?}")).collect();
        v.sort();
        v
    }

    // Own recorders: one sink through `with_sink` (the fast path), one through
    // `with_shared_sink` (the trait), on the same layer.
    let fast_rec = DebuggingRecorder::new();
    let fast_snap = fast_rec.snapshotter();
    let slow_rec = DebuggingRecorder::new();
    let slow_snap = slow_rec.snapshotter();
    let fast = MetricsSink::new().with_recorder(fast_rec);
    let slow = MetricsSink::new().with_recorder(slow_rec);
    let svc = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(fast.clone())
        .with_shared_sink(Arc::new(slow.clone()) as Arc<dyn PhaseSink>)
        .layer(upstream());
    scenario(&svc).await;
    let f = view(&snapshot(&fast_snap));
    assert!(f.iter().any(|s| s.contains("client_disconnect")));
    assert!(f.iter().any(|s| s.contains("completed")));
    assert_eq!(f, view(&snapshot(&slow_snap)));
    assert_eq!(fast.cached_label_sets(), slow.cached_label_sets());

    // The facade: the same scenario under two local recorders, fast path then trait path.
    for shared in [false, true] {
        let rec = DebuggingRecorder::new();
        let snap = rec.snapshotter();
        let layer = LatencyPhaseRecorderLayer::new().without_sinks();
        let layer = if shared {
            layer.with_shared_sink(Arc::new(MetricsSink::new()) as Arc<dyn PhaseSink>)
        } else {
            layer.with_sink(MetricsSink::new())
        };
        let svc = layer.layer(upstream());
        let guard = metrics::set_default_local_recorder(&rec);
        scenario(&svc).await;
        drop(guard);
        let v = view(&snapshot(&snap));
        if shared {
            assert_eq!(v, f, "facade, trait path");
        } else {
            assert_eq!(v, f, "facade, fast path");
        }
    }
}
