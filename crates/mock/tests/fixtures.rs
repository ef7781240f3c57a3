//! The mock's streams have the same shape as the captured real streams in testdata/fixtures:
//! the same sequence of event kinds, the same event names and the same JSON keys.

mod common;

use std::collections::BTreeSet;

use common::*;
use serde_json::Value;
use tailguard_mock::{MockServer, Script};

fn fixture(name: &str) -> String {
    String::from_utf8(tailguard_test_support::fixture(name).to_vec()).expect("utf-8")
}

/// (event name, data) of every SSE event.
fn events(text: &str) -> Vec<(Option<String>, String)> {
    text.split("\n\n")
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let name = e
                .lines()
                .find_map(|l| l.strip_prefix("event: ").map(str::to_owned));
            let data = e
                .lines()
                .find_map(|l| l.strip_prefix("data: ").map(str::to_owned))
                .unwrap_or_default();
            (name, data)
        })
        .collect()
}

/// The kind of an OpenAI chunk.
fn openai_kind(data: &str) -> &'static str {
    if data == "[DONE]" {
        return "done";
    }
    let v: Value = serde_json::from_str(data).unwrap();
    let Some(choice) = v["choices"].as_array().and_then(|c| c.first()) else {
        return if v["usage"].is_object() {
            "usage"
        } else {
            "empty"
        };
    };
    let delta = &choice["delta"];
    let non_empty = |x: &Value| x.as_str().is_some_and(|s| !s.is_empty()) || x.is_array();
    if non_empty(&delta["content"]) || non_empty(&delta["tool_calls"]) || non_empty(&choice["text"])
    {
        return "token";
    }
    if !choice["finish_reason"].is_null() {
        return "finish";
    }
    if delta["role"].is_string() {
        return "role";
    }
    "other"
}

/// Runs of the same kind collapsed: token, token, token → token+.
fn shape(kinds: impl IntoIterator<Item = String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for k in kinds {
        match out.last_mut() {
            Some(last) if *last == k || *last == format!("{k}+") => *last = format!("{k}+"),
            _ => out.push(k),
        }
    }
    out
}

fn openai_shape(text: &str) -> Vec<String> {
    shape(events(text).iter().map(|(_, d)| openai_kind(d).to_owned()))
}

fn keys(v: &Value) -> BTreeSet<String> {
    v.as_object()
        .map(|o| o.keys().cloned().collect())
        .unwrap_or_default()
}

/// Key sets of the chunk, its first choice and its delta, per kind.
fn openai_keys(text: &str) -> Vec<(&'static str, BTreeSet<String>, BTreeSet<String>)> {
    events(text)
        .iter()
        .filter(|(_, d)| d != "[DONE]")
        .map(|(_, d)| {
            let v: Value = serde_json::from_str(d).unwrap();
            let choice = v["choices"].get(0).cloned().unwrap_or(Value::Null);
            (openai_kind(d), keys(&v), keys(&choice))
        })
        .collect()
}

async fn mock_text(path: &str, body: &str, script: Script) -> Collected {
    let server = MockServer::start(script).await.unwrap();
    let c = collect(&client(), post(&server.url(), path, body, &[])).await;
    assert_eq!(c.status, 200);
    c
}

#[tokio::test(start_paused = true)]
async fn openai_chat_matches_llamacpp_shape() {
    let c = mock_text(
        "/v1/chat/completions",
        CHAT_STREAM,
        Script::new().tokens(12),
    )
    .await;
    let fx = fixture("llamacpp-chat-stream.sse");
    assert_eq!(openai_shape(&c.text()), openai_shape(&fx));
    assert_eq!(openai_shape(&fx), ["role", "token+", "finish", "done"]);
    // Role-only first chunk: no content key at all, as llama.cpp sends it.
    let first: Value = serde_json::from_str(&events(&c.text())[0].1).unwrap();
    assert_eq!(
        keys(&first["choices"][0]["delta"]),
        BTreeSet::from(["role".to_owned()])
    );
    // Finish chunk with an empty delta.
    let finish = events(&c.text()).iter().rev().nth(1).unwrap().1.clone();
    let finish: Value = serde_json::from_str(&finish).unwrap();
    assert_eq!(finish["choices"][0]["delta"], serde_json::json!({}));
    // One event per frame.
    assert_eq!(c.frames.len(), events(&c.text()).len());
    for (_, f) in &c.frames {
        assert!(f.ends_with(b"\n\n"));
    }
}

#[tokio::test(start_paused = true)]
async fn openai_usage_chunk_matches_llmock() {
    let body = r#"{"model":"gpt-4o","stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"a b c d e"}]}"#;
    let c = mock_text("/v1/chat/completions", body, Script::new().tokens(10)).await;
    let fx = fixture("llmock-openai-chat-stream-usage.sse");
    assert_eq!(openai_shape(&c.text()), openai_shape(&fx));
    assert_eq!(
        openai_shape(&fx),
        ["role", "token+", "finish", "usage", "done"]
    );
    // Same JSON keys per kind (chunk and choice level), e.g. `usage: null` on every chunk.
    let mine = openai_keys(&c.text());
    let theirs = openai_keys(&fx);
    for kind in ["role", "token", "finish", "usage"] {
        let m = mine.iter().find(|k| k.0 == kind).unwrap();
        let t = theirs.iter().find(|k| k.0 == kind).unwrap();
        assert_eq!((&m.1, &m.2), (&t.1, &t.2), "{kind}");
    }
    // Keys in the order real servers send them (serde_json's map would sort them).
    let order = |d: &str| -> Vec<usize> {
        [
            "\"id\"",
            "\"object\"",
            "\"created\"",
            "\"model\"",
            "\"system_fingerprint\"",
            "\"choices\"",
            "\"usage\"",
        ]
        .iter()
        .map(|k| d.find(k).unwrap())
        .collect()
    };
    for (_, d) in events(&c.text()).iter().filter(|(_, d)| d != "[DONE]") {
        let pos = order(d);
        assert!(pos.windows(2).all(|w| w[0] < w[1]), "{d}");
    }
    let fx_first = &events(&fx)[0].1;
    assert!(order(fx_first).windows(2).all(|w| w[0] < w[1]));
    let usage: Value =
        serde_json::from_str(&events(&c.text()).iter().rev().nth(1).unwrap().1).unwrap();
    assert_eq!(usage["choices"], serde_json::json!([]));
    assert_eq!(usage["usage"]["completion_tokens"], 10);
    assert_eq!(usage["usage"]["prompt_tokens"], 5);
    assert_eq!(usage["usage"]["total_tokens"], 15);
    // Without include_usage: no usage chunk and no usage key.
    let c = mock_text("/v1/chat/completions", CHAT_STREAM, Script::new()).await;
    assert!(!c.text().contains("usage"));
}

#[tokio::test(start_paused = true)]
async fn tool_call_stream_matches_llmock() {
    let c = mock_text(
        "/v1/chat/completions",
        CHAT_STREAM,
        Script::new().tool_calls(true).tokens(3),
    )
    .await;
    let fx = fixture("llmock-openai-tool-call-stream.sse");
    assert_eq!(openai_shape(&c.text()), openai_shape(&fx));
    let mine = events(&c.text());
    let theirs = events(&fx);
    let tc = |d: &str| -> Value {
        serde_json::from_str::<Value>(d).unwrap()["choices"][0]["delta"]["tool_calls"][0].clone()
    };
    assert_eq!(keys(&tc(&mine[1].1)), keys(&tc(&theirs[1].1)));
    assert_eq!(keys(&tc(&mine[2].1)), keys(&tc(&theirs[2].1)));
    assert!(c.text().contains(r#""finish_reason":"tool_calls""#));
}

#[tokio::test(start_paused = true)]
async fn completions_match_llamacpp() {
    let body = r#"{"model":"m","prompt":"Once upon a time","stream":true,"max_tokens":9}"#;
    let c = mock_text("/v1/completions", body, Script::new().tokens(20)).await;
    let fx = fixture("llamacpp-completions-stream.sse");
    assert_eq!(openai_shape(&c.text()), openai_shape(&fx));
    assert_eq!(openai_shape(&fx), ["token+", "finish", "done"]);
    let mine = openai_keys(&c.text());
    let theirs = openai_keys(&fx);
    assert_eq!(mine[0].2, theirs[0].2);
    // max_tokens cut the script short: finish reason length, as in the fixture.
    assert!(c.text().contains(r#""finish_reason":"length""#));
    assert_eq!(mine.iter().filter(|k| k.0 == "token").count(), 9);
}

#[tokio::test(start_paused = true)]
async fn non_streamed_chat_matches_llamacpp() {
    let c = mock_text(
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#,
        Script::new().tokens(20),
    )
    .await;
    assert_eq!(c.headers["content-type"], "application/json");
    let mine: Value = serde_json::from_str(&c.text()).unwrap();
    let theirs: Value = serde_json::from_str(&fixture("llamacpp-chat-nostream.json")).unwrap();
    assert!(keys(&theirs).is_subset(&keys(&mine)));
    assert_eq!(keys(&mine["choices"][0]), keys(&theirs["choices"][0]));
    assert_eq!(
        keys(&mine["choices"][0]["message"]),
        keys(&theirs["choices"][0]["message"])
    );
    assert_eq!(keys(&mine["usage"]), keys(&theirs["usage"]));
    assert_eq!(mine["choices"][0]["finish_reason"], "length");
    assert_eq!(mine["usage"]["completion_tokens"], 8);
}

#[tokio::test(start_paused = true)]
async fn anthropic_matches_llmock() {
    let body = r#"{"model":"claude-sonnet-4-5","stream":true,"max_tokens":100,"messages":[{"role":"user","content":"Tell me a short fact."}]}"#;
    let c = mock_text("/v1/messages", body, Script::new().tokens(10)).await;
    let fx = fixture("llmock-anthropic-messages-stream.sse");
    let names = |t: &str| shape(events(t).into_iter().map(|(n, _)| n.unwrap()));
    assert_eq!(names(&c.text()), names(&fx));
    assert_eq!(
        names(&fx),
        [
            "message_start",
            "content_block_start",
            "ping",
            "content_block_delta+",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );
    // Every event's data has the same keys as the fixture's event of that name, and its
    // `type` is the event name.
    let theirs = events(&fx);
    for (name, data) in events(&c.text()) {
        let name = name.unwrap();
        let v: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(v["type"], name.as_str());
        let (_, fd) = theirs
            .iter()
            .find(|(n, _)| n.as_deref() == Some(&name))
            .unwrap();
        let f: Value = serde_json::from_str(fd).unwrap();
        assert_eq!(keys(&v), keys(&f), "{name}");
        for sub in ["message", "delta", "content_block", "usage"] {
            assert_eq!(keys(&v[sub]), keys(&f[sub]), "{name}.{sub}");
        }
    }
    assert!(c.text().contains(r#""usage":{"output_tokens":10}"#));
    assert_eq!(c.frames.len(), events(&c.text()).len());
}

#[tokio::test(start_paused = true)]
async fn anthropic_error_event_and_non_streamed() {
    let server = MockServer::start(Script::new().error_event_after(1))
        .await
        .unwrap();
    let c = collect(
        &client(),
        post(
            &server.url(),
            "/anthropic/v1/messages",
            r#"{"stream":true}"#,
            &[],
        ),
    )
    .await;
    let ev = events(&c.text());
    let (name, data) = ev.last().unwrap();
    assert_eq!(name.as_deref(), Some("error"));
    let v: Value = serde_json::from_str(data).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "api_error");
    server.set_script(Script::new().tokens(3));
    let c = collect(&client(), post(&server.url(), "/v1/messages", "{}", &[])).await;
    let v: Value = serde_json::from_str(&c.text()).unwrap();
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["text"], "Hello there,");
    assert_eq!(v["usage"]["output_tokens"], 3);
}

#[tokio::test(start_paused = true)]
async fn models_and_unknown_routes() {
    let server = MockServer::start(Script::new()).await.unwrap();
    let req = http::Request::get(format!("{}/v1/models", server.url()))
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .unwrap();
    let c = collect(&client(), req).await;
    let v: Value = serde_json::from_str(&c.text()).unwrap();
    assert_eq!(v["object"], "list");
    assert_eq!(v["data"][0]["id"], "mock-model");
    let c = collect(&client(), post(&server.url(), "/v2/nothing", "{}", &[])).await;
    assert_eq!(c.status, 404);
    let c = collect(
        &client(),
        post(&server.url(), "/v1/chat/completions", "{not json", &[]),
    )
    .await;
    assert_eq!(c.status, 400);
    let s = server.stats();
    assert_eq!(s.requests, 3);
    assert_eq!(s.completed, 1);
    assert_eq!(s.in_flight, 0);
}

#[tokio::test(start_paused = true)]
async fn ollama_lines() {
    let server = MockServer::start(Script::new().tokens(3)).await.unwrap();
    let c = collect(
        &client(),
        post(&server.url(), "/api/chat", r#"{"model":"llama3","messages":[{"role":"user","content":"hi"}],"options":{"num_predict":2}}"#, &[]),
    )
    .await;
    let lines: Vec<Value> = c
        .text()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    assert_eq!(c.frames.len(), 3, "one line per frame");
    assert_eq!(lines[0]["message"]["content"], "Hello");
    assert_eq!(lines[0]["done"], false);
    assert_eq!(lines[2]["done"], true);
    assert_eq!(lines[2]["done_reason"], "length");
    assert_eq!(lines[2]["eval_count"], 2);
    assert_eq!(lines[2]["model"], "llama3");
    // "stream": false gives one JSON object.
    let c = collect(
        &client(),
        post(
            &server.url(),
            "/api/generate",
            r#"{"prompt":"x","stream":false}"#,
            &[],
        ),
    )
    .await;
    assert_eq!(c.headers["content-type"], "application/json");
    let v: Value = serde_json::from_str(&c.text()).unwrap();
    assert_eq!(v["response"], "Hello there,");
    assert_eq!(v["done"], true);
}

#[tokio::test(start_paused = true)]
async fn responses_api_matches_llmock() {
    let body = r#"{"model":"gpt-4o-mini","stream":true,"input":"Say hello in five words."}"#;
    let c = mock_text("/v1/responses", body, Script::new().tokens(10)).await;
    let fx = fixture("llmock-openai-responses-stream.sse");
    let names = |t: &str| shape(events(t).into_iter().map(|(n, _)| n.unwrap()));
    assert_eq!(names(&c.text()), names(&fx));
    // Every event's data is named by its `type`, numbered in sequence, and has no key the
    // fixture's event of that name lacks (the mock leaves out sampling settings and logprobs).
    let theirs = events(&fx);
    for (seq, (name, data)) in events(&c.text()).into_iter().enumerate() {
        let name = name.unwrap();
        let v: Value = serde_json::from_str(&data).unwrap();
        assert_eq!(v["type"], name.as_str());
        assert_eq!(v["sequence_number"], seq as u64);
        let (_, fd) = theirs
            .iter()
            .find(|(n, _)| n.as_deref() == Some(&name))
            .unwrap();
        let f: Value = serde_json::from_str(fd).unwrap();
        assert!(keys(&v).is_subset(&keys(&f)), "{name}");
        for sub in ["response", "item", "part"] {
            assert!(keys(&v[sub]).is_subset(&keys(&f[sub])), "{name}.{sub}");
        }
    }
    assert!(c.text().contains(r#""output_tokens":10"#));
}
