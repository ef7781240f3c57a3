//! After the first token the body allocates nothing per frame and scans nothing.

mod common;

use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use common::*;
use http_body::Body;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tower::{Layer, ServiceExt};

#[global_allocator]
static GLOBAL: &StatsAlloc<std::alloc::System> = &INSTRUMENTED_SYSTEM;

async fn no_allocation_per_frame_after_the_first_token() {
    let mut items = vec![data(ROLE), Step::Wait(ms(600)), data(token("a"))];
    for i in 0..1000 {
        items.push(Step::Data(Bytes::from(token(&format!("t{i}")))));
    }
    items.push(data(DONE));
    let plan = Plan::items(items);
    // The primary is slow, so this is a raced response: a backup won.
    let up = Upstream::new(vec![Plan::sse(ms(10_000)), plan.clone()]);
    let res = layer().layer(up).oneshot(chat_request()).await.unwrap();
    assert!(res.body().is_raced());
    let mut body = std::pin::pin!(res.into_body());
    let mut cx = Context::from_waker(Waker::noop());
    // The replayed role chunk and the first token.
    for _ in 0..2 {
        assert!(matches!(
            body.as_mut().poll_frame(&mut cx),
            Poll::Ready(Some(Ok(_)))
        ));
    }
    let region = Region::new(GLOBAL);
    let mut frames = 0;
    while let Poll::Ready(Some(Ok(_))) = body.as_mut().poll_frame(&mut cx) {
        frames += 1;
    }
    let allocations = region.change().allocations;
    assert_eq!(frames, 1001);
    assert_eq!(allocations, 0);
}

// This file runs without libtest (`harness = false` in Cargo.toml): the allocation counter is
// process-wide, and libtest's own threads allocate while a test runs. Run on the main thread
// with nothing else alive, the count is exactly this test's.
fn main() {
    paused_runtime().block_on(no_allocation_per_frame_after_the_first_token());
    println!("test no_allocation_per_frame_after_the_first_token ... ok");
    println!("1 passed, 0 failed");
}
