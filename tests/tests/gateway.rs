//! The gateway (`tailguard_gateway`) end to end, in-process over loopback:
//! embedded mock replicas, the whole tailguard stack, the axum routes, configuration errors and
//! graceful shutdown. Timing tests run on a paused clock (the mock and the gateway both use
//! tokio's clock).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use tailguard_gateway::{Args, Config, Gateway, HedgeDelaySetting, MOCK_MODEL};
use tailguard_test_support::{client, ms};
use tokio::time::Instant;

const CHAT: &str =
    r#"{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"Hello!"}]}"#;
const SCRIPT: &str = "ttft=10ms,tokens=8,gap=2ms";
/// The mock's text for eight tokens.
const EIGHT_TOKENS: &str = "Hello there, this is a mock reply";

fn test_config() -> Config {
    let mut c = Config::resolve(Default::default(), &Args::default()).unwrap();
    c.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    c.mock.replicas = 2;
    c.mock.script = SCRIPT.into();
    c.mock.congested_script = "ttft=3s,tokens=8,gap=2ms".into();
    c.hedge.delay = HedgeDelaySetting::Fixed(ms(50));
    c
}

fn post(gw: &Gateway, path: &str, body: &str, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    tailguard_test_support::post(&format!("http://{}{path}", gw.addr()), body, headers)
}

async fn text(res: Response<hyper::body::Incoming>) -> String {
    String::from_utf8(res.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

/// The concatenated `delta.content` of an OpenAI chat stream.
fn content(sse: &str) -> String {
    sse.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter(|d| *d != "[DONE]")
        .filter_map(|d| serde_json::from_str::<serde_json::Value>(d).ok())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn streams_the_upstreams_tokens_with_request_id_and_hedge_header() {
    let gw = Gateway::start(test_config()).await.unwrap();
    let started = Instant::now();
    let res = client()
        .request(post(
            &gw,
            "/v1/chat/completions",
            CHAT,
            &[("x-mock-script", SCRIPT)],
        ))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(res.headers().contains_key("x-request-id"));
    assert_eq!(res.headers()["x-tailguard-hedge"], "attempts=1; winner=0");
    let body = text(res).await;
    assert_eq!(content(&body), EIGHT_TOKENS);
    assert!(body.ends_with("data: [DONE]\n\n"));
    assert_eq!(started.elapsed(), ms(10 + 7 * 2));
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_slow_primary_is_hedged_to_the_other_replica() {
    let gw = Gateway::start(test_config()).await.unwrap();
    let started = Instant::now();
    let headers = [("x-mock-script", SCRIPT), ("x-mock-script-0", "ttft=3s")];
    let res = client()
        .request(post(&gw, "/v1/chat/completions", CHAT, &headers))
        .await
        .unwrap();
    assert_eq!(res.headers()["x-tailguard-hedge"], "attempts=2; winner=1");
    // Headers once the backup's first token arrived: the hedge delay, then its TTFT.
    assert_eq!(started.elapsed(), ms(50 + 10));
    let body = text(res).await;
    assert_eq!(content(&body), EIGHT_TOKENS);
    assert_eq!(body.matches("\"role\"").count(), 1, "one clean stream");
    // The losing primary was cancelled upstream.
    for m in gw.mocks() {
        m.wait_idle().await;
    }
    let cancelled: u64 = gw.mocks().iter().map(|m| m.stats().cancelled).sum();
    assert_eq!(cancelled, 1);
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_idle_stream_ends_in_band() {
    let mut config = test_config();
    config.timeout.idle = Some(ms(200));
    let gw = Gateway::start(config).await.unwrap();
    let script = format!("{SCRIPT},stall_after=3,keepalive=20ms");
    let res = client()
        .request(post(
            &gw,
            "/v1/chat/completions",
            CHAT,
            &[("x-mock-script", &script)],
        ))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = text(res).await;
    assert_eq!(content(&body), "Hello there,");
    assert!(body.contains(r#""code":"idle_timeout""#), "{body}");
    assert!(body.ends_with("data: [DONE]\n\n"));
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_full_gateway_refuses_with_429_and_retry_after() {
    let mut config = test_config();
    config.admission.capacity = 1;
    config.admission.queue_len = 0;
    let gw = Gateway::start(config).await.unwrap();
    let c = client();
    let slow = [("x-mock-script", "ttft=10ms,tokens=100,gap=100ms")];
    let held = c
        .request(post(&gw, "/v1/chat/completions", CHAT, &slow))
        .await
        .unwrap();
    let res = c
        .request(post(&gw, "/v1/chat/completions", CHAT, &[]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(res.headers().contains_key("retry-after"));
    let body = text(res).await;
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "queue_full");
    drop(held);
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_ends_a_stalled_stream_in_band_after_the_grace_period() {
    let mut config = test_config();
    config.shutdown_grace = ms(1000);
    config.timeout.idle = None;
    let gw = Gateway::start(config).await.unwrap();
    let addr = gw.addr();
    let script = format!("{SCRIPT},stall_after=2");
    let res = client()
        .request(post(
            &gw,
            "/v1/chat/completions",
            CHAT,
            &[("x-mock-script", &script)],
        ))
        .await
        .unwrap();
    let mut body = res.into_body();
    let mut seen = String::new();
    while !seen.contains("\" there\"") {
        let f = body.frame().await.unwrap().unwrap().into_data().unwrap();
        seen.push_str(std::str::from_utf8(&f).unwrap());
    }
    let stop = Instant::now();
    let shutdown = tokio::spawn(gw.shutdown());
    // Give the server a moment to close its listener, then a new connection is refused.
    tokio::time::sleep(ms(10)).await;
    assert!(
        client()
            .request(
                Request::get(format!("http://{addr}/healthz"))
                    .body(Full::default())
                    .unwrap()
            )
            .await
            .is_err()
    );
    let rest = body.collect().await.unwrap().to_bytes();
    let rest = std::str::from_utf8(&rest).unwrap();
    assert_eq!(
        stop.elapsed(),
        ms(1000),
        "ended when the grace period was over"
    );
    assert!(rest.starts_with("data: {\"error\":"), "{rest}");
    assert!(rest.contains(r#""code":"shutdown""#), "{rest}");
    assert!(rest.ends_with("data: [DONE]\n\n"));
    shutdown.await.unwrap().unwrap();
}

#[tokio::test(start_paused = true)]
async fn graceful_shutdown_lets_a_stream_finish_within_the_grace_period() {
    let mut config = test_config();
    config.shutdown_grace = ms(5000);
    let gw = Gateway::start(config).await.unwrap();
    let res = client()
        .request(post(
            &gw,
            "/v1/chat/completions",
            CHAT,
            &[("x-mock-script", "ttft=10ms,tokens=8,gap=100ms")],
        ))
        .await
        .unwrap();
    let stop = Instant::now();
    let shutdown = tokio::spawn(gw.shutdown());
    let body = text(res).await;
    assert_eq!(content(&body), EIGHT_TOKENS);
    assert!(!body.contains("error"));
    shutdown.await.unwrap().unwrap();
    assert!(
        stop.elapsed() < ms(5000),
        "shutdown did not wait for the grace period"
    );
}

#[tokio::test(start_paused = true)]
async fn completions_non_streamed_models_health_and_metrics() {
    let gw = Gateway::start(test_config()).await.unwrap();
    let c = client();
    // Streamed completions.
    let res = c
        .request(post(
            &gw,
            "/v1/completions",
            r#"{"model":"mock-llm","prompt":"Hi","stream":true}"#,
            &[("x-mock-script", SCRIPT)],
        ))
        .await
        .unwrap();
    let body = text(res).await;
    assert!(body.contains(r#""text":"Hello""#), "{body}");
    // A non-streamed chat completion is not hedged (RequestFacts says stream: false).
    let res = c
        .request(post(
            &gw,
            "/v1/chat/completions",
            r#"{"model":"mock-llm","messages":[{"role":"user","content":"Hi"}]}"#,
            &[("x-mock-script", SCRIPT)],
        ))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    assert!(!res.headers().contains_key("x-tailguard-hedge"));
    let v: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], EIGHT_TOKENS);

    let get = |path: &str| {
        Request::get(format!("http://{}{path}", gw.addr()))
            .body(Full::default())
            .unwrap()
    };
    let models = text(c.request(get("/v1/models")).await.unwrap()).await;
    let v: serde_json::Value = serde_json::from_str(&models).unwrap();
    assert_eq!(v["data"][0]["id"], MOCK_MODEL);
    let health = c.request(get("/healthz")).await.unwrap();
    assert_eq!(health.status(), StatusCode::OK);

    let metrics = c.request(get("/metrics")).await.unwrap();
    assert!(
        metrics.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain")
    );
    let metrics = text(metrics).await;
    // Real histograms, with the recorder's bucket boundaries, and the bounded labels.
    for needle in [
        "# TYPE tailguard_time_to_first_token_seconds histogram",
        "tailguard_time_to_first_token_seconds_bucket{",
        "le=\"0.001\"",
        "# TYPE tailguard_request_duration_seconds histogram",
        "route=\"/v1/completions\"",
        "model=\"mock-llm\"",
        "priority=\"standard\"",
        "end_reason=\"completed\"",
    ] {
        assert!(
            metrics.contains(needle),
            "{needle} missing from:\n{metrics}"
        );
    }
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn bad_requests_get_openai_errors() {
    let mut config = test_config();
    config.max_request_bytes = 256;
    let gw = Gateway::start(config).await.unwrap();
    let c = client();
    for (body, status, code) in [
        ("{not json", StatusCode::BAD_REQUEST, "invalid_json"),
        ("[1,2]", StatusCode::BAD_REQUEST, "invalid_json"),
        (
            &"x".repeat(1000),
            StatusCode::PAYLOAD_TOO_LARGE,
            "request_too_large",
        ),
    ] {
        let res = c
            .request(post(&gw, "/v1/chat/completions", body, &[]))
            .await
            .unwrap();
        assert_eq!(res.status(), status);
        let v: serde_json::Value = serde_json::from_str(&text(res).await).unwrap();
        assert_eq!(v["error"]["code"], code);
    }
    // Nothing reached an upstream.
    assert_eq!(
        gw.mocks().iter().map(|m| m.stats().requests).sum::<u64>(),
        0
    );
    gw.shutdown().await.unwrap();
}

#[test]
fn configuration_errors_name_the_bad_key() {
    let e = Config::parse_file("[timeout]\nidel = \"5s\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("unknown field `idel`") && e.contains("`idle`"),
        "{e}"
    );
    let e = Config::parse_file("[hedge]\ndelay = \"soon\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("delay = \"soon\"") && e.contains("adaptive"),
        "{e}"
    );
    let e = Config::parse_file("listen = 8080\n")
        .unwrap_err()
        .to_string();
    assert!(e.contains("listen"), "{e}");

    let resolve = |toml: &str| {
        Config::resolve(Config::parse_file(toml).unwrap(), &Args::default())
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    assert!(resolve("[admission]\ncapacity = 0").contains("admission.capacity"));
    assert!(resolve("[priority]\ndefault = \"urgent\"").contains("priority.default"));
    assert!(resolve("upstreams = [\"ftp://x\"]").contains("upstreams"));
    assert!(resolve("[hedge]\nmax_attempts = 9").contains("hedge.max_attempts"));
    assert!(resolve("[mock]\nscript = \"ttft=fast\"").contains("mock.script"));
    assert!(resolve("[timeout]\nidle = \"0ms\"").contains("timeout.idle"));
}

#[test]
fn flags_and_environment_override_the_file_which_overrides_defaults() {
    use clap::Parser;
    let file = "[timeout]\nidle = \"5s\"\nfirst_token = \"off\"\n[admission]\ncapacity = 8\n";
    let args = Args::try_parse_from(["gateway", "--timeout-idle", "7s"]).unwrap();
    let c = Config::resolve(Config::parse_file(file).unwrap(), &args).unwrap();
    assert_eq!(c.timeout.idle, Some(Duration::from_secs(7))); // flag over file
    assert_eq!(c.timeout.first_token, None); // file over default
    assert_eq!(c.admission.capacity, 8);
    assert_eq!(c.timeout.total, Some(Duration::from_secs(600))); // default
    assert_eq!(c.listen, SocketAddr::from(([127, 0, 0, 1], 8080)));
    let args = Args::try_parse_from([
        "gateway",
        "--upstream",
        "http://127.0.0.1:9001",
        "--upstream",
        "http://127.0.0.1:9002/",
    ])
    .unwrap();
    let c = Config::resolve(Default::default(), &args).unwrap();
    assert_eq!(c.upstreams.len(), 2);
    assert!(c.models.is_empty(), "no mock model with real upstreams");
    let bad = Args::try_parse_from(["gateway", "--timeout-idle", "5 parsecs"]).unwrap_err();
    assert!(bad.to_string().contains("--timeout-idle"), "{bad}");
}

#[tokio::test(start_paused = true)]
async fn real_upstreams_by_url_and_their_model_list() {
    let upstreams = tailguard_mock::MockServer::start_replicas(
        2,
        tailguard_mock::Script::new().apply(SCRIPT).unwrap(),
    )
    .await
    .unwrap();
    let mut config = test_config();
    config.models.clear();
    config.upstreams = upstreams.iter().map(|m| m.url().parse().unwrap()).collect();
    let gw = Gateway::start(config).await.unwrap();
    assert!(
        gw.mocks().is_empty(),
        "no embedded mocks with upstreams configured"
    );
    let c = client();
    for _ in 0..2 {
        let res = c
            .request(post(&gw, "/v1/chat/completions", CHAT, &[]))
            .await
            .unwrap();
        assert_eq!(content(&text(res).await), EIGHT_TOKENS);
    }
    // Round robin: one request each.
    assert!(upstreams.iter().all(|m| m.stats().requests == 1));
    // No model configured: the first upstream's own list.
    let models = c
        .request(
            Request::get(format!("http://{}/v1/models", gw.addr()))
                .body(Full::default())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(models.status(), StatusCode::OK);
    let v: serde_json::Value = serde_json::from_str(&text(models).await).unwrap();
    assert_eq!(v["object"], "list");
    assert!(v["data"][0]["id"].is_string());
    gw.shutdown().await.unwrap();
    for m in upstreams {
        m.shutdown().await;
    }
}
