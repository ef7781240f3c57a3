//! `LatencyPhaseRecorder` as the outermost layer over the real tailguard layers, a hyper client
//! and `tailguard-mock` on loopback: every end reason comes from a real scenario.
//!
//! Stack order: recorder → `SseIdleTimeout` → `BoundedAdmission` → client (admission inside the
//! timeout, so that the test also covers that order).
//!
//! The last test needs an upstream that holds its body open after `data: [DONE]`, which the mock
//! cannot script (it always ends the body after `[DONE]`), so it uses a small hyper server of
//! its own, and a hyper server in front of the recorder for a client that closes the
//! connection.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tailguard::admission::BoundedAdmissionLayer;
use tailguard::core::{EndReason, ReplayBody, UpstreamFailure};
use tailguard::hedge::FirstTokenHedgeLayer;
use tailguard::phases::{LatencyPhaseRecorderLayer, MetricsSink, PhaseReport};
use tailguard::timeout::SseIdleTimeoutLayer;
use tailguard_mock::{MockServer, SCRIPT_HEADER, Script};
use tailguard_test_support::{CHAT, HttpClient, Recorded, client, client_of, ms, snapshot};
use tower::{Layer, ServiceBuilder, ServiceExt};

fn recorder() -> (
    LatencyPhaseRecorderLayer,
    Recorded<PhaseReport>,
    Snapshotter,
) {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let reports = Recorded::default();
    let r = reports.clone();
    let layer = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(MetricsSink::new().with_recorder(rec))
        .with_sink(move |rep: &PhaseReport| r.push(rep.clone()))
        .with_routes(["/v1/chat/completions"])
        .with_models(["gpt-4o"]);
    (layer, reports, snap)
}

fn chat(server: &MockServer, headers: &[(&str, &str)]) -> Request<Full<Bytes>> {
    tailguard_test_support::chat(&server.url(), headers)
}

/// One `end_reason` label per request counted in `tailguard_requests_total`, sorted.
fn end_reasons(snap: &Snapshotter) -> Vec<String> {
    let mut v: Vec<String> = snapshot(snap)
        .iter()
        .filter(|s| s.name == "tailguard_requests_total")
        .flat_map(|s| {
            let label = s.label("end_reason").unwrap().to_owned();
            std::iter::repeat_n(label, s.counter() as usize)
        })
        .collect();
    v.sort();
    v
}

#[tokio::test(start_paused = true)]
async fn completed_through_admission_and_timeouts() {
    let server = MockServer::start(Script::new().ttft(ms(100)).tokens(3).gap(ms(10)))
        .await
        .unwrap();
    let (layer, reports, snap) = recorder();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(
            SseIdleTimeoutLayer::new()
                .with_first_token_timeout(ms(1000))
                .with_idle_timeout(ms(500)),
        )
        .layer(BoundedAdmissionLayer::new(4))
        .service(client());
    let res = svc.oneshot(chat(&server, &[])).await.unwrap();
    res.into_body().collect().await.unwrap();
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::Completed);
    assert!(!r.end_reason_reported);
    assert_eq!(r.queue_wait, Some(Duration::ZERO));
    assert_eq!(r.time_to_first_token, Some(ms(100)));
    assert_eq!(r.total, ms(120));
    assert_eq!(end_reasons(&snap), ["completed"]);
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn first_token_timeout_from_sse_idle_timeout() {
    let server = MockServer::start(Script::new().ttft(ms(5000)).keepalive_every(ms(50)))
        .await
        .unwrap();
    let (layer, reports, snap) = recorder();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(SseIdleTimeoutLayer::new().with_first_token_timeout(ms(200)))
        .service(client());
    let res = svc.oneshot(chat(&server, &[])).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.into_body().collect().await.unwrap();
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::FirstTokenTimeout);
    assert!(r.end_reason_reported);
    assert_eq!(r.time_to_first_token, None);
    assert_eq!(r.output_events, 0);
    assert_eq!(r.total, ms(200));
    assert_eq!(end_reasons(&snap), ["first_token_timeout"]);
    server.wait_idle().await;
    assert_eq!(server.stats().cancelled, 1);
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn idle_timeout_from_sse_idle_timeout() {
    let server = MockServer::start(
        Script::new()
            .ttft(ms(40))
            .tokens(6)
            .gap(ms(10))
            .stall_after(2, None)
            .keepalive_every(ms(30)),
    )
    .await
    .unwrap();
    let (layer, reports, snap) = recorder();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(SseIdleTimeoutLayer::new().with_idle_timeout(ms(100)))
        .service(client());
    let res = svc.oneshot(chat(&server, &[])).await.unwrap();
    res.into_body().collect().await.unwrap();
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::IdleTimeout);
    assert!(r.end_reason_reported);
    assert_eq!(r.time_to_first_token, Some(ms(40)));
    assert_eq!(r.output_events, 2);
    assert_eq!(r.gaps.count, 1);
    assert_eq!(r.gaps.max, ms(10));
    // Token 2 at 50 ms, then 100 ms of keepalives only.
    assert_eq!(r.total, ms(150));
    assert_eq!(end_reasons(&snap), ["idle_timeout"]);
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn upstream_500_through_the_stack() {
    let server = MockServer::start(Script::new().status(StatusCode::INTERNAL_SERVER_ERROR))
        .await
        .unwrap();
    let (layer, reports, snap) = recorder();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(SseIdleTimeoutLayer::new().with_first_token_timeout(ms(1000)))
        .layer(BoundedAdmissionLayer::new(4))
        .service(client());
    let res = svc.oneshot(chat(&server, &[])).await.unwrap();
    assert_eq!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
    res.into_body().collect().await.unwrap();
    let r = reports.one();
    assert_eq!(
        r.end_reason,
        EndReason::UpstreamError(UpstreamFailure::Status(StatusCode::INTERNAL_SERVER_ERROR))
    );
    assert_eq!(end_reasons(&snap), ["upstream_error_5xx"]);
    server.shutdown().await;
}

/// A reset mid-stream: `SseIdleTimeout` ends the stream with an in-band error event and
/// `[DONE]` (no body error reaches the client) and reports `upstream_error_transport`.
#[tokio::test(start_paused = true)]
async fn upstream_reset_mid_stream_is_a_clean_ending_and_a_transport_error() {
    let server = MockServer::start(Script::new().ttft(ms(20)).tokens(5).reset_after_tokens(2))
        .await
        .unwrap();
    let (layer, reports, snap) = recorder();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(SseIdleTimeoutLayer::new())
        .service(client());
    let res = svc.oneshot(chat(&server, &[])).await.unwrap();
    let body = res.into_body().collect().await.expect("no body error");
    let text = String::from_utf8(body.to_bytes().to_vec()).unwrap();
    assert!(
        text.contains("\"code\":\"upstream_error_transport\""),
        "{text}"
    );
    assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
    let r = reports.one();
    assert_eq!(
        r.end_reason,
        EndReason::UpstreamError(UpstreamFailure::Transport)
    );
    assert!(r.end_reason_reported);
    assert_eq!(r.output_events, 2);
    assert_eq!(end_reasons(&snap), ["upstream_error_transport"]);
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn client_disconnect_mid_stream_releases_everything() {
    let server = MockServer::start(Script::new().ttft(ms(20)).tokens(50).gap(ms(100)))
        .await
        .unwrap();
    let (layer, reports, snap) = recorder();
    let admission = BoundedAdmissionLayer::new(2);
    let handle = admission.handle();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(SseIdleTimeoutLayer::new().with_idle_timeout(ms(1000)))
        .layer(admission)
        .service(client());
    let res = svc.oneshot(chat(&server, &[])).await.unwrap();
    let mut body = Box::pin(res.into_body());
    let mut text = String::new();
    while text.matches("\"content\"").count() < 3 {
        if let Ok(d) = body.frame().await.unwrap().unwrap().into_data() {
            text.push_str(&String::from_utf8_lossy(bytes::Buf::chunk(&d)));
        }
    }
    assert_eq!(handle.in_flight(), 1);
    drop(body);
    assert_eq!(handle.in_flight(), 0, "the admission permit is released");
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::ClientDisconnect);
    assert_eq!(r.output_events, 3);
    assert_eq!(r.total, ms(220));
    assert_eq!(end_reasons(&snap), ["client_disconnect"]);
    server.wait_idle().await;
    assert_eq!(server.stats().cancelled, 1);
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn rejection_and_queue_wait_from_bounded_admission() {
    let server = MockServer::start(Script::new().ttft(ms(300)).tokens(1))
        .await
        .unwrap();
    let (layer, reports, snap) = recorder();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(
            BoundedAdmissionLayer::new(1)
                .with_queue_len(1)
                .with_queue_timeout(ms(10_000))
                .with_codel(None),
        )
        .service(client());
    // The first holds the only unit for 300 ms; the second queues behind it; the third finds
    // the queue full and is refused at once.
    let first = tokio::spawn(svc.clone().oneshot(chat(&server, &[])));
    tokio::task::yield_now().await;
    let second = tokio::spawn(svc.clone().oneshot(chat(&server, &[])));
    tokio::task::yield_now().await;
    let third = svc.clone().oneshot(chat(&server, &[])).await.unwrap();
    assert_eq!(third.status(), StatusCode::TOO_MANY_REQUESTS);
    third.into_body().collect().await.unwrap();
    let first = first.await.unwrap().unwrap();
    first.into_body().collect().await.unwrap();
    let second = second.await.unwrap().unwrap();
    second.into_body().collect().await.unwrap();

    let all = reports.all();
    assert_eq!(all.len(), 3);
    assert_eq!(all[0].end_reason, EndReason::Rejected);
    assert!(all[0].admission.as_ref().unwrap().rejected.is_some());
    assert_eq!(all[0].queue_wait, Some(Duration::ZERO));
    assert_eq!(all[1].end_reason, EndReason::Completed);
    assert_eq!(all[1].queue_wait, Some(Duration::ZERO));
    assert_eq!(all[2].end_reason, EndReason::Completed);
    assert_eq!(all[2].queue_wait, Some(ms(300)));
    assert_eq!(all[2].time_to_first_token, Some(ms(600)));
    assert_eq!(end_reasons(&snap), ["completed", "completed", "rejected"]);
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn hedge_outcome_from_first_token_hedge() {
    let server = MockServer::start(Script::new().tokens(3).gap(ms(5)))
        .await
        .unwrap();
    let (layer, reports, snap) = recorder();
    let upstream: HttpClient<ReplayBody<Full<Bytes>>> = client_of();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(
            FirstTokenHedgeLayer::new()
                .with_delay(ms(100))
                .with_max_attempts(2),
        )
        .service(upstream);
    let req = chat(
        &server,
        &[
            ("x-mock-script-0", "ttft=2s"),
            ("x-mock-script-1", "ttft=10ms"),
        ],
    );
    let res = svc.oneshot(req).await.unwrap();
    res.into_body().collect().await.unwrap();
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::Completed);
    let h = r.hedge.expect("hedge outcome");
    assert_eq!((h.attempts, h.winner), (2, Some(1)));
    assert_eq!(r.time_to_first_token, Some(ms(110)));
    let hedged: Vec<_> = snap
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == "tailguard_hedged_requests_total")
        .map(|(k, _, _, v)| {
            let w = k
                .key()
                .labels()
                .find(|l| l.key() == "winner")
                .unwrap()
                .value()
                .to_owned();
            (w, matches!(v, DebugValue::Counter(1)))
        })
        .collect();
    assert_eq!(hedged, [("hedge".to_owned(), true)]);
    server.wait_idle().await;
    let stats = server.stats();
    assert_eq!(stats.requests, 2);
    assert_eq!(
        stats.cancelled, 1,
        "the losing attempt was cancelled upstream"
    );
    let _ = SCRIPT_HEADER;
    server.shutdown().await;
}

/// The hedge's losers of `r`: (attempt, how long it ran).
fn loser_runs(r: &PhaseReport) -> Vec<(u8, Duration)> {
    r.hedge
        .as_ref()
        .map(|h| h.losers.iter().map(|l| (l.attempt, l.ran)).collect())
        .unwrap_or_default()
}

#[tokio::test(start_paused = true)]
async fn a_race_cut_short_by_the_first_token_timeout_still_reports_what_the_hedge_did() {
    // Both replicas are slow: the backup goes out at 100 ms, and the first-token timeout (outside
    // the hedge) ends the request at 300 ms with no response from the hedge. The report still
    // says two attempts ran and both lost, and for how long.
    let server = MockServer::start(Script::new().ttft(ms(5000)))
        .await
        .unwrap();
    let (layer, reports, snap) = recorder();
    let upstream: HttpClient<ReplayBody<Full<Bytes>>> = client_of();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(SseIdleTimeoutLayer::new().with_first_token_timeout(ms(300)))
        .layer(
            FirstTokenHedgeLayer::new()
                .with_delay(ms(100))
                .with_max_attempts(2),
        )
        .service(upstream);
    let res = svc.oneshot(chat(&server, &[])).await.unwrap();
    res.into_body().collect().await.unwrap();
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::FirstTokenTimeout);
    let h = r
        .hedge
        .as_ref()
        .expect("the hedge's outcome, from the end report");
    assert_eq!((h.attempts, h.winner), (2, None));
    assert_eq!(loser_runs(&r), [(0, ms(300)), (1, ms(200))]);
    let attempts: Vec<_> = snapshot(&snap)
        .iter()
        .filter(|s| s.name == "tailguard_hedge_attempts")
        .map(|s| s.label("end_reason").unwrap().to_owned())
        .collect();
    assert_eq!(attempts, ["first_token_timeout"]);
    server.wait_idle().await;
    assert_eq!(
        server.stats().cancelled,
        2,
        "both attempts were cancelled upstream"
    );
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn a_client_gone_during_the_race_still_reports_what_the_hedge_did() {
    let server = MockServer::start(Script::new().ttft(ms(5000)))
        .await
        .unwrap();
    let (layer, reports, _snap) = recorder();
    let upstream: HttpClient<ReplayBody<Full<Bytes>>> = client_of();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(
            FirstTokenHedgeLayer::new()
                .with_delay(ms(100))
                .with_max_attempts(2),
        )
        .service(upstream);
    let gone = tokio::time::timeout(ms(250), svc.oneshot(chat(&server, &[]))).await;
    assert!(gone.is_err(), "no first token within 250 ms");
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::ClientDisconnect);
    assert_eq!(
        r.hedge.as_ref().map(|h| (h.attempts, h.winner)),
        Some((2, None))
    );
    assert_eq!(loser_runs(&r), [(0, ms(250)), (1, ms(150))]);
    server.wait_idle().await;
    assert_eq!(server.stats().cancelled, 2);
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn every_hedge_attempt_reset_before_its_first_token_is_recorded_as_the_502_it_is() {
    // Issue 15: both attempts send a role-only chunk, then reset. The recorder logged
    // status=200 for a reply the client never got; now it logs the 502 the client gets, with
    // the true failure.
    let server = MockServer::start(Script::new()).await.unwrap();
    let (layer, reports, snap) = recorder();
    let upstream: HttpClient<ReplayBody<Full<Bytes>>> = client_of();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(FirstTokenHedgeLayer::new().with_delay(ms(100)))
        .service(upstream);
    let res = svc
        .oneshot(chat(&server, &[("x-mock-script", "reset=0")]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(v["error"]["type"], "upstream_error");
    let r = reports.one();
    assert_eq!(r.status, Some(StatusCode::BAD_GATEWAY));
    assert_eq!(
        r.end_reason,
        EndReason::UpstreamError(UpstreamFailure::Transport)
    );
    assert_eq!(r.hedge.map(|h| h.attempts), Some(2));
    assert_eq!(end_reasons(&snap), ["upstream_error_transport"]);
    server.shutdown().await;
}

#[tokio::test(start_paused = true)]
async fn head_timeout_and_deadline_from_sse_idle_timeout() {
    let server = MockServer::start(Script::new().tokens(100).gap(ms(7)))
        .await
        .unwrap();
    let (layer, reports, snap) = recorder();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(
            SseIdleTimeoutLayer::new()
                .with_head_timeout(ms(50))
                .with_total_timeout(ms(300)),
        )
        .service(client());
    // Headers 200 ms late: the timeout layer answers 504 itself and reports why.
    let res = svc
        .clone()
        .oneshot(chat(&server, &[(SCRIPT_HEADER, "head_delay=200ms")]))
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    res.into_body().collect().await.unwrap();
    // 100 tokens 7 ms apart from t = 0: the 300 ms deadline cuts the stream after 43 (the 43rd
    // at 294 ms).
    let res = svc.oneshot(chat(&server, &[])).await.unwrap();
    res.into_body().collect().await.unwrap();

    let all = reports.all();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].end_reason, EndReason::HeadTimeout);
    assert!(all[0].end_reason_reported);
    assert_eq!(all[0].total, ms(50));
    assert_eq!(all[1].end_reason, EndReason::Deadline);
    assert_eq!(all[1].total, ms(300));
    assert_eq!(all[1].output_events, 43);
    assert_eq!(all[1].gaps.count, 42);
    assert_eq!((all[1].gaps.min, all[1].gaps.max), (ms(7), ms(7)));
    assert_eq!(end_reasons(&snap), ["deadline", "head_timeout"]);
    server.shutdown().await;
}

/// The error flavour (for tonic stacks) refuses with an `Err(Overloaded)`, not a response: the
/// recorder gets the reason through the `EndReport`.
#[tokio::test(start_paused = true)]
async fn rejection_as_an_error_by_bounded_admission() {
    let server = MockServer::start(Script::new().ttft(ms(300)).tokens(1))
        .await
        .unwrap();
    let (layer, reports, snap) = recorder();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(
            BoundedAdmissionLayer::new(1)
                .with_queue_len(0)
                .with_error_mode(),
        )
        .service(client());
    let first = svc.clone().oneshot(chat(&server, &[])).await.unwrap();
    let second = svc.clone().oneshot(chat(&server, &[])).await;
    assert!(second.is_err());
    first.into_body().collect().await.unwrap();
    let all = reports.all();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].end_reason, EndReason::Rejected);
    assert!(all[0].end_reason_reported);
    assert_eq!(all[1].end_reason, EndReason::Completed);
    assert_eq!(end_reasons(&snap), ["completed", "rejected"]);
    server.shutdown().await;
}

/// `PriorityClass` only classifies (no time passes in it), so it goes outside the recorder,
/// which then finds the `Priority` in the request extensions for its `priority` label.
#[tokio::test(start_paused = true)]
async fn priority_label_from_priority_class() {
    let server = MockServer::start(Script::new().tokens(2)).await.unwrap();
    let (layer, reports, snap) = recorder();
    let svc = ServiceBuilder::new()
        .layer(tailguard::priority::PriorityClassLayer::new())
        .layer(layer)
        .layer(BoundedAdmissionLayer::new(4))
        .service(client());
    for p in ["interactive", "batch", "not-a-class"] {
        let res = svc
            .clone()
            .oneshot(chat(&server, &[("x-priority", p)]))
            .await
            .unwrap();
        res.into_body().collect().await.unwrap();
    }
    let labels: Vec<_> = reports
        .all()
        .iter()
        .map(|r| r.labels.priority().to_owned())
        .collect();
    assert_eq!(labels, ["interactive", "batch", "standard"]);
    let mut seen: Vec<String> = snap
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(k, ..)| k.key().name() == "tailguard_requests_total")
        .filter_map(|(k, ..)| {
            k.key()
                .labels()
                .find(|l| l.key() == "priority")
                .map(|l| l.value().to_owned())
        })
        .collect();
    seen.sort();
    assert_eq!(seen, ["batch", "interactive", "standard"]);
    server.shutdown().await;
}

/// An upstream body that sends `frames` (each after its delay) and then stays open without
/// ending, as a uvicorn-based server can after `data: [DONE]`; `dropped` is notified when hyper
/// drops it (the connection closed).
struct HeldOpen {
    frames: std::collections::VecDeque<(Duration, &'static str)>,
    sleep: Option<std::pin::Pin<Box<tokio::time::Sleep>>>,
    dropped: Arc<tokio::sync::Notify>,
}

impl http_body::Body for HeldOpen {
    type Data = Bytes;
    type Error = std::convert::Infallible;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        let Some(&(delay, text)) = self.frames.front() else {
            return std::task::Poll::Pending; // held open: no end of body, ever
        };
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(delay)));
        std::task::ready!(sleep.as_mut().poll(cx));
        self.sleep = None;
        self.frames.pop_front();
        std::task::Poll::Ready(Some(Ok(http_body::Frame::data(Bytes::from_static(
            text.as_bytes(),
        )))))
    }
}

impl Drop for HeldOpen {
    fn drop(&mut self) {
        self.dropped.notify_one();
    }
}

/// Serves every connection on `listener` over HTTP/1.1 with `handle`.
fn serve<F, Fut, B>(listener: tokio::net::TcpListener, handle: F)
where
    F: Fn(Request<hyper::body::Incoming>) -> Fut + Clone + Send + 'static,
    Fut: Future<Output = Result<http::Response<B>, std::convert::Infallible>> + Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let handle = handle.clone();
            tokio::spawn(async move {
                let io = hyper_util::rt::TokioIo::new(stream);
                let svc = hyper::service::service_fn(handle);
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, svc)
                    .await;
            });
        }
    });
}

/// The openai SDK closes the connection as soon as it has read `[DONE]`; the upstream's end of
/// body has not arrived yet. Client → hyper server → recorder → idle timeout → hyper client →
/// an upstream that holds the body open after `[DONE]`: the stream is `completed`, timed to the
/// `[DONE]` frame, and the upstream request is released.
#[tokio::test(start_paused = true)]
async fn client_closing_right_after_done_is_completed() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let upstream = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream_addr = upstream.local_addr().unwrap();
    let dropped = Arc::new(tokio::sync::Notify::new());
    let released = dropped.clone();
    serve(upstream, move |_req| {
        let body = HeldOpen {
            frames: [
                (
                    ms(0),
                    "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n",
                ),
                (
                    ms(10),
                    "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\n",
                ),
                (
                    ms(10),
                    "data: {\"choices\":[{\"delta\":{\"content\":\"!\"}}]}\n\n",
                ),
                (
                    ms(10),
                    "data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n",
                ),
            ]
            .into(),
            sleep: None,
            dropped: dropped.clone(),
        };
        let res = http::Response::builder()
            .header("content-type", "text/event-stream")
            .body(body)
            .unwrap();
        async move { Ok(res) }
    });

    let (layer, reports, snap) = recorder();
    let reported = Arc::new(tokio::sync::Notify::new());
    let on_report = reported.clone();
    let layer = layer.with_sink(move |_: &PhaseReport| on_report.notify_one());
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(SseIdleTimeoutLayer::new().with_idle_timeout(ms(600_000)))
        .service(client());
    let gateway = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway_addr = gateway.local_addr().unwrap();
    serve(gateway, move |req: Request<hyper::body::Incoming>| {
        let svc = svc.clone();
        async move {
            let (mut parts, body) = req.into_parts();
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            parts.uri = format!("http://{upstream_addr}{}", parts.uri)
                .parse()
                .unwrap();
            let res = svc
                .oneshot(Request::from_parts(parts, Full::new(body)))
                .await;
            Ok(res.unwrap_or_else(|e| panic!("gateway: {e}")))
        }
    });

    let mut conn = tokio::net::TcpStream::connect(gateway_addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: gateway\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{CHAT}",
        CHAT.len()
    );
    conn.write_all(head.as_bytes()).await.unwrap();
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while !String::from_utf8_lossy(&seen).contains("data: [DONE]") {
        let n = conn.read(&mut buf).await.unwrap();
        assert!(n > 0, "the gateway closed before [DONE]");
        seen.extend_from_slice(&buf[..n]);
    }
    drop(conn); // the client has its answer and goes

    // Far inside the idle timeout: the report comes from the client's close, not an expiry.
    let wait = ms(10_000);
    tokio::time::timeout(wait, reported.notified())
        .await
        .expect("a report");
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::Completed);
    assert!(!r.end_reason_reported);
    assert!(r.done_seen);
    assert_eq!(r.time_to_first_token, Some(ms(10)));
    assert_eq!(r.output_events, 2);
    assert_eq!(r.total, ms(30), "until the [DONE] frame");
    assert_eq!(end_reasons(&snap), ["completed"]);
    tokio::time::timeout(wait, released.notified())
        .await
        .expect("the upstream request is released");
}

/// Issue 31: the stream is read once. Behind the timeout the recorder follows the timeout's
/// reading (in the timeout's dialect) instead of scanning the stream in its own: a recorder
/// told to read Anthropic events, which would find no token in this OpenAI stream, reports the
/// tokens the timeout found; alone, it reads the stream itself, in its own dialect.
#[tokio::test(start_paused = true)]
async fn the_recorder_follows_the_timeouts_reading_of_the_stream() {
    use tailguard::core::Dialect;
    let server = MockServer::start(Script::new().ttft(ms(100)).tokens(3).gap(ms(10)))
        .await
        .unwrap();
    // Behind the timeout: its reading, in its dialect (`Auto`: OpenAI's chunks).
    let (layer, reports, _snap) = recorder();
    let svc = ServiceBuilder::new()
        .layer(layer.with_dialect(Dialect::Anthropic))
        .layer(SseIdleTimeoutLayer::new().with_idle_timeout(ms(500)))
        .service(client());
    let res = svc.oneshot(chat(&server, &[])).await.unwrap();
    res.into_body().collect().await.unwrap();
    let r = reports.one();
    assert_eq!(r.time_to_first_token, Some(ms(100)));
    assert_eq!(r.output_events, 3);
    // Alone: its own reading, in its own dialect.
    let (layer, reports, _snap) = recorder();
    let svc = layer.with_dialect(Dialect::Anthropic).layer(client());
    let res = svc.oneshot(chat(&server, &[])).await.unwrap();
    res.into_body().collect().await.unwrap();
    let r = reports.one();
    assert_eq!(r.time_to_first_token, None);
    assert_eq!(r.output_events, 0);
    server.shutdown().await;
}

/// An interrupting server (llama.cpp's default) ends a running stream with a bare `[DONE]`: no
/// finish reason. The recorder alone records it as cut short, not completed; with the timeout
/// inside, the client is told too (an error event before `[DONE]`) and the reason is the same.
#[tokio::test(start_paused = true)]
async fn a_bare_done_after_tokens_is_recorded_as_truncated() {
    let server = MockServer::start(Script::new().ttft(ms(20)).tokens(6).gap(ms(10)))
        .await
        .unwrap();
    let interrupted = [(SCRIPT_HEADER, "interrupt_after=3")];
    let check = |text: &str, r: &PhaseReport, with_timeout: bool| {
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        assert_eq!(
            text.contains("upstream_error_truncated"),
            with_timeout,
            "{text}"
        );
        assert_eq!(
            r.end_reason,
            EndReason::UpstreamError(UpstreamFailure::Truncated)
        );
        assert_eq!(r.output_events, 3);
        assert_eq!(r.end_reason_reported, with_timeout);
    };
    // The recorder alone.
    let (layer, reports, _snap) = recorder();
    let svc = ServiceBuilder::new().layer(layer).service(client());
    let res = svc.oneshot(chat(&server, &interrupted)).await.unwrap();
    // The server closes the connection right after the bare `[DONE]`.
    let (body, _) = tailguard_test_support::read_all(res.into_body()).await;
    check(&String::from_utf8_lossy(&body), &reports.one(), false);
    // With the timeout inside it.
    let (layer, reports, _snap) = recorder();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .layer(SseIdleTimeoutLayer::new())
        .service(client());
    let res = svc.oneshot(chat(&server, &interrupted)).await.unwrap();
    let (body, failed) = tailguard_test_support::read_all(res.into_body()).await;
    assert!(!failed, "the timeout ends the stream cleanly");
    check(&String::from_utf8_lossy(&body), &reports.one(), true);
    // A whole answer from the same server is completed.
    let (layer, reports, _snap) = recorder();
    let svc = ServiceBuilder::new().layer(layer).service(client());
    let res = svc.oneshot(chat(&server, &[])).await.unwrap();
    res.into_body().collect().await.unwrap();
    assert_eq!(reports.one().end_reason, EndReason::Completed);
}
