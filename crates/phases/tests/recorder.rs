//! The recorder over in-process services with scripted bodies, on a paused clock.

mod common;

use std::convert::Infallible;

use bytes::Bytes;
use common::*;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Empty, Full};
use tailguard_core::Upstream;
use tailguard_core::{
    AdmissionOutcome, EndReason, EndReport, HedgeOutcome, LoserRun, OverloadReason, Priority,
    RequestFacts, UpstreamFailure,
};
use tailguard_phases::{MetricNames, MetricsSink, RequestId, Route};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};

/// The headline scenario: exact TTFT, gaps, TPOT, total and counts, a role-only first chunk and
/// keepalives not counted, two tokens in one frame counted as one arrival.
#[tokio::test(start_paused = true)]
async fn exact_phases_of_a_scripted_stream() {
    let (layer, reports, snap) = layer();
    let svc = ServiceBuilder::new()
        .layer(
            layer
                .with_routes(["/v1/chat/completions"])
                .with_models(["gpt-4o"])
                .with_upstream("vllm-a"),
        )
        .service(service_fn(|_req: Request<Empty<Bytes>>| async {
            tokio::time::sleep(ms(50)).await;
            Ok::<_, Infallible>(sse(ScriptBody::new([
                data(ROLE),
                Step::Wait(ms(40)),
                data(KEEPALIVE),
                Step::Wait(ms(60)),
                data(TOKEN), // t = 150 ms: first token
                Step::Wait(ms(20)),
                data(TOKEN), // gap 20 ms
                Step::Wait(ms(30)),
                data(TWO_TOKENS), // gap 30 ms, two events
                Step::Wait(ms(5)),
                data(KEEPALIVE),
                Step::Wait(ms(5)),
                data(END), // t = 210 ms
            ])))
        }));
    let mut req = Request::post("/v1/chat/completions/")
        .body(Empty::new())
        .unwrap();
    req.extensions_mut().insert(
        RequestFacts::new()
            .with_model("gpt-4o-2024-08-06")
            .with_max_tokens(64),
    );
    req.extensions_mut().insert(Priority::interactive());
    let res = svc.oneshot(req).await.unwrap();
    assert_eq!(reports.len(), 0, "nothing is reported before the end");
    drain(res.into_body()).await.unwrap();

    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::Completed);
    assert!(!r.end_reason_reported);
    assert_eq!(r.time_to_headers, Some(ms(50)));
    assert_eq!(r.time_to_first_token, Some(ms(150)));
    assert_eq!(r.total, ms(210));
    assert_eq!(r.output_events, 4);
    assert_eq!(r.gaps.count, 2);
    assert_eq!(
        (r.gaps.min, r.gaps.max, r.gaps.sum),
        (ms(20), ms(30), ms(50))
    );
    // (210 - 150) / (4 - 1)
    assert_eq!(r.time_per_output_token, Some(ms(20)));
    assert!(r.done_seen);
    assert_eq!(
        r.events, 9,
        "role + 2 keepalives + 4 tokens + finish + done"
    );
    assert_eq!(r.labels.route(), "/v1/chat/completions");
    assert_eq!(r.labels.model(), "gpt-4o");
    assert_eq!(r.labels.upstream(), "vllm-a");
    // The log line, and the flat record of the `serde` feature.
    let line = r.to_string();
    assert!(line.starts_with("request_id="), "{line}");
    assert!(
        line.ends_with(
            " route=/v1/chat/completions model=gpt-4o upstream=vllm-a priority=interactive \
             streamed=true status=200 end_reason=completed queue_wait=- \
             time_to_headers=0.050000s ttft=0.150000s total=0.210000s output_events=4 events=9"
        ),
        "{line}"
    );
    #[cfg(feature = "serde")]
    {
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(v["ttft"], 0.15);
        assert_eq!(v["total"], 0.21);
        assert_eq!(v["output_events"], 4);
        assert_eq!(v["status"], 200);
        assert_eq!(v["end_reason"], "completed");
        assert_eq!(
            (v["requested_model"].as_str(), v["max_tokens"].as_u64()),
            (Some("gpt-4o-2024-08-06"), Some(64))
        );
        assert!(v["hedge_attempts"].is_null() && v["queue_wait"].is_null());
    }
    assert_eq!(r.labels.priority(), "interactive");
    assert!(r.labels.streamed());
    assert_eq!(r.facts.as_ref().unwrap().max_tokens, Some(64));

    let all = snapshot(&snap);
    let ttft = metric(&all, "tailguard_time_to_first_token_seconds");
    assert_secs(&ttft.hist(), &[0.150]);
    for (k, v) in [
        ("route", "/v1/chat/completions"),
        ("model", "gpt-4o"),
        ("upstream", "vllm-a"),
        ("priority", "interactive"),
        ("end_reason", "completed"),
        ("streamed", "true"),
    ] {
        assert_eq!(ttft.label(k), Some(v), "label {k}");
    }
    let gaps = metric(&all, "tailguard_inter_token_gap_seconds");
    assert_secs(&gaps.hist(), &[0.020, 0.030]);
    assert_eq!(
        gaps.label("end_reason"),
        None,
        "gaps are recorded before the end"
    );
    assert_secs(
        &metric(&all, "tailguard_request_duration_seconds").hist(),
        &[0.210],
    );
    assert_secs(
        &metric(&all, "tailguard_time_to_headers_seconds").hist(),
        &[0.050],
    );
    assert_secs(
        &metric(&all, "tailguard_time_per_output_token_seconds").hist(),
        &[0.020],
    );
    assert_secs(&metric(&all, "tailguard_output_events").hist(), &[4.0]);
    assert_eq!(metric(&all, "tailguard_requests_total").counter(), 1);
    assert!(!has(&all, "tailguard_queue_wait_seconds"));
    assert!(!has(&all, "tailguard_hedge_attempts"));
}

#[tokio::test(start_paused = true)]
async fn role_only_first_chunk_is_not_the_first_token() {
    let (layer, reports, snap) = layer();
    let svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(sse(ScriptBody::new([
                Step::Wait(ms(100)),
                data(ROLE),
                Step::Wait(ms(200)),
                data(TOKEN),
                data(END),
            ])))
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    drain(res.into_body()).await.unwrap();
    let r = reports.one();
    assert_eq!(r.time_to_first_token, Some(ms(300)));
    assert_eq!(r.output_events, 1);
    assert_eq!(r.time_per_output_token, None, "one event: no TPOT");
    assert_eq!(r.gaps.count, 0);
    let all = snapshot(&snap);
    assert_secs(
        &metric(&all, "tailguard_time_to_first_token_seconds").hist(),
        &[0.300],
    );
    assert!(!has(&all, "tailguard_time_per_output_token_seconds"));
    assert!(
        !has(&all, "tailguard_inter_token_gap_seconds")
            || metric(&all, "tailguard_inter_token_gap_seconds")
                .hist()
                .is_empty()
    );
}

trait LayerFn {
    fn layer_fn<S, F: FnOnce() -> S>(self, f: F) -> tailguard_phases::LatencyPhaseRecorder<S>;
}

impl LayerFn for tailguard_phases::LatencyPhaseRecorderLayer {
    fn layer_fn<S, F: FnOnce() -> S>(self, f: F) -> tailguard_phases::LatencyPhaseRecorder<S> {
        tailguard_phases::LatencyPhaseRecorder::new(f(), &self)
    }
}

#[tokio::test(start_paused = true)]
async fn non_streamed_response_records_total_only() {
    let (layer, reports, snap) = layer();
    let svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            tokio::time::sleep(ms(700)).await;
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(
                        b"{\"choices\":[{\"message\":{\"content\":\"Hi\"}}]}",
                    )))
                    .unwrap(),
            )
        })
    });
    let mut req = Request::new(Empty::new());
    req.extensions_mut()
        .insert(RequestFacts::new().with_stream(false));
    let res = svc.oneshot(req).await.unwrap();
    drain(res.into_body()).await.unwrap();
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::Completed);
    assert!(!r.labels.streamed());
    assert_eq!(r.time_to_first_token, None);
    assert_eq!(r.output_events, 0);
    assert_eq!(r.total, ms(700));
    let all = snapshot(&snap);
    assert!(!has(&all, "tailguard_time_to_first_token_seconds"));
    assert!(!has(&all, "tailguard_output_events"));
    let total = metric(&all, "tailguard_request_duration_seconds");
    assert_secs(&total.hist(), &[0.7]);
    assert_eq!(total.label("streamed"), Some("false"));
}

#[tokio::test(start_paused = true)]
async fn client_disconnect_mid_stream_is_reported_once() {
    let (layer, reports, snap) = layer();
    let svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(sse(ScriptBody::new([
                Step::Wait(ms(10)),
                data(TOKEN),
                Step::Wait(ms(10)),
                data(TOKEN),
                Step::Wait(ms(10_000)),
                data(END),
            ])))
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    let mut body = res.into_body();
    body.frame().await.unwrap().unwrap();
    body.frame().await.unwrap().unwrap();
    tokio::time::sleep(ms(5)).await;
    drop(body);
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::ClientDisconnect);
    assert_eq!(r.output_events, 2);
    assert_eq!(r.total, ms(25));
    let all = snapshot(&snap);
    assert_eq!(
        metric(&all, "tailguard_requests_total").label("end_reason"),
        Some("client_disconnect")
    );
}

#[tokio::test(start_paused = true)]
async fn response_future_dropped_before_headers_is_a_client_disconnect() {
    let (layer, reports, _snap) = layer();
    let mut svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            tokio::time::sleep(ms(1000)).await;
            Ok::<_, Infallible>(sse(ScriptBody::new([data(END)])))
        })
    });
    let fut = svc.ready().await.unwrap().call(Request::new(Empty::new()));
    let timed = tokio::time::timeout(ms(300), fut).await;
    assert!(timed.is_err());
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::ClientDisconnect);
    assert_eq!(r.time_to_headers, None);
    assert_eq!(r.total, ms(300));
}

#[tokio::test(start_paused = true)]
async fn service_error_and_body_error_are_transport_failures() {
    let (layer, reports, snap) = layer();
    let svc = layer.clone().layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            tokio::time::sleep(ms(5)).await;
            Err::<Response<ScriptBody>, _>(TransportError)
        })
    });
    assert!(svc.oneshot(Request::new(Empty::new())).await.is_err());

    let svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(sse(ScriptBody::new([
                data(TOKEN),
                Step::Wait(ms(10)),
                Step::Error,
            ])))
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    assert!(drain(res.into_body()).await.is_err());

    let all = reports.all();
    assert_eq!(all.len(), 2);
    let transport = EndReason::UpstreamError(UpstreamFailure::Transport);
    assert_eq!(all[0].end_reason, transport);
    assert_eq!(all[0].total, ms(5));
    assert_eq!(all[1].end_reason, transport);
    assert_eq!(all[1].output_events, 1);
    let seen = snapshot(&snap);
    let reqs: Vec<_> = seen
        .iter()
        .filter(|s| s.name == "tailguard_requests_total")
        .collect();
    assert!(
        reqs.iter()
            .all(|s| s.label("end_reason") == Some("upstream_error_transport"))
    );
}

#[tokio::test(start_paused = true)]
async fn error_status_is_an_upstream_error_with_its_class() {
    let (layer, reports, snap) = layer();
    let svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(
                Response::builder()
                    .status(StatusCode::BAD_GATEWAY)
                    .header("content-type", "application/json")
                    .body(Full::new(Bytes::from_static(b"{\"error\":{}}")))
                    .unwrap(),
            )
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    // The client drops the error body unread: still an upstream error, not a disconnect.
    drop(res);
    let r = reports.one();
    assert_eq!(
        r.end_reason,
        EndReason::UpstreamError(UpstreamFailure::Status(StatusCode::BAD_GATEWAY))
    );
    assert_eq!(r.status, Some(StatusCode::BAD_GATEWAY));
    assert!(!r.labels.streamed());
    let all = snapshot(&snap);
    assert_eq!(
        metric(&all, "tailguard_requests_total").label("end_reason"),
        Some("upstream_error_5xx")
    );
}

#[tokio::test(start_paused = true)]
async fn in_band_error_event_and_grpc_trailers() {
    let (layer, reports, _snap) = layer();
    let svc = layer.clone().layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(sse(ScriptBody::new([
                data(TOKEN),
                data(IN_BAND_ERROR),
                data(END),
            ])))
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    drain(res.into_body()).await.unwrap();

    // gRPC: length-prefixed messages, then trailers with a non-zero status; the report is
    // finalised at the trailers frame.
    let svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            let mut t = HeaderMap::new();
            t.insert("grpc-status", HeaderValue::from_static("13"));
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "application/grpc")
                    .body(ScriptBody::new([
                        Step::Wait(ms(30)),
                        data("\0\0\0\0\x02\x0a\0"),
                        Step::Wait(ms(10)),
                        data("\0\0\0\0\x02\x0a\0\0\0\0\0\x02\x0a\0"),
                        Step::Trailers(t),
                    ]))
                    .unwrap(),
            )
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    let mut body = res.into_body();
    while let Some(f) = body.frame().await {
        if f.unwrap().is_trailers() {
            break;
        }
    }
    let all = reports.all();
    assert_eq!(all.len(), 2, "the gRPC report is final at the trailers");
    let in_band = EndReason::UpstreamError(UpstreamFailure::InBand);
    assert_eq!(all[0].end_reason, in_band);
    assert_eq!(all[0].output_events, 1);
    assert_eq!(all[1].end_reason, in_band);
    assert_eq!(all[1].output_events, 3, "every gRPC message is a token");
    assert_eq!(all[1].time_to_first_token, Some(ms(30)));
    assert_eq!(all[1].gaps.count, 1);
    drop(body);
    assert_eq!(reports.len(), 2, "finalised exactly once");
}

#[tokio::test(start_paused = true)]
async fn end_of_stream_after_a_frame_finalises_without_another_poll() {
    let (layer, reports, _snap) = layer();
    let svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(sse(ScriptBody::new([
                Step::Wait(ms(10)),
                data(TOKEN),
                data(END),
            ])))
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    let mut body = res.into_body();
    body.frame().await.unwrap().unwrap();
    body.frame().await.unwrap().unwrap();
    assert!(body.is_end_stream());
    assert_eq!(reports.len(), 1, "final before the body is polled to None");
    // A consumer that stops here (hyper does) does not turn it into a disconnect.
    drop(body);
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::Completed);
    assert_eq!(r.total, ms(10));
}

#[tokio::test(start_paused = true)]
async fn empty_body_ends_at_headers() {
    let (layer, reports, _snap) = layer();
    let svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            tokio::time::sleep(ms(3)).await;
            Ok::<_, Infallible>(Response::new(Empty::<Bytes>::new()))
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    assert_eq!(reports.len(), 1);
    drop(res);
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::Completed);
    assert_eq!(r.total, ms(3));
}

/// An inner layer (a timeout, here simulated) reports its reason through the `EndReport`
/// before it yields its final frame; the recorder uses it.
#[tokio::test(start_paused = true)]
async fn reasons_reported_by_inner_layers_win() {
    let (layer, reports, snap) = layer();
    let svc = layer.layer_fn(|| {
        service_fn(|req: Request<Empty<Bytes>>| async move {
            let report = req
                .extensions()
                .get::<EndReport>()
                .cloned()
                .expect("EndReport");
            // The simulated inner layer ends the stream after an idle period.
            let body = ScriptBody::new([data(TOKEN), Step::Wait(ms(500))]);
            let body = ReportOnEnd {
                inner: body,
                report,
                reason: EndReason::IdleTimeout,
            };
            Ok::<_, Infallible>(
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(body)
                    .unwrap(),
            )
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    drain(res.into_body()).await.unwrap();
    let r = reports.one();
    assert_eq!(r.end_reason, EndReason::IdleTimeout);
    assert!(r.end_reason_reported);
    assert_eq!(r.total, ms(500));
    let all = snapshot(&snap);
    assert_eq!(
        metric(&all, "tailguard_requests_total").label("end_reason"),
        Some("idle_timeout")
    );
}

/// Reports `reason` when the inner body ends, before yielding the end.
struct ReportOnEnd<B> {
    inner: B,
    report: EndReport,
    reason: EndReason,
}

impl<B: Body + Unpin> Body for ReportOnEnd<B> {
    type Data = B::Data;
    type Error = B::Error;
    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let r = std::task::ready!(std::pin::Pin::new(&mut self.inner).poll_frame(cx));
        if r.is_none() {
            self.report.report(self.reason);
        }
        std::task::Poll::Ready(r)
    }
}

#[tokio::test(start_paused = true)]
async fn admission_and_hedge_outcomes_from_response_extensions() {
    let (layer, reports, snap) = layer();
    let svc = layer.clone().layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            tokio::time::sleep(ms(250)).await;
            let mut res = sse(ScriptBody::new([
                Step::Wait(ms(50)),
                data(TOKEN),
                data(END),
            ]));
            res.extensions_mut()
                .insert(AdmissionOutcome::admitted(ms(200), 1));
            res.extensions_mut()
                .insert(HedgeOutcome::new(2, 1, Some(ms(40))));
            res.extensions_mut().insert(Upstream::new("replica-b"));
            Ok::<_, Infallible>(res)
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    drain(res.into_body()).await.unwrap();

    // A rejection by admission: 429 with the outcome in the response extensions.
    let svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            tokio::time::sleep(ms(80)).await;
            let mut res = Response::builder()
                .status(StatusCode::TOO_MANY_REQUESTS)
                .body(Full::new(Bytes::from_static(b"{}")))
                .unwrap();
            res.extensions_mut().insert(AdmissionOutcome::rejected(
                ms(80),
                1,
                OverloadReason::QueueTimeout,
            ));
            Ok::<_, Infallible>(res)
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    drain(res.into_body()).await.unwrap();

    let all = reports.all();
    assert_eq!(all[0].queue_wait, Some(ms(200)));
    assert_eq!(
        all[0].hedge.as_ref().map(|h| (h.attempts, h.winner)),
        Some((2, Some(1)))
    );
    assert_eq!(all[0].labels.upstream(), "replica-b");
    assert_eq!(all[0].time_to_first_token, Some(ms(300)));
    assert_eq!(all[1].end_reason, EndReason::Rejected);
    assert_eq!(all[1].queue_wait, Some(ms(80)));

    let seen = snapshot(&snap);
    let qw: Vec<_> = seen
        .iter()
        .filter(|s| s.name == "tailguard_queue_wait_seconds")
        .collect();
    assert_eq!(qw.len(), 2);
    let rejected = qw
        .iter()
        .find(|s| s.label("end_reason") == Some("rejected"))
        .unwrap();
    assert_secs(&rejected.hist(), &[0.08]);
    let hedged = metric(&seen, "tailguard_hedged_requests_total");
    assert_eq!(hedged.label("winner"), Some("hedge"));
    assert_eq!(hedged.counter(), 1);
    assert_secs(&metric(&seen, "tailguard_hedge_attempts").hist(), &[2.0]);
}

#[tokio::test(start_paused = true)]
async fn hedge_costs_reach_the_report_and_the_metrics_per_upstream() {
    let (layer, reports, snap) = layer();
    let svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            let mut res = sse(ScriptBody::new([data(TOKEN), data(END)]));
            let losers = vec![LoserRun::new(0, ms(120)), LoserRun::new(1, ms(80))];
            res.extensions_mut()
                .insert(HedgeOutcome::new(3, 2, Some(ms(40))).with_losers(losers, 500, Some(30)));
            res.extensions_mut().insert(Upstream::new("replica-b"));
            Ok::<_, Infallible>(res)
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    drain(res.into_body()).await.unwrap();

    let r = reports.one();
    let h = r.hedge.unwrap();
    assert_eq!((h.attempts, h.winner), (3, Some(2)));
    assert_eq!(h.loser_time(), ms(200));
    assert_eq!(
        h.wasted_prompt_bytes, 1000,
        "two losers sent 500 bytes each"
    );
    assert_eq!(h.wasted_prompt_tokens, Some(60));
    assert!(!h.deadline_skipped);

    let seen = snapshot(&snap);
    let bytes = metric(&seen, "tailguard_hedge_wasted_prompt_bytes_total");
    assert_eq!(bytes.label("upstream"), Some("replica-b"));
    assert_eq!(bytes.counter(), 1000);
    let tokens = metric(&seen, "tailguard_hedge_wasted_prompt_tokens_total");
    assert_eq!(tokens.label("upstream"), Some("replica-b"));
    assert_eq!(tokens.counter(), 60);
    assert_secs(
        &metric(&seen, "tailguard_hedge_loser_duration_seconds").hist(),
        &[0.12, 0.08],
    );
}

#[tokio::test(start_paused = true)]
async fn a_request_nobody_hedged_wastes_nothing() {
    let (layer, _reports, snap) = layer();
    let svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            let mut res = sse(ScriptBody::new([data(TOKEN), data(END)]));
            res.extensions_mut()
                .insert(HedgeOutcome::new(1, 0, None).with_losers(Vec::new(), 500, Some(30)));
            Ok::<_, Infallible>(res)
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    drain(res.into_body()).await.unwrap();
    let seen = snapshot(&snap);
    for name in [
        "tailguard_hedge_wasted_prompt_bytes_total",
        "tailguard_hedge_wasted_prompt_tokens_total",
        "tailguard_hedge_loser_duration_seconds",
    ] {
        assert!(seen.iter().all(|s| s.name != name), "{name} recorded");
    }
    assert_secs(&metric(&seen, "tailguard_hedge_attempts").hist(), &[1.0]);
}

#[tokio::test(start_paused = true)]
async fn request_id_is_taken_or_generated_and_propagated() {
    let (layer, reports, _snap) = layer();
    let svc = layer.layer_fn(|| {
        service_fn(|req: Request<Empty<Bytes>>| async move {
            let header = req
                .headers()
                .get("x-request-id")
                .cloned()
                .expect("propagated upstream");
            let ext = req
                .extensions()
                .get::<RequestId>()
                .cloned()
                .expect("extension");
            assert_eq!(ext.header_value(), &header);
            // An upstream that answers with an id of its own.
            Ok::<_, Infallible>(
                Response::builder()
                    .header("x-request-id", "upstream-id")
                    .body(Full::new(Bytes::from_static(b"ok")))
                    .unwrap(),
            )
        })
    });
    let res = svc
        .clone()
        .oneshot(
            Request::builder()
                .header("x-request-id", "client-42")
                .body(Empty::new())
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(res.headers()["x-request-id"], "client-42");
    drain(res.into_body()).await.unwrap();

    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    let generated = res.headers()["x-request-id"].to_str().unwrap().to_owned();
    assert_eq!(generated.len(), 32);
    drain(res.into_body()).await.unwrap();

    let all = reports.all();
    assert_eq!(all[0].request_id.as_ref().unwrap().as_str(), "client-42");
    assert_eq!(all[1].request_id.as_ref().unwrap().as_str(), generated);
}

/// An unusable client id is replaced (every value of the header, upstream and back); of
/// repeated ids the first one is used when it is usable, and the header goes upstream as sent.
#[tokio::test(start_paused = true)]
async fn unusable_or_repeated_request_ids() {
    let (layer, reports, _snap) = layer();
    let svc = layer.layer_fn(|| {
        service_fn(|req: Request<Empty<Bytes>>| async move {
            let sent: Vec<_> = req
                .headers()
                .get_all("x-request-id")
                .iter()
                .cloned()
                .collect();
            let ext = req.extensions().get::<RequestId>().cloned().unwrap();
            assert_eq!(ext.header_value(), &sent[0]);
            let mut res = Response::new(Full::new(Bytes::from_static(b"ok")));
            res.extensions_mut().insert(sent);
            Ok::<_, Infallible>(res)
        })
    });
    let with = |ids: &[&'static str]| {
        let mut b = Request::builder();
        for id in ids {
            b = b.header("x-request-id", *id);
        }
        b.body(Empty::new()).unwrap()
    };
    for (ids, kept) in [
        (&["a b"][..], None),
        (&["a b", "ok-1"][..], None),
        (&["ok-2", "a b"][..], Some("ok-2")),
        (&["ok-3", "ok-4"][..], Some("ok-3")),
    ] {
        let res = svc.clone().oneshot(with(ids)).await.unwrap();
        let sent = res
            .extensions()
            .get::<Vec<http::HeaderValue>>()
            .cloned()
            .unwrap();
        let back = res.headers()["x-request-id"].to_str().unwrap().to_owned();
        assert_eq!(res.headers().get_all("x-request-id").iter().count(), 1);
        drain(res.into_body()).await.unwrap();
        let report = reports.all().pop().unwrap();
        let id = report.request_id.unwrap().as_str().to_owned();
        assert_eq!(id, back);
        match kept {
            Some(k) => {
                assert_eq!(id, k);
                assert_eq!(sent.len(), ids.len(), "sent upstream as the client sent it");
            }
            None => {
                assert_eq!(id.len(), 32, "generated");
                assert_eq!(sent.len(), 1, "every unusable value replaced");
                assert_eq!(sent[0], id.as_str());
            }
        }
    }
}

#[tokio::test(start_paused = true)]
async fn usage_is_extracted_from_include_usage_chunks() {
    let (layer, reports, snap) = layer();
    let svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(sse(ScriptBody::new([
                data(ROLE),
                data(TOKEN),
                data(USAGE),
                data(END),
            ])))
        })
    });
    let res = svc.oneshot(Request::new(Empty::new())).await.unwrap();
    drain(res.into_body()).await.unwrap();
    let u = reports.one().usage.expect("usage");
    assert_eq!((u.prompt_tokens, u.completion_tokens), (Some(11), Some(4)));
    let seen = snapshot(&snap);
    let usage: Vec<_> = seen
        .iter()
        .filter(|s| s.name == "tailguard_usage_tokens")
        .map(|s| (s.label("token_type").unwrap().to_owned(), s.hist()))
        .collect();
    assert_eq!(usage.len(), 2);
    for (ty, v) in usage {
        assert_eq!(v, if ty == "input" { vec![11.0] } else { vec![4.0] });
    }
}

#[tokio::test(start_paused = true)]
async fn otel_genai_server_names() {
    let rec = metrics_util::debugging::DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let layer = tailguard_phases::LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(
            MetricsSink::new()
                .with_names(MetricNames::otel_genai_server())
                .with_recorder(rec),
        );
    let svc = layer.layer_fn(|| {
        service_fn(|_req: Request<Empty<Bytes>>| async {
            Ok::<_, Infallible>(sse(ScriptBody::new([
                Step::Wait(ms(10)),
                data(TOKEN),
                Step::Wait(ms(10)),
                data(TOKEN),
            ])))
        })
    });
    let mut req = Request::new(Empty::new());
    req.extensions_mut().insert(Route::new("/chat"));
    let res = svc.oneshot(req).await.unwrap();
    drain(res.into_body()).await.unwrap();
    let all = snapshot(&snap);
    let ttft = metric(&all, "gen_ai.server.time_to_first_token");
    assert_secs(&ttft.hist(), &[0.01]);
    assert_eq!(ttft.label("http.route"), Some("/chat"));
    assert_eq!(ttft.label("gen_ai.request.model"), Some("unknown"));
    assert_secs(
        &metric(&all, "gen_ai.server.time_per_output_token").hist(),
        &[0.01],
    );
    assert_secs(
        &metric(&all, "gen_ai.server.request.duration").hist(),
        &[0.02],
    );
}

/// 1,000 requests with random models, paths and request ids produce a bounded label set.
#[tokio::test(start_paused = true)]
async fn label_cardinality_is_bounded() {
    let (layer, reports, snap) = layer();
    let svc = layer
        .with_models(["gpt-4o", "llama-3.1-8b"])
        .with_routes(["/v1/chat/completions", "/v1/completions"])
        .layer_fn(|| {
            service_fn(|_req: Request<Empty<Bytes>>| async {
                Ok::<_, Infallible>(sse(ScriptBody::new([data(TOKEN), data(END)])))
            })
        });
    let mut x: u64 = 0x9e37_79b9;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for _ in 0..1000 {
        let n = next();
        let model = match n % 4 {
            0 => "gpt-4o".to_owned(),
            1 => format!("gpt-4o-{}", n % 997),
            2 => format!("llama-3.1-8b:{}", n % 13),
            _ => format!("random-{n:x}"),
        };
        let path = match (n >> 8) % 3 {
            0 => "/v1/chat/completions".to_owned(),
            1 => "/v1/completions".to_owned(),
            _ => format!("/v1/files/{}", n >> 20),
        };
        let mut req = Request::post(path)
            .header("x-request-id", format!("id-{n:x}"))
            .body(Empty::new())
            .unwrap();
        req.extensions_mut()
            .insert(RequestFacts::new().with_model(model));
        let res = svc.clone().oneshot(req).await.unwrap();
        drain(res.into_body()).await.unwrap();
    }
    assert_eq!(reports.len(), 1000);
    let all = snapshot(&snap);
    let mut label_sets: Vec<Vec<(String, String)>> = all.iter().map(|s| s.labels.clone()).collect();
    label_sets.sort();
    label_sets.dedup();
    let values = |k: &str| {
        let mut v: Vec<_> = all
            .iter()
            .filter_map(|s| s.label(k).map(str::to_owned))
            .collect();
        v.sort();
        v.dedup();
        v
    };
    assert_eq!(values("model"), ["gpt-4o", "llama-3.1-8b", "other"]);
    assert_eq!(
        values("route"),
        ["/v1/chat/completions", "/v1/completions", "other"]
    );
    assert_eq!(values("upstream"), ["default"]);
    assert!(
        all.iter()
            .all(|s| s.labels.iter().all(|(_, v)| !v.starts_with("id-")))
    );
    // 3 models x 3 routes, with and without end_reason.
    assert!(label_sets.len() <= 18, "{} label sets", label_sets.len());
    let series: std::collections::HashSet<_> = all.iter().map(|s| (&s.name, &s.labels)).collect();
    assert!(series.len() <= 9 * 8, "{} series", series.len());
}
