//! Reservations, reconciliation and refusals through the layer, on a paused clock.

mod common;

use std::time::Duration;

use http::{Response, StatusCode};
use http_body_util::BodyExt;
use tailguard_core::{RequestFacts, Tenant};
use tailguard_tenant::{
    BudgetBody, CODE_EXCEEDED, CODE_TOO_LARGE, Decision, Kind, Limit, LocalStore, Reply, Store,
    Ticket, TokenBudget, TokenBudgetLayer, Tokens,
};
use tailguard_test_support::{DONE, ScriptBody, data, read_all, secs, token};
use tower::ServiceExt;

use common::{Plan, budget, chat, limits, request, tokens, upstream, usage};

const OUTPUT_PER_MINUTE: u64 = 100;

fn per_minute() -> Limit {
    Limit::per_minute(Kind::Output, OUTPUT_PER_MINUTE)
}

/// The JSON body of a response.
async fn json(res: Response<BudgetBody<ScriptBody>>) -> serde_json::Value {
    let (bytes, failed) = read_all(res.into_body()).await;
    assert!(!failed);
    serde_json::from_slice(&bytes).unwrap()
}

fn retry_after(res: &Response<BudgetBody<ScriptBody>>) -> Option<&str> {
    res.headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap())
}

#[tokio::test(start_paused = true)]
async fn a_stream_with_usage_is_charged_its_usage_and_the_rest_comes_back() {
    let (svc, store) = budget(limits([per_minute()]));
    let mut steps = tokens(3);
    steps.insert(3, usage(11, 4));
    let res = svc.oneshot(chat(80, Plan::sse(steps))).await.unwrap();
    assert!(res.body().holds_reservation());
    assert_eq!(store.available("acme", &per_minute()), 20);
    let (_, failed) = read_all(res.into_body()).await;
    assert!(!failed);
    // 4 reported, not the 3 chunks counted.
    assert_eq!(store.available("acme", &per_minute()), 96);
}

#[tokio::test(start_paused = true)]
async fn a_stream_without_usage_is_charged_the_chunks_it_carried() {
    let (svc, store) = budget(limits([per_minute()]));
    let res = svc.oneshot(chat(80, Plan::sse(tokens(3)))).await.unwrap();
    read_all(res.into_body()).await;
    assert_eq!(store.available("acme", &per_minute()), 97);
}

#[tokio::test(start_paused = true)]
async fn a_client_that_goes_away_mid_stream_is_charged_what_it_got() {
    let (svc, store) = budget(limits([per_minute()]));
    let mut steps = tokens(2);
    steps.pop();
    steps.extend([tailguard_test_support::wait_ms(1000), data(token("late"))]);
    let res = svc.oneshot(chat(80, Plan::sse(steps))).await.unwrap();
    let mut body = res.into_body();
    for _ in 0..2 {
        body.frame().await.unwrap().unwrap();
    }
    assert_eq!(store.available("acme", &per_minute()), 20);
    drop(body);
    assert_eq!(store.available("acme", &per_minute()), 98);
}

#[tokio::test(start_paused = true)]
async fn the_largest_of_conflicting_output_limits_is_reserved() {
    let (svc, store) = budget(limits([per_minute()]));
    let body = br#"{"model":"m","max_tokens":10,"max_completion_tokens":70,"max_output_tokens":30,
        "messages":[{"role":"user","content":"hi"}]}"#;
    let facts = RequestFacts::from_json(body).unwrap();
    let req = request(Some("acme"), "/v1/chat/completions", facts, Plan::open());
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(store.available("acme", &per_minute()), 30);
    drop(res);
    assert_eq!(store.available("acme", &per_minute()), 100);
}

#[tokio::test(start_paused = true)]
async fn over_budget_is_a_429_in_openai_shape_with_an_exact_retry_after() {
    let (svc, store) = budget(limits([Limit::per_minute(Kind::Output, 60)]));
    let held = svc.clone().oneshot(chat(60, Plan::open())).await.unwrap();

    // 30 tokens at one a second.
    let res = svc.clone().oneshot(chat(30, Plan::open())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&res), Some("30"));
    assert_eq!(res.headers()["content-type"], "application/json");
    assert!(res.body().is_refusal());
    let v = json(res).await;
    assert_eq!(v["error"]["type"], "rate_limit_exceeded");
    assert_eq!(v["error"]["code"], CODE_EXCEEDED);
    assert!(v["error"]["param"].is_null());
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("reserves 30 output tokens and 0 of the 60 per minute are left"),
        "{message}"
    );

    tokio::time::advance(Duration::from_millis(10_500)).await;
    let res = svc.clone().oneshot(chat(30, Plan::open())).await.unwrap();
    assert_eq!(retry_after(&res), Some("20"), "19.5 s, rounded up");
    tokio::time::advance(Duration::from_millis(19_500)).await;
    let res = svc.clone().oneshot(chat(30, Plan::open())).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        store.available("acme", &Limit::per_minute(Kind::Output, 60)),
        0
    );
    drop((held, res));
    assert_eq!(
        store.available("acme", &Limit::per_minute(Kind::Output, 60)),
        60
    );
}

#[tokio::test(start_paused = true)]
async fn over_budget_on_the_messages_api_is_a_429_in_anthropic_shape() {
    let (svc, _store) = budget(limits([Limit::per_minute(Kind::Output, 60)]));
    let messages = |max| {
        request(
            Some("acme"),
            "/v1/messages",
            RequestFacts::new().with_max_tokens(max),
            Plan::open(),
        )
    };
    let _held = svc.clone().oneshot(messages(50)).await.unwrap();
    let res = svc.clone().oneshot(messages(20)).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&res), Some("10"));
    let v = json(res).await;
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "rate_limit_error");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .ends_with("retry in 10 s")
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_over_the_limit_itself_is_refused_without_retry_after() {
    let (svc, store) = budget(limits([per_minute()]));
    let res = svc.oneshot(chat(101, Plan::open())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&res), None);
    let v = json(res).await;
    assert_eq!(v["error"]["code"], CODE_TOO_LARGE);
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("101 output tokens, more than the 100 per minute"),
        "{message}"
    );
    assert_eq!(store.available("acme", &per_minute()), 100);
}

#[tokio::test(start_paused = true)]
async fn a_request_without_a_tenant_or_limits_passes_untouched() {
    let layer = limits([per_minute()]).with_tenant_limits("exempt", []);
    let (svc, store) = budget(layer);
    let anonymous = request(
        None,
        "/v1/chat/completions",
        RequestFacts::new().with_max_tokens(100_000),
        Plan::sse(tokens(2)),
    );
    let res = svc.clone().oneshot(anonymous).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(!res.body().holds_reservation());
    let exempt = request(
        Some("exempt"),
        "/v1/chat/completions",
        RequestFacts::new().with_max_tokens(100_000),
        Plan::sse(tokens(2)),
    );
    let res = svc.oneshot(exempt).await.unwrap();
    assert!(!res.body().holds_reservation());
    let (bytes, _) = read_all(res.into_body()).await;
    assert!(bytes.ends_with(DONE.as_bytes()));
    assert_eq!(store.tenants(), 0);
}

#[tokio::test(start_paused = true)]
async fn with_a_day_and_a_minute_limit_the_scarcest_decides() {
    let minute = Limit::per_minute(Kind::Output, 100);
    let day = Limit::per_day(Kind::Output, 150);
    let (svc, store) = budget(limits([minute, day]));
    let used_up = |n| {
        let mut steps = tokens(1);
        steps.insert(1, usage(1, n));
        chat(100, Plan::sse(steps))
    };
    let res = svc.clone().oneshot(used_up(100)).await.unwrap();
    read_all(res.into_body()).await;
    assert_eq!(store.available("acme", &minute), 0);
    assert_eq!(store.available("acme", &day), 50);

    tokio::time::advance(secs(60)).await;
    // The minute is full again; the day holds 50 + 60 s × 150/86400 s and needs 49.896 more,
    // at 150 tokens a day: 28740 s.
    let res = svc.clone().oneshot(used_up(100)).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(retry_after(&res), Some("28740"));
    assert!(
        json(res).await["error"]["message"]
            .as_str()
            .unwrap()
            .contains("of the 150 per day")
    );
    tokio::time::advance(secs(28_739)).await;
    let res = svc.clone().oneshot(used_up(100)).await.unwrap();
    assert_eq!(retry_after(&res), Some("1"));
    tokio::time::advance(secs(1)).await;
    let res = svc.oneshot(used_up(100)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test(start_paused = true)]
async fn error_answers_inner_errors_and_early_drops_charge_nothing() {
    let (svc, store) = budget(limits([per_minute()]));
    let full = || store.available("acme", &per_minute());

    let error = Plan::sse([data(r#"{"error":{"message":"busy"}}"#)])
        .with_status(StatusCode::SERVICE_UNAVAILABLE, "application/json");
    let res = svc.clone().oneshot(chat(80, error)).await.unwrap();
    assert_eq!(res.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(!res.body().holds_reservation());
    assert_eq!(full(), 100);

    let mut failing = Plan::open();
    failing.fail = true;
    assert!(svc.clone().oneshot(chat(80, failing)).await.is_err());
    assert_eq!(full(), 100);

    let mut slow = Plan::open();
    slow.head_delay = Some(secs(10));
    let mut fut = Box::pin(svc.oneshot(chat(80, slow)));
    assert!(
        tokio::time::timeout(Duration::from_millis(1), &mut fut)
            .await
            .is_err()
    );
    assert_eq!(full(), 20, "reserved while the head is on its way");
    drop(fut);
    assert_eq!(full(), 100);
}

#[tokio::test(start_paused = true)]
async fn an_empty_answer_is_settled_at_the_head_and_charged_no_output() {
    // Answers that are whole documents: `tests/document.rs`.
    let (svc, store) = budget(limits([per_minute()]));
    let empty = Plan::sse([]);
    let res = svc.clone().oneshot(chat(40, empty)).await.unwrap();
    assert!(!res.body().holds_reservation(), "settled at the head");
    assert_eq!(store.available("acme", &per_minute()), 100);
    let empty = Plan::json([]);
    let res = svc.oneshot(chat(40, empty)).await.unwrap();
    assert!(!res.body().holds_reservation(), "settled at the head");
    assert_eq!(store.available("acme", &per_minute()), 100);
}

#[tokio::test(start_paused = true)]
async fn anthropic_usage_settles_input_and_output() {
    let total = Limit::per_minute(Kind::Total, 1000);
    let (svc, store) = budget(limits([total]));
    let events = [
        (
            "message_start",
            r#"{"type":"message_start","message":{"id":"m","type":"message","role":"assistant","content":[],"model":"c","usage":{"input_tokens":25,"output_tokens":1}}}"#,
        ),
        (
            "content_block_start",
            r#"{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}"#,
        ),
        (
            "content_block_delta",
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}"#,
        ),
        (
            "content_block_stop",
            r#"{"type":"content_block_stop","index":0}"#,
        ),
        (
            "message_delta",
            r#"{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":7}}"#,
        ),
        ("message_stop", r#"{"type":"message_stop"}"#),
    ];
    let steps = events.map(|(name, json)| data(format!("event: {name}\ndata: {json}\n\n")));
    let facts = RequestFacts::new()
        .with_prompt_bytes(400)
        .with_max_tokens(300);
    let req = request(Some("acme"), "/v1/messages", facts, Plan::sse(steps));
    let res = svc.oneshot(req).await.unwrap();
    // 100 estimated from 400 bytes, 300 of output.
    assert_eq!(store.available("acme", &total), 600);
    read_all(res.into_body()).await;
    assert_eq!(store.available("acme", &total), 1000 - 25 - 7);
}

#[tokio::test(start_paused = true)]
async fn use_beyond_the_reservation_is_taken_as_far_as_the_bucket_holds() {
    let (svc, store) = budget(limits([per_minute()]));
    let mut steps = tokens(1);
    steps.insert(1, usage(1, 70));
    let res = svc
        .clone()
        .oneshot(chat(50, Plan::sse(steps)))
        .await
        .unwrap();
    read_all(res.into_body()).await;
    assert_eq!(store.available("acme", &per_minute()), 30);
    let mut steps = tokens(1);
    steps.insert(1, usage(1, 500));
    let res = svc.oneshot(chat(10, Plan::sse(steps))).await.unwrap();
    read_all(res.into_body()).await;
    // Never below zero: the bucket refills from nothing.
    assert_eq!(store.available("acme", &per_minute()), 0);
    tokio::time::advance(Duration::from_millis(600)).await;
    assert_eq!(store.available("acme", &per_minute()), 1);
}

#[tokio::test(start_paused = true)]
async fn behind_an_inner_reader_the_layer_follows_its_record() {
    let store = LocalStore::new();
    let layer = limits([per_minute()]).with_store(store.clone());
    let inner = tailguard_timeout::SseIdleTimeoutLayer::new().with_idle_timeout(secs(30));
    let svc = TokenBudget::new(tower::Layer::layer(&inner, upstream()), &layer);

    let mut steps = tokens(3);
    steps.insert(3, usage(11, 4));
    let res = svc
        .clone()
        .oneshot(chat(80, Plan::sse(steps)))
        .await
        .unwrap();
    read_all(res.into_body()).await;
    assert_eq!(store.available("acme", &per_minute()), 96);

    let mut steps = tokens(2);
    steps.pop();
    steps.extend([tailguard_test_support::wait_ms(1000), data(token("late"))]);
    let res = svc.oneshot(chat(50, Plan::sse(steps))).await.unwrap();
    let mut body = Box::pin(res.into_body());
    body.frame().await.unwrap().unwrap();
    drop(body);
    assert_eq!(store.available("acme", &per_minute()), 95);
}

/// A store that answers later: the local one, 5 ms late.
#[derive(Clone, Debug)]
struct Remote(LocalStore);

impl Store for Remote {
    fn reserve(&self, tenant: &Tenant, limits: &[Limit], want: Tokens) -> Reply {
        let (store, tenant, limits) = (self.0.clone(), tenant.clone(), limits.to_vec());
        Reply::Later(Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(5)).await;
            store.reserve(&tenant, &limits, want).await
        }))
    }

    fn reconcile(&self, t: &Tenant, l: &[Limit], ticket: Ticket, reserved: Tokens, used: Tokens) {
        self.0.reconcile(t, l, ticket, reserved, used);
    }
}

#[tokio::test(start_paused = true)]
async fn a_store_that_answers_later_is_waited_for() {
    let local = LocalStore::new();
    let layer = TokenBudgetLayer::new()
        .with_default_limits([per_minute()])
        .with_store(Remote(local.clone()));
    let svc = TokenBudget::new(upstream(), &layer);
    let start = tokio::time::Instant::now();
    let res = svc
        .clone()
        .oneshot(chat(80, Plan::sse(tokens(2))))
        .await
        .unwrap();
    assert_eq!(start.elapsed(), Duration::from_millis(5));
    read_all(res.into_body()).await;
    assert_eq!(local.available("acme", &per_minute()), 98);
    let res = svc.oneshot(chat(99, Plan::open())).await.unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(matches!(
        Remote(local)
            .reserve(&Tenant::new("acme"), &[per_minute()], Tokens::new(0, 98))
            .await,
        Decision::Reserved(_)
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_requests_never_take_more_than_the_budget() {
    // A day's limit: what refills during the race is a fraction of a token.
    let day = Limit::per_day(Kind::Output, 1000);
    let (svc, store) = budget(limits([day]));
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(50));
    let tasks: Vec<_> = (0..50)
        .map(|_| {
            let (svc, barrier) = (svc.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                svc.oneshot(chat(100, Plan::open())).await.unwrap()
            })
        })
        .collect();
    let mut held = Vec::new();
    for t in tasks {
        held.push(t.await.unwrap());
    }
    let admitted = held.iter().filter(|r| r.status() == StatusCode::OK).count();
    assert_eq!(admitted, 10);
    assert_eq!(store.available("acme", &day), 0);
    drop(held);
    assert_eq!(store.available("acme", &day), 1000);
}

#[tokio::test(start_paused = true)]
async fn a_body_error_settles_what_passed_before_it_once() {
    let (svc, store) = budget(limits([per_minute()]));
    let steps = [
        data(token("a")),
        data(token("b")),
        tailguard_test_support::Step::Error,
    ];
    let res = svc.oneshot(chat(80, Plan::sse(steps))).await.unwrap();
    let mut body = res.into_body();
    body.frame().await.unwrap().unwrap();
    body.frame().await.unwrap().unwrap();
    assert!(body.frame().await.unwrap().is_err());
    assert!(!body.holds_reservation());
    assert_eq!(store.available("acme", &per_minute()), 98);
    drop(body);
    assert_eq!(store.available("acme", &per_minute()), 98);
}

#[tokio::test(start_paused = true)]
async fn a_grpc_request_over_budget_gets_a_trailers_only_resource_exhausted() {
    let (svc, _store) = budget(limits([per_minute()]));
    let mut req = chat(500, Plan::open());
    req.headers_mut()
        .insert("content-type", "application/grpc".parse().unwrap());
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(res.headers()["content-type"], "application/grpc");
    assert_eq!(res.headers()["grpc-status"], "8");
    let message = res.headers()["grpc-message"].to_str().unwrap();
    assert!(message.starts_with("token budget exceeded"), "{message}");
}

#[tokio::test(start_paused = true)]
async fn a_trailers_only_grpc_error_charges_not_even_the_prompt() {
    let input = Limit::per_minute(Kind::Input, 100);
    let (svc, store) = budget(limits([input]));
    let mut trailers_only = Plan::sse([]).with_status(StatusCode::OK, "application/grpc");
    trailers_only.headers.push(("grpc-status", "14"));
    let facts = RequestFacts::new().with_prompt_tokens(30);
    let req = request(
        Some("acme"),
        "/gen.Generator/Stream",
        facts.clone(),
        trailers_only,
    );
    let res = svc.clone().oneshot(req).await.unwrap();
    assert!(!res.body().holds_reservation());
    assert_eq!(store.available("acme", &input), 100);
    // An empty 2xx answer that is no error is charged its prompt.
    let empty = Plan::sse([]).with_status(StatusCode::OK, "application/grpc");
    let req = request(Some("acme"), "/gen.Generator/Stream", facts, empty);
    svc.oneshot(req).await.unwrap();
    assert_eq!(store.available("acme", &input), 70);
}
