//! `FirstTokenHedge` costs: per request on the no-hedge path (fast primary) against the bare
//! service and `tower::hedge`, and per frame after the first token against the bare body.
//!
//! * `hedge_per_request`: one request through `ready` + `call`, then the whole (three-frame)
//!   body read: a role-only chunk, a content chunk (the first token) and `[DONE]`, all ready at
//!   once. `tower::hedge` (10 data points, p90, 60 s period) and `FirstTokenHedge` (the default
//!   layer: adaptive p90, warm, default budget) are both warmed up first, so both arm their
//!   hedge timer on every request. What `FirstTokenHedge` adds: buffering the request body
//!   for replay, a copy of the request head for a backup, the first-token scan of the
//!   pre-token frames, the replay of the frames before the token, the TTFT sample.
//!   `bare_plus_stream_tracker` is the bare service with its body read through a
//!   `StreamTracker` until the first token: the JSON inspection of the pre-token events that
//!   core's classifier does, which any token-aware layer pays; the layer's own cost is the
//!   difference between it and `first_token_hedge`.
//! * `hedge_per_frame`: a 1,003-frame OpenAI stream read after the winner was committed
//!   (the response is built outside the timed section). Allocations per frame are counted and
//!   printed.
//!
//! Run: `cargo bench -p tailguard-benches --bench hedge -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;
use std::task::{Context, Poll, Waker};

use bytes::{Buf, Bytes};
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};
use http::{Request, Response};
use http_body::Body;
use http_body_util::Full;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tailguard::core::{Dialect, StreamTracker};
use tailguard::hedge::FirstTokenHedgeLayer;
use tailguard_benches::{
    CONTENT_CHUNKS, Frames, drain, one, openai_stream, request, tower_hedge, upstream,
};
use tower::{Layer, Service, ServiceExt};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

/// Allocations per frame after the first token.
fn allocs_per_frame<B: Body>(frames: usize, body: B) -> f64 {
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(Waker::noop());
    // The replayed role chunk and first token.
    for _ in 0..2 {
        let _ = body.as_mut().poll_frame(&mut cx);
    }
    let region = Region::new(GLOBAL);
    drain(body);
    region.change().allocations as f64 / (frames - 2) as f64
}

/// The bare service, its body read through a `StreamTracker` until the first token: the
/// first-token scan that any token-aware layer pays (the floor under `FirstTokenHedge`).
async fn one_tracked<S, B>(svc: &mut S) -> usize
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
{
    let res = svc.ready().await.unwrap().call(request()).await.unwrap();
    let mut tracker = StreamTracker::new(&Dialect::Auto, res.headers());
    let mut body = std::pin::pin!(res.into_body());
    let mut cx = Context::from_waker(Waker::noop());
    let mut n = 0;
    let mut seen = false;
    while let Poll::Ready(Some(Ok(f))) = body.as_mut().poll_frame(&mut cx) {
        if let Some(d) = f.data_ref() {
            if !seen {
                seen = tracker.observe(d).first_token;
            }
            n += d.remaining();
        }
    }
    black_box(n)
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();

    // Per request, no hedge.
    let short = openai_stream(1);
    let short_bytes: usize = short.iter().map(Bytes::len).sum();
    let mut bare = upstream::<Full<Bytes>>(short.clone());
    let mut tower_hedge = tower_hedge(upstream::<Full<Bytes>>(short.clone()));
    let mut ftk = FirstTokenHedgeLayer::new().layer(upstream(short.clone()));
    // The same layer finding the first token without JSON (the first body byte is the token):
    // the layer's own mechanics alone.
    let mut ftk_any_byte = FirstTokenHedgeLayer::new()
        .with_dialect(Dialect::AnyByte)
        .layer(upstream(short.clone()));
    rt.block_on(async {
        for _ in 0..100 {
            assert_eq!(one(&mut bare).await, short_bytes);
            assert_eq!(one(&mut tower_hedge).await, short_bytes);
            assert_eq!(one(&mut ftk).await, short_bytes);
            assert_eq!(one(&mut ftk_any_byte).await, short_bytes);
        }
    });

    let allocs = |f: &mut dyn FnMut()| {
        let region = Region::new(GLOBAL);
        for _ in 0..100 {
            f();
        }
        region.change().allocations as f64 / 100.0
    };
    eprintln!(
        "allocations per request: bare {:.1}, bare+tracker {:.1}, tower::hedge {:.1}, \
         FirstTokenHedge {:.1}, FirstTokenHedge (AnyByte) {:.1}",
        allocs(&mut || {
            rt.block_on(one(&mut bare));
        }),
        allocs(&mut || {
            rt.block_on(one_tracked(&mut bare));
        }),
        allocs(&mut || {
            rt.block_on(one(&mut tower_hedge));
        }),
        allocs(&mut || {
            rt.block_on(one(&mut ftk));
        }),
        allocs(&mut || {
            rt.block_on(one(&mut ftk_any_byte));
        }),
    );

    let mut g = c.benchmark_group("hedge_per_request");
    g.throughput(Throughput::Elements(1));
    g.bench_function("bare", |b| b.iter(|| rt.block_on(one(&mut bare))));
    g.bench_function("bare_plus_stream_tracker", |b| {
        b.iter(|| rt.block_on(one_tracked(&mut bare)))
    });
    g.bench_function("tower_hedge", |b| {
        b.iter(|| rt.block_on(one(&mut tower_hedge)))
    });
    g.bench_function("first_token_hedge", |b| {
        b.iter(|| rt.block_on(one(&mut ftk)))
    });
    g.bench_function("first_token_hedge_any_byte", |b| {
        b.iter(|| rt.block_on(one(&mut ftk_any_byte)))
    });
    g.finish();

    // Per frame, after the first token.
    let long = openai_stream(CONTENT_CHUNKS);
    let n = long.len();
    let long_bytes: usize = long.iter().map(Bytes::len).sum();
    let ftk_long = FirstTokenHedgeLayer::new().layer(upstream(long.clone()));
    let hedged_body = || {
        let res = rt.block_on(ftk_long.clone().oneshot(request())).unwrap();
        assert!(res.body().is_raced());
        res.into_body()
    };
    assert_eq!(drain(hedged_body()), long_bytes);
    eprintln!(
        "allocations per frame after the first token: bare {:.3}, FirstTokenHedge {:.3}",
        allocs_per_frame(n, Frames::new(long.clone())),
        allocs_per_frame(n, hedged_body()),
    );

    let mut g = c.benchmark_group("hedge_per_frame");
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function("bare", |b| {
        b.iter_batched(|| Frames::new(long.clone()), drain, BatchSize::SmallInput)
    });
    g.bench_function("first_token_hedge", |b| {
        b.iter_batched(hedged_body, drain, BatchSize::SmallInput)
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
