//! The classifier presets decide pre-first-token events without allocating (once the per-thread
//! memo of recent decisions is warm): counted by a global allocator.
//!
//! One test in this file only, so that no other test allocates while it counts.

use std::alloc::System;

use stats_alloc::{INSTRUMENTED_SYSTEM, Region, StatsAlloc};
use tailguard_core::Class;
use tailguard_core::classify::{
    AnthropicClassifier, Classify, LlmSseClassifier, NdjsonClassifier, OpenAiClassifier,
};
use tailguard_core::scan::{Captured, Event, SseScanner};
use tailguard_test_support::FIXTURES;

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

/// Runs `f` and returns how many allocations and reallocations it made.
fn allocations<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let region = Region::new(GLOBAL);
    let out = f();
    let stats = region.change();
    (out, stats.allocations + stats.reallocations)
}

fn sse<'a>(name: &'a [u8], data: &'a [u8]) -> Event<'a> {
    Event::Sse {
        name,
        data: Captured {
            bytes: data,
            len: data.len(),
        },
    }
}

fn line(data: &[u8]) -> Event<'_> {
    Event::Line {
        data: Captured {
            bytes: data,
            len: data.len(),
        },
    }
}

/// Classifies `event` before the first token, counting allocations.
fn classify(classifier: &dyn Classify, event: &Event<'_>) -> (Class, usize) {
    allocations(|| classifier.classify(event, false))
}

/// Every SSE data event of a fixture, as (event name, data).
fn fixture_events(bytes: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut events = Vec::new();
    let mut scanner = SseScanner::new();
    let mut push = |event: Event<'_>| {
        if let Event::Sse { name, data } = event {
            assert!(data.is_complete());
            events.push((name.to_vec(), data.bytes.to_vec()));
        }
    };
    scanner.feed(bytes, &mut push).unwrap();
    scanner.finish(&mut push).unwrap();
    events
}

fn pre_first_token_classification_allocates_nothing() {
    // The counter counts.
    let (_, n) = allocations(|| std::hint::black_box(vec![0u8; 16]));
    assert!(n > 0);

    // Warm-up: the per-thread memo of recent decisions allocates its buffers on this thread's
    // first distinct events, once (a few distinct events of each kind fill every entry).
    for i in 0..8 {
        let data = format!(r#"{{"warm":{i}}}"#);
        OpenAiClassifier.classify(&sse(b"", data.as_bytes()), false);
        NdjsonClassifier.classify(&line(data.as_bytes()), false);
    }
    let (_, n) =
        allocations(|| OpenAiClassifier.classify(&sse(b"", br#"{"warm":"again"}"#), false));
    assert_eq!(n, 0, "a warm memo does not allocate");

    // Typical OpenAI chunks (vLLM / llama.cpp / hosted API shapes).
    let openai: [(&str, Class); 16] = [
        (
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1718000000,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}"#,
            Class::Meta,
        ),
        (
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","created":1718000000,"model":"m","choices":[{"index":0,"delta":{"content":"Hello"},"logprobs":null,"finish_reason":null}]}"#,
            Class::Token,
        ),
        (
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_1","type":"function","function":{"name":"get_weather","arguments":""}}]},"finish_reason":null}]}"#,
            Class::Token,
        ),
        (
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"reasoning_content":"Let me think"}}]}"#,
            Class::Token,
        ),
        (
            r#"{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":" the","logprobs":null,"finish_reason":null}]}"#,
            Class::Token,
        ),
        (
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}"#,
            Class::Meta,
        ),
        (
            r#"{"id":"chatcmpl-1","object":"chat.completion.chunk","choices":[],"usage":{"prompt_tokens":12,"total_tokens":40,"completion_tokens":28,"prompt_tokens_details":{"cached_tokens":0}}}"#,
            Class::Meta,
        ),
        (
            r#"{"error":{"message":"The server is overloaded","type":"server_error","param":null,"code":503}}"#,
            Class::Error,
        ),
        (
            r#"{"object":"error","message":"x","error":null,"choices":[{"delta":{"content":null}}]}"#,
            Class::Meta,
        ),
        ("[DONE]", Class::Done),
        // Escapes: non-empty, and read without unescaping into a buffer.
        (
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"\n"}}]}"#,
            Class::Token,
        ),
        (
            r#"{"id":"chatcmpl-1","choices":[{"index":0,"delta":{"content":"\u00e9t\u00e9 \ud83d\ude00"}}]}"#,
            Class::Token,
        ),
        (
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"city\": \"Paris\"}"}}]}}]}"#,
            Class::Token,
        ),
        (
            r#"{"\u0063hoices":[{"delta":{"\u0063ontent":"x"}}]}"#,
            Class::Token,
        ),
        // Numbers other than short integers are parsed for their range, without allocating.
        (
            r#"{"choices":[{"delta":{"role":"assistant"},"logprobs":{"content":[{"token":"a","logprob":-0.0123,"bytes":[97],"top_logprobs":[]}]}}],"x":12345678901234567890123,"y":1.5e300}"#,
            Class::Meta,
        ),
        (r#"{"id":"chatcmpl-1","choices":[{"delta""#, Class::Meta),
    ];
    for (data, want) in openai {
        for classifier in [&OpenAiClassifier as &dyn Classify, &LlmSseClassifier] {
            let (class, n) = classify(classifier, &sse(b"", data.as_bytes()));
            assert_eq!(class, want, "{data}");
            assert_eq!(n, 0, "allocations classifying {data}");
        }
    }

    // Anthropic events, named (decided from the name) and unnamed (decided from `type`).
    let anthropic: [(&str, &str, Class); 7] = [
        (
            "message_start",
            r#"{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"claude","stop_reason":null,"usage":{"input_tokens":25,"output_tokens":1}}}"#,
            Class::Meta,
        ),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
            Class::Meta,
        ),
        ("ping", r#"{"type": "ping"}"#, Class::Keepalive),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hello"}}"#,
            Class::Token,
        ),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn","stop_sequence":null},"usage":{"output_tokens":15}}"#,
            Class::Meta,
        ),
        (
            "error",
            r#"{"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}"#,
            Class::Error,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_\u0064elta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"city\": \"Par"}}"#,
            Class::Token,
        ),
    ];
    for (name, data, want) in anthropic {
        for event in [
            sse(name.as_bytes(), data.as_bytes()),
            sse(b"", data.as_bytes()),
        ] {
            let (class, n) = classify(&AnthropicClassifier, &event);
            assert_eq!(class, want, "{name} {data}");
            assert_eq!(n, 0, "allocations classifying {name} {data}");
        }
        let (class, n) = classify(&LlmSseClassifier, &sse(name.as_bytes(), data.as_bytes()));
        assert_eq!((class, n), (want, 0), "{name} {data}");
    }

    // NDJSON (Ollama) lines.
    let ndjson: [(&str, Class); 5] = [
        (
            r#"{"model":"m","created_at":"2024-06-10T00:00:00Z","response":"Hi","done":false}"#,
            Class::Token,
        ),
        (
            r#"{"model":"m","message":{"role":"assistant","content":""},"done":true,"done_reason":"stop","total_duration":123,"eval_count":9}"#,
            Class::Done,
        ),
        (
            r#"{"model":"m","message":{"role":"assistant","content":"Hi"},"done":false}"#,
            Class::Token,
        ),
        (r#"{"model":"m","error":"model not found"}"#, Class::Error),
        ("not json", Class::Token),
    ];
    for (data, want) in ndjson {
        let (class, n) = classify(&NdjsonClassifier, &line(data.as_bytes()));
        assert_eq!((class, n), (want, 0), "{data}");
    }

    // Every event of the captured SSE fixtures, classified as if no token had been seen yet.
    let mut checked = 0;
    let mut escaped = 0;
    for (fixture, bytes) in FIXTURES.iter().filter(|(name, _)| name.ends_with(".sse")) {
        for (name, data) in fixture_events(bytes) {
            let ((), n) = allocations(|| {
                std::hint::black_box(LlmSseClassifier.classify(&sse(&name, &data), false));
                std::hint::black_box(OpenAiClassifier.classify(&sse(&name, &data), false));
                std::hint::black_box(AnthropicClassifier.classify(&sse(&name, &data), false));
            });
            let shown = String::from_utf8_lossy(&data);
            assert_eq!(n, 0, "allocations classifying {fixture}: {shown}");
            escaped += usize::from(data.contains(&b'\\'));
            checked += 1;
        }
    }
    assert!(
        checked > 50 && escaped > 0,
        "{checked} events checked, {escaped} escaped"
    );
    eprintln!("{checked} fixture events, {escaped} with escapes");
}

// This file runs without libtest (`harness = false` in Cargo.toml): the allocation counter is
// process-wide, and libtest's own threads allocate while a test runs. Run on the main thread
// with nothing else alive, the count is exactly this test's.
fn main() {
    pre_first_token_classification_allocates_nothing();
    println!("test pre_first_token_classification_allocates_nothing ... ok");
    println!("1 passed, 0 failed");
}
