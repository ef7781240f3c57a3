//! The gateway's routes beyond chat completions, in-process over loopback: Anthropic's
//! `/v1/messages` and OpenAI's `/v1/responses` hedged in their own dialects, and every other
//! `/v1/*` request passed through un-hedged with the route label `other`.

use std::net::SocketAddr;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tailguard_gateway::{Args, Config, Gateway, HedgeDelaySetting};
use tailguard_test_support::{client, ms};
use tokio::time::Instant;

const SCRIPT: &str = "ttft=10ms,tokens=8,gap=2ms";
/// The mock's text for eight tokens.
const EIGHT_TOKENS: &str = "Hello there, this is a mock reply";

fn test_config() -> Config {
    let mut c = Config::resolve(Default::default(), &Args::default()).unwrap();
    c.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    c.mock.replicas = 2;
    c.mock.script = SCRIPT.into();
    c.mock.congested_script = SCRIPT.into();
    c.hedge.delay = HedgeDelaySetting::Fixed(ms(50));
    // Every request here may be hedged (the default budget starts with one token).
    c.hedge.budget_ratio = 1.0;
    c
}

fn request(
    gw: &Gateway,
    method: &str,
    path: &str,
    body: &str,
    headers: &[(&str, &str)],
) -> Request<Full<Bytes>> {
    let mut b = Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", gw.addr()));
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(Full::new(Bytes::copy_from_slice(body.as_bytes())))
        .unwrap()
}

async fn text(res: Response<hyper::body::Incoming>) -> String {
    String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

/// The `data:` JSON of every event named `name`.
fn data_of(sse: &str, name: &str) -> Vec<serde_json::Value> {
    sse.split("\n\n")
        .filter(|e| e.lines().next() == Some(&format!("event: {name}")))
        .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

#[tokio::test(start_paused = true)]
async fn messages_and_responses_are_hedged_in_their_own_dialects() {
    let gw = Gateway::start(test_config()).await.unwrap();
    let cases = [
        (
            "/v1/messages",
            r#"{"model":"mock-llm","max_tokens":64,"stream":true,"messages":[{"role":"user","content":"Hi"}]}"#,
            "content_block_delta",
            "/delta/text",
            "message_stop",
        ),
        (
            "/v1/responses",
            r#"{"model":"mock-llm","stream":true,"input":"Hi"}"#,
            "response.output_text.delta",
            "/delta",
            "response.completed",
        ),
    ];
    for (path, body, token, text_at, last) in cases {
        let started = Instant::now();
        let headers = [("x-mock-script", SCRIPT), ("x-mock-script-0", "ttft=3s")];
        let res = client()
            .request(request(&gw, "POST", path, body, &headers))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        assert_eq!(
            res.headers()["x-tailguard-hedge"],
            "attempts=2; winner=1",
            "{path}"
        );
        assert_eq!(
            started.elapsed(),
            ms(50 + 10),
            "{path}: the backup's first token"
        );
        let sse = text(res).await;
        let got: String = data_of(&sse, token)
            .iter()
            .map(|v| v.pointer(text_at).unwrap().as_str().unwrap().to_owned())
            .collect();
        assert_eq!(got, EIGHT_TOKENS, "{path}");
        assert!(sse.starts_with("event: "), "{path}: one clean stream");
        assert_eq!(data_of(&sse, last).len(), 1, "{path}");
        assert!(sse.ends_with("\n\n") && sse.contains(&format!("event: {last}\n")));
    }
    let metrics = text(
        client()
            .request(request(&gw, "GET", "/metrics", "", &[]))
            .await
            .unwrap(),
    )
    .await;
    for route in ["/v1/messages", "/v1/responses"] {
        let needle = format!("tailguard_requests_total{{route=\"{route}\",model=\"mock-llm\"");
        assert!(
            metrics.contains(&needle),
            "{needle} missing from:\n{metrics}"
        );
    }
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn other_v1_requests_pass_through_unhedged_as_route_other() {
    let gw = Gateway::start(test_config()).await.unwrap();
    // A slow primary would be hedged on an LLM route; here the one attempt is the answer.
    let slow = [
        ("x-mock-script-0", "ttft=3s"),
        ("content-type", "application/json"),
    ];
    let multipart = [("content-type", "multipart/form-data; boundary=x")];
    for (method, path, body, headers) in [
        (
            "POST",
            "/v1/embeddings",
            r#"{"model":"mock-llm","input":"Hi"}"#,
            &slow[..],
        ),
        ("POST", "/v1/files", "--x--", &multipart[..]),
        ("GET", "/v1/files/file-1", "", &[][..]),
        ("DELETE", "/v1/batches/b-1", "", &[][..]),
    ] {
        let res = client()
            .request(request(&gw, method, path, body, headers))
            .await
            .unwrap();
        // The mock has none of these routes: its own 404 comes back, not a 415 or a 405.
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{method} {path}");
        assert!(
            !res.headers().contains_key("x-tailguard-hedge"),
            "{method} {path}"
        );
        assert!(res.headers().contains_key("x-request-id"));
        let v: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
        assert_eq!(v["error"]["message"], "no such route");
    }
    let sent: u64 = gw.mocks().iter().map(|m| m.stats().requests).sum();
    assert_eq!(sent, 4, "one attempt each");
    let metrics = text(
        client()
            .request(request(&gw, "GET", "/metrics", "", &[]))
            .await
            .unwrap(),
    )
    .await;
    assert!(metrics.contains("route=\"other\""), "{metrics}");
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn the_llm_routes_answer_malformed_json_with_a_400_before_any_upstream() {
    let gw = Gateway::start(test_config()).await.unwrap();
    for path in ["/v1/messages", "/v1/responses"] {
        let res = client()
            .request(request(&gw, "POST", path, "{not json", &[]))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{path}");
        let v: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
        assert_eq!(v["error"]["code"], "invalid_json");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    assert_eq!(
        gw.mocks().iter().map(|m| m.stats().requests).sum::<u64>(),
        0
    );
    gw.shutdown().await.unwrap();
}

/// Issue 30: dot segments (plain and percent-encoded) and doubled slashes are resolved before
/// routing, so a path that climbs out of `/v1/*` is routed as what it resolves to (a 404 here)
/// and never reaches an upstream; one that resolves to an LLM route is served as that route.
#[tokio::test(start_paused = true)]
async fn dot_segments_are_resolved_before_routing() {
    let gw = Gateway::start(test_config()).await.unwrap();
    let json = [("content-type", "application/json")];
    for path in [
        "/v1/models/../../admin",
        "/v1/models/%2e%2e/%2E%2E/admin",
        "/v1/chat/completions/../../..//admin",
    ] {
        let res = client()
            .request(request(&gw, "POST", path, "{}", &json))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{path}");
    }
    assert_eq!(
        gw.mocks().iter().map(|m| m.stats().requests).sum::<u64>(),
        0,
        "nothing reached an upstream"
    );
    let body = r#"{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"Hi"}]}"#;
    let res = client()
        .request(request(&gw, "POST", "/v1/./chat//completions", body, &json))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(text(res).await.ends_with("data: [DONE]\n\n"));
    gw.shutdown().await.unwrap();
}

/// Issue 30: a request body the route cannot serve (empty, or without the prompt member its
/// API needs) is answered 400 and never reaches an upstream.
#[tokio::test(start_paused = true)]
async fn bodies_without_what_the_route_needs_get_a_400_before_any_upstream() {
    let gw = Gateway::start(test_config()).await.unwrap();
    let json = [("content-type", "application/json")];
    for (path, body, member) in [
        ("/v1/chat/completions", "", "messages"),
        (
            "/v1/chat/completions",
            r#"{"model":"mock-llm","stream":true}"#,
            "messages",
        ),
        (
            "/v1/chat/completions",
            r#"{"model":"mock-llm","messages":null}"#,
            "messages",
        ),
        (
            "/v1/completions",
            r#"{"model":"mock-llm","stream":true}"#,
            "prompt",
        ),
        (
            "/v1/messages",
            r#"{"model":"mock-llm","max_tokens":8}"#,
            "messages",
        ),
    ] {
        let res = client()
            .request(request(&gw, "POST", path, body, &json))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{path} {body}");
        let v: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
        assert_eq!(v["error"]["code"], "missing_required_parameter");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(&format!("`{member}`")), "{message}");
    }
    assert_eq!(
        gw.mocks().iter().map(|m| m.stats().requests).sum::<u64>(),
        0
    );
    gw.shutdown().await.unwrap();
}
