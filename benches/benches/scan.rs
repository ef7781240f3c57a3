//! Scanning + classifying a realistic 1,000-chunk OpenAI stream: tailguard-core's
//! `StreamTracker` vs. the `eventsource-stream` crate vs. a raw `memchr` pass over the same
//! bytes.
//!
//! The stream is what an OpenAI-compatible server sends for a 1,000-token completion: a
//! role-only chunk, 1,000 content chunks, a finish chunk with an empty delta and `[DONE]`,
//! framed one event per frame like real servers. Throughput is in events.
//!
//! Run: `cargo bench -p tailguard-benches --bench scan -- --warm-up-time 1 --measurement-time 3`

use std::convert::Infallible;
use std::hint::black_box;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use eventsource_stream::Eventsource;
use futures_util::Stream;
use http::HeaderMap;
use tailguard_core::{Dialect, StreamTracker};

const CONTENT_CHUNKS: usize = 1_000;

/// The frames of the stream, one event per frame.
fn openai_stream() -> Vec<Bytes> {
    const WORDS: [&str; 8] = [
        " the", " quick", " brown", " fox", " jumps", " over", " a", " dog",
    ];
    let head = r#"{"id":"chatcmpl-8f7a6b5c4d3e2f1a0b9c8d7e","object":"chat.completion.chunk","created":1796053661,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_5f20662549","choices":[{"index":0,"delta":"#;
    let mut frames = Vec::with_capacity(CONTENT_CHUNKS + 3);
    frames.push(Bytes::from(format!(
        "data: {head}{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
    )));
    for i in 0..CONTENT_CHUNKS {
        let word = WORDS[i % WORDS.len()];
        frames.push(Bytes::from(format!(
            "data: {head}{{\"content\":\"{word}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        )));
    }
    frames.push(Bytes::from(format!(
        "data: {head}{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}]}}\n\n"
    )));
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    frames
}

fn tailguard(frames: &[Bytes], headers: &HeaderMap) -> u64 {
    let mut tracker = StreamTracker::new(&Dialect::Auto, headers);
    let mut done = false;
    for frame in frames {
        done |= tracker.observe(frame).done;
    }
    assert!(done);
    tracker.events()
}

/// The SSE scanner alone (no classification), for reference.
fn scanner_only(frames: &[Bytes]) -> u64 {
    let mut scanner = tailguard_core::scan::SseScanner::new();
    scanner.set_capture(16);
    let mut n = 0;
    for frame in frames {
        scanner.feed(frame, |_| n += 1).unwrap();
    }
    n
}

fn eventsource(frames: &[Bytes]) -> u64 {
    let stream = futures_util::stream::iter(frames.iter().cloned().map(Ok::<_, Infallible>));
    let mut events = pin!(stream.eventsource());
    let mut cx = Context::from_waker(Waker::noop());
    let mut n = 0;
    loop {
        match events.as_mut().poll_next(&mut cx) {
            Poll::Ready(Some(Ok(event))) => {
                black_box(&event);
                n += 1;
            }
            Poll::Ready(Some(Err(e))) => panic!("{e}"),
            Poll::Ready(None) => return n,
            Poll::Pending => unreachable!("an iterator stream is always ready"),
        }
    }
}

fn raw_memchr(frames: &[Bytes], finder: &memchr::memmem::Finder<'_>) -> u64 {
    let mut n = 0;
    for frame in frames {
        n += finder.find_iter(frame).count() as u64;
    }
    n
}

fn scan(c: &mut Criterion) {
    let frames = openai_stream();
    let events = frames.len() as u64;
    let mut headers = HeaderMap::new();
    headers.insert("content-type", "text/event-stream".parse().unwrap());
    let finder = memchr::memmem::Finder::new(b"\n\n");

    // Every contender sees every event.
    assert_eq!(tailguard(&frames, &headers), events);
    assert_eq!(scanner_only(&frames), events);
    assert_eq!(eventsource(&frames), events);
    assert_eq!(raw_memchr(&frames, &finder), events);

    let mut group = c.benchmark_group("openai_stream_1000_chunks");
    group.throughput(Throughput::Elements(events));
    group.bench_function("tailguard_tracker", |b| {
        b.iter(|| tailguard(black_box(&frames), &headers))
    });
    group.bench_function("tailguard_scanner_only", |b| {
        b.iter(|| scanner_only(black_box(&frames)))
    });
    group.bench_function("eventsource_stream", |b| {
        b.iter(|| eventsource(black_box(&frames)))
    });
    group.bench_function("raw_memchr", |b| {
        b.iter(|| raw_memchr(black_box(&frames), &finder))
    });
    group.finish();
}

criterion_group!(benches, scan);
criterion_main!(benches);
