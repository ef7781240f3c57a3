//! Answers that are not streams (whole JSON documents): reconciled from the usage they report
//! when their body ends cleanly, else charged their reserved output; on a paused clock.

mod common;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::BodyExt;
use tailguard_core::RequestFacts;
use tailguard_tenant::{Kind, Limit, LocalStore, MAX_DOCUMENT_BYTES};
use tailguard_test_support::{Step, data, fixture, frames, read_all, wait_ms};
use tower::ServiceExt;

use common::{Plan, budget, limits, request};

/// The reservation of every request here: its counted prompt tokens and its `max_tokens`.
const INPUT: u64 = 50;
const OUTPUT: u64 = 300;
const LIMIT: u64 = 1000;

const CHAT: &str = "/v1/chat/completions";

/// An Anthropic message (`/v1/messages` without `stream`).
const MESSAGE: &[u8] = br#"{"id":"msg_013Zva2CMHLNnXjNJJKqJ2EF","type":"message","role":"assistant","model":"claude-sonnet-4-20250514","content":[{"type":"text","text":"Hi! My name is Claude."}],"stop_reason":"end_turn","stop_sequence":null,"usage":{"input_tokens":21,"cache_creation_input_tokens":0,"cache_read_input_tokens":0,"output_tokens":13}}"#;

/// An OpenAI Responses API response (`/v1/responses` without `stream`).
const RESPONSE: &[u8] = br#"{"id":"resp_67ccd2bed1ec8190","object":"response","created_at":1741476542,"status":"completed","error":null,"model":"gpt-4.1-2025-04-14","output":[{"type":"message","id":"msg_67ccd2bf17f0","status":"completed","role":"assistant","content":[{"type":"output_text","text":"In a peaceful grove beneath a silver moon...","annotations":[]}]}],"usage":{"input_tokens":36,"input_tokens_details":{"cached_tokens":0},"output_tokens":87,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":123},"metadata":{}}"#;

fn input() -> Limit {
    Limit::per_minute(Kind::Input, LIMIT)
}

fn output() -> Limit {
    Limit::per_minute(Kind::Output, LIMIT)
}

/// A request of tenant `acme` to `path` reserving [`INPUT`] and [`OUTPUT`], answered with
/// `plan`.
fn ask(path: &str, plan: Plan) -> Request<()> {
    let facts = RequestFacts::new()
        .with_prompt_tokens(INPUT)
        .with_max_tokens(OUTPUT as u32);
    request(Some("acme"), path, facts, plan)
}

/// `document` in data frames of `size` bytes.
fn chunked(document: &[u8], size: usize) -> Vec<Bytes> {
    document.chunks(size).map(Bytes::copy_from_slice).collect()
}

fn steps(frames: &[Bytes]) -> Vec<Step> {
    frames.iter().cloned().map(Step::Data).collect()
}

/// (input, output) taken from the tenant's buckets so far.
fn charged(store: &LocalStore) -> (u64, u64) {
    (
        LIMIT - store.available("acme", &input()),
        LIMIT - store.available("acme", &output()),
    )
}

#[tokio::test(start_paused = true)]
async fn a_json_answer_is_charged_the_usage_it_reports() {
    let cases: [(&str, &[u8], (u64, u64)); 3] = [
        // Captured from llama.cpp (`stream: false`).
        (CHAT, fixture("llamacpp-chat-nostream.json"), (33, 8)),
        ("/v1/messages", MESSAGE, (21, 13)),
        ("/v1/responses", RESPONSE, (36, 87)),
    ];
    for (path, document, used) in cases {
        // Without a size hint, and with an exact one (a `content-length`).
        for hint in [None, Some(document.len() as u64)] {
            let (svc, store) = budget(limits([input(), output()]));
            let sent = chunked(document, 40);
            let mut plan = Plan::json(steps(&sent));
            plan.hint = hint;
            let res = svc.oneshot(ask(path, plan)).await.unwrap();
            assert!(res.body().holds_reservation());
            assert_eq!(charged(&store), (INPUT, OUTPUT));
            let (got, trailers, failed) = frames(res.into_body()).await;
            assert!(!failed && trailers.is_none());
            assert_eq!(got, sent, "the frames pass untouched");
            assert_eq!(charged(&store), used, "{path}, hint {hint:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_json_answer_without_usage_is_charged_its_reserved_output() {
    let cases: [(&str, &[u8], (u64, u64)); 6] = [
        (
            "application/json",
            br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi"},"finish_reason":"stop"}]}"#,
            (INPUT, OUTPUT),
        ),
        ("application/json", br#"{"choices":[],"usage":null}"#, (INPUT, OUTPUT)),
        ("text/html", b"<html><body>hello</body></html>", (INPUT, OUTPUT)),
        // A document cut short that still says `"usage":{`.
        (
            "application/json",
            br#"{"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2"#,
            (INPUT, OUTPUT),
        ),
        // One count only: the other is the reservation's.
        ("application/json", br#"{"usage":{"prompt_tokens":5}}"#, (5, OUTPUT)),
        ("application/json", br#"{"usage":{"completion_tokens":7}}"#, (INPUT, 7)),
    ];
    for (content_type, document, used) in cases {
        let (svc, store) = budget(limits([input(), output()]));
        let plan = Plan::json([data(document)]).with_status(StatusCode::OK, content_type);
        let res = svc.oneshot(ask(CHAT, plan)).await.unwrap();
        let (got, failed) = read_all(res.into_body()).await;
        assert!(!failed);
        assert_eq!(got, document);
        assert_eq!(
            charged(&store),
            used,
            "{}",
            String::from_utf8_lossy(document)
        );
    }
}

/// A chat completion of exactly `len` bytes (a long content), reporting 12 prompt and 3
/// completion tokens at its end.
fn padded(len: usize) -> Vec<u8> {
    let head = br#"{"object":"chat.completion","choices":[{"message":{"content":""#;
    let tail =
        br#""},"finish_reason":"length"}],"usage":{"prompt_tokens":12,"completion_tokens":3}}"#;
    let mut document = head.to_vec();
    document.resize(len - tail.len(), b'x');
    document.extend_from_slice(tail);
    document
}

#[tokio::test(start_paused = true)]
async fn a_json_answer_over_the_cap_is_charged_its_reserved_output() {
    // At the cap it is read; one byte over, or a size hint over it, it is not.
    let cases = [
        (MAX_DOCUMENT_BYTES, None, (12, 3)),
        (MAX_DOCUMENT_BYTES + 1, None, (INPUT, OUTPUT)),
        (
            MAX_DOCUMENT_BYTES + 1,
            Some(MAX_DOCUMENT_BYTES as u64 + 1),
            (INPUT, OUTPUT),
        ),
        // A size hint over the cap is believed: nothing is kept from the first frame.
        (1000, Some(MAX_DOCUMENT_BYTES as u64 + 1), (INPUT, OUTPUT)),
    ];
    for (len, hint, used) in cases {
        let (svc, store) = budget(limits([input(), output()]));
        let document = padded(len);
        let mut plan = Plan::json(steps(&chunked(&document, 64 * 1024)));
        plan.hint = hint;
        let res = svc.oneshot(ask(CHAT, plan)).await.unwrap();
        let (got, failed) = read_all(res.into_body()).await;
        assert!(!failed);
        assert!(got == document, "the frames pass untouched");
        assert_eq!(charged(&store), used, "{len} bytes, hint {hint:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn a_json_answer_cut_short_is_charged_its_reserved_output() {
    let document = fixture("llamacpp-chat-nostream.json");
    let (head, tail) = document.split_at(document.len() / 2);

    // The client drops the body mid-way.
    let (svc, store) = budget(limits([input(), output()]));
    let plan = Plan::json([data(head), wait_ms(1000), data(tail)]);
    let res = svc.oneshot(ask(CHAT, plan)).await.unwrap();
    let mut body = res.into_body();
    let frame = body.frame().await.unwrap().unwrap();
    assert_eq!(frame.into_data().unwrap(), head);
    assert!(body.holds_reservation());
    drop(body);
    assert_eq!(charged(&store), (INPUT, OUTPUT));

    // The body fails: mid-way, or after the whole document (it did not end cleanly).
    for steps in [
        vec![data(head), Step::Error],
        vec![data(head), data(tail), Step::Error],
    ] {
        let (svc, store) = budget(limits([input(), output()]));
        let res = svc.oneshot(ask(CHAT, Plan::json(steps))).await.unwrap();
        let mut body = res.into_body();
        while let Some(frame) = body.frame().await {
            if frame.is_err() {
                break;
            }
        }
        assert!(!body.holds_reservation(), "settled at the error");
        assert_eq!(charged(&store), (INPUT, OUTPUT));
    }
}
