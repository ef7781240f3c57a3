//! Issue 33, the records and the stall: `ResumeLayer` in the gateway's order (recorder →
//! `SseIdleTimeout` → resume → hedge → `ReplicaSet`) over two `tailguard-mock` replicas on
//! loopback. The phase report names each break, from which replica to which and what came of
//! it; a stalled stream resumes before the idle timeout would end it, goes on when no
//! continuation can take over, and every stream the client no longer reads is cancelled
//! upstream.

use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use tailguard::core::{BreakReason, EndReason, ReplayBody, ResumeOutcome, Resumption};
use tailguard::hedge::{FirstTokenHedgeLayer, HedgeBudget, HedgeDelay, ResumeLayer};
use tailguard::phases::{LatencyPhaseRecorderLayer, PhaseReport};
use tailguard::route::ReplicaSet;
use tailguard::timeout::SseIdleTimeoutLayer;
use tailguard_mock::{MockServer, Script};
use tailguard_test_support::{Recorded, client_of, ms};
use tower::util::BoxCloneSyncService;
use tower::{BoxError, ServiceBuilder, ServiceExt};

type Stack = BoxCloneSyncService<Request<Full<Bytes>>, http::Response<ReplyBody>, BoxError>;
type ReplyBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

const IDLE: Duration = Duration::from_secs(2);
const STALL: Duration = Duration::from_secs(1);

/// Two replicas, the recorder's reports, and the stack over them (resume on, stall at 1 s
/// under a 2 s idle timeout; no hedge: the first attempt is the one that breaks).
async fn stack(resume: ResumeLayer) -> (Vec<MockServer>, Recorded<PhaseReport>, Stack) {
    let script = Script::default().tokens(20).ttft(ms(10)).gap(ms(2));
    let mocks = MockServer::start_replicas(2, script).await.unwrap();
    let bases: Vec<http::Uri> = mocks.iter().map(|m| m.url().parse().unwrap()).collect();
    let set =
        ReplicaSet::from_base_uris(client_of::<ReplayBody<ReplayBody<Full<Bytes>>>>(), &bases)
            .unwrap();
    let reports = Recorded::default();
    let r = reports.clone();
    let svc = ServiceBuilder::new()
        .map_response(|res: http::Response<_>| {
            res.map(|b| BodyExt::map_err(b, Into::into).boxed_unsync())
        })
        .map_err(Into::<BoxError>::into)
        .layer(
            LatencyPhaseRecorderLayer::new()
                .without_sinks()
                .with_sink(move |rep: &PhaseReport| r.push(rep.clone())),
        )
        .layer(SseIdleTimeoutLayer::new().with_idle_timeout(IDLE))
        .layer(resume.with_stall_after(STALL))
        .layer(FirstTokenHedgeLayer::new().with_delay(HedgeDelay::fixed(ms(5_000))))
        .service(set);
    (mocks, reports, BoxCloneSyncService::new(svc))
}

/// Sends the chat request with `headers`; the stream's text and whether it ended with one
/// finish reason and `[DONE]`.
async fn send(svc: &Stack, mocks: &[MockServer], headers: &[(&str, &str)]) -> (String, bool) {
    let req = tailguard_test_support::chat(&mocks[0].url(), headers);
    let res = svc.clone().oneshot(req).await.unwrap();
    let body = res.into_body().collect().await.unwrap().to_bytes();
    let sse = String::from_utf8(body.to_vec()).unwrap();
    let mut text = String::new();
    let mut finishes = 0;
    for data in sse.lines().filter_map(|l| l.strip_prefix("data: ")) {
        let Ok(v) = serde_json::from_str::<Value>(data) else {
            continue;
        };
        text.extend(
            v.pointer("/choices/0/delta/content")
                .and_then(Value::as_str),
        );
        finishes += usize::from(
            v.pointer("/choices/0/finish_reason")
                .is_some_and(|f| !f.is_null()),
        );
    }
    let whole = finishes == 1 && sse.matches("data: [DONE]").count() == 1;
    (text, whole)
}

/// The replicas' names as the set labels them (their authorities), in order.
fn names(mocks: &[MockServer]) -> Vec<String> {
    mocks.iter().map(|m| m.addr().to_string()).collect()
}

fn cancelled(mocks: &[MockServer]) -> u64 {
    mocks.iter().map(|m| m.stats().cancelled).sum()
}

/// The break's reason and outcome, and whether it went from one replica to the other.
fn read(r: &Resumption, names: &[String]) -> (BreakReason, ResumeOutcome, bool) {
    let name = |u: &Option<tailguard::core::Upstream>| u.as_ref().map(|u| u.as_str().to_owned());
    let (from, to) = (name(&r.from), name(&r.to));
    let crossed = from.is_some_and(|f| names.contains(&f))
        && to.is_some_and(|t| names.contains(&t))
        && r.from != r.to;
    (r.reason, r.outcome, crossed)
}

#[tokio::test(start_paused = true)]
async fn the_report_names_each_break_from_which_replica_to_which() {
    let (mocks, reports, svc) = stack(ResumeLayer::new()).await;
    let names = names(&mocks);
    let (expected, whole) = send(&svc, &mocks, &[]).await;
    assert!(whole && !expected.is_empty());
    assert!(reports.one().resumes.is_empty());
    let faults = [
        ("reset_after=5", BreakReason::Transport),
        ("error_after=5", BreakReason::ErrorEvent),
        ("half_event=5", BreakReason::Truncated),
        // Keepalives every 100 ms: they do not count as progress.
        ("stall_after=5,keepalive=100ms", BreakReason::Stall),
    ];
    for (i, (fault, reason)) in faults.into_iter().enumerate() {
        let (text, whole) = send(&svc, &mocks, &[("x-mock-script-0", fault)]).await;
        assert_eq!((text.as_str(), whole), (expected.as_str(), true), "{fault}");
        let report = &reports.all()[i + 1];
        assert_eq!(report.end_reason, EndReason::Completed, "{fault}");
        let breaks: Vec<_> = report.resumes.iter().map(|r| read(r, &names)).collect();
        assert_eq!(breaks, [(reason, ResumeOutcome::Resumed, true)], "{fault}");
        assert!(report.to_string().contains(" resumes="), "{report}");
    }
    // The stall's pause is one of the stream's gaps: the stall limit (the stream's pace, 2 ms
    // between tokens, puts it at its floor, 250 ms), then the continuation's first token.
    let stalled = reports.all().pop().unwrap();
    assert!(stalled.gaps.max >= ms(250), "{:?}", stalled.gaps);
    assert!(stalled.gaps.max < STALL, "{:?}", stalled.gaps);
    // The stalled stream was cancelled upstream when its continuation took over.
    for m in &mocks {
        m.wait_idle().await;
    }
    assert!(
        cancelled(&mocks) >= 1,
        "{:?}",
        mocks.iter().map(MockServer::stats).collect::<Vec<_>>()
    );
}

#[tokio::test(start_paused = true)]
async fn a_stall_no_continuation_takes_over_goes_on_as_it_was() {
    // No budget: the stalled stream (1.5 s without a token, under the 2 s idle timeout) goes
    // on and completes on its own replica.
    let none = ResumeLayer::new().with_budget(HedgeBudget::none());
    let (mocks, reports, svc) = stack(none).await;
    let (expected, _) = send(&svc, &mocks, &[]).await;
    let pause = [("x-mock-script-0", "stall_after=5,stall_for=1500ms")];
    assert_eq!(send(&svc, &mocks, &pause).await, (expected.clone(), true));
    let report = reports.all().pop().unwrap();
    assert_eq!(report.end_reason, EndReason::Completed);
    let outcomes: Vec<_> = report
        .resumes
        .iter()
        .map(|r| (r.reason, r.outcome, r.to.is_none()))
        .collect();
    assert_eq!(
        outcomes,
        [(BreakReason::Stall, ResumeOutcome::NotSent("budget"), true)]
    );
    // Any other break without budget ends as it broke (in-band, from the timeout layer).
    let (text, whole) = send(&svc, &mocks, &[("x-mock-script-0", "reset_after=5")]).await;
    assert!(!whole && text.len() < expected.len(), "{text}");
    let report = reports.all().pop().unwrap();
    assert_eq!(
        report.end_reason,
        EndReason::UpstreamError(tailguard::core::UpstreamFailure::Transport)
    );
    let outcomes: Vec<_> = report
        .resumes
        .iter()
        .map(|r| (r.reason, r.outcome))
        .collect();
    assert_eq!(
        outcomes,
        [(BreakReason::Transport, ResumeOutcome::NotSent("budget"))]
    );

    // A continuation that fails (a 503, and on the hedge's failover too): the stalled stream
    // goes on.
    let (mocks, reports, svc) = stack(ResumeLayer::new()).await;
    let failing = [
        pause[0],
        ("x-mock-script-1", "status=503"),
        ("x-mock-script-2", "status=503"),
    ];
    assert_eq!(send(&svc, &mocks, &failing).await, (expected, true));
    let report = reports.all().pop().unwrap();
    assert_eq!(report.end_reason, EndReason::Completed);
    let outcomes: Vec<_> = report
        .resumes
        .iter()
        .map(|r| (r.reason, r.outcome))
        .collect();
    assert_eq!(outcomes, [(BreakReason::Stall, ResumeOutcome::Failed)]);

    // A stall past the idle timeout with no continuation: the idle timeout ends it.
    let forever = [("x-mock-script-0", "stall_after=5"), failing[1], failing[2]];
    let (text, whole) = send(&svc, &mocks, &forever).await;
    assert!(!whole && text.len() < 40, "{text}");
    assert_eq!(
        reports.all().pop().unwrap().end_reason,
        EndReason::IdleTimeout
    );
}

#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_during_a_resume_cancels_the_continuation_upstream() {
    let (mocks, reports, svc) = stack(ResumeLayer::new()).await;
    // The primary resets after 5 tokens; the continuation's head takes 10 s.
    let headers = [
        ("x-mock-script-0", "reset_after=5"),
        ("x-mock-script-1", "head_delay=10s"),
    ];
    let req = tailguard_test_support::chat(&mocks[0].url(), &headers);
    let res = svc.clone().oneshot(req).await.unwrap();
    let mut body = res.into_body();
    // Read what the primary sent; the next frame waits for the continuation.
    let mut got = 0;
    while got < 5 {
        let frame = body.frame().await.unwrap().unwrap();
        let data = frame.into_data().unwrap();
        got += String::from_utf8_lossy(&data)
            .matches("\"content\":\"")
            .count();
    }
    let next = tokio::time::timeout(ms(1_000), body.frame()).await;
    assert!(next.is_err(), "the continuation is still on its way");
    let requests: u64 = mocks.iter().map(|m| m.stats().requests).sum();
    assert_eq!(requests, 2, "the primary and its continuation");
    drop(body);
    for m in &mocks {
        m.wait_idle().await;
    }
    let stats: Vec<_> = mocks.iter().map(MockServer::stats).collect();
    assert_eq!(
        stats.iter().map(|s| s.cancelled).sum::<u64>(),
        1,
        "{stats:?}"
    );
    assert_eq!(stats.iter().map(|s| s.resets).sum::<u64>(), 1, "{stats:?}");
    let report = reports.one();
    assert_eq!(report.end_reason, EndReason::ClientDisconnect);
}

#[tokio::test(start_paused = true)]
async fn a_stalled_stream_that_goes_on_first_wins_the_race_with_its_continuation() {
    let (mocks, reports, svc) = stack(ResumeLayer::new()).await;
    let (expected, _) = send(&svc, &mocks, &[]).await;
    // Silent for 400 ms after 5 tokens (the stall limit is 250 ms at this pace); the
    // continuation's first token would take 2 s.
    let race = [
        ("x-mock-script-0", "stall_after=5,stall_for=400ms"),
        ("x-mock-script-1", "ttft=2s"),
    ];
    assert_eq!(send(&svc, &mocks, &race).await, (expected, true));
    let report = reports.all().pop().unwrap();
    assert_eq!(report.end_reason, EndReason::Completed);
    let outcomes: Vec<_> = report
        .resumes
        .iter()
        .map(|r| (r.reason, r.outcome))
        .collect();
    assert_eq!(outcomes, [(BreakReason::Stall, ResumeOutcome::Recovered)]);
    assert!(report.total < ms(1_000), "{:?}", report.total);
    // The continuation, dropped before its first token, was cancelled upstream.
    for m in &mocks {
        m.wait_idle().await;
    }
    assert_eq!(cancelled(&mocks), 1);
}
