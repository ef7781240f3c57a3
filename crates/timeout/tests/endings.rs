//! Clean endings when the upstream fails, over real loopback HTTP: a stream cut short (a clean
//! FIN, or the clean end of a chunked body, without the terminal event), a reset mid-stream, a
//! line over the scanner's cap, junk data lines before and after the first token.
//!
//! Upstreams: `tailguard-mock` where it has the fault (resets); where it has none, a raw
//! HTTP/1.1 server written here (a stream cut at an exact byte, a line that never ends) and a
//! hyper HTTP/2 server playing a scripted gRPC body.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::{Buf, Bytes};
use http::{Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tailguard_core::{BoxError, EndReason, EndReport, UpstreamFailure};
use tailguard_mock::{MockServer, Script};
use tailguard_test_support::{
    CHAT, Collected, MESSAGES, ScriptBody, Step, client, collect, error_json, grpc_message, ms,
};
use tailguard_timeout::SseIdleTimeoutLayer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

const TOKEN_A: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\n";
const TOKEN_B: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n";
const HALF: &str = "data: {\"choices\":[{\"index\":0,\"del";

/// A JSON `POST` of `body` to `url`, with `report` in its extensions.
fn post(url: &str, body: &str, report: &EndReport) -> Request<Full<Bytes>> {
    let mut req = tailguard_test_support::post(url, body, &[]);
    req.extensions_mut().insert(report.clone());
    req
}

/// How the raw upstream goes on after its response bytes.
enum Then {
    /// Closes the connection cleanly (FIN).
    Close,
    /// Writes `x` (an SSE line that never ends) up to 300 MB, and says how many bytes it
    /// managed before the client went away.
    EndlessLine(oneshot::Sender<u64>),
}

/// A raw HTTP/1.1 upstream on 127.0.0.1: reads one request, writes `response` as it is, then
/// goes on as `then` says.
async fn raw_upstream(response: String, then: Then) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        read_request(&mut tcp).await;
        tcp.write_all(response.as_bytes()).await.unwrap();
        match then {
            Then::Close => {
                tcp.shutdown().await.unwrap();
                // Read on until the client closes: unread input would turn the close into a
                // reset.
                let mut buf = [0u8; 1024];
                while matches!(tcp.read(&mut buf).await, Ok(n) if n > 0) {}
            }
            Then::EndlessLine(written) => {
                let piece = vec![b'x'; 64 * 1024];
                let mut n = 0u64;
                while n < 300_000_000 && tcp.write_all(&piece).await.is_ok() {
                    n += piece.len() as u64;
                }
                let _ = written.send(n);
            }
        }
    });
    format!("http://{addr}/v1/chat/completions")
}

/// Reads a request head and a body of its `content-length`.
async fn read_request(tcp: &mut TcpStream) {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = tcp.read(&mut chunk).await.unwrap();
        assert!(n > 0, "request cut short");
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = tcp.read(&mut chunk).await.unwrap();
        assert!(n > 0, "request body cut short");
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// A response head for a body delimited by the end of the connection.
fn close_delimited(content_type: &str) -> String {
    format!("HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\nconnection: close\r\n\r\n")
}

/// A chunked response whose body is `pieces`, one chunk each, ended cleanly.
fn chunked(content_type: &str, pieces: &[&str]) -> String {
    let mut s = format!(
        "HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ntransfer-encoding: chunked\r\n\r\n"
    );
    for p in pieces {
        s.push_str(&format!("{:x}\r\n{p}\r\n", p.len()));
    }
    s.push_str("0\r\n\r\n");
    s
}

/// What a client read: the text, and the body error it ended with, if any.
async fn read<B>(res: Response<B>) -> (String, Option<BoxError>)
where
    B: http_body::Body,
    B::Error: Into<BoxError>,
{
    let seen = collect(res.into_body(), Instant::now()).await;
    (seen.text(), seen.error.map(|(_, e)| e))
}

fn events(text: &str) -> Vec<&str> {
    assert!(text.ends_with("\n\n"), "ends mid-event: {text:?}");
    text.split_terminator("\n\n").collect()
}

#[tokio::test]
async fn a_stream_cut_mid_event_by_a_clean_fin_ends_with_a_truncation_error() {
    let response = format!(
        "{}{TOKEN_A}{TOKEN_B}{HALF}",
        close_delimited("text/event-stream")
    );

    // Without the layer: half an event, no [DONE], no error; an SDK returns a cut answer.
    let url = raw_upstream(response.clone(), Then::Close).await;
    let (text, error) = read(
        client()
            .oneshot(post(&url, CHAT, &EndReport::new()))
            .await
            .unwrap(),
    )
    .await;
    assert!(error.is_none());
    assert!(text.ends_with(HALF), "{text:?}");

    let url = raw_upstream(response, Then::Close).await;
    let report = EndReport::new();
    let svc = SseIdleTimeoutLayer::new().layer(client());
    let (text, error) = read(svc.oneshot(post(&url, CHAT, &report)).await.unwrap()).await;
    assert!(error.is_none(), "{error:?}");
    let events = events(&text);
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!(
        format!("{}\n\n{}\n\n", events[0], events[1]),
        format!("{TOKEN_A}{TOKEN_B}")
    );
    let err = error_json(events[2]);
    assert_eq!(err["error"]["type"], "upstream_error");
    assert_eq!(err["error"]["code"], "upstream_error_truncated");
    assert_eq!(events[3], "data: [DONE]");
    assert_eq!(
        report.get(),
        Some(EndReason::UpstreamError(UpstreamFailure::Truncated))
    );
}

#[tokio::test]
async fn a_chunked_anthropic_stream_without_message_stop_is_truncated() {
    let start =
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\"}}\n\n";
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
    let url = raw_upstream(chunked("text/event-stream", &[start, delta]), Then::Close).await;
    let report = EndReport::new();
    let svc = SseIdleTimeoutLayer::new().layer(client());
    let (text, error) = read(svc.oneshot(post(&url, MESSAGES, &report)).await.unwrap()).await;
    assert!(error.is_none(), "{error:?}");
    let events = events(&text);
    assert_eq!(events.len(), 3, "{events:?}");
    let last = events[2];
    assert!(last.starts_with("event: error\ndata: "), "{last}");
    let v: serde_json::Value =
        serde_json::from_str(last.lines().nth(1).unwrap().strip_prefix("data: ").unwrap()).unwrap();
    assert_eq!(v["type"], "error");
    assert_eq!(v["error"]["type"], "api_error");
    assert_eq!(
        report.get(),
        Some(EndReason::UpstreamError(UpstreamFailure::Truncated))
    );

    // A complete stream passes as it is.
    let stop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let url = raw_upstream(
        chunked("text/event-stream", &[start, delta, MESSAGE_DELTA, stop]),
        Then::Close,
    )
    .await;
    let report = EndReport::new();
    let svc = SseIdleTimeoutLayer::new().layer(client());
    let (text, error) = read(svc.oneshot(post(&url, MESSAGES, &report)).await.unwrap()).await;
    assert!(error.is_none());
    assert_eq!(text, format!("{start}{delta}{MESSAGE_DELTA}{stop}"));
    assert_eq!(report.get(), None);
}

/// An Anthropic `message_delta` that says why the message stopped.
const MESSAGE_DELTA: &str = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\",\"stop_sequence\":null},\"usage\":{\"output_tokens\":1}}\n\n";
const FINISH: &str =
    "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
const DONE: &str = "data: [DONE]\n\n";

/// An interrupting server (llama.cpp's default) ends the running stream with a bare `[DONE]`
/// when a newer request takes its slot: no finish reason. An SDK would return the cut answer
/// as whole, so the layer ends it in-band as cut short.
#[tokio::test]
async fn a_terminal_event_without_a_finish_reason_ends_as_cut_short() {
    // Without the layer the client gets the bare [DONE]: a silent truncation.
    let url = raw_upstream(
        chunked("text/event-stream", &[TOKEN_A, TOKEN_B, DONE]),
        Then::Close,
    )
    .await;
    let (text, _) = read(
        client()
            .oneshot(post(&url, CHAT, &EndReport::new()))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(text, format!("{TOKEN_A}{TOKEN_B}{DONE}"));

    let url = raw_upstream(
        chunked("text/event-stream", &[TOKEN_A, TOKEN_B, DONE]),
        Then::Close,
    )
    .await;
    let report = EndReport::new();
    let svc = SseIdleTimeoutLayer::new().layer(client());
    let (text, error) = read(svc.oneshot(post(&url, CHAT, &report)).await.unwrap()).await;
    assert!(error.is_none(), "{error:?}");
    let events = events(&text);
    assert_eq!(events.len(), 4, "{events:?}");
    assert_eq!(
        format!("{}\n\n{}\n\n", events[0], events[1]),
        format!("{TOKEN_A}{TOKEN_B}")
    );
    let err = error_json(events[2]);
    assert_eq!(err["error"]["code"], "upstream_error_truncated");
    assert!(
        err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("finish reason"),
        "{err}"
    );
    assert_eq!(events[3], "data: [DONE]");
    assert_eq!(
        report.get(),
        Some(EndReason::UpstreamError(UpstreamFailure::Truncated))
    );

    // In one piece with the tokens: the tokens go on, the bare [DONE] does not.
    let one = format!("{TOKEN_A}{TOKEN_B}{DONE}");
    let url = raw_upstream(chunked("text/event-stream", &[&one]), Then::Close).await;
    let svc = SseIdleTimeoutLayer::new().layer(client());
    let (text, _) = read(
        svc.oneshot(post(&url, CHAT, &EndReport::new()))
            .await
            .unwrap(),
    )
    .await;
    let evs = crate::events(&text);
    assert_eq!(evs.len(), 4, "{evs:?}");
    assert_eq!(
        format!("{}\n\n{}\n\n", evs[0], evs[1]),
        format!("{TOKEN_A}{TOKEN_B}")
    );
    assert_eq!(
        error_json(evs[2])["error"]["code"],
        "upstream_error_truncated"
    );

    // With the finish reason (and usage after it) the stream passes as it is.
    let usage =
        "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":2}}\n\n";
    let url = raw_upstream(
        chunked(
            "text/event-stream",
            &[TOKEN_A, TOKEN_B, FINISH, usage, DONE],
        ),
        Then::Close,
    )
    .await;
    let report = EndReport::new();
    let svc = SseIdleTimeoutLayer::new().layer(client());
    let (text, error) = read(svc.oneshot(post(&url, CHAT, &report)).await.unwrap()).await;
    assert!(error.is_none());
    assert_eq!(text, format!("{TOKEN_A}{TOKEN_B}{FINISH}{usage}{DONE}"));
    assert_eq!(report.get(), None);

    // An empty answer says so with its finish reason; without one it is no answer at all.
    let url = raw_upstream(chunked("text/event-stream", &[FINISH, DONE]), Then::Close).await;
    let svc = SseIdleTimeoutLayer::new().layer(client());
    let (text, _) = read(
        svc.oneshot(post(&url, CHAT, &EndReport::new()))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(text, format!("{FINISH}{DONE}"));

    // Asked off: the bare [DONE] passes.
    let url = raw_upstream(chunked("text/event-stream", &[TOKEN_A, DONE]), Then::Close).await;
    let svc = SseIdleTimeoutLayer::new()
        .with_require_terminal_event(false)
        .layer(client());
    let (text, _) = read(
        svc.oneshot(post(&url, CHAT, &EndReport::new()))
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(text, format!("{TOKEN_A}{DONE}"));
}

/// The stream llama-cpp-python's server sent when a newer request interrupted it before its
/// first token (captured: `testdata/llamacpp-chat-stream-interrupted.http`): a role chunk and
/// a bare `[DONE]`. The client gets an error, not an empty answer.
#[tokio::test]
async fn a_captured_interruption_before_any_token_is_an_error_not_an_empty_answer() {
    let captured =
        include_str!("testdata/llamacpp-chat-stream-interrupted.http").replace("\r\n", "\n");
    let (head, body) = captured.split_once("\n\n").unwrap();
    assert!(
        head.contains("transfer-encoding: chunked") || head.contains("Transfer-Encoding: chunked")
    );
    // The chunked body as captured, in lines: size, data, size, data, 0.
    let pieces: Vec<String> = body
        .split("\n\n\n")
        .filter_map(|c| {
            c.split_once('\n')
                .map(|(_, data)| format!("{}\n\n", data.trim_end()))
        })
        .filter(|p| p.starts_with("data: "))
        .collect();
    assert_eq!(pieces.len(), 2, "{pieces:?}");
    let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
    let url = raw_upstream(
        chunked("text/event-stream; charset=utf-8", &refs),
        Then::Close,
    )
    .await;
    let report = EndReport::new();
    let svc = SseIdleTimeoutLayer::new().layer(client());
    let (text, error) = read(svc.oneshot(post(&url, CHAT, &report)).await.unwrap()).await;
    assert!(error.is_none(), "{error:?}");
    let events = events(&text);
    assert_eq!(events.len(), 3, "{events:?}");
    assert_eq!(format!("{}\n\n", events[0]), pieces[0]);
    assert_eq!(
        error_json(events[1])["error"]["code"],
        "upstream_error_truncated"
    );
    assert_eq!(
        report.get(),
        Some(EndReason::UpstreamError(UpstreamFailure::Truncated))
    );
}

/// The same for Anthropic: `message_stop` with no `stop_reason` before it.
#[tokio::test]
async fn an_anthropic_message_stop_without_a_stop_reason_ends_as_cut_short() {
    let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"stop_reason\":null}}\n\n";
    let delta = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
    let stop = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
    let url = raw_upstream(
        chunked("text/event-stream", &[start, delta, stop]),
        Then::Close,
    )
    .await;
    let report = EndReport::new();
    let svc = SseIdleTimeoutLayer::new().layer(client());
    let (text, error) = read(svc.oneshot(post(&url, MESSAGES, &report)).await.unwrap()).await;
    assert!(error.is_none(), "{error:?}");
    let events = events(&text);
    assert_eq!(events.len(), 3, "{events:?}");
    assert!(events[2].starts_with("event: error\n"), "{}", events[2]);
    assert_eq!(
        report.get(),
        Some(EndReason::UpstreamError(UpstreamFailure::Truncated))
    );
}

#[tokio::test]
async fn the_check_is_off_when_asked_and_for_dialects_without_a_terminal_event() {
    let cut = chunked("text/event-stream", &[TOKEN_A, HALF]);
    // Asked off: the end passes through as the upstream sent it.
    let url = raw_upstream(cut.clone(), Then::Close).await;
    let report = EndReport::new();
    let svc = SseIdleTimeoutLayer::new()
        .with_require_terminal_event(false)
        .layer(client());
    let (text, _) = read(svc.oneshot(post(&url, CHAT, &report)).await.unwrap()).await;
    assert_eq!(text, format!("{TOKEN_A}{HALF}"));
    assert_eq!(report.get(), None);

    // NDJSON (no terminal event every server sends) and a non-streamed JSON answer.
    for (content_type, body) in [
        (
            "application/x-ndjson",
            "{\"response\":\"a\"}\n{\"response\":\"b\"}\n",
        ),
        (
            "application/json",
            "{\"choices\":[{\"message\":{\"content\":\"hi\"}}]}",
        ),
    ] {
        let url = raw_upstream(chunked(content_type, &[body]), Then::Close).await;
        let report = EndReport::new();
        let svc = SseIdleTimeoutLayer::new().layer(client());
        let (text, error) = read(svc.oneshot(post(&url, CHAT, &report)).await.unwrap()).await;
        assert!(error.is_none());
        assert_eq!(text, body, "{content_type}");
        assert_eq!(report.get(), None, "{content_type}");
    }
}

#[tokio::test]
async fn a_line_over_the_scan_cap_ends_with_a_protocol_error_and_is_not_read_on() {
    let (written, bytes) = oneshot::channel();
    let response = format!("{}{TOKEN_A}data: ", close_delimited("text/event-stream"));
    let url = raw_upstream(response, Then::EndlessLine(written)).await;
    let report = EndReport::new();
    let svc = SseIdleTimeoutLayer::new().layer(client());
    let (text, error) = read(svc.oneshot(post(&url, CHAT, &report)).await.unwrap()).await;
    assert!(error.is_none(), "{error:?}");
    let events = events(&text);
    assert_eq!(events.len(), 3, "the token, the error, [DONE]");
    assert_eq!(format!("{}\n\n", events[0]), TOKEN_A);
    assert_eq!(
        error_json(events[1])["error"]["code"],
        "upstream_error_protocol"
    );
    assert_eq!(events[2], "data: [DONE]");
    assert_eq!(
        report.get(),
        Some(EndReason::UpstreamError(UpstreamFailure::Protocol))
    );
    // The upstream connection was dropped long before the 300 MB were out.
    let n = bytes.await.unwrap();
    assert!((1 << 20..300_000_000).contains(&n), "{n} bytes written");
}

/// A hyper HTTP/2 upstream on 127.0.0.1 answering one request with a gRPC response whose body
/// plays `steps`.
async fn h2_upstream(steps: Vec<Step>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let svc = hyper::service::service_fn(move |_req: Request<Incoming>| {
            let body = ScriptBody::new(steps.clone());
            async move {
                Ok::<_, Infallible>(
                    Response::builder()
                        .header("content-type", "application/grpc")
                        .body(body)
                        .unwrap(),
                )
            }
        });
        let _ = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
            .serve_connection(TokioIo::new(tcp), svc)
            .await;
    });
    format!("http://{addr}/tailguard.mock.Generate/Generate")
}

/// Plays `steps` as a gRPC response over HTTP/2 through the layer: what the client saw, and the
/// end reason reported.
async fn grpc_through_the_layer(steps: Vec<Step>) -> (Collected, Option<EndReason>) {
    let url = h2_upstream(steps).await;
    let report = EndReport::new();
    let h2 = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http::<Full<Bytes>>();
    let svc = SseIdleTimeoutLayer::new().layer(h2);
    let mut req = Request::post(url)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(Full::new(grpc_message(b"")))
        .unwrap();
    req.extensions_mut().insert(report.clone());
    let res = svc.oneshot(req).await.unwrap();
    (collect(res.into_body(), Instant::now()).await, report.get())
}

#[tokio::test]
async fn a_grpc_stream_without_its_status_ends_with_unavailable_and_no_partial_message() {
    let (m1, m2) = (grpc_message(b"one"), grpc_message(b"two, cut"));
    let mut ok = http::HeaderMap::new();
    ok.insert("grpc-status", "0".parse().unwrap());
    // No trailers at all; or an OK status after half a message.
    for tail in [vec![], vec![Step::Trailers(ok.clone())]] {
        let mut steps = vec![Step::Data(m1.clone()), Step::Data(m2.slice(..6))];
        steps.extend(tail);
        let (seen, reason) = grpc_through_the_layer(steps).await;
        assert!(seen.error.is_none(), "{:?}", seen.error);
        assert_eq!(seen.bytes(), m1.to_vec(), "the partial message is dropped");
        let trailers = seen.trailers.expect("trailers");
        assert_eq!(trailers["grpc-status"], "14");
        let message = trailers["grpc-message"].to_str().unwrap();
        assert!(message.contains("without its final event"), "{message}");
        assert_eq!(
            reason,
            Some(EndReason::UpstreamError(UpstreamFailure::Truncated))
        );
    }
    // Whole messages and a status pass as they are.
    let steps = vec![Step::Data(m1.clone()), Step::Trailers(ok.clone())];
    let (seen, reason) = grpc_through_the_layer(steps).await;
    assert_eq!(seen.bytes(), m1.to_vec());
    assert_eq!(seen.trailers, Some(ok));
    assert_eq!(reason, None);
}

/// A gateway on 127.0.0.1: a hyper HTTP/1.1 server that sends each request on to `upstream`
/// through a hyper client, behind `layer` when there is one, with `report` in its extensions.
async fn gateway(
    upstream: String,
    layer: Option<SseIdleTimeoutLayer>,
    report: EndReport,
) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr: SocketAddr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let handler = hyper::service::service_fn(move |req: Request<Incoming>| {
            forward(req, upstream.clone(), layer.clone(), report.clone())
        });
        let _ = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(tcp), handler)
            .await;
    });
    format!("http://{addr}")
}

type GatewayBody = UnsyncBoxBody<Bytes, BoxError>;

/// The gateway's handler.
async fn forward(
    req: Request<Incoming>,
    upstream: String,
    layer: Option<SseIdleTimeoutLayer>,
    report: EndReport,
) -> Result<Response<GatewayBody>, BoxError> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let mut req = Request::post(format!("{upstream}{}", parts.uri.path()))
        .header("content-type", "application/json")
        .body(Full::new(body))?;
    req.extensions_mut().insert(report);
    Ok(match layer {
        Some(layer) => {
            let res = layer.layer(client()).oneshot(req).await?;
            res.map(|b| {
                b.map_frame(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining())))
                    .boxed_unsync()
            })
        }
        None => {
            let res = client().oneshot(req).await?;
            res.map(|b| b.map_err(|e| Box::new(e) as BoxError).boxed_unsync())
        }
    })
}

#[tokio::test(start_paused = true)]
async fn a_reset_after_tokens_reaches_the_client_as_an_error_event_not_a_broken_connection() {
    let script = Script::new().ttft(ms(50)).tokens(10).reset_after_tokens(3);
    let server = MockServer::start(script).await.unwrap();

    // Without the layer the client's read fails (curl exit 18, an SDK's "Connection error").
    let url = gateway(server.url(), None, EndReport::new()).await;
    let req = post(
        &format!("{url}/v1/chat/completions"),
        CHAT,
        &EndReport::new(),
    );
    let (_, error) = read(client().oneshot(req).await.unwrap()).await;
    assert!(error.is_some(), "a transport error without the layer");

    let report = EndReport::new();
    let url = gateway(
        server.url(),
        Some(SseIdleTimeoutLayer::new()),
        report.clone(),
    )
    .await;
    let req = post(
        &format!("{url}/v1/chat/completions"),
        CHAT,
        &EndReport::new(),
    );
    let (text, error) = read(client().oneshot(req).await.unwrap()).await;
    assert!(error.is_none(), "{error:?}");
    let events = events(&text);
    let n = events.len();
    assert_eq!(
        events.iter().filter(|e| e.contains("\"content\"")).count(),
        3
    );
    let err = error_json(events[n - 2]);
    assert_eq!(err["error"]["type"], "upstream_error");
    assert_eq!(err["error"]["code"], "upstream_error_transport");
    assert_eq!(events[n - 1], "data: [DONE]");
    assert_eq!(
        report.get(),
        Some(EndReason::UpstreamError(UpstreamFailure::Transport))
    );
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_reset_before_the_first_token_after_headers_is_an_error_event_too() {
    let server = MockServer::start(Script::new().tokens(5).reset_after_tokens(0))
        .await
        .unwrap();
    for (path, body) in [("/v1/chat/completions", CHAT), ("/v1/messages", MESSAGES)] {
        let report = EndReport::new();
        let svc = SseIdleTimeoutLayer::new().layer(client());
        let req = post(&format!("{}{path}", server.url()), body, &report);
        let res = svc.oneshot(req).await.unwrap();
        assert_eq!(res.status(), 200);
        let (text, error) = read(res).await;
        assert!(error.is_none(), "{path}: {error:?}");
        let events = events(&text);
        // No token came: no content delta.
        assert!(
            !text.contains("_delta") && !text.contains("\"content\":\""),
            "{text}"
        );
        let last = events[events.len() - 1];
        if path == "/v1/messages" {
            assert!(last.starts_with("event: error\n"), "{last}");
        } else {
            assert_eq!(last, "data: [DONE]");
            let err = error_json(events[events.len() - 2]);
            assert_eq!(err["error"]["code"], "upstream_error_transport");
        }
        assert_eq!(
            report.get(),
            Some(EndReason::UpstreamError(UpstreamFailure::Transport)),
            "{path}"
        );
    }
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn junk_before_or_after_the_first_token_ends_the_stream_in_band_and_is_never_passed_on() {
    // Issue 30.2, with no hedge in front: the mock's junk data lines reach this layer.
    let server = MockServer::start(Script::new().ttft(ms(20)).tokens(4).gap(ms(5)))
        .await
        .unwrap();
    let protocol = Some(EndReason::UpstreamError(UpstreamFailure::Protocol));
    for (script, tokens) in [("junk_before=2", 0), ("junk_after=1", 1)] {
        for (path, body) in [("/v1/chat/completions", CHAT), ("/v1/messages", MESSAGES)] {
            let report = EndReport::new();
            let svc = SseIdleTimeoutLayer::new().layer(client());
            let mut req = post(&format!("{}{path}", server.url()), body, &report);
            req.headers_mut()
                .insert(tailguard_mock::SCRIPT_HEADER, script.parse().unwrap());
            let res = svc.oneshot(req).await.unwrap();
            assert_eq!(res.status(), 200);
            let (text, error) = read(res).await;
            assert!(error.is_none(), "{script} {path}: {error:?}");
            assert!(
                !text.contains("not json") && !text.contains("{{{{"),
                "{script} {path}: {text}"
            );
            let events = events(&text);
            let deltas = events
                .iter()
                .filter(|e| e.contains("\"content\":\"") || e.contains("text_delta"))
                .count();
            assert_eq!(deltas, tokens, "{script} {path}: {text}");
            let last = events[events.len() - 1];
            if path == "/v1/messages" {
                assert!(last.starts_with("event: error\n"), "{last}");
                assert!(last.contains("not a JSON object"), "{last}");
            } else {
                assert_eq!(last, "data: [DONE]");
                let err = error_json(events[events.len() - 2]);
                assert_eq!(err["error"]["code"], "upstream_error_protocol");
            }
            assert_eq!(report.get(), protocol, "{script} {path}");
        }
    }
    server.shutdown().await;
}
