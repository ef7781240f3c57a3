//! End reasons of protocol errors the recorder sees for itself (issue 30): junk in a stream,
//! and a whole JSON document answering a request that asked to stream.

mod common;

use std::convert::Infallible;

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full};
use tailguard_core::{EndReason, RequestFacts, UpstreamFailure};
use tower::{ServiceExt, service_fn};

const PROTOCOL: EndReason = EndReason::UpstreamError(UpstreamFailure::Protocol);

#[tokio::test(start_paused = true)]
async fn junk_that_reached_the_client_is_a_protocol_error_however_the_stream_ended() {
    let (layer, reports, _snap) = layer();
    let svc = tailguard_phases::LatencyPhaseRecorder::new(
        service_fn(|_req: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(sse(ScriptBody::new([
                data("data: this is not json at all\n\n"),
                data("data: {{{{\n\n"),
                data(TOKEN),
                data(DONE),
            ])))
        }),
        &layer,
    );
    // Read to its end: not `completed`.
    let res = svc
        .clone()
        .oneshot(Request::new(Empty::new()))
        .await
        .unwrap();
    drain(res.into_body()).await.unwrap();
    let r = reports.one();
    assert_eq!(r.end_reason, PROTOCOL);
    assert_eq!(r.output_events, 1, "junk is no output");

    // A client (an SDK that failed to decode the junk) that closes the stream after it: not
    // `client_disconnect`.
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    let mut body = res.into_body();
    body.frame().await.unwrap().unwrap();
    drop(body);
    let all = reports.all();
    assert_eq!(all[1].end_reason, PROTOCOL);
}

fn json_reply() -> Response<Full<Bytes>> {
    Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            b"{\"choices\":[{\"message\":{\"content\":\"Hi\"}}]}",
        )))
        .unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_json_reply_to_a_request_that_asked_to_stream_is_a_protocol_error() {
    let (layer, reports, _snap) = layer();
    let svc = tailguard_phases::LatencyPhaseRecorder::new(
        service_fn(|_req: Request<Empty<Bytes>>| async { Ok::<_, Infallible>(json_reply()) }),
        &layer,
    );
    for (stream, want) in [
        (Some(true), PROTOCOL),
        // A request that did not ask to stream, or said nothing: an answer as any other.
        (Some(false), EndReason::Completed),
        (None, EndReason::Completed),
    ] {
        let mut req = Request::new(Empty::new());
        let mut facts = RequestFacts::new();
        if let Some(s) = stream {
            facts = facts.with_stream(s);
        }
        req.extensions_mut().insert(facts);
        let res = svc.clone().oneshot(req).await.unwrap();
        let body = res.into_body().collect().await.unwrap().to_bytes();
        assert!(
            !body.is_empty(),
            "the recorder passes the answer on as it is"
        );
        let all = reports.all();
        assert_eq!(all.last().unwrap().end_reason, want, "stream: {stream:?}");
    }
}
