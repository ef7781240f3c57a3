//! A client's deadline through the whole stack — recorder, admission, timeouts, hedge, a hyper
//! client and `tailguard-mock` on loopback — on a paused clock: it ends the request on time in
//! the dialect's own way, keeps the hedge from sending a backup that could not win, and travels
//! upstream as the budget left on every attempt.

use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Request, Response, StatusCode};
use http_body::Body;
use http_body_util::{BodyExt, Full};
use tailguard::admission::BoundedAdmissionLayer;
use tailguard::core::{ClientDeadline, EndReason, ReplayBody};
use tailguard::hedge::{AdaptiveDelay, FirstTokenHedgeLayer, HedgeBudget, HedgeDelay};
use tailguard::phases::{LatencyPhaseRecorderLayer, PhaseReport};
use tailguard::timeout::SseIdleTimeoutLayer;
use tailguard_mock::{MockServer, Script};
use tailguard_test_support::{Recorded, chat, client_of, ms};
use tokio::time::Instant;
use tower::util::BoxCloneService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

type Stack = BoxCloneService<Request<Full<Bytes>>, Response<BoxBody>, BoxError>;
type BoxBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

fn bytes_body<B>(res: Response<B>) -> Response<impl Body<Data = Bytes, Error = B::Error>>
where
    B: Body,
    B::Data: Buf,
{
    res.map(|b| b.map_frame(|f| f.map_data(|mut d| d.copy_to_bytes(d.remaining()))))
}

/// The recommended stack; the hedge's delay is adaptive and acts after 3 samples; the timeout
/// layer sends the budget left on in the default header.
fn stack(reports: &Recorded<PhaseReport>) -> Stack {
    let r = reports.clone();
    let svc = ServiceBuilder::new()
        .layer(
            LatencyPhaseRecorderLayer::new()
                .without_sinks()
                .with_sink(move |rep: &PhaseReport| r.push(rep.clone())),
        )
        .layer(BoundedAdmissionLayer::new(8))
        .map_response(bytes_body)
        .layer(
            SseIdleTimeoutLayer::new()
                .with_first_token_timeout(Duration::from_secs(30))
                .with_total_timeout(Duration::from_secs(120))
                .with_client_deadline(ClientDeadline::new().with_propagation(true)),
        )
        .layer(
            FirstTokenHedgeLayer::new()
                .with_delay(HedgeDelay::Adaptive(
                    AdaptiveDelay::new().with_min_samples(3),
                ))
                .with_budget(HedgeBudget::unlimited()),
        )
        .service(client_of::<ReplayBody<Full<Bytes>>>())
        .map_response(|res: Response<_>| res.map(|b| b.map_err(Into::into).boxed_unsync()))
        .map_err(Into::<BoxError>::into);
    BoxCloneService::new(svc)
}

/// A mock whose answers take 1.5 s to the first token, and a stack whose hedge has learnt it.
async fn warmed_up() -> (MockServer, Stack, Recorded<PhaseReport>) {
    let server = MockServer::start(Script::new().ttft(ms(1500)).tokens(3).gap(ms(10)))
        .await
        .unwrap();
    let reports = Recorded::default();
    let svc = stack(&reports);
    for _ in 0..3 {
        let res = svc.clone().oneshot(chat(&server.url(), &[])).await.unwrap();
        res.into_body().collect().await.unwrap();
    }
    server.wait_idle().await;
    server.reset_stats();
    (server, svc, reports)
}

/// The report of the request after the warm-up.
fn last(reports: &Recorded<PhaseReport>) -> PhaseReport {
    let all = reports.all();
    assert_eq!(all.len(), 4, "three to warm up, then one");
    all.into_iter().next_back().unwrap()
}

/// The budget an attempt's request carried, in milliseconds.
fn budget_ms(headers: &http::HeaderMap) -> u64 {
    let v = headers["x-request-timeout"].to_str().unwrap();
    v.strip_suffix("ms").unwrap().parse().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_two_second_deadline_over_a_congested_primary_ends_at_two_seconds_without_a_backup() {
    let (server, svc, reports) = warmed_up().await;
    // The primary is congested (10 s to its first token); a backup would take 1.5 s.
    let headers = [("x-request-timeout", "2"), ("x-mock-script-0", "ttft=10s")];
    let start = Instant::now();
    let res = svc.oneshot(chat(&server.url(), &headers)).await.unwrap();
    // The hedge holds the head until a first token, so the deadline passes before headers:
    // the OpenAI dialect's timeout answer.
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(res.status(), StatusCode::GATEWAY_TIMEOUT);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["error"]["code"], "deadline_exceeded", "{json}");
    let report = last(&reports);
    assert_eq!(report.end_reason, EndReason::Deadline);
    assert_eq!(report.total, Duration::from_secs(2));
    server.wait_idle().await;
    let stats = server.stats();
    // The backup was due at 1 s (half the time left) with 1 s left, less than the 1.5 s a first
    // token takes: it was never sent.
    assert_eq!(stats.log.len(), 1, "one attempt: {:?}", stats.log);
    assert_eq!(budget_ms(&stats.log[0].headers), 2000);
    assert_eq!(stats.cancelled, 1);
}

#[tokio::test(start_paused = true)]
async fn a_backup_that_can_win_is_sent_with_the_budget_left_then() {
    let (server, svc, reports) = warmed_up().await;
    let headers = [
        ("x-request-timeout", "10000ms"),
        ("x-mock-script-0", "ttft=10s"),
        ("x-mock-script-1", "ttft=100ms"),
    ];
    let res = svc.oneshot(chat(&server.url(), &headers)).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let body = res.into_body().collect().await.unwrap().to_bytes();
    assert!(body.ends_with(b"data: [DONE]\n\n"));
    let report = last(&reports);
    assert_eq!(report.end_reason, EndReason::Completed);
    let hedge = report.hedge.clone().unwrap();
    assert_eq!((hedge.attempts, hedge.winner), (2, Some(1)));
    assert!(!hedge.deadline_skipped);
    let delay = hedge.delay.unwrap();
    server.wait_idle().await;
    let stats = server.stats();
    let primary = stats.by_attempt("0").next().unwrap();
    let backup = stats.by_attempt("1").next().unwrap();
    // Each attempt carries what was left when it was sent: the backup went out `delay` later.
    assert_eq!(budget_ms(&primary.headers), 10_000);
    let left = Duration::from_secs(10) - delay;
    assert_eq!(budget_ms(&backup.headers), left.as_millis() as u64);
    // The primary lost: it ran until the backup's first token, and its prompt was wasted.
    assert_eq!(hedge.losers.len(), 1);
    assert_eq!(hedge.losers[0].attempt, 0);
    assert_eq!(hedge.losers[0].ran, report.time_to_first_token.unwrap());
    assert_eq!(hedge.wasted_prompt_bytes, primary.body.len() as u64);
}
