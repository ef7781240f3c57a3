//! Zero allocations per frame in the steady state (its own test binary: it installs a counting
//! global allocator).

use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tailguard_test_support::{ScriptBody, Step};
use tailguard_timeout::SseIdleTimeoutLayer;
use tower::{Layer, ServiceExt};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

fn steady_state_frames_allocate_nothing() {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let _enter = rt.enter();
    let mut frames = vec![Bytes::from_static(
        b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
    )];
    for _ in 0..500 {
        frames.push(Bytes::from_static(
            b"data: {\"choices\":[{\"delta\":{\"content\":\" word\"}}]}\n\n",
        ));
        frames.push(Bytes::from_static(b": keepalive\n\n"));
    }
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    let n = frames.len();
    let svc = SseIdleTimeoutLayer::new()
        .with_head_timeout(Duration::from_secs(10))
        .with_first_token_timeout(Duration::from_secs(30))
        .with_idle_timeout(Duration::from_secs(5))
        .with_total_timeout(Duration::from_secs(600))
        .layer(tower::service_fn(move |_req: Request<()>| {
            let frames = frames.clone();
            async move {
                Ok::<_, std::convert::Infallible>(
                    Response::builder()
                        .header("content-type", "text/event-stream")
                        .body(ScriptBody::new(frames.into_iter().map(Step::Data)))
                        .unwrap(),
                )
            }
        }));
    let res = rt.block_on(svc.oneshot(Request::new(()))).unwrap();
    let mut body = std::pin::pin!(res.into_body());
    let mut cx = Context::from_waker(Waker::noop());
    // Warm-up: the classifier parses JSON until the first token, and the scanner's capture
    // buffers get their capacity on the first event of each kind (role, token, comment).
    for _ in 0..3 {
        assert!(matches!(
            body.as_mut().poll_frame(&mut cx),
            Poll::Ready(Some(Ok(_)))
        ));
    }
    let region = Region::new(GLOBAL);
    for _ in 3..n - 1 {
        let frame = body.as_mut().poll_frame(&mut cx);
        assert!(matches!(frame, Poll::Ready(Some(Ok(f))) if f.is_data()));
    }
    let stats = region.change();
    assert_eq!(stats.allocations, 0, "{stats:?}");
    assert_eq!(stats.reallocations, 0, "{stats:?}");
    // [DONE] and the end.
    assert!(matches!(
        body.as_mut().poll_frame(&mut cx),
        Poll::Ready(Some(Ok(_)))
    ));
    assert!(matches!(
        body.as_mut().poll_frame(&mut cx),
        Poll::Ready(None)
    ));
}

// This file runs without libtest (`harness = false` in Cargo.toml): the allocation counter is
// process-wide, and libtest's own threads allocate while a test runs. Run on the main thread
// with nothing else alive, the count is exactly this test's.
fn main() {
    steady_state_frames_allocate_nothing();
    println!("test steady_state_frames_allocate_nothing ... ok");
    println!("1 passed, 0 failed");
}
