//! One request: route, script, body, then a streamed or a whole response.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use http::header::{CACHE_CONTROL, CONTENT_TYPE, HeaderValue, RETRY_AFTER};
use http::{HeaderMap, Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use tailguard_core::render::retry_after_secs;
use tokio::time::sleep;

use crate::body::MockBody;
use crate::continuation::{self, NotAPrefix};
use crate::grpc::{GENERATE_PATH, decode_request};
use crate::latency::MAX_LATENCY;
use crate::producer::{self, Job};
use crate::rng::{SplitMix64, mix};
use crate::script::{Reset, Script};
use crate::server::Inner;
use crate::stats::{Outcome, RequestGuard};
use crate::wire::{self, Api, Ctx};

/// Header whose value (in the [`Script::apply`] syntax) overrides the replica's script for one
/// request.
pub const SCRIPT_HEADER: &str = "x-mock-script";

/// Prefix of per-attempt script headers: `x-mock-script-<attempt>` applies (after
/// [`SCRIPT_HEADER`]) when the request's [`ATTEMPT_HEADER`] equals `<attempt>`, so one request
/// that a hedging layer sends twice can act differently per attempt.
pub const ATTEMPT_SCRIPT_HEADER_PREFIX: &str = "x-mock-script-";

/// Header carrying the attempt number, recorded in [`RequestRecord::attempt`](crate::RequestRecord).
pub const ATTEMPT_HEADER: &str = "x-tailguard-attempt";

/// Largest request body the mock reads (1 MiB).
pub const MAX_REQUEST_BODY: usize = 1 << 20;

/// The error a handler fails with to break the connection before the head.
#[derive(Debug)]
pub(crate) struct ResetBeforeHeaders;

impl std::fmt::Display for ResetBeforeHeaders {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("mock upstream reset the connection before headers")
    }
}

impl std::error::Error for ResetBeforeHeaders {}

type Handled = Result<Response<MockBody>, ResetBeforeHeaders>;

fn simple(
    status: StatusCode,
    content_type: &'static str,
    body: Bytes,
    outcome: Outcome,
    guard: RequestGuard,
) -> Response<MockBody> {
    guard.headers_sent();
    let mut res = Response::new(MockBody::full(body, outcome, guard));
    *res.status_mut() = status;
    res.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    res
}

fn bad_request(status: StatusCode, msg: &str, guard: RequestGuard) -> Response<MockBody> {
    let body = serde_json::json!({"error": {"message": msg, "type": "invalid_request_error",
        "param": null, "code": null}});
    simple(
        status,
        "application/json",
        Bytes::from(body.to_string()),
        Outcome::BadRequest(status.as_u16()),
        guard,
    )
}

/// Serves one request; `abort` is the connection's RST flag.
pub(crate) async fn handle(
    inner: Arc<Inner>,
    abort: Arc<AtomicBool>,
    req: Request<Incoming>,
) -> Handled {
    let attempt = req
        .headers()
        .get(ATTEMPT_HEADER)
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    let guard = inner
        .shared
        .begin(req.uri().path(), attempt.clone(), req.headers().clone());
    let api = match (req.method(), req.uri().path()) {
        (&Method::POST, "/v1/chat/completions") => Api::Chat,
        (&Method::POST, "/v1/completions") => Api::Completions,
        (&Method::POST, "/v1/messages" | "/anthropic/v1/messages") => Api::Anthropic,
        (&Method::POST, "/v1/responses") => Api::Responses,
        (&Method::POST, GENERATE_PATH) => Api::Grpc,
        (&Method::POST, "/api/generate") => Api::OllamaGenerate,
        (&Method::POST, "/api/chat") => Api::OllamaChat,
        (&Method::GET, "/v1/models") => return Ok(models(guard)),
        _ => return Ok(bad_request(StatusCode::NOT_FOUND, "no such route", guard)),
    };
    let script = match pick_script(&inner, req.headers(), attempt.as_deref()) {
        Ok(s) => s,
        Err(e) => return Ok(bad_request(StatusCode::BAD_REQUEST, &e, guard)),
    };
    // A TCP RST ends the whole connection: HTTP/1.1 only.
    let abort = (req.version() < Version::HTTP_2).then_some(abort);
    let body = match Limited::new(req.into_body(), MAX_REQUEST_BODY)
        .collect()
        .await
    {
        Ok(b) => b.to_bytes(),
        Err(_) => {
            let msg = "request body unreadable or over 1 MiB";
            return Ok(bad_request(StatusCode::PAYLOAD_TOO_LARGE, msg, guard));
        }
    };
    guard.set_body(&body);
    let Some(params) = parse_params(api, &body, script.tokens) else {
        if api == Api::Grpc {
            let outcome = Outcome::BadRequest(400);
            return Ok(grpc_trailers_only(3, "bad GenerateRequest", outcome, guard));
        }
        let msg = "request body is not valid JSON";
        return Ok(bad_request(StatusCode::BAD_REQUEST, msg, guard));
    };
    generate(inner, api, script, params, guard, abort).await
}

fn models(guard: RequestGuard) -> Response<MockBody> {
    let body = serde_json::json!({"object": "list", "data": [{"id": "mock-model",
        "object": "model", "created": 1_796_053_661u64, "owned_by": "tailguard-mock"}]});
    let body = Bytes::from(body.to_string());
    simple(
        StatusCode::OK,
        "application/json",
        body,
        Outcome::Completed,
        guard,
    )
}

/// The replica's script (or the next queued one) with the request's overrides applied.
fn pick_script(
    inner: &Inner,
    headers: &HeaderMap,
    attempt: Option<&str>,
) -> Result<Script, String> {
    let queued = inner
        .queue
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .pop_front();
    let mut script = queued.unwrap_or_else(|| {
        inner
            .script
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    });
    let mut overrides = vec![headers.get(SCRIPT_HEADER)];
    if let Some(a) = attempt {
        overrides.push(headers.get(format!("{ATTEMPT_SCRIPT_HEADER_PREFIX}{a}").as_str()));
    }
    for value in overrides.into_iter().flatten() {
        let value = value
            .to_str()
            .map_err(|_| "script header is not ASCII".to_owned())?;
        script = script.apply(value).map_err(|e| e.to_string())?;
    }
    Ok(script)
}

/// A generation request, understood: act out its script.
async fn generate(
    inner: Arc<Inner>,
    api: Api,
    script: Script,
    params: Params,
    guard: RequestGuard,
    abort: Option<Arc<AtomicBool>>,
) -> Handled {
    let offset = match params.offset {
        Ok(k) => k,
        Err(NotAPrefix) => {
            let (body, outcome) = (continuation::error_body(api), Outcome::BadRequest(400));
            let status = StatusCode::BAD_REQUEST;
            return Ok(simple(status, "application/json", body, outcome, guard));
        }
    };
    if let Some(k) = offset {
        guard.continuation(k);
    }
    let offset = offset.unwrap_or(0);
    let index = guard.index();
    inner.latest.fetch_max(index, Ordering::Relaxed);
    let mut rng = SplitMix64::new(mix(script.seed, index));
    let tokens = continuation::token_count(script.tokens, params.max_tokens, offset);
    let ctx = context(api, index, &params, &script, tokens, offset);
    // Draw everything random up front, in a fixed order, so a request's behaviour depends only
    // on the seed and its index.
    let fail = script.status.is_some() && rng.next_f64() < script.status_fraction;
    let prefill = script
        .prefill_per_token
        .saturating_mul(u32::try_from(params.prompt_tokens).unwrap_or(u32::MAX));
    let ttft = script
        .ttft
        .sample(&mut rng)
        .saturating_add(prefill)
        .min(MAX_LATENCY);

    if !script.head_delay.is_zero() {
        sleep(script.head_delay).await;
    }
    if script.reset == Reset::BeforeHeaders {
        if let (true, Some(flag)) = (script.rst, &abort) {
            flag.store(true, Ordering::Relaxed);
        }
        let mut guard = guard;
        guard.finish(Outcome::ResetBeforeHeaders);
        return Err(ResetBeforeHeaders);
    }
    if let (true, Some(status)) = (fail, script.status) {
        return Ok(error_status(api, status, &script, guard));
    }
    let job = Job {
        ctx,
        script,
        tokens,
        ttft,
        rng,
    };
    // A scripted JSON reply answers a streamed request as a non-streamed one (gRPC has none).
    if !params.stream || (job.script.json_reply && api != Api::Grpc) {
        return non_streamed(&inner, job, guard, abort).await;
    }
    let (body, head) = producer::spawn(inner, job, guard, abort);
    // Until the producer lets the head go; if the client leaves meanwhile, hyper drops this
    // future and the body with it.
    let _ = head.await;
    body.headers_sent();
    let mut res = Response::new(body);
    let h = res.headers_mut();
    let content_type = match api {
        Api::Grpc => "application/grpc",
        Api::OllamaGenerate | Api::OllamaChat => "application/x-ndjson",
        _ => {
            h.insert(CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            "text/event-stream; charset=utf-8"
        }
    };
    h.insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    Ok(res)
}

fn context(
    api: Api,
    index: u64,
    params: &Params,
    script: &Script,
    tokens: u32,
    offset: u32,
) -> Ctx {
    let prefix = match api {
        Api::Chat => "chatcmpl",
        Api::Completions => "cmpl",
        Api::Anthropic => "msg",
        Api::Responses => "resp",
        Api::Grpc | Api::OllamaGenerate | Api::OllamaChat => "gen",
    };
    Ctx {
        api,
        id: format!("{prefix}-mock-{index}"),
        model: params.model.clone(),
        include_usage: params.include_usage,
        tool_calls: script.tool_calls && api == Api::Chat,
        prompt_tokens: params.prompt_tokens,
        truncated: tokens < script.tokens.saturating_sub(offset),
        offset,
    }
}

/// A scripted error status in the route's dialect.
fn error_status(
    api: Api,
    status: StatusCode,
    script: &Script,
    guard: RequestGuard,
) -> Response<MockBody> {
    let outcome = Outcome::Status(status.as_u16());
    if api == Api::Grpc {
        let code = wire::grpc_code_for(status);
        return grpc_trailers_only(code, "mock upstream error status", outcome, guard);
    }
    let body = wire::error_body(api, status);
    let mut res = simple(status, "application/json", body, outcome, guard);
    if let Some(after) = script.retry_after {
        res.headers_mut()
            .insert(RETRY_AFTER, HeaderValue::from(retry_after_secs(after)));
    }
    res
}

fn grpc_trailers_only(
    code: u16,
    message: &'static str,
    outcome: Outcome,
    guard: RequestGuard,
) -> Response<MockBody> {
    guard.headers_sent();
    // A trailers-only response: the status travels in the head, the body is empty.
    let mut res = Response::new(MockBody::full(Bytes::new(), outcome, guard));
    let h = res.headers_mut();
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    h.insert("grpc-status", HeaderValue::from(code));
    h.insert("grpc-message", HeaderValue::from_static(message));
    res
}

async fn non_streamed(
    inner: &Inner,
    job: Job,
    guard: RequestGuard,
    abort: Option<Arc<AtomicBool>>,
) -> Handled {
    let Job {
        ctx,
        script,
        tokens,
        ttft,
        mut rng,
    } = job;
    // The permit is held until the response is built; the handler future owns it, so a client
    // that goes away while waiting releases it.
    let _slot = if inner.takes_slot(&script) {
        inner.slot.clone().acquire().await
    } else {
        None
    };
    sleep(ttft).await;
    for i in 0..=tokens {
        if i > 0 && i < tokens {
            sleep(inner.decode_gap(script.gap.sample(&mut rng))).await;
        }
        if let Some((n, pause)) = script.stall_after
            && n == i
        {
            match pause {
                Some(p) => sleep(p).await,
                None => std::future::pending::<()>().await,
            }
        }
        if script.reset == Reset::AfterTokens(i) {
            // Breaking a non-streamed response before its head is the only reset it has.
            if let (true, Some(flag)) = (script.rst, &abort) {
                flag.store(true, Ordering::Relaxed);
            }
            let mut guard = guard;
            guard.finish(Outcome::ResetAfterTokens(i));
            return Err(ResetBeforeHeaders);
        }
        if script.error_event_after == Some(i) {
            let status = StatusCode::INTERNAL_SERVER_ERROR;
            let body = wire::error_body(ctx.api, status);
            let outcome = Outcome::ErrorEvent(i);
            return Ok(simple(status, "application/json", body, outcome, guard));
        }
        if i < tokens {
            guard.recorder().token();
        }
    }
    let content_type = match ctx.api {
        Api::Grpc => "application/grpc",
        _ => "application/json",
    };
    let body = ctx.non_streamed(tokens);
    Ok(simple(
        StatusCode::OK,
        content_type,
        body,
        Outcome::Completed,
        guard,
    ))
}
struct Params {
    stream: bool,
    include_usage: bool,
    max_tokens: Option<u32>,
    model: String,
    prompt_tokens: u64,
    /// A continuation request's offset (see [`continuation::offset`]).
    offset: Result<Option<u32>, NotAPrefix>,
}

fn parse_params(api: Api, body: &[u8], script_tokens: u32) -> Option<Params> {
    if api == Api::Grpc {
        let r = decode_request(body)?;
        return Some(Params {
            stream: true,
            include_usage: false,
            max_tokens: (r.max_tokens > 0).then_some(r.max_tokens),
            model: if r.model.is_empty() {
                "mock-model".to_owned()
            } else {
                r.model
            },
            prompt_tokens: r.prompt.split_whitespace().count() as u64,
            offset: Ok(None),
        });
    }
    // An empty body is accepted as `{}` (curl -X POST with no data).
    let v: serde_json::Value = if body.is_empty() {
        serde_json::Value::Object(Default::default())
    } else {
        serde_json::from_slice(body).ok()?
    };
    // Ollama streams unless told not to; OpenAI and Anthropic only when told to.
    let stream = v
        .get("stream")
        .and_then(|s| s.as_bool())
        .unwrap_or(api.is_ollama());
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(|s| s.as_bool())
        .unwrap_or(false);
    let max_tokens = v
        .get("max_tokens")
        .or_else(|| v.get("max_completion_tokens"))
        .or_else(|| v.get("max_output_tokens"))
        .or_else(|| v.pointer("/options/num_predict"))
        .and_then(|m| m.as_u64())
        .map(|m| u32::try_from(m).unwrap_or(u32::MAX));
    let model = v
        .get("model")
        .and_then(|m| m.as_str())
        .unwrap_or("mock-model")
        .to_owned();
    let prompt_tokens = prompt_words(&v);
    Some(Params {
        stream,
        include_usage,
        max_tokens,
        model,
        prompt_tokens,
        offset: continuation::offset(api, &v, script_tokens),
    })
}

/// Counts whitespace-separated words of the prompt / messages as "prompt tokens".
fn prompt_words(v: &serde_json::Value) -> u64 {
    fn words(v: &serde_json::Value) -> u64 {
        match v {
            serde_json::Value::String(s) => s.split_whitespace().count() as u64,
            serde_json::Value::Array(a) => a.iter().map(words).sum(),
            serde_json::Value::Object(o) => o
                .get("content")
                .or_else(|| o.get("text"))
                .map(words)
                .unwrap_or(0),
            _ => 0,
        }
    }
    v.get("messages")
        .or_else(|| v.get("prompt"))
        .or_else(|| v.get("input"))
        .map(words)
        .unwrap_or(0)
}
