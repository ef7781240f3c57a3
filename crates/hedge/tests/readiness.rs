//! The inner service's readiness during the race, with tower-test's mock services: a backup
//! is sent only on a ready service (a call without readiness would panic the mock), a service
//! or replica that is not ready holds only its own attempt back, and a `poll_ready` error is a
//! failed attempt like a transport error.

mod common;

use std::io;
use std::task::Poll;

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::Full;
use tailguard_core::attempt::Attempt;
use tailguard_core::{EndReason, EndReport, HedgeOutcome, ReplayBody, UpstreamFailure};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};
use tower_test::mock::{self, Handle, Mock, SendResponse};

type Req = Request<ReplayBody<Full<Bytes>>>;
type Res = Response<AttemptBody>;

fn pair() -> (Mock<Req, Res>, Handle<Req, Res>) {
    mock::pair()
}

/// Answers with `plan`'s stream; the probe tells whether the attempt was dropped unfinished.
fn answer(send: SendResponse<Res>, plan: Plan) -> Probe {
    let (body, probe) = ScriptBody::new(plan.items.clone()).probed();
    send.send_response(plan.response(body));
    probe
}

fn attempt(req: &Req) -> u8 {
    req.extensions()
        .get::<Attempt>()
        .map(Attempt::number)
        .unwrap()
}

/// Whether no request reached `handle` (its mock may be gone by now).
fn none_sent(handle: &mut Handle<Req, Res>) -> bool {
    !matches!(handle.poll_request(), Poll::Ready(Some(_)))
}

fn outcome<B>(res: &Response<B>) -> HedgeOutcome {
    outcome_without_costs(res).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_backup_on_a_service_that_is_not_ready_is_not_sent_and_the_primary_wins() {
    let (svc, mut handle) = pair();
    // One call: the primary's. When the backup is due the service is not ready.
    handle.allow(1);
    let start = Instant::now();
    let race = tokio::spawn(layer().layer(svc).oneshot(chat_request()));
    let (primary, send) = handle.next_request().await.unwrap();
    assert_eq!(attempt(&primary), 0);
    let probe = answer(send, Plan::sse(ms(800)));
    let res = race.await.unwrap().unwrap();
    assert_eq!(
        start.elapsed(),
        ms(800),
        "the race went on with the primary"
    );
    assert_eq!(outcome(&res), HedgeOutcome::new(1, 0, Some(ms(500))));
    let (got, _, err) = frames(res.into_body()).await;
    assert!(!err);
    assert_eq!(concat(&got), Plan::sse(ms(800)).bytes());
    assert!(!probe.cancelled());
    assert!(none_sent(&mut handle), "no backup was sent");
}

#[tokio::test(start_paused = true)]
async fn a_backup_goes_out_when_the_service_is_ready_again() {
    let (svc, mut handle) = pair();
    handle.allow(1);
    let start = Instant::now();
    let race = tokio::spawn(layer().layer(svc).oneshot(chat_request()));
    let (_, send) = handle.next_request().await.unwrap();
    let primary = answer(send, Plan::sse(ms(10_000)));
    // The delay passes at 500 ms; the service is ready again at 700 ms.
    tokio::time::sleep(ms(700)).await;
    handle.allow(1);
    let (backup, send) = handle.next_request().await.unwrap();
    assert_eq!(start.elapsed(), ms(700));
    assert_eq!(attempt(&backup), 1);
    let _backup = answer(send, Plan::sse(ms(20)));
    let res = race.await.unwrap().unwrap();
    assert_eq!(start.elapsed(), ms(720));
    assert_eq!(outcome(&res), HedgeOutcome::new(2, 1, Some(ms(500))));
    assert!(primary.cancelled(), "the loser was dropped at commit");
}

#[tokio::test(start_paused = true)]
async fn a_poll_ready_error_is_a_failed_attempt_and_the_race_goes_on() {
    let (svc, mut handle) = pair();
    let race = tokio::spawn(layer().layer(svc).oneshot(chat_request()));
    let (_, send) = handle.next_request().await.unwrap();
    let _primary = answer(send, Plan::sse(ms(800)));
    // The next poll_ready, the backup's at 500 ms, fails.
    handle.send_error(TransportError);
    let res = race.await.unwrap().unwrap();
    assert_eq!(
        outcome(&res),
        HedgeOutcome::new(2, 0, Some(ms(500))),
        "the backup counts as sent, and failed"
    );
    let (got, _, err) = frames(res.into_body()).await;
    assert!(!err);
    assert_eq!(concat(&got), Plan::sse(ms(800)).bytes());
    assert!(none_sent(&mut handle), "nothing was called");
}

#[tokio::test(start_paused = true)]
async fn when_every_attempt_fails_the_later_readiness_error_is_returned_and_reported() {
    let (svc, mut handle) = pair();
    let report = EndReport::new();
    let mut req = chat_request();
    req.extensions_mut().insert(report.clone());
    let race = tokio::spawn(layer().layer(svc).oneshot(req));
    let (_, send) = handle.next_request().await.unwrap();
    // The primary fails in transport, so the backup is wanted at once; its poll_ready fails.
    handle.send_error(TransportError);
    send.send_error(io::Error::other("primary refused"));
    let err = race.await.unwrap().unwrap_err();
    assert!(err.downcast_ref::<TransportError>().is_some(), "{err}");
    assert_eq!(
        report.get(),
        Some(EndReason::UpstreamError(UpstreamFailure::Transport))
    );
    assert!(none_sent(&mut handle));
}

#[tokio::test(start_paused = true)]
async fn the_outer_poll_ready_is_the_inner_one() {
    let (svc, mut handle) = pair();
    let mut svc = layer().layer(svc);
    handle.send_error(TransportError);
    let err = svc.ready().await.unwrap_err();
    assert!(err.downcast_ref::<TransportError>().is_some(), "{err}");
}
