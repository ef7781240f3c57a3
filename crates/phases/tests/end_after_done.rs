//! A client that closes once it has read the stream's terminal event (the openai SDK stops at
//! `[DONE]`) while the upstream's end of body has not arrived: `completed`, not
//! `client_disconnect`. On a paused clock, with scripted bodies that stay open after the event.

mod common;

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use common::*;
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Empty};
use tailguard_core::{EndReason, EndReport, UpstreamFailure};
use tower::{Layer, ServiceExt, service_fn};

const MESSAGE_START: &str = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"role\":\"assistant\"}}\n\n";
const DELTA: &str = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
const MESSAGE_DELTA: &str = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\n";
const MESSAGE_STOP: &str = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";

fn sse<B>(body: B) -> Response<B> {
    Response::builder()
        .header("content-type", "text/event-stream")
        .body(body)
        .unwrap()
}

/// Reads `n` frames, waits `linger` with the body still open, then drops it.
async fn read_then_drop<B: Body + Unpin>(mut body: B, n: usize, linger: std::time::Duration)
where
    B::Error: std::fmt::Debug,
{
    for _ in 0..n {
        body.frame().await.expect("a frame").expect("no error");
    }
    // One more poll finds nothing (the upstream holds the body open), then the client goes.
    assert!(tokio::time::timeout(linger, body.frame()).await.is_err());
    drop(body);
}

/// The OpenAI case: tokens, `[DONE]`, then the body stays open; the client reads through
/// `[DONE]`, lingers, and drops it. Total, TTFT, gaps and TPOT are those of a completed stream
/// ending at the `[DONE]` frame.
#[tokio::test(start_paused = true)]
async fn drop_after_openai_done_is_completed() {
    let (layer, reports, snap) = layer();
    let svc = layer.layer(service_fn(|_req: Request<Empty<Bytes>>| async {
        Ok::<_, Infallible>(sse(ScriptBody::new([
            data(ROLE),
            wait_ms(10),
            data(TOKEN), // t = 10 ms
            wait_ms(20),
            data(TOKEN), // t = 30 ms
            wait_ms(10),
            data(END), // t = 40 ms
            Step::Pending,
        ])))
    }));
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    read_then_drop(res.into_body(), 4, ms(50)).await;

    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::Completed);
    assert!(!r.end_reason_reported);
    assert!(r.done_seen);
    assert_eq!(r.time_to_first_token, Some(ms(10)));
    assert_eq!(r.output_events, 2);
    assert_eq!((r.gaps.count, r.gaps.max), (1, ms(20)));
    assert_eq!(
        r.total,
        ms(40),
        "until the [DONE] frame, not the drop at 90 ms"
    );
    assert_eq!(r.time_per_output_token, Some(ms(30)));
    let all = snapshot(&snap);
    assert_eq!(
        metric(&all, "tailguard_requests_total").label("end_reason"),
        Some("completed")
    );
    assert_secs(
        &metric(&all, "tailguard_request_duration_seconds").hist(),
        &[0.040],
    );
}

/// The Anthropic case: `message_stop` is the terminal event.
#[tokio::test(start_paused = true)]
async fn drop_after_anthropic_message_stop_is_completed() {
    let (layer, reports, snap) = layer();
    let svc = layer.layer(service_fn(|_req: Request<Empty<Bytes>>| async {
        Ok::<_, Infallible>(sse(ScriptBody::new([
            data(MESSAGE_START),
            wait_ms(15),
            data(DELTA), // t = 15 ms
            wait_ms(5),
            data(DELTA), // t = 20 ms
            data(MESSAGE_DELTA),
            wait_ms(5),
            data(MESSAGE_STOP), // t = 25 ms
            Step::Pending,
        ])))
    }));
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    read_then_drop(res.into_body(), 5, ms(1000)).await;

    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::Completed);
    assert!(r.done_seen);
    assert_eq!(r.time_to_first_token, Some(ms(15)));
    assert_eq!(r.output_events, 2);
    assert_eq!(r.total, ms(25));
    let all = snapshot(&snap);
    assert_eq!(
        metric(&all, "tailguard_requests_total").label("end_reason"),
        Some("completed")
    );
}

/// A drop before the terminal event reached the client stays a disconnect, timed at the drop.
#[tokio::test(start_paused = true)]
async fn drop_before_done_is_a_client_disconnect() {
    let (layer, reports, snap) = layer();
    let svc = layer.layer(service_fn(|_req: Request<Empty<Bytes>>| async {
        Ok::<_, Infallible>(sse(ScriptBody::new([
            wait_ms(10),
            data(TOKEN),
            wait_ms(10),
            data(TOKEN),
            Step::Pending,
            data(DONE),
        ])))
    }));
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    read_then_drop(res.into_body(), 2, ms(30)).await;

    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::ClientDisconnect);
    assert!(!r.done_seen);
    assert_eq!(r.output_events, 2);
    assert_eq!(r.total, ms(50));
    let all = snapshot(&snap);
    assert_eq!(
        metric(&all, "tailguard_requests_total").label("end_reason"),
        Some("client_disconnect")
    );
}

/// An in-band error event before `[DONE]`: the drop after `[DONE]` ends the stream as the body's
/// end would, with the in-band error.
#[tokio::test(start_paused = true)]
async fn drop_after_done_keeps_an_in_band_error() {
    let (layer, reports, _snap) = layer();
    let svc = layer.layer(service_fn(|_req: Request<Empty<Bytes>>| async {
        Ok::<_, Infallible>(sse(ScriptBody::new([
            data(TOKEN),
            data(IN_BAND_ERROR),
            data(DONE),
            Step::Pending,
        ])))
    }));
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    read_then_drop(res.into_body(), 3, ms(10)).await;
    let r = reports.one();
    assert_eq!(
        r.end_reason,
        EndReason::UpstreamError(UpstreamFailure::InBand)
    );
}

/// gRPC ends with its trailers: the report is final (`completed` with `grpc-status` 0) when the
/// trailers frame is handed on, so a drop after it changes nothing.
#[tokio::test(start_paused = true)]
async fn grpc_trailers_with_status_zero_then_drop_is_completed() {
    let (layer, reports, _snap) = layer();
    let svc = layer.layer(service_fn(|_req: Request<Empty<Bytes>>| async {
        let mut t = HeaderMap::new();
        t.insert("grpc-status", HeaderValue::from_static("0"));
        Ok::<_, Infallible>(
            Response::builder()
                .header("content-type", "application/grpc")
                .body(ScriptBody::new([
                    wait_ms(30),
                    data("\0\0\0\0\x02\x0a\0"),
                    wait_ms(10),
                    Step::Trailers(t),
                    Step::Pending,
                ]))
                .unwrap(),
        )
    }));
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    read_then_drop(res.into_body(), 2, ms(100)).await;
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::Completed);
    assert_eq!(r.output_events, 1);
    assert_eq!(r.total, ms(40));
}

/// Reports `reason` when the inner body has nothing ready after `after` frames (an inner layer
/// noticing something while it waits).
struct ReportWhenPending<B> {
    inner: B,
    report: EndReport,
    reason: EndReason,
    after: usize,
}

impl<B: Body + Unpin> Body for ReportWhenPending<B> {
    type Data = B::Data;
    type Error = B::Error;
    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match polled {
            Poll::Ready(_) => self.after = self.after.saturating_sub(1),
            Poll::Pending if self.after == 0 => {
                self.report.report(self.reason);
            }
            Poll::Pending => {}
        }
        polled
    }
}

/// What an inner layer reports after `[DONE]` reached the client: `client_disconnect` is
/// overruled (the client had its answer), any other reason still wins.
#[tokio::test(start_paused = true)]
async fn inner_reports_after_done() {
    for (reason, expected, reported) in [
        (EndReason::ClientDisconnect, EndReason::Completed, false),
        (EndReason::IdleTimeout, EndReason::IdleTimeout, true),
    ] {
        let (layer, reports, _snap) = layer();
        let svc = layer.layer(service_fn(move |req: Request<Empty<Bytes>>| async move {
            let report = req.extensions().get::<EndReport>().cloned().unwrap();
            let inner = ScriptBody::new([data(TOKEN), wait_ms(10), data(END), Step::Pending]);
            Ok::<_, Infallible>(sse(ReportWhenPending {
                inner,
                report,
                reason,
                after: 2,
            }))
        }));
        let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
        read_then_drop(res.into_body(), 2, ms(10)).await;
        let r = reports.one();
        assert_eq!(r.end_reason, expected, "inner report {reason}");
        assert_eq!(r.end_reason_reported, reported, "inner report {reason}");
        assert_eq!(r.total, ms(10));
    }
}

/// The same inner `client_disconnect` before `[DONE]` was delivered is kept.
#[tokio::test(start_paused = true)]
async fn inner_client_disconnect_before_done_is_kept() {
    let (layer, reports, _snap) = layer();
    let svc = layer.layer(service_fn(|req: Request<Empty<Bytes>>| async move {
        let report = req.extensions().get::<EndReport>().cloned().unwrap();
        let inner = ScriptBody::new([data(TOKEN), Step::Pending, data(DONE)]);
        Ok::<_, Infallible>(sse(ReportWhenPending {
            inner,
            report,
            reason: EndReason::ClientDisconnect,
            after: 1,
        }))
    }));
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    read_then_drop(res.into_body(), 1, ms(10)).await;
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::ClientDisconnect);
    assert!(r.end_reason_reported);
}
