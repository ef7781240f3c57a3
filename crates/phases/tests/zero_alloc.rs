//! The recorder's body allocates nothing per frame once the stream is running (counted by a
//! global allocator; one test in this file, so nothing else allocates while it counts).

use std::alloc::System;
use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tailguard_phases::{LatencyPhaseRecorderLayer, PhaseReport};
use tailguard_test_support::{ScriptBody, Step};
use tower::{Layer, Service, service_fn};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

fn poll_frame<B: Body + Unpin>(b: &mut B) -> Option<Frame<B::Data>> {
    let mut cx = Context::from_waker(Waker::noop());
    match Pin::new(b).poll_frame(&mut cx) {
        Poll::Ready(Some(Ok(f))) => Some(f),
        Poll::Ready(None) => None,
        _ => panic!("scripted frames are always ready"),
    }
}

fn steady_state_allocates_nothing_per_frame() {
    let role =
        Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n");
    let token = Bytes::from_static(
        b"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
    );
    let keepalive = Bytes::from_static(b": keepalive\n\n");
    let mut frames = vec![role, token.clone()];
    for i in 0..300 {
        frames.push(if i % 10 == 9 {
            keepalive.clone()
        } else {
            token.clone()
        });
    }
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));

    let reports = Arc::new(AtomicUsize::new(0));
    let seen = reports.clone();
    // Default sinks (metrics to the facade's no-op recorder, tracing with no subscriber) plus
    // a sink of our own.
    let layer = LatencyPhaseRecorderLayer::new()
        .with_models(["gpt-4o"])
        .with_sink(move |_r: &PhaseReport| {
            seen.fetch_add(1, Ordering::Relaxed);
        });
    let mut svc = layer.layer(service_fn(move |_req: Request<()>| {
        let frames = frames.clone();
        async move {
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(ScriptBody::new(frames.into_iter().map(Step::Data)))
                    .unwrap(),
            )
        }
    }));

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _guard = rt.enter();
    let mut fut = Box::pin(svc.call(Request::new(())));
    let mut cx = Context::from_waker(Waker::noop());
    let Poll::Ready(Ok(res)) = fut.as_mut().poll(&mut cx) else {
        panic!("ready at once")
    };
    let mut body = Box::pin(res.into_body());
    // Role-only chunk and the first token: the tracker leaves its JSON phase here.
    poll_frame(&mut body).unwrap();
    poll_frame(&mut body).unwrap();

    let mut n = 0;
    // Warm up through the first keepalive: core's scanner allocates a small buffer once per
    // stream at its first comment line (a per-request cost, not a per-frame one).
    for _ in 0..10 {
        poll_frame(&mut body).unwrap();
    }
    let region = Region::new(GLOBAL);
    for _ in 0..290 {
        let f = poll_frame(&mut body).unwrap();
        n += f.data_ref().map_or(0, |d| d.len());
    }
    let stats = region.change();
    assert!(n > 0);
    assert_eq!(
        stats.allocations + stats.reallocations,
        0,
        "allocations over 290 frames: {stats:?}"
    );

    poll_frame(&mut body).unwrap();
    assert!(poll_frame(&mut body).is_none());
    assert_eq!(reports.load(Ordering::Relaxed), 1);
}

// This file runs without libtest (`harness = false` in Cargo.toml): the allocation counter is
// process-wide, and libtest's own threads allocate while a test runs. Run on the main thread
// with nothing else alive, the count is exactly this test's.
fn main() {
    steady_state_allocates_nothing_per_frame();
    println!("test steady_state_allocates_nothing_per_frame ... ok");
    println!("1 passed, 0 failed");
}
