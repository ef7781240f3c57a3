//! Per-frame cost of `SseIdleTimeout` vs. tower-http's `ResponseBodyTimeoutLayer` vs. the bare
//! body, on the same 1,000-chunk OpenAI stream.
//!
//! The stream is a role-only chunk, 1,000 content chunks, a finish chunk and `[DONE]`, one
//! event per frame, from an in-memory body, so what is measured is the wrapper's own work per
//! frame: for `SseIdleTimeout` with all four timers set, the event scan and classification and
//! the deadline bookkeeping; for tower-http, re-arming a tokio timer on every frame. Two
//! delivery patterns: `timeout_per_stream` has every frame ready at once; `timeout_pending_each`
//! has the body return `Pending` (and wake itself) before every frame, as a network body does
//! between tokens, so each frame also pays one wait (for `SseIdleTimeout`: a clock read and a
//! poll of the already-armed sleep). The response (and the tracker) is built outside the timed
//! section. Allocations per frame are counted once per variant and printed.
//!
//! Reference points: `bare_plus_stream_tracker` is the bare body plus `StreamTracker::observe`
//! on every frame (the scan floor of any token-aware wrapper); `sse_idle_timeout_head_only` is the
//! wrapper with no body timer (pass-through).
//!
//! Run: `cargo bench -p tailguard-benches --bench timeout -- --warm-up-time 1 --measurement-time 3`

use std::convert::Infallible;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use http::{Request, Response};
use http_body::{Body, Frame};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tailguard::core::{Dialect, StreamTracker};
use tailguard::timeout::SseIdleTimeoutLayer;
use tailguard_benches::{CONTENT_CHUNKS, openai_stream};
use tower::{Layer, ServiceExt};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// An in-memory body: every frame ready, or (`pend`) each frame preceded by one `Pending`.
struct Frames {
    frames: Arc<[Bytes]>,
    next: usize,
    pend: bool,
    flip: bool,
}

impl Frames {
    fn new(frames: &Arc<[Bytes]>, pend: bool) -> Self {
        Frames {
            frames: frames.clone(),
            next: 0,
            pend,
            flip: false,
        }
    }
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.pend {
            self.flip = !self.flip;
            if self.flip {
                cx.waker().wake_by_ref();
                return Poll::Pending;
            }
        }
        let i = self.next;
        self.next += 1;
        Poll::Ready(self.frames.get(i).cloned().map(|b| Ok(Frame::data(b))))
    }

    fn is_end_stream(&self) -> bool {
        self.next >= self.frames.len()
    }
}

fn upstream(
    frames: Arc<[Bytes]>,
    pend: bool,
) -> impl tower::Service<Request<()>, Response = Response<Frames>, Error = Infallible> + Clone {
    tower::service_fn(move |_req: Request<()>| {
        let body = Frames::new(&frames, pend);
        async move {
            Ok(Response::builder()
                .header("content-type", "text/event-stream")
                .body(body)
                .unwrap())
        }
    })
}

/// Polls every frame; returns the bytes seen.
fn drain<B: Body>(body: B) -> usize {
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(Waker::noop());
    let mut n = 0;
    loop {
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(f))) => n += f.data_ref().map_or(0, Buf::remaining),
            Poll::Ready(Some(Err(_))) => panic!("body error"),
            Poll::Ready(None) => return black_box(n),
            Poll::Pending => {}
        }
    }
}

fn layer() -> SseIdleTimeoutLayer {
    SseIdleTimeoutLayer::new()
        .with_head_timeout(Duration::from_secs(10))
        .with_first_token_timeout(Duration::from_secs(30))
        .with_idle_timeout(Duration::from_secs(5))
        .with_total_timeout(Duration::from_secs(600))
}

/// Allocations per frame in the steady state: after the first token (the classifier parses
/// JSON only until then), over the remaining frames.
fn allocs_per_frame<B: Body>(frames: usize, body: B) -> f64 {
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(Waker::noop());
    let mut delivered = 0;
    while delivered < 3 {
        if let Poll::Ready(Some(_)) = body.as_mut().poll_frame(&mut cx) {
            delivered += 1;
        }
    }
    let region = Region::new(GLOBAL);
    drain(body);
    region.change().allocations as f64 / (frames - 3) as f64
}

/// The bare body with a `StreamTracker` observing every frame: the scan floor that any
/// token-aware wrapper pays.
struct Tracked {
    inner: Frames,
    tracker: StreamTracker,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        let res = Pin::new(&mut this.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(f))) = &res
            && let Some(d) = f.data_ref()
        {
            black_box(this.tracker.observe(d));
        }
        res
    }
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let frames = openai_stream(CONTENT_CHUNKS);
    let n = frames.len();
    let bytes: usize = frames.iter().map(Bytes::len).sum();
    let mut sse_headers = http::HeaderMap::new();
    sse_headers.insert("content-type", "text/event-stream".parse().unwrap());

    for (group, pend) in [
        ("timeout_per_stream", false),
        ("timeout_pending_each", true),
    ] {
        let sse = layer().layer(upstream(frames.clone(), pend));
        // Only a head timer: the wrapper without a tracker (pass-through).
        let head_only = SseIdleTimeoutLayer::new()
            .with_head_timeout(Duration::from_secs(10))
            .layer(upstream(frames.clone(), pend));
        let tower_http = tower_http::timeout::ResponseBodyTimeoutLayer::new(Duration::from_secs(5))
            .layer(upstream(frames.clone(), pend));
        let bare = || Frames::new(&frames, pend);
        let tracked = || Tracked {
            inner: Frames::new(&frames, pend),
            tracker: StreamTracker::new(&Dialect::Auto, &sse_headers),
        };
        let head_only_body = || {
            rt.block_on(head_only.clone().oneshot(Request::new(())))
                .unwrap()
                .into_body()
        };
        let sse_body = || {
            rt.block_on(sse.clone().oneshot(Request::new(())))
                .unwrap()
                .into_body()
        };
        let th_body = || {
            rt.block_on(tower_http.clone().oneshot(Request::new(())))
                .unwrap()
                .into_body()
        };
        assert_eq!(drain(bare()), bytes);
        assert_eq!(drain(sse_body()), bytes);
        assert_eq!(drain(th_body()), bytes);
        eprintln!(
            "{group}: allocations per frame after the first token: bare {:.3}, \
             SseIdleTimeout {:.3}, tower-http {:.3}",
            allocs_per_frame(n, bare()),
            allocs_per_frame(n, sse_body()),
            allocs_per_frame(n, th_body()),
        );

        let mut g = c.benchmark_group(group);
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function("bare", |b| {
            b.iter_batched(bare, drain, BatchSize::SmallInput)
        });
        g.bench_function("bare_plus_stream_tracker", |b| {
            b.iter_batched(tracked, drain, BatchSize::SmallInput)
        });
        g.bench_function("sse_idle_timeout_head_only", |b| {
            b.iter_batched(head_only_body, drain, BatchSize::SmallInput)
        });
        g.bench_function("sse_idle_timeout", |b| {
            b.iter_batched(sse_body, drain, BatchSize::SmallInput)
        });
        g.bench_function("tower_http_body_timeout", |b| {
            b.iter_batched(th_body, drain, BatchSize::SmallInput)
        });
        g.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
