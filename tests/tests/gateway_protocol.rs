//! Hostile upstreams the gateway must not pass on (issue 30.2 and 30.3), in-process over
//! loopback with the embedded mock replicas scripted per request: junk data lines before and
//! after the first token, and a whole JSON reply to a request that asked to stream. Timing
//! runs on a paused clock.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tailguard_gateway::{Args, Config, Gateway, HedgeDelaySetting};
use tailguard_test_support::{client, ms};
use tokio::time::Instant;

const CHAT: &str =
    r#"{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"Hello!"}]}"#;
const SCRIPT: &str = "ttft=10ms,tokens=8,gap=2ms";
/// The mock's text for eight tokens.
const EIGHT_TOKENS: &str = "Hello there, this is a mock reply";

fn test_config(replicas: usize) -> Config {
    let mut c = Config::resolve(Default::default(), &Args::default()).unwrap();
    c.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    c.mock.replicas = replicas;
    c.mock.script = SCRIPT.into();
    c.mock.congested_script = SCRIPT.into();
    c.hedge.delay = HedgeDelaySetting::Fixed(ms(50));
    c
}

fn post(gw: &Gateway, path: &str, body: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    tailguard_test_support::post(&format!("http://{}{path}", gw.addr()), body, headers)
}

async fn text(res: Response<hyper::body::Incoming>) -> String {
    String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

/// Every `data:` payload of an SSE stream.
fn payloads(sse: &str) -> Vec<&str> {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect()
}

/// The concatenated `delta.content` of an OpenAI chat stream; panics on a payload that is not
/// JSON (as the openai SDK raises `JSONDecodeError`).
fn content(sse: &str) -> String {
    payloads(sse)
        .into_iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str::<serde_json::Value>(d).expect(d))
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

/// The gateway's request counter, every series (the metrics recorder is the process's: the
/// tests of this file share it, so only what a test adds is asserted, never an absence).
async fn end_reasons(gw: &Gateway) -> String {
    let res = client()
        .request(
            Request::get(format!("http://{}/metrics", gw.addr()))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    text(res)
        .await
        .lines()
        .filter(|l| l.starts_with("tailguard_requests_total{"))
        .collect::<Vec<_>>()
        .join("\n")
}

async fn openai_error(res: Response<hyper::body::Incoming>) -> serde_json::Value {
    assert_eq!(res.headers()["content-type"], "application/json");
    let v: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
    v["error"].clone()
}

#[tokio::test(start_paused = true)]
async fn junk_before_the_first_token_fails_over_to_the_backup_at_once() {
    let gw = Gateway::start(test_config(2)).await.unwrap();
    let started = Instant::now();
    let headers = [
        ("x-mock-script", SCRIPT),
        (
            "x-mock-script-0",
            "ttft=10ms,tokens=8,gap=2ms,junk_before=2",
        ),
    ];
    let res = client()
        .request(post(&gw, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-tailguard-hedge"], "attempts=2; winner=1");
    // The junk came with the primary's first token time; the backup was sent then, not after
    // the hedge delay.
    assert_eq!(started.elapsed(), ms(10 + 10));
    let body = text(res).await;
    assert!(!body.contains("not json") && !body.contains("{{"), "{body}");
    assert_eq!(content(&body), EIGHT_TOKENS);
    assert!(body.ends_with("data: [DONE]\n\n"));
    gw.shutdown().await.unwrap();

    // One replica: nothing to fail over to. An API error the SDK raises, not a 200 of junk.
    let gw = Gateway::start(test_config(1)).await.unwrap();
    let headers = [("x-mock-script", "ttft=10ms,tokens=8,gap=2ms,junk_before=1")];
    let res = client()
        .request(post(&gw, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    let e = openai_error(res).await;
    assert_eq!(e["code"], "upstream_malformed", "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("not a JSON object"),
        "{e}"
    );
    let reasons = end_reasons(&gw).await;
    assert!(
        reasons.contains(r#"end_reason="upstream_error_protocol""#),
        "{reasons}"
    );
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn junk_after_the_first_token_ends_the_stream_in_band_and_is_not_passed_on() {
    let gw = Gateway::start(test_config(2)).await.unwrap();
    let headers = [("x-mock-script", "ttft=10ms,tokens=8,gap=2ms,junk_after=1")];
    let res = client()
        .request(post(&gw, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = text(res).await;
    // Every payload is JSON (or `[DONE]`): the junk never reached the client.
    assert!(!body.contains("not json"), "{body}");
    assert_eq!(content(&body), "Hello");
    let p = payloads(&body);
    assert_eq!(p[p.len() - 1], "[DONE]");
    let err: serde_json::Value = serde_json::from_str(p[p.len() - 2]).unwrap();
    assert_eq!(err["error"]["code"], "upstream_error_protocol", "{err}");
    let reasons = end_reasons(&gw).await;
    assert!(
        reasons.contains(r#"end_reason="upstream_error_protocol""#),
        "{reasons}"
    );

    // Anthropic: its own `event: error`.
    let messages = r#"{"model":"mock-llm","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;
    let res = client()
        .request(post(&gw, "/v1/messages", messages, &headers))
        .await
        .unwrap();
    let body = text(res).await;
    assert!(!body.contains("not json"), "{body}");
    assert!(
        body.trim_end()
            .split("\n\n")
            .last()
            .unwrap()
            .starts_with("event: error\n"),
        "{body}"
    );
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_json_reply_to_a_streaming_request_fails_over_and_is_a_502_when_every_replica_does() {
    let gw = Gateway::start(test_config(2)).await.unwrap();
    let started = Instant::now();
    let headers = [
        ("x-mock-script", SCRIPT),
        (
            "x-mock-script-0",
            "ttft=10ms,tokens=8,gap=2ms,json_reply=true",
        ),
    ];
    let res = client()
        .request(post(&gw, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["x-tailguard-hedge"], "attempts=2; winner=1");
    assert!(
        started.elapsed() < ms(50),
        "failed over before the hedge delay"
    );
    assert_eq!(content(&text(res).await), EIGHT_TOKENS);

    let headers = [(
        "x-mock-script",
        "ttft=10ms,tokens=8,gap=2ms,json_reply=true",
    )];
    let res = client()
        .request(post(&gw, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    let e = openai_error(res).await;
    assert_eq!(e["code"], "upstream_not_a_stream", "{e}");
    let reasons = end_reasons(&gw).await;
    assert!(
        reasons.contains(r#"end_reason="upstream_error_protocol""#),
        "{reasons}"
    );

    // A request that did not ask to stream is not affected.
    let plain = r#"{"model":"mock-llm","messages":[{"role":"user","content":"Hello!"}]}"#;
    let res = client()
        .request(post(&gw, "/v1/chat/completions", plain, &headers))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], EIGHT_TOKENS);
    gw.shutdown().await.unwrap();
}

/// An answer that ends empty (a finish reason, no text, `[DONE]`: a model that has nothing to
/// say) is an answer: a plain proxy passes it on, and so does the gateway, from the one
/// attempt. Only a terminal event with no finish reason (an interrupting server's bare
/// `[DONE]`) is an attempt that failed.
#[tokio::test(start_paused = true)]
async fn an_empty_answer_is_passed_on_not_failed_over() {
    let gw = Gateway::start(test_config(2)).await.unwrap();
    for body in [
        CHAT,
        r#"{"model":"mock-llm","stream":true,"prompt":"Hello"}"#,
        r#"{"model":"mock-llm","stream":true,"max_tokens":16,"messages":[{"role":"user","content":"Hello"}]}"#,
    ] {
        let path = if body.contains("prompt") {
            "/v1/completions"
        } else if body.contains("max_tokens") {
            "/v1/messages"
        } else {
            "/v1/chat/completions"
        };
        let res = client()
            .request(post(&gw, path, body, &[("x-mock-script", "tokens=0")]))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let sse = text(res).await;
        let end = if path == "/v1/messages" {
            "message_stop"
        } else {
            "[DONE]"
        };
        assert!(sse.contains(end), "{path}: {sse}");
        assert!(!sse.contains("error"), "{path}: {sse}");
    }
    let requests: u64 = gw.mocks().iter().map(|m| m.stats().requests).sum();
    assert_eq!(requests, 3, "one attempt each");
    gw.shutdown().await.unwrap();
}
