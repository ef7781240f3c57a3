//! Per-request cost of `BoundedAdmission` vs. `tower::limit::ConcurrencyLimit`, uncontended,
//! and admit/release throughput with 1,000 waiters.
//!
//! Futures and bodies are polled by hand with a no-op waker (every step is ready at once when
//! uncontended), so what is measured is the layer's own work: for `ConcurrencyLimit`, a
//! semaphore acquire in `poll_ready` and the release when the response future completes; for
//! `BoundedAdmission`, the decision in `call` (under the gate's one lock), the response wrapped
//! in a body that holds the permit, and the release at the end of the body. The
//! inner service answers at once with a one-frame body, which is read to its end in every
//! variant.
//!
//! With 1,000 waiters, one iteration is one release that admits the next waiter, plus one new
//! arrival so the queue stays 1,000 deep: for `ConcurrencyLimit` the waiters are service clones
//! pending in `poll_ready`; for `BoundedAdmission` they are response futures pending in the
//! queue (one class, or 200 waiters in each of the five standard classes).
//!
//! The interleaved comparison printed first is repeated over an inner service whose response
//! already carries an extension (as under `FirstTokenHedge` in a gateway's stack), where the
//! `AdmissionOutcome` insert costs one allocation instead of the three of a first insert.
//!
//! Run: `cargo bench -p tailguard-benches --bench admission -- --warm-up-time 1 --measurement-time 3`

use std::collections::VecDeque;
use std::convert::Infallible;
use std::future::{Future, Ready, ready};
use std::hint::black_box;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use tailguard::admission::{BoundedAdmission, BoundedAdmissionLayer};
use tailguard::core::Priority;
use tower::limit::ConcurrencyLimit;
use tower::{Layer, Service};

#[derive(Clone, Copy)]
struct Inner;

impl Service<Request<()>> for Inner {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Full<Bytes>>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: Request<()>) -> Self::Future {
        ready(Ok(Response::new(Full::new(Bytes::from_static(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n",
        )))))
    }
}

/// The same inner service, but its response already carries an extension, as it does under
/// `BoundedAdmission` in a gateway's stack (`FirstTokenHedge` below it inserts its
/// `HedgeOutcome`, a hyper client response may carry its own): `AdmissionOutcome` is then added
/// to an existing map instead of being the first insert into an empty one.
#[derive(Clone, Copy)]
struct InnerWithExtension;

impl Service<Request<()>> for InnerWithExtension {
    type Response = Response<Full<Bytes>>;
    type Error = Infallible;
    type Future = Ready<Result<Response<Full<Bytes>>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<()>) -> Self::Future {
        let mut res = match Inner.call(req).into_inner() {
            Ok(res) => res,
            Err(never) => match never {},
        };
        res.extensions_mut()
            .insert(tailguard::core::HedgeOutcome::new(1, 0, None));
        ready(Ok(res))
    }
}

fn cx() -> Context<'static> {
    Context::from_waker(Waker::noop())
}

fn poll_ready<S: Service<Request<()>>>(svc: &mut S) -> bool {
    matches!(svc.poll_ready(&mut cx()), Poll::Ready(Ok(())))
}

fn poll_once<F: Future>(f: Pin<&mut F>) -> Option<F::Output> {
    match f.poll(&mut cx()) {
        Poll::Ready(v) => Some(v),
        Poll::Pending => None,
    }
}

/// Reads a ready body to its end.
fn drain<B: Body>(body: B) {
    let mut body = std::pin::pin!(body);
    loop {
        match body.as_mut().poll_frame(&mut cx()) {
            Poll::Ready(Some(Ok(f))) => {
                black_box(f);
            }
            Poll::Ready(None) => return,
            Poll::Ready(Some(Err(_))) | Poll::Pending => panic!("the body is always ready"),
        }
    }
}

/// One request through `svc`, every step ready at once.
fn one<S, B>(svc: &mut S)
where
    S: Service<Request<()>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
{
    assert!(poll_ready(svc));
    let fut = std::pin::pin!(svc.call(Request::new(())));
    let res = poll_once(fut).expect("ready").unwrap();
    drain(res.into_body());
}

/// Nanoseconds per request of `f` run `n` times.
fn per_request(n: u32, mut f: impl FnMut()) -> f64 {
    let start = tokio::time::Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed().as_nanos() as f64 / f64::from(n)
}

/// The machine these benches run on is shared, so besides criterion's sequential estimates the
/// variants are also measured interleaved (30 rounds, 20,000 requests per variant per round)
/// and the best round of each is printed with its ratio to `ConcurrencyLimit`: load spikes hit
/// every variant alike.
fn interleaved() {
    const N: u32 = 20_000;
    let mut bare = Inner;
    let mut limit = ConcurrencyLimit::new(Inner, 1024);
    let mut admission = BoundedAdmissionLayer::new(1024).layer(Inner);
    let mut no_outcome = BoundedAdmissionLayer::new(1024)
        .with_response_outcome(false)
        .layer(Inner);
    let mut best = [f64::MAX; 4];
    for _ in 0..30 {
        best[0] = best[0].min(per_request(N, || one(&mut bare)));
        best[1] = best[1].min(per_request(N, || one(&mut limit)));
        best[2] = best[2].min(per_request(N, || one(&mut admission)));
        best[3] = best[3].min(per_request(N, || one(&mut no_outcome)));
    }
    println!(
        "interleaved best ns/request: bare {:.1}, concurrency_limit {:.1}, bounded_admission \
         {:.1} ({:.2}x), bounded_admission_no_outcome {:.1} ({:.2}x)",
        best[0],
        best[1],
        best[2],
        best[2] / best[1],
        best[3],
        best[3] / best[1],
    );
    let mut bare = InnerWithExtension;
    let mut limit = ConcurrencyLimit::new(InnerWithExtension, 1024);
    let mut admission = BoundedAdmissionLayer::new(1024).layer(InnerWithExtension);
    let mut best = [f64::MAX; 3];
    for _ in 0..30 {
        best[0] = best[0].min(per_request(N, || one(&mut bare)));
        best[1] = best[1].min(per_request(N, || one(&mut limit)));
        best[2] = best[2].min(per_request(N, || one(&mut admission)));
    }
    println!(
        "interleaved best ns/request, inner response already carrying an extension: bare {:.1}, \
         concurrency_limit {:.1}, bounded_admission {:.1} ({:.2}x)",
        best[0],
        best[1],
        best[2],
        best[2] / best[1],
    );
}

fn uncontended(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    interleaved();
    let mut g = c.benchmark_group("admission_uncontended");
    g.throughput(Throughput::Elements(1));
    g.bench_function("bare", |b| {
        let mut svc = Inner;
        b.iter(|| one(&mut svc));
    });
    g.bench_function("concurrency_limit", |b| {
        let mut svc = ConcurrencyLimit::new(Inner, 1024);
        b.iter(|| one(&mut svc));
    });
    g.bench_function("bounded_admission", |b| {
        let mut svc = BoundedAdmissionLayer::new(1024).layer(Inner);
        b.iter(|| one(&mut svc));
    });
    // Without the `AdmissionOutcome` response extension (an allocation per request).
    g.bench_function("bounded_admission_no_outcome", |b| {
        let mut svc = BoundedAdmissionLayer::new(1024)
            .with_response_outcome(false)
            .layer(Inner);
        b.iter(|| one(&mut svc));
    });
    g.finish();
}

fn waiters(c: &mut Criterion) {
    const WAITERS: usize = 1_000;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let mut g = c.benchmark_group("admission_1000_waiters");
    g.throughput(Throughput::Elements(1));

    g.bench_function("concurrency_limit", |b| {
        let base = ConcurrencyLimit::new(Inner, 1);
        let mut first = base.clone();
        assert!(poll_ready(&mut first));
        // The permit travels with the response future until it completes or is dropped.
        let mut held = Some(first.call(Request::new(())));
        let mut queue: VecDeque<_> = (0..WAITERS)
            .map(|_| {
                let mut s = base.clone();
                assert!(!poll_ready(&mut s));
                s
            })
            .collect();
        b.iter(|| {
            drop(held.take());
            let mut next = queue.pop_front().unwrap();
            assert!(poll_ready(&mut next));
            held = Some(next.call(Request::new(())));
            let mut arrival = base.clone();
            assert!(!poll_ready(&mut arrival));
            queue.push_back(arrival);
        });
    });

    for classes in [1usize, 5] {
        let name = if classes == 1 {
            "bounded_admission".to_owned()
        } else {
            format!("bounded_admission_{classes}_classes")
        };
        g.bench_function(name, |b| {
            let layer = BoundedAdmissionLayer::new(1)
                .with_queue_len(WAITERS + 1)
                .with_queue_timeout(Duration::from_secs(24 * 3600))
                .with_codel(None)
                .with_aging(Some(Duration::from_secs(24 * 3600)));
            let mut svc = layer.layer(Inner);
            let set = Priority::standard_set();
            let hot = set[0].clone();
            let request = |p: &Priority| {
                let mut r = Request::new(());
                r.extensions_mut().insert(p.clone());
                r
            };
            assert!(poll_ready(&mut svc));
            let mut first = Box::pin(svc.call(request(&hot)));
            let mut held = Some(poll_once(first.as_mut()).unwrap().unwrap());
            let enqueue = |svc: &mut BoundedAdmission<Inner>, p: &Priority| {
                assert!(poll_ready(svc));
                let mut f = Box::pin(Service::call(svc, request(p)));
                assert!(poll_once(f.as_mut()).is_none());
                f
            };
            // The most important class is admitted first; the others wait behind it.
            let mut hot_queue = VecDeque::new();
            let mut cold = Vec::new();
            for i in 0..WAITERS {
                let p = &set[i % classes];
                let f = enqueue(&mut svc, p);
                if p == &hot {
                    hot_queue.push_back(f);
                } else {
                    cold.push(f);
                }
            }
            assert_eq!(svc.handle().queued(), WAITERS);
            b.iter(|| {
                drop(held.take());
                let mut next = hot_queue.pop_front().unwrap();
                held = Some(poll_once(next.as_mut()).expect("admitted").unwrap());
                hot_queue.push_back(enqueue(&mut svc, &hot));
            });
            drop(held);
            drop(hot_queue);
            drop(cold);
            assert_eq!(svc.handle().queued(), 0);
        });
    }
    g.finish();
}

criterion_group!(benches, uncontended, waiters);
criterion_main!(benches);
