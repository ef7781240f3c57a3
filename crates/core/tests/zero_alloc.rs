//! A warm scanner/tracker allocates nothing per frame: counted by a global allocator.
//!
//! One test in this file only, so that no other test allocates while it counts.

use std::alloc::System;

use bytes::Bytes;
use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tailguard_core::scan::{GrpcScanner, NdjsonScanner, SseScanner};
use tailguard_core::{Dialect, StreamTracker};
use tailguard_test_support::{content_type, grpc_message};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Runs `f` and returns how many allocations (and reallocations) it made.
fn allocations(f: impl FnOnce()) -> usize {
    let region = Region::new(GLOBAL);
    f();
    let stats = region.change();
    stats.allocations + stats.reallocations
}

fn steady_state_allocates_nothing_per_frame() {
    // Frames prepared up front (`Bytes` clones of them do not allocate).
    let role =
        Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n");
    let token = Bytes::from_static(
        b"data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"},\"finish_reason\":null}]}\n\n",
    );
    let keepalive = Bytes::from_static(b": keepalive\n\n");
    let anthropic = Bytes::from_static(
        b"event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"hi\"}}\r\n\r\n",
    );
    let ping = Bytes::from_static(b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
    let split: Vec<Bytes> = (0..token.len())
        .step_by(7)
        .map(|at| token.slice(at..(at + 7).min(token.len())))
        .collect();
    let bytewise: Vec<Bytes> = (0..token.len()).map(|at| token.slice(at..at + 1)).collect();

    let sse = content_type("text/event-stream");
    let mut openai = StreamTracker::new(&Dialect::Auto, &sse);
    let mut claude = StreamTracker::new(&Dialect::Auto, &sse);
    let mut usage = StreamTracker::new(&Dialect::Auto, &sse).with_usage(true);
    let grpc_frame = grpc_message(b"\x0a\x05Hello");
    let mut grpc_tracker = StreamTracker::new(&Dialect::Auto, &content_type("application/grpc"));
    let ndjson_frame = Bytes::from_static(b"{\"response\":\"Hi\",\"done\":false}\n");
    let mut ndjson_tracker =
        StreamTracker::new(&Dialect::Auto, &content_type("application/x-ndjson"));
    let mut opaque = StreamTracker::new(&Dialect::Auto, &content_type("application/json"));

    let mut sse_scanner = SseScanner::new();
    let mut grpc_scanner = GrpcScanner::new();
    let mut ndjson_scanner = NdjsonScanner::new();

    // Warm up: first tokens (JSON is parsed here and may allocate), buffers grown.
    let mut events = 0u64;
    let mut warm = || {
        for frame in [&role, &token, &keepalive, &token] {
            openai.observe(frame);
            usage.observe(frame);
        }
        for frame in &split {
            openai.observe(frame);
        }
        for frame in [&ping, &anthropic, &anthropic] {
            claude.observe(frame);
        }
        grpc_tracker.observe(&grpc_frame);
        ndjson_tracker.observe(&ndjson_frame);
        opaque.observe(&token);
        for frame in [&token, &keepalive, &anthropic] {
            sse_scanner.feed(frame, |_| events += 1).unwrap();
        }
        grpc_scanner.feed(&grpc_frame, |_| events += 1).unwrap();
        ndjson_scanner.feed(&ndjson_frame, |_| events += 1).unwrap();
    };
    // The counter counts: the first pass parses JSON and grows buffers.
    assert!(allocations(&mut warm) > 0);
    warm();
    assert!(openai.first_token_seen() && claude.first_token_seen());
    assert!(grpc_tracker.first_token_seen() && ndjson_tracker.first_token_seen());

    let mut tokens = 0u64;
    let n = allocations(|| {
        for _ in 0..200 {
            for frame in [&token, &keepalive, &token] {
                tokens += u64::from(openai.observe(frame).tokens);
                tokens += u64::from(usage.observe(frame).tokens);
            }
            for frame in &split {
                tokens += u64::from(openai.observe(frame).tokens);
            }
            for frame in [&ping, &anthropic] {
                tokens += u64::from(claude.observe(frame).tokens);
            }
            tokens += u64::from(grpc_tracker.observe(&grpc_frame).tokens);
            tokens += u64::from(ndjson_tracker.observe(&ndjson_frame).tokens);
            tokens += u64::from(opaque.observe(&token).tokens);
            for frame in [&token, &keepalive, &anthropic] {
                sse_scanner.feed(frame, |_| events += 1).unwrap();
            }
            grpc_scanner.feed(&grpc_frame, |_| events += 1).unwrap();
            ndjson_scanner.feed(&ndjson_frame, |_| events += 1).unwrap();
        }
        for frame in &bytewise {
            tokens += u64::from(openai.observe(frame).tokens);
        }
    });
    assert_eq!(n, 0, "allocations in steady state");
    // The loop really did the work it claims.
    assert_eq!(tokens, 200 * (2 + 2 + 1 + 1 + 1 + 1 + 1) + 1);
    assert!(events > 200 * 5);
}

// This file runs without libtest (`harness = false` in Cargo.toml): the allocation counter is
// process-wide, and libtest's own threads allocate while a test runs. Run on the main thread
// with nothing else alive, the count is exactly this test's.
fn main() {
    steady_state_allocates_nothing_per_frame();
    println!("test steady_state_allocates_nothing_per_frame ... ok");
    println!("1 passed, 0 failed");
}
