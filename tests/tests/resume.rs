//! Issue 33: a stream that breaks after its first token continues on the other replica, through
//! the gateway (`--resume on`) over its embedded mock replicas, which continue an answer from
//! a continuation request: the client gets the uninterrupted answer, byte for byte in its
//! text, as one stream.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tailguard_gateway::{Args, Config, Gateway, HedgeDelaySetting};
use tailguard_test_support::{client, ms};

const SCRIPT: &str = "ttft=10ms,tokens=20,gap=2ms";

fn config(resume: bool) -> Config {
    let mut c = Config::resolve(Default::default(), &Args::default()).unwrap();
    c.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    c.mock.replicas = 2;
    c.mock.script = SCRIPT.into();
    c.mock.congested_script = SCRIPT.into();
    // No hedge in these tests: the first attempt of each stream is the one that breaks.
    c.hedge.delay = HedgeDelaySetting::Fixed(ms(5_000));
    c.hedge.resume = resume;
    c
}

/// One API: its path, a streamed request, and how to read a stream's text.
struct Api {
    path: &'static str,
    body: &'static str,
    text: fn(&str) -> String,
}

const CHAT: Api = Api {
    path: "/v1/chat/completions",
    body: r#"{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"Hi"}]}"#,
    text: chat_text,
};
const COMPLETIONS: Api = Api {
    path: "/v1/completions",
    body: r#"{"model":"mock-llm","stream":true,"prompt":"Once upon a time"}"#,
    text: completions_text,
};
const MESSAGES: Api = Api {
    path: "/v1/messages",
    body: r#"{"model":"mock-llm","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Hi"}]}"#,
    text: messages_text,
};

/// The JSON of every `data:` line (`[DONE]` left out).
fn events(sse: &str) -> Vec<Value> {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn chat_text(sse: &str) -> String {
    let e = events(sse);
    e.iter()
        .filter_map(|v| v.pointer("/choices/0/delta/content")?.as_str())
        .collect()
}

fn completions_text(sse: &str) -> String {
    let e = events(sse);
    e.iter()
        .filter_map(|v| v.pointer("/choices/0/text")?.as_str())
        .collect()
}

fn messages_text(sse: &str) -> String {
    let e = events(sse);
    e.iter()
        .filter(|v| v["type"] == "content_block_delta")
        .filter_map(|v| v.pointer("/delta/text")?.as_str())
        .collect()
}

/// Sends one streamed request; its status, the body read as far as it went, and whether the
/// body ended with an error (a broken stream).
async fn send(gw: &Gateway, api: &Api, headers: &[(&str, &str)]) -> (StatusCode, String, bool) {
    let mut b = Request::post(format!("http://{}{}", gw.addr(), api.path))
        .header("content-type", "application/json");
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    let req = b
        .body(Full::new(Bytes::from_static(api.body.as_bytes())))
        .unwrap();
    let res = client().request(req).await.unwrap();
    let status = res.status();
    let mut body = res.into_body();
    let mut bytes = Vec::new();
    let mut broke = false;
    while let Some(frame) = body.frame().await {
        match frame {
            Ok(f) => bytes.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
            Err(_) => {
                broke = true;
                break;
            }
        }
    }
    (status, String::from_utf8(bytes).unwrap(), broke)
}

/// Every chunk of a resumed OpenAI stream names the first stream's id and model; one role
/// chunk; one finish reason; one `[DONE]`.
fn assert_one_openai_stream(sse: &str, chat: bool) {
    let e = events(sse);
    let ids: Vec<&str> = e.iter().filter_map(|v| v["id"].as_str()).collect();
    assert!(ids.windows(2).all(|w| w[0] == w[1]), "{ids:?}");
    if chat {
        let roles = e
            .iter()
            .filter(|v| v.pointer("/choices/0/delta/role").is_some())
            .count();
        assert_eq!(roles, 1, "{sse}");
    }
    let finishes = e
        .iter()
        .filter(|v| {
            v.pointer("/choices/0/finish_reason")
                .is_some_and(|f| !f.is_null())
        })
        .count();
    assert_eq!(finishes, 1, "{sse}");
    assert_eq!(sse.matches("data: [DONE]").count(), 1, "{sse}");
}

#[tokio::test(start_paused = true)]
async fn a_stream_broken_after_its_first_token_continues_on_the_other_replica() {
    let gw = Gateway::start(config(true)).await.unwrap();
    for api in [CHAT, COMPLETIONS, MESSAGES] {
        let (status, whole, broke) = send(&gw, &api, &[]).await;
        assert_eq!((status, broke), (StatusCode::OK, false));
        let expected = (api.text)(&whole);
        assert_eq!(expected.matches("Hello").count(), 2, "{whole}");
        // The primary breaks after 5 tokens: a reset, an in-band error, half an event.
        for fault in ["reset_after=5", "error_after=5", "half_event=5"] {
            let (status, sse, broke) = send(&gw, &api, &[("x-mock-script-0", fault)]).await;
            assert_eq!(status, StatusCode::OK, "{} {fault}", api.path);
            assert!(!broke, "{} {fault}: {sse}", api.path);
            assert_eq!((api.text)(&sse), expected, "{} {fault}: {sse}", api.path);
            if api.path == MESSAGES.path {
                assert_eq!(sse.matches("event: message_start").count(), 1, "{sse}");
                assert_eq!(sse.matches("event: message_stop").count(), 1, "{sse}");
            } else {
                assert_one_openai_stream(&sse, api.path == CHAT.path);
            }
        }
    }
    let metrics = client()
        .get(format!("http://{}/metrics", gw.addr()).parse().unwrap())
        .await
        .unwrap();
    let text = String::from_utf8(
        metrics
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    // Nine breaks (three APIs, three faults), each resumed once (the counters are the
    // process's: other tests add theirs).
    let resumed: f64 = text
        .lines()
        .filter(|l| l.starts_with("tailguard_resumes_total{") && l.contains("outcome=\"resumed\""))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert!(resumed >= 9.0, "{text}");
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn without_resume_the_broken_stream_ends_as_it_broke() {
    let gw = Gateway::start(config(false)).await.unwrap();
    let (status, sse, _) = send(&gw, &CHAT, &[("x-mock-script-0", "error_after=5")]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(chat_text(&sse).len() < 40, "{sse}");
    assert!(sse.contains("\"error\""), "{sse}");
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn requests_whose_continuation_is_not_defined_are_not_resumed() {
    let gw = Gateway::start(config(true)).await.unwrap();
    // Two choices: not resumed; the in-band error reaches the client as it was sent.
    let two = Api {
        body: r#"{"model":"mock-llm","stream":true,"n":2,"messages":[{"role":"user","content":"Hi"}]}"#,
        ..CHAT
    };
    let (status, sse, _) = send(&gw, &two, &[("x-mock-script-0", "error_after=5")]).await;
    assert_eq!(status, StatusCode::OK);
    assert!(sse.contains("\"error\""), "{sse}");
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_continuation_that_breaks_is_resumed_again_up_to_the_limit() {
    let gw = Gateway::start(config(true)).await.unwrap();
    let (_, whole, _) = send(&gw, &CHAT, &[]).await;
    let expected = chat_text(&whole);
    // The primary breaks after 5 tokens, its continuation (attempt 1) after 3 more: resumed
    // twice, the text is still the uninterrupted one.
    let twice = [
        ("x-mock-script-0", "reset_after=5"),
        ("x-mock-script-1", "reset_after=3"),
    ];
    let (status, sse, broke) = send(&gw, &CHAT, &twice).await;
    assert_eq!((status, broke), (StatusCode::OK, false), "{sse}");
    assert_eq!(chat_text(&sse), expected);
    assert_one_openai_stream(&sse, true);
    // A third break is past the limit of two: the stream ends as it broke (the timeout layer
    // ends a broken stream in-band, in the client's dialect).
    let thrice = [
        ("x-mock-script-0", "reset_after=5"),
        ("x-mock-script-1", "reset_after=3"),
        ("x-mock-script-2", "reset_after=3"),
    ];
    let (status, sse, _) = send(&gw, &CHAT, &thrice).await;
    assert_eq!(status, StatusCode::OK);
    assert!(sse.contains("upstream_error_transport"), "{sse}");
    let got = chat_text(&sse);
    assert!(
        got.len() < expected.len() && expected.starts_with(&got),
        "{sse}"
    );
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_stream_that_breaks_at_its_output_limit_ends_with_finish_length() {
    let gw = Gateway::start(config(true)).await.unwrap();
    let chat = Api {
        body: r#"{"model":"mock-llm","stream":true,"max_tokens":5,"messages":[{"role":"user","content":"Hi"}]}"#,
        ..CHAT
    };
    let messages = Api {
        body: r#"{"model":"mock-llm","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"Hi"}]}"#,
        ..MESSAGES
    };
    for api in [chat, messages] {
        let (_, whole, _) = send(&gw, &api, &[]).await;
        let expected = (api.text)(&whole);
        // The fifth token is the last `max_tokens` allows; the stream breaks before its finish
        // (an interrupting server's bare terminal event, or a reset): nothing is left to
        // continue, and the answer is whole.
        for fault in ["interrupt_after=5", "reset_after=5"] {
            let (status, sse, broke) = send(&gw, &api, &[("x-mock-script-0", fault)]).await;
            assert_eq!((status, broke), (StatusCode::OK, false), "{fault}: {sse}");
            assert_eq!((api.text)(&sse), expected, "{fault}: {sse}");
            assert!(!sse.contains("error"), "{fault}: {sse}");
            if api.path == MESSAGES.path {
                let stops: Vec<Value> = events(&sse)
                    .into_iter()
                    .filter(|v| v["type"] == "message_delta")
                    .collect();
                assert_eq!(stops.len(), 1, "{sse}");
                assert_eq!(stops[0]["delta"]["stop_reason"], "max_tokens", "{sse}");
                assert_eq!(sse.matches("event: message_stop").count(), 1, "{sse}");
            } else {
                assert_one_openai_stream(&sse, true);
                let finish = events(&sse)
                    .into_iter()
                    .filter_map(|v| v.pointer("/choices/0/finish_reason").cloned())
                    .find(|f| !f.is_null());
                assert_eq!(finish, Some(Value::from("length")), "{sse}");
            }
        }
    }
    gw.shutdown().await.unwrap();
}
