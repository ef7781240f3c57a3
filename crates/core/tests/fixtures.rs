//! Every captured fixture in `testdata/fixtures`, fed whole, in every 2-way split and one byte
//! per frame, gives the same events and classes; and the classes are the right ones.

use bytes::Bytes;
use tailguard_core::{Dialect, StreamTracker, Wire};
use tailguard_test_support::{content_type, fixture};

/// What a whole stream amounted to.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Summary {
    events: u64,
    tokens: u64,
    meta: u64,
    keepalives: u64,
    done: bool,
    error: bool,
    /// Junk events (data that is not a JSON object).
    malformed: u64,
    /// Index (in events) of the first token.
    first_token_at: Option<u64>,
    wire: Wire,
    pending_at_end: usize,
    usage: Option<tailguard_core::Usage>,
}

fn run(content_type: &str, frames: &[&[u8]], usage: bool) -> Summary {
    let mut tracker = StreamTracker::new(
        &Dialect::Auto,
        &tailguard_test_support::content_type(content_type),
    )
    .with_usage(usage);
    let mut s = Summary {
        events: 0,
        tokens: 0,
        meta: 0,
        keepalives: 0,
        done: false,
        error: false,
        malformed: 0,
        first_token_at: None,
        wire: Wire::Opaque,
        pending_at_end: 0,
        usage: None,
    };
    let observe = |s: &mut Summary, obs: tailguard_core::Observation| {
        assert!(obs.scan_error.is_none(), "{:?}", obs.scan_error);
        if obs.first_token {
            assert!(s.first_token_at.is_none(), "first token reported twice");
            s.first_token_at = Some(s.tokens);
        }
        s.events += u64::from(obs.events);
        s.tokens += u64::from(obs.tokens);
        s.meta += u64::from(obs.meta);
        s.keepalives += u64::from(obs.keepalives);
        s.done |= obs.done;
        s.error |= obs.error;
        s.malformed += u64::from(obs.malformed);
    };
    for frame in frames {
        let obs = tracker.observe(&Bytes::copy_from_slice(frame));
        observe(&mut s, obs);
    }
    let obs = tracker.finish();
    observe(&mut s, obs);
    assert_eq!(s.events, tracker.events());
    assert_eq!(s.tokens, tracker.tokens());
    assert_eq!(s.first_token_at.is_some(), tracker.first_token_seen());
    s.wire = tracker.wire();
    s.pending_at_end = tracker.pending_bytes();
    s.usage = tracker.usage();
    s
}

/// Runs whole, every 2-way split, and byte by byte; all must agree. Returns the summary.
fn all_splits(name: &str, content_type: &str, usage: bool) -> Summary {
    let bytes = fixture(name);
    let whole = run(content_type, &[bytes], usage);
    for at in 0..=bytes.len() {
        let (a, b) = bytes.split_at(at);
        assert_eq!(
            run(content_type, &[a, b], usage),
            whole,
            "{name} split at {at}"
        );
    }
    let bytewise: Vec<&[u8]> = bytes.chunks(1).collect();
    assert_eq!(
        run(content_type, &bytewise, usage),
        whole,
        "{name} byte by byte"
    );
    if !name.contains("malformed") {
        assert_eq!(whole.malformed, 0, "{name}: a real stream carries no junk");
    }
    whole
}

const SSE: &str = "text/event-stream";

#[test]
fn llamacpp_chat_role_only_first_chunk_is_meta() {
    let s = all_splits("llamacpp-chat-stream.sse", SSE, false);
    assert_eq!(s.first_token_at, Some(0));
    assert!(s.meta >= 1, "role-only chunk is meta: {s:?}");
    assert!(s.done && !s.error);
    assert_eq!(s.wire, Wire::OpenAiSse);
    assert_eq!(s.pending_at_end, 0);
    // role chunk (meta) + tokens + finish chunk (token after the first token: syntax only) + done
    assert_eq!(s.events, s.tokens + s.meta + 1);
}

#[test]
fn llamacpp_chat_usage_ignored_by_server() {
    let s = all_splits("llamacpp-chat-stream-usage.sse", SSE, true);
    assert!(s.done && s.tokens > 0);
    assert_eq!(s.usage, None);
}

#[test]
fn llamacpp_completions_text_is_token() {
    let s = all_splits("llamacpp-completions-stream.sse", SSE, false);
    assert_eq!(s.meta, 0, "first chunk has text: {s:?}");
    assert_eq!(s.first_token_at, Some(0));
    assert!(s.done);
}

#[test]
fn non_streamed_json_first_byte_is_the_token() {
    // Opaque framing: every non-empty frame is one event, so counts depend on the framing; the
    // first token is always the first non-empty frame.
    let bytes = fixture("llamacpp-chat-nostream.json");
    for at in 0..=bytes.len() {
        let (a, b) = bytes.split_at(at);
        let s = run("application/json", &[a, b], false);
        assert_eq!(s.first_token_at, Some(0));
        assert_eq!(s.events, 1 + u64::from(at > 0 && at < bytes.len()));
        assert!(!s.done);
        assert_eq!(s.wire, Wire::Opaque);
        assert_eq!(s.pending_at_end, 0);
    }
    let mut tracker = StreamTracker::new(&Dialect::Auto, &content_type("application/json"));
    assert!(
        !tracker.observe(&Bytes::new()).first_token,
        "an empty frame is not a token"
    );
    assert!(tracker.observe(&Bytes::from_static(b"{")).first_token);
}

#[test]
fn llmock_usage_chunk_is_read() {
    let s = all_splits("llmock-openai-chat-stream-usage.sse", SSE, true);
    assert!(s.done);
    // With usage on (the recorder's mode) the finish-only chunk is meta too, not output.
    assert_eq!(s.meta, 2, "role chunk and finish-only chunk: {s:?}");
    let usage = s.usage.expect("usage");
    assert_eq!(usage.prompt_tokens, Some(5));
    assert_eq!(usage.completion_tokens, Some(12));
    let without = all_splits("llmock-openai-chat-stream-usage.sse", SSE, false);
    assert_eq!(without.usage, None);
    assert_eq!(without.events, s.events);
    assert_eq!(
        without.meta, 1,
        "role chunk with empty content: {without:?}"
    );
    assert_eq!(without.tokens, s.tokens + 1, "the finish chunk is progress");
}

#[test]
fn llmock_tool_calls_are_tokens() {
    let s = all_splits("llmock-openai-tool-call-stream.sse", SSE, false);
    assert_eq!(s.meta, 1, "only the role chunk is meta: {s:?}");
    assert_eq!(s.first_token_at, Some(0));
    assert!(s.tokens >= 3);
    assert!(s.done);
}

#[test]
fn llmock_responses_api_deltas_are_tokens_and_completed_is_done() {
    let s = all_splits("llmock-openai-responses-stream.sse", SSE, false);
    // Its own wire: a stream ended early gets the Responses API's `error` event, not chat's.
    assert_eq!(s.wire, Wire::OpenAiResponsesSse);
    // created, in_progress, output_item.added, content_part.added come first (meta).
    assert_eq!(s.first_token_at, Some(0), "{s:?}");
    // Ten `response.output_text.delta` events.
    assert_eq!(s.tokens, 10);
    // The four before, then output_text.done, content_part.done, output_item.done.
    assert_eq!(s.meta, 7);
    assert!(s.done && !s.error);
    assert_eq!(s.events, s.tokens + s.meta + 1);
}

#[test]
fn llmock_anthropic_ping_is_keepalive() {
    let s = all_splits("llmock-anthropic-messages-stream.sse", SSE, true);
    assert_eq!(s.wire, Wire::AnthropicSse);
    assert_eq!(s.keepalives, 1);
    // message_start, content_block_start, content_block_stop, message_delta
    assert_eq!(s.meta, 4);
    assert!(s.done && !s.error);
    assert_eq!(s.events, s.tokens + s.meta + s.keepalives + 1);
    let usage = s.usage.expect("usage");
    assert_eq!(usage.prompt_tokens, Some(5));
    assert_eq!(usage.completion_tokens, Some(15));
}

#[test]
fn llmock_malformed_event_after_the_first_token_is_junk() {
    // The event cut short after the first token (its captured prefix looks like any chunk's)
    // is told by its last byte, in every split and in both capture modes.
    for usage in [false, true] {
        let s = all_splits("llmock-openai-chat-stream-malformed.sse", SSE, usage);
        assert!(s.done && !s.error);
        assert_eq!(s.malformed, 1);
        assert!(s.tokens > 0);
        assert_eq!(s.events, s.tokens + s.meta + s.malformed + 1);
    }
}

#[test]
fn llmock_truncated_stream_has_no_done() {
    let s = all_splits("llmock-openai-chat-stream-truncated.sse", SSE, false);
    assert!(!s.done && !s.error);
    assert!(s.tokens > 0);
}

/// The malformed event, as the first event of a stream, is junk: never a token.
#[test]
fn malformed_first_event_is_junk() {
    let bytes = fixture("llmock-openai-chat-stream-malformed.sse");
    let text = std::str::from_utf8(bytes).unwrap();
    let bad = text
        .split("\n\n")
        .find(|e| e.starts_with("data: {") && serde_json_fails(&e[6..]))
        .expect("a malformed event");
    let mut tracker = StreamTracker::new(&Dialect::Auto, &content_type(SSE));
    let obs = tracker.observe(&Bytes::from(format!("{bad}\n\n")));
    assert_eq!((obs.events, obs.meta, obs.tokens), (1, 0, 0));
    assert!(obs.malformed);
    assert!(!tracker.first_token_seen());
}

fn serde_json_fails(s: &str) -> bool {
    // A cheap structural check (serde_json is not a dev-dependency here): unbalanced braces.
    s.matches('{').count() != s.matches('}').count()
}
