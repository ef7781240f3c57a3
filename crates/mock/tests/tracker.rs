//! The mock's streams read by tailguard-core's `StreamTracker` exactly as the layers read them:
//! the role-only chunk and other meta events are not tokens, every scripted token is one,
//! keepalives are keepalives, the end and in-band errors are recognised, per dialect.
//!
//! After the first token core classifies OpenAI events by syntax alone (it never parses JSON
//! per frame once the stream is going), so the finish chunk and the usage chunk may count as
//! token events there: the counts below allow exactly those.

mod common;

use common::*;
use tailguard_core::{Dialect, StreamTracker, Wire};
use tailguard_mock::grpc::{GenerateClient, GenerateRequest};
use tailguard_mock::{MockServer, SCRIPT_HEADER, Script};

struct Seen {
    tokens: u64,
    keepalives: u32,
    meta: u32,
    done: bool,
    error: bool,
    /// Index of the frame that carried the first token.
    first_token_frame: Option<usize>,
    wire: Wire,
    usage: Option<tailguard_core::Usage>,
}

fn track(c: &Collected) -> Seen {
    let mut t = StreamTracker::new(&Dialect::Auto, &c.headers).with_usage(true);
    let mut seen = Seen {
        tokens: 0,
        keepalives: 0,
        meta: 0,
        done: false,
        error: false,
        first_token_frame: None,
        wire: Wire::Opaque,
        usage: None,
    };
    for (i, (_, f)) in c.frames.iter().enumerate() {
        let o = t.observe(f);
        seen.keepalives += o.keepalives;
        seen.meta += o.meta;
        seen.done |= o.done;
        seen.error |= o.error;
        if o.first_token {
            seen.first_token_frame = Some(i);
        }
        assert!(o.scan_error.is_none());
    }
    if let Some(tr) = &c.trailers {
        let o = t.observe_trailers(tr);
        seen.done |= o.done;
        seen.error |= o.error;
    }
    t.finish();
    seen.tokens = t.tokens();
    seen.wire = t.wire();
    seen.usage = t.usage();
    assert_eq!(
        t.pending_bytes(),
        0,
        "the mock ends every frame at an event boundary"
    );
    seen
}

async fn run(path: &str, body: &str, script: &str) -> Seen {
    let server = MockServer::start(Script::new()).await.unwrap();
    let c = collect(
        &client(),
        post(&server.url(), path, body, &[(SCRIPT_HEADER, script)]),
    )
    .await;
    track(&c)
}

const USAGE: &str = r#"{"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"one two three"}]}"#;

#[tokio::test(start_paused = true)]
async fn openai_chat() {
    let s = run(
        "/v1/chat/completions",
        USAGE,
        "tokens=7,keepalive=10ms,ttft=35ms",
    )
    .await;
    assert!((7..=7 + 2).contains(&s.tokens), "{}", s.tokens);
    // The role-only chunk (frame 0) is meta; keepalives come before the first token.
    assert_eq!(s.first_token_frame, Some(1 + 3));
    assert_eq!(s.keepalives, 3);
    assert!(s.meta >= 1, "the role chunk is meta");
    assert!(s.done && !s.error);
    assert_eq!(s.wire, Wire::OpenAiSse);
    let u = s.usage.unwrap();
    assert_eq!((u.prompt_tokens, u.completion_tokens), (Some(3), Some(7)));
}

#[tokio::test(start_paused = true)]
async fn openai_tool_calls_and_late_meta() {
    let s = run(
        "/v1/chat/completions",
        CHAT_STREAM,
        "tokens=4,tool_calls=true,early_meta=false",
    )
    .await;
    assert!((4..=4 + 1).contains(&s.tokens), "{}", s.tokens);
    assert_eq!(s.first_token_frame, Some(1));
    assert!(s.done);
}

#[tokio::test(start_paused = true)]
async fn openai_completions() {
    let s = run(
        "/v1/completions",
        r#"{"prompt":"x","stream":true}"#,
        "tokens=5",
    )
    .await;
    assert!((5..=5 + 1).contains(&s.tokens), "{}", s.tokens);
    assert_eq!(s.first_token_frame, Some(0));
    assert!(s.done);
}

#[tokio::test(start_paused = true)]
async fn openai_in_band_error() {
    let s = run(
        "/v1/chat/completions",
        CHAT_STREAM,
        "tokens=5,error_after=2",
    )
    .await;
    assert_eq!(s.tokens, 2);
    assert!(s.error);
}

#[tokio::test(start_paused = true)]
async fn anthropic() {
    let s = run(
        "/v1/messages",
        r#"{"stream":true}"#,
        "tokens=6,keepalive=10ms,ttft=25ms",
    )
    .await;
    assert_eq!(s.tokens, 6);
    // message_start, content_block_start, ping, then 2 pings during the TTFT.
    assert_eq!(s.first_token_frame, Some(5));
    assert_eq!(s.keepalives, 3);
    assert!(s.done && !s.error);
    assert_eq!(s.wire, Wire::AnthropicSse);
    let s = run(
        "/v1/messages",
        r#"{"stream":true}"#,
        "tokens=6,error_after=1",
    )
    .await;
    assert_eq!(s.tokens, 1);
    assert!(s.error);
}

#[tokio::test(start_paused = true)]
async fn non_streamed_json_is_one_token() {
    let s = run("/v1/chat/completions", r#"{"messages":[]}"#, "tokens=6").await;
    assert_eq!(s.first_token_frame, Some(0));
    assert!(s.tokens >= 1);
}

#[tokio::test(start_paused = true)]
async fn grpc_messages_are_tokens() {
    // Through a raw HTTP/2 client so the tracker sees the length-prefixed frames.
    let server = MockServer::start(Script::new().tokens(3).error_event_after(2))
        .await
        .unwrap();
    let mut body = vec![0u8];
    let msg = {
        use prost::Message;
        GenerateRequest {
            prompt: "p".into(),
            max_tokens: 0,
            model: String::new(),
        }
        .encode_to_vec()
    };
    body.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    body.extend_from_slice(&msg);
    let req = http::Request::post(format!(
        "{}{}",
        server.url(),
        tailguard_mock::grpc::GENERATE_PATH
    ))
    .header("content-type", "application/grpc")
    .header("te", "trailers")
    .body(http_body_util::Full::new(bytes::Bytes::from(body)))
    .unwrap();
    let c = collect(&h2_client(), req).await;
    let s = track(&c);
    assert_eq!(s.tokens, 2);
    assert!(s.error, "grpc-status 13 in the trailers");
    assert_eq!(c.trailers.as_ref().unwrap()["grpc-status"], "13");
    // And the tonic client sees the same stream.
    let ch = tonic::transport::Channel::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut stream = GenerateClient::new(ch)
        .generate(GenerateRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().is_some());
}

#[tokio::test(start_paused = true)]
async fn ollama_ndjson() {
    let server = MockServer::start(Script::new().tokens(4)).await.unwrap();
    let c = collect(
        &client(),
        post(
            &server.url(),
            "/api/generate",
            r#"{"model":"llama3","prompt":"a b"}"#,
            &[],
        ),
    )
    .await;
    assert_eq!(c.headers["content-type"], "application/x-ndjson");
    let s = track(&c);
    assert_eq!(s.tokens, 4);
    assert_eq!(s.first_token_frame, Some(0));
    assert!(s.done && !s.error);
    assert_eq!(s.wire, Wire::Ndjson);
    let c = collect(
        &client(),
        post(
            &server.url(),
            "/api/chat",
            r#"{"messages":[]}"#,
            &[(SCRIPT_HEADER, "error_after=2")],
        ),
    )
    .await;
    let s = track(&c);
    assert_eq!(s.tokens, 2);
    assert!(s.error);
}
