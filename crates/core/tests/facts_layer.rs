//! `RequestFactsLayer` over an in-process service: facts in the extensions, the body handed on
//! replayable and whole, OpenAI-shaped refusals without calling the inner service.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tailguard_core::{AnswerBody, ReplayBody, RequestFacts, RequestFactsLayer};
use tailguard_test_support::{ScriptBody, Step, data};
use tower::{Layer, ServiceExt, service_fn};

/// What the inner service saw: the facts, the body's bytes, whether it was replayable.
type Seen = Arc<Mutex<Vec<(Option<RequestFacts>, Bytes, bool)>>>;

async fn call(
    layer: RequestFactsLayer,
    req: Request<ScriptBody>,
) -> (
    Response<AnswerBody<Full<Bytes>>>,
    Vec<(Option<RequestFacts>, Bytes, bool)>,
) {
    let seen = Seen::default();
    let log = seen.clone();
    let inner = service_fn(move |req: Request<ReplayBody<ScriptBody>>| {
        let log = log.clone();
        async move {
            let facts = req.extensions().get::<RequestFacts>().cloned();
            let body = req.into_body();
            let replayable = body.try_clone().is_some();
            let bytes = body.collect().await.unwrap().to_bytes();
            log.lock().unwrap().push((facts, bytes, replayable));
            Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
        }
    });
    let res = layer.layer(inner).oneshot(req).await.unwrap();
    let seen = seen.lock().unwrap().clone();
    (res, seen)
}

fn post(content_type: Option<&str>, steps: Vec<Step>) -> Request<ScriptBody> {
    let mut b = Request::post("/v1/chat/completions");
    if let Some(ct) = content_type {
        b = b.header("content-type", ct);
    }
    b.body(ScriptBody::new(steps)).unwrap()
}

async fn error_code(res: Response<AnswerBody<Full<Bytes>>>) -> String {
    assert_eq!(res.headers()["content-type"], "application/json");
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    v["error"]["code"].as_str().unwrap().to_owned()
}

#[tokio::test]
async fn a_body_in_frames_is_read_once_and_handed_on_whole_and_replayable() {
    let json = r#"{"model":"gpt-4o","stream":true,"max_tokens":7,"messages":[{"role":"user","content":"Hello"}]}"#;
    let (a, b) = json.split_at(20);
    let req = post(
        Some("application/json; charset=utf-8"),
        vec![data(a), data(b)],
    );
    let (res, seen) = call(RequestFactsLayer::new(), req).await;
    assert_eq!(res.status(), StatusCode::OK);
    let (facts, bytes, replayable) = &seen[0];
    let facts = facts.as_ref().unwrap();
    assert_eq!(facts.model.as_deref(), Some("gpt-4o"));
    assert_eq!(
        (facts.stream, facts.max_tokens, facts.prompt_bytes),
        (Some(true), Some(7), Some(5))
    );
    assert_eq!(bytes.as_ref(), json.as_bytes());
    assert!(replayable);
}

#[tokio::test]
async fn malformed_json_is_a_400_and_the_inner_service_is_not_called() {
    for body in ["{not json", "[1,2]", r#"{"stream":"yes"}"#] {
        let (res, seen) = call(RequestFactsLayer::new(), post(None, vec![data(body)])).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{body}");
        assert_eq!(error_code(res).await, "invalid_json");
        assert!(seen.is_empty());
    }
}

#[tokio::test]
async fn a_body_over_the_limit_is_a_413_and_a_broken_one_a_400() {
    let layer = RequestFactsLayer::new().with_max_body(8);
    let (res, seen) = call(layer, post(None, vec![data(r#"{"model":"long-name"}"#)])).await;
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(error_code(res).await, "request_too_large");
    assert!(seen.is_empty());

    let (res, seen) = call(
        RequestFactsLayer::new(),
        post(None, vec![data("{"), Step::Error]),
    )
    .await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(error_code(res).await, "bad_body");
    assert!(seen.is_empty());
}

#[tokio::test]
async fn other_content_types_and_empty_bodies_pass_on_without_facts() {
    let (res, seen) = call(
        RequestFactsLayer::new(),
        post(Some("text/plain"), vec![data("{x")]),
    )
    .await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(seen[0].0, None);
    assert_eq!(seen[0].1.as_ref(), b"{x");
    assert!(!seen[0].2, "passed on unread, so not replayable");

    let (res, seen) = call(RequestFactsLayer::new(), post(None, vec![])).await;
    assert_eq!(res.status(), StatusCode::OK);
    assert_eq!(
        (seen[0].0.clone(), seen[0].1.len(), seen[0].2),
        (None, 0, true)
    );

    let ct = "application/vnd.api+json";
    let (_, seen) = call(
        RequestFactsLayer::new(),
        post(Some(ct), vec![data(r#"{"model":"m"}"#)]),
    )
    .await;
    assert_eq!(seen[0].0.as_ref().unwrap().model.as_deref(), Some("m"));
}
