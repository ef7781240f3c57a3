//! Fuzz StreamTracker under every preset dialect: it never panics, and its counts and classes
//! do not depend on how the body is split into frames.
#![no_main]

use bytes::Bytes;
use http::HeaderMap;
use libfuzzer_sys::fuzz_target;
use tailguard_core::{Dialect, StreamTracker};

#[derive(Debug, PartialEq)]
struct Summary {
    events: u64,
    tokens: u64,
    meta: u64,
    keepalives: u64,
    done: bool,
    error: bool,
    scan_error: bool,
    first_token: bool,
}

fn run(dialect: &Dialect, usage: bool, input: &[u8], cuts: &[usize]) -> Summary {
    let mut t = StreamTracker::new(dialect, &HeaderMap::new())
        .with_max_event_bytes(512)
        .with_usage(usage);
    let mut s = Summary {
        events: 0,
        tokens: 0,
        meta: 0,
        keepalives: 0,
        done: false,
        error: false,
        scan_error: false,
        first_token: false,
    };
    let mut at = 0;
    let add = |s: &mut Summary, o: tailguard_core::Observation| {
        s.events += u64::from(o.events);
        s.tokens += u64::from(o.tokens);
        s.meta += u64::from(o.meta);
        s.keepalives += u64::from(o.keepalives);
        s.done |= o.done;
        s.error |= o.error;
        s.scan_error |= o.scan_error.is_some();
        s.first_token |= o.first_token;
    };
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        let cut = cut.clamp(at, input.len());
        let o = t.observe(&Bytes::copy_from_slice(&input[at..cut]));
        add(&mut s, o);
        at = cut;
    }
    let o = t.finish();
    add(&mut s, o);
    let _ = (t.usage(), t.wire(), t.pending_bytes());
    assert_eq!(s.events, t.events());
    assert_eq!(s.tokens, t.tokens());
    assert_eq!(s.first_token, t.first_token_seen());
    s
}

fuzz_target!(|data: &[u8]| {
    let Some((&[a, b], input)) = data.split_first_chunk::<2>() else {
        return;
    };
    let dialect = match a % 6 {
        0 => Dialect::OpenAi,
        1 => Dialect::Anthropic,
        2 => Dialect::LlmSse,
        3 => Dialect::AnySse,
        4 => Dialect::Grpc,
        _ => Dialect::Ndjson,
    };
    let usage = a & 0x80 != 0;
    let whole = run(&dialect, usage, input, &[]);
    let len = input.len().max(1);
    assert_eq!(run(&dialect, usage, input, &[usize::from(b) % len]), whole);
    let bytewise: Vec<usize> = (1..input.len()).collect();
    assert_eq!(run(&dialect, usage, input, &bytewise), whole);
});
