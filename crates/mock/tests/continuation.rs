//! Continuation requests over a real socket: the start of an answer plus the mock's
//! continuation of it equals the uninterrupted answer, byte for byte.

mod common;

use common::*;
use serde_json::{Value, json};
use tailguard_mock::{MockServer, Outcome, Script};

/// The routes that continue.
#[derive(Clone, Copy, Debug)]
enum Route {
    Chat,
    Anthropic,
    Completions,
}

impl Route {
    fn path(self) -> &'static str {
        match self {
            Route::Chat => "/v1/chat/completions",
            Route::Anthropic => "/v1/messages",
            Route::Completions => "/v1/completions",
        }
    }

    /// A streamed request, continuing after `prefix` if given; `variant` picks one of the
    /// request's shapes.
    fn body(self, prefix: Option<&str>, max_tokens: Option<u32>, variant: usize) -> String {
        let mut v = match self {
            Route::Chat => {
                let mut messages = vec![json!({"role": "user", "content": "hi"})];
                if let Some(p) = prefix {
                    messages.push(json!({"role": "assistant", "content": p}));
                }
                let mut v = json!({"model": "m", "stream": true,
                    "stream_options": {"include_usage": true}, "messages": messages});
                if prefix.is_some() && variant.is_multiple_of(2) {
                    // vLLM / SGLang's flags, optional.
                    v["continue_final_message"] = json!(true);
                    v["add_generation_prompt"] = json!(false);
                }
                v
            }
            Route::Anthropic => {
                let mut messages = vec![json!({"role": "user", "content": "hi"})];
                if let Some(p) = prefix {
                    // String content, or a text block.
                    let content = match variant.is_multiple_of(2) {
                        true => json!(p),
                        false => json!([{"type": "text", "text": p}]),
                    };
                    messages.push(json!({"role": "assistant", "content": content}));
                }
                json!({"model": "claude", "stream": true, "messages": messages})
            }
            Route::Completions => json!({"model": "m", "stream": true,
                "stream_options": {"include_usage": true},
                "prompt": format!("Once upon a time{}", prefix.unwrap_or(""))}),
        };
        if let Some(m) = max_tokens {
            v["max_tokens"] = json!(m);
        }
        v.to_string()
    }
}

/// What a streamed answer said.
#[derive(Debug)]
struct Answer {
    /// The text of each token event.
    pieces: Vec<String>,
    /// `finish_reason` / `stop_reason`.
    finish: Option<String>,
    /// Usage: completion / output tokens.
    tokens: Option<u64>,
    /// The body broke.
    error: bool,
}

impl Answer {
    fn text(&self) -> String {
        self.pieces.concat()
    }
}

fn read(route: Route, c: &Collected) -> Answer {
    assert_eq!(c.status, 200, "{}", c.text());
    let mut a = Answer {
        pieces: Vec::new(),
        finish: None,
        tokens: None,
        error: c.error,
    };
    for data in c.data_events() {
        if data == "[DONE]" {
            continue;
        }
        let v: Value = serde_json::from_str(&data).unwrap();
        let text = |t: &Value| t.as_str().map(str::to_owned);
        match route {
            Route::Anthropic => match v["type"].as_str().unwrap() {
                "content_block_delta" => a.pieces.extend(text(&v["delta"]["text"])),
                "message_delta" => {
                    a.finish = text(&v["delta"]["stop_reason"]);
                    a.tokens = v["usage"]["output_tokens"].as_u64();
                }
                _ => {}
            },
            Route::Chat | Route::Completions => {
                if let Some(u) = v["usage"]["completion_tokens"].as_u64() {
                    a.tokens = Some(u);
                }
                let Some(choice) = v["choices"].get(0) else {
                    continue;
                };
                if let Some(f) = text(&choice["finish_reason"]) {
                    a.finish = Some(f);
                } else if let Route::Chat = route {
                    a.pieces.extend(text(&choice["delta"]["content"]));
                } else {
                    a.pieces.extend(text(&choice["text"]));
                }
            }
        }
    }
    a
}

async fn ask(server: &MockServer, route: Route, body: &str, headers: &[(&str, &str)]) -> Answer {
    let c = collect(&client(), post(&server.url(), route.path(), body, headers)).await;
    read(route, &c)
}

/// Prefix `k` of an uninterrupted answer of `n` tokens plus the continuation equals the
/// answer, for every route and `k`, with the count from `max_tokens` (lowered by `k` on the
/// continuation) or from the script; the stats count the continuations.
async fn resumes(route: Route, script_tokens: u32, max_tokens: Option<u32>, n: u32) {
    let server = MockServer::start(Script::new().tokens(script_tokens))
        .await
        .unwrap();
    let whole = ask(&server, route, &route.body(None, max_tokens, 0), &[]).await;
    assert_eq!(whole.pieces.len(), n as usize, "{route:?}");
    assert_eq!(whole.tokens, Some(u64::from(n)));
    let ks = [1, 12, n - 1];
    for (variant, k) in ks.into_iter().enumerate() {
        let prefix: String = whole.pieces[..k as usize].concat();
        let max = max_tokens.map(|m| m - k);
        let rest = ask(
            &server,
            route,
            &route.body(Some(&prefix), max, variant),
            &[],
        )
        .await;
        assert_eq!(
            format!("{prefix}{}", rest.text()),
            whole.text(),
            "{route:?} k = {k}"
        );
        assert_eq!(rest.pieces, whole.pieces[k as usize..], "{route:?} k = {k}");
        assert_eq!(rest.finish, whole.finish, "{route:?} k = {k}");
        assert_eq!(rest.tokens, Some(u64::from(n - k)), "{route:?} k = {k}");
    }
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!((s.requests, s.completed, s.continuations), (4, 4, 3));
    let offsets: Vec<_> = s.log.iter().map(|r| r.continued_from).collect();
    assert_eq!(offsets, [None, Some(1), Some(12), Some(n - 1)]);
    let sent: Vec<_> = s.log.iter().map(|r| r.tokens_sent).collect();
    assert_eq!(sent, [n, n - 1, n - 12, 1]);
}

#[tokio::test(start_paused = true)]
async fn chat_continues_an_assistant_prefill() {
    // The count from max_tokens (finish reason "length"), then from the script ("stop").
    resumes(Route::Chat, 30, Some(20), 20).await;
    resumes(Route::Chat, 20, None, 20).await;
}

#[tokio::test(start_paused = true)]
async fn anthropic_continues_an_assistant_prefill() {
    resumes(Route::Anthropic, 30, Some(20), 20).await;
    // A max_tokens above the script's count: the count comes from the script.
    resumes(Route::Anthropic, 20, Some(100), 20).await;
}

#[tokio::test(start_paused = true)]
async fn completions_continue_a_prompt_ending_with_the_answer() {
    resumes(Route::Completions, 30, Some(20), 20).await;
    resumes(Route::Completions, 20, None, 20).await;
}

#[tokio::test(start_paused = true)]
async fn knobs_count_the_tokens_of_the_continuation() {
    let server = MockServer::start(Script::new().tokens(20)).await.unwrap();
    let whole = ask(&server, Route::Chat, &Route::Chat.body(None, None, 0), &[]).await;
    let prefix = whole.pieces[..12].concat();
    let body = Route::Chat.body(Some(&prefix), None, 1);
    let broken = ask(
        &server,
        Route::Chat,
        &body,
        &[("x-mock-script", "reset_after=5")],
    )
    .await;
    assert!(broken.error);
    assert_eq!(broken.pieces, whole.pieces[12..17]);
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!(s.log[1].outcome, Outcome::ResetAfterTokens(5));
    assert_eq!((s.continuations, s.log[1].continued_from), (1, Some(12)));
}

#[tokio::test(start_paused = true)]
async fn a_non_streamed_continuation_is_the_rest_of_the_answer() {
    let server = MockServer::start(Script::new().tokens(20)).await.unwrap();
    let whole = ask(&server, Route::Chat, &Route::Chat.body(None, None, 0), &[]).await;
    let prefix = whole.pieces[..12].concat();
    let body = json!({"messages": [{"role": "user", "content": "hi"},
        {"role": "assistant", "content": prefix}], "max_tokens": 30});
    let c = collect(
        &client(),
        post(&server.url(), Route::Chat.path(), &body.to_string(), &[]),
    )
    .await;
    let v: Value = serde_json::from_str(&c.text()).unwrap();
    let rest = v["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(format!("{prefix}{rest}"), whole.text());
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 8);
}

#[tokio::test(start_paused = true)]
async fn a_prefill_off_the_answer_gets_a_400() {
    let server = MockServer::start(Script::new().tokens(20)).await.unwrap();
    let msg = "mock: assistant prefill is not a prefix of the mock's answer";
    // Not the mock's words; not on a token boundary.
    for (route, prefix) in [
        (Route::Chat, "Hello there, that"),
        (Route::Anthropic, "Hel"),
    ] {
        let body = route.body(Some(prefix), Some(10), 0);
        let c = collect(&client(), post(&server.url(), route.path(), &body, &[])).await;
        assert_eq!(c.status, 400, "{route:?}");
        assert_eq!(c.headers["content-type"], "application/json");
        let v: Value = serde_json::from_str(&c.text()).unwrap();
        assert_eq!(v["error"]["message"], msg, "{route:?}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        if let Route::Anthropic = route {
            assert_eq!(v["type"], "error");
        }
    }
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!((s.requests, s.continuations), (2, 0));
    assert!(s.log.iter().all(|r| r.outcome == Outcome::BadRequest(400)));
    assert!(s.log.iter().all(|r| r.continued_from.is_none()));
}
