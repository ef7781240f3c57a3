//! Storm: thousands of requests with random costs, classes and client cancellations at random
//! points, on a paused clock. Afterwards nothing is in flight, nothing waits, nothing leaked.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use tailguard_admission::{BoundedAdmissionLayer, Cost};
use tailguard_core::{AdmissionOutcome, OverloadReason, Overloaded, Priority};
use tailguard_test_support::{ScriptBody, Step};
use tokio::time::{Sleep, sleep};
use tower::{Layer, Service, ServiceExt};

/// splitmix64: a tiny seeded PRNG, so the storm is the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

#[derive(Default)]
struct Live {
    futures: AtomicUsize,
    bodies: AtomicUsize,
    calls: AtomicUsize,
    head_cancelled: AtomicUsize,
}

/// An upstream that answers after `x-head` ms with `x-frames` frames `x-gap` ms apart.
#[derive(Clone)]
struct Upstream(Arc<Live>);

fn header(req: &Request<()>, name: &str) -> u64 {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok()?.parse().ok())
        .unwrap_or(0)
}

struct HeadFuture {
    sleep: Pin<Box<Sleep>>,
    frames: u64,
    gap: Duration,
    live: Arc<Live>,
    done: bool,
}

impl Drop for HeadFuture {
    fn drop(&mut self) {
        self.live.futures.fetch_sub(1, Ordering::SeqCst);
        if !self.done {
            self.live.head_cancelled.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Future for HeadFuture {
    type Output = Result<Response<ScriptBody>, io::Error>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        ready!(self.sleep.as_mut().poll(cx));
        self.done = true;
        self.live.bodies.fetch_add(1, Ordering::SeqCst);
        let gap = self.gap;
        let frame = Bytes::from_static(b"data: {}\n\n");
        let steps = (0..self.frames).flat_map(|_| [Step::Wait(gap), Step::Data(frame.clone())]);
        let live = self.live.clone();
        let body = ScriptBody::new(steps).on_drop(move |_| {
            live.bodies.fetch_sub(1, Ordering::SeqCst);
        });
        Poll::Ready(Ok(Response::new(body)))
    }
}

impl Service<Request<()>> for Upstream {
    type Response = Response<ScriptBody>;
    type Error = io::Error;
    type Future = HeadFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), io::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<()>) -> HeadFuture {
        self.0.futures.fetch_add(1, Ordering::SeqCst);
        self.0.calls.fetch_add(1, Ordering::SeqCst);
        HeadFuture {
            sleep: Box::pin(sleep(Duration::from_millis(header(&req, "x-head")))),
            frames: header(&req, "x-frames"),
            gap: Duration::from_millis(header(&req, "x-gap")),
            live: self.0.clone(),
            done: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
enum Outcome {
    Completed,
    CancelledBeforeResponse,
    CancelledMidStream,
    Rejected(u16, &'static str),
}

struct Plan {
    arrival: Duration,
    req: Request<()>,
    /// `Some(d)`: the client gives up `d` after sending if no response came yet.
    cancel_before: Option<Duration>,
    /// `Some(k)`: the client drops the body after `k` frames.
    cancel_after_frames: Option<u64>,
}

fn plan(rng: &mut Rng, span_ms: u64) -> Plan {
    let classes = Priority::standard_set();
    let mut req = Request::builder()
        .header("x-cost", (1 + rng.below(12)).to_string())
        .header("x-head", rng.below(150).to_string())
        .header("x-frames", rng.below(12).to_string())
        .header("x-gap", (1 + rng.below(80)).to_string())
        .body(())
        .unwrap();
    req.extensions_mut()
        .insert(classes[rng.below(5) as usize].clone());
    let mode = rng.below(10);
    // Mostly spread out, with one in five requests in one of 20 simultaneous bursts.
    let arrival = if rng.below(5) == 0 {
        rng.below(20) * (span_ms / 20)
    } else {
        rng.below(span_ms)
    };
    Plan {
        arrival: Duration::from_millis(arrival),
        req,
        cancel_before: (mode < 2).then(|| Duration::from_millis(rng.below(400))),
        cancel_after_frames: (mode >= 8).then(|| rng.below(8)),
    }
}

fn cost() -> Cost {
    Cost::from_fn(|p| {
        p.headers
            .get("x-cost")
            .and_then(|v| v.to_str().ok()?.parse().ok())
            .unwrap_or(1)
    })
}

async fn read_body<B>(body: B, cancel_after: Option<u64>) -> Outcome
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: std::fmt::Debug,
{
    let mut body = body;
    let mut frames = 0;
    loop {
        if cancel_after == Some(frames) {
            return Outcome::CancelledMidStream;
        }
        match body.frame().await {
            Some(Ok(_)) => frames += 1,
            Some(Err(e)) => panic!("body error: {e:?}"),
            None => return Outcome::Completed,
        }
    }
}

fn assert_refusal(status: StatusCode, retry_after: Option<&http::HeaderValue>) {
    assert!(
        status == StatusCode::TOO_MANY_REQUESTS || status == StatusCode::SERVICE_UNAVAILABLE,
        "{status}"
    );
    let secs: u64 = retry_after
        .expect("Retry-After")
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&secs));
}

fn tally(outcomes: Vec<Outcome>) -> std::collections::BTreeMap<Outcome, usize> {
    let mut m = std::collections::BTreeMap::new();
    for o in outcomes {
        *m.entry(o).or_default() += 1;
    }
    m
}

#[tokio::test(start_paused = true)]
async fn storm_of_ten_thousand_requests_leaves_nothing_behind() {
    const N: usize = 10_000;
    let live = Arc::new(Live::default());
    let layer = BoundedAdmissionLayer::new(64)
        .with_queue_len(64)
        .with_queue_timeout(Duration::from_millis(700))
        .with_adaptive_lifo(true)
        .with_aging(Some(Duration::from_millis(100)))
        .with_cost(cost())
        .with_reserved_share(Priority::batch(), 0.2);
    let h = layer.handle();
    let svc = layer.layer(Upstream(live.clone()));
    let mut rng = Rng(0x005E_ED0F_7A11);
    let mut tasks = Vec::with_capacity(N);
    for _ in 0..N {
        let p = plan(&mut rng, 120_000);
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            sleep(p.arrival).await;
            let call = svc.oneshot(p.req);
            let res = match p.cancel_before {
                Some(d) => tokio::select! {
                    r = call => r,
                    _ = sleep(d) => return Outcome::CancelledBeforeResponse,
                },
                None => call.await,
            };
            let res = res.expect("the upstream never fails");
            let status = res.status();
            if status == StatusCode::OK {
                assert!(res.extensions().get::<AdmissionOutcome>().is_some());
                return read_body(res.into_body(), p.cancel_after_frames).await;
            }
            assert_refusal(status, res.headers().get(http::header::RETRY_AFTER));
            let reason = res
                .extensions()
                .get::<AdmissionOutcome>()
                .and_then(|o| o.rejected)
                .expect("a refusal says why");
            let body = res.into_body().collect().await.unwrap().to_bytes();
            let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
            assert_eq!(v["error"]["code"], reason.as_str());
            Outcome::Rejected(status.as_u16(), reason.as_str())
        }));
    }
    let mut outcomes = Vec::with_capacity(N);
    for t in tasks {
        outcomes.push(t.await.expect("no client task panicked"));
    }
    assert_eq!(outcomes.len(), N);
    let counts = tally(outcomes);
    println!("{counts:#?}");
    // Every path was exercised.
    for o in [
        Outcome::Completed,
        Outcome::CancelledBeforeResponse,
        Outcome::CancelledMidStream,
        Outcome::Rejected(429, "queue_full"),
        Outcome::Rejected(429, "evicted"),
        Outcome::Rejected(503, "queue_timeout"),
    ] {
        assert!(
            counts.get(&o).copied().unwrap_or(0) > 0,
            "{o:?} never happened"
        );
    }
    let head_cancelled = live.head_cancelled.load(Ordering::SeqCst);
    let cancelled_before = counts[&Outcome::CancelledBeforeResponse];
    assert!(head_cancelled > 0, "no cancellation before headers");
    assert!(
        cancelled_before > head_cancelled,
        "no cancellation while queued"
    );
    // Nothing in flight, nothing queued, no permit leaked.
    assert_eq!((h.in_flight(), h.in_flight_units(), h.queued()), (0, 0, 0));
    for p in Priority::standard_set() {
        assert_eq!(
            (
                h.in_flight_of(&p),
                h.queued_of(&p),
                h.in_flight_units_of(&p)
            ),
            (0, 0, 0)
        );
    }
    // No upstream future or body outlived its client.
    assert_eq!(live.futures.load(Ordering::SeqCst), 0);
    assert_eq!(live.bodies.load(Ordering::SeqCst), 0);
    // The full capacity is usable again, at once.
    let mut held = Vec::new();
    for _ in 0..64 {
        let req = Request::builder()
            .header("x-frames", "1")
            .header("x-gap", "1000")
            .body(())
            .unwrap();
        let res = svc.clone().oneshot(req).await.unwrap();
        assert_eq!(
            res.extensions()
                .get::<AdmissionOutcome>()
                .unwrap()
                .queue_wait,
            Duration::ZERO
        );
        held.push(res);
    }
    assert_eq!(h.in_flight_units(), 64);
    drop(held);
    assert_eq!(h.in_flight_units(), 0);
}

#[tokio::test(start_paused = true)]
async fn storm_in_the_error_flavour_yields_typed_errors() {
    const N: usize = 2_000;
    let live = Arc::new(Live::default());
    let layer = BoundedAdmissionLayer::new(8)
        .with_queue_len(16)
        .with_queue_timeout(Duration::from_millis(300))
        .with_cost(cost())
        .with_error_mode();
    let h = layer.handle();
    let svc = layer.layer(Upstream(live.clone()));
    let mut rng = Rng(42);
    let mut tasks = Vec::with_capacity(N);
    for _ in 0..N {
        let p = plan(&mut rng, 6_000);
        let svc = svc.clone();
        tasks.push(tokio::spawn(async move {
            sleep(p.arrival).await;
            let call = svc.oneshot(p.req);
            let res = match p.cancel_before {
                Some(d) => tokio::select! {
                    r = call => r,
                    _ = sleep(d) => return Outcome::CancelledBeforeResponse,
                },
                None => call.await,
            };
            match res {
                Ok(res) => read_body(res.into_body(), p.cancel_after_frames).await,
                Err(e) => {
                    let o = e.downcast_ref::<Overloaded>().expect("a typed error");
                    assert!(o.retry_after().is_some());
                    let reason = match o.reason() {
                        OverloadReason::QueueFull => "queue_full",
                        OverloadReason::QueueTimeout => "queue_timeout",
                        OverloadReason::Evicted => "evicted",
                        other => panic!("unexpected {other:?}"),
                    };
                    Outcome::Rejected(o.status().as_u16(), reason)
                }
            }
        }));
    }
    let mut outcomes = Vec::with_capacity(N);
    for t in tasks {
        outcomes.push(t.await.expect("no client task panicked"));
    }
    let counts = tally(outcomes);
    println!("{counts:#?}");
    assert!(counts.contains_key(&Outcome::Rejected(503, "queue_timeout")));
    assert!(counts.contains_key(&Outcome::Completed));
    assert_eq!((h.in_flight(), h.in_flight_units(), h.queued()), (0, 0, 0));
    assert_eq!(live.futures.load(Ordering::SeqCst), 0);
    assert_eq!(live.bodies.load(Ordering::SeqCst), 0);
}
