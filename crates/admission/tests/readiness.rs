//! The inner service's readiness under admission, with tower-test's mock service: `poll_ready`
//! only forwards the inner readiness (the decision is made in `call`), and a queued request
//! carries the ready service it was called on, so once admitted it is sent on it (a call
//! without readiness would panic the mock) without waiting on the outer `poll_ready`.

mod common;

use std::task::Poll;
use std::time::Duration;

use common::*;
use http::{Request, Response, StatusCode};
use tailguard_admission::BoundedAdmissionLayer;
use tower::{Service, ServiceExt};
use tower_test::mock::{self, Handle, Spawn};

type Svc = tailguard_admission::BoundedAdmission<mock::Mock<Request<()>, Response<ScriptBody>>>;

fn spawn(layer: BoundedAdmissionLayer) -> (Spawn<Svc>, Handle<Request<()>, Response<ScriptBody>>) {
    mock::spawn_layer(layer)
}

fn id(req: &Request<()>) -> &str {
    req.headers()["x-id"].to_str().unwrap()
}

/// Answers the next request with a body the test feeds: (the request's id, the feed).
async fn answer_fed(handle: &mut Handle<Request<()>, Response<ScriptBody>>) -> (String, Feed) {
    let (req, send) = handle.next_request().await.unwrap();
    let (body, feed) = ScriptBody::fed();
    send.send_response(Response::new(body));
    (id(&req).to_owned(), feed)
}

/// Whether no request reached `handle` (its mock may be gone by now).
fn none_sent(handle: &mut Handle<Request<()>, Response<ScriptBody>>) -> bool {
    !matches!(handle.poll_request(), Poll::Ready(Some(_)))
}

#[tokio::test(start_paused = true)]
async fn poll_ready_is_the_inner_readiness_whatever_the_gate_holds() {
    let layer = BoundedAdmissionLayer::new(1);
    let gate = layer.handle();
    let (mut svc, mut handle) = spawn(layer);
    // The gate is empty, but the inner service is not ready: neither is admission.
    handle.allow(0);
    assert!(svc.poll_ready().is_pending());
    handle.allow(1);
    assert!(svc.is_woken(), "the inner readiness wakes the caller");
    assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
    let res = tokio::spawn(svc.call(request("a")));
    let (a, feed) = answer_fed(&mut handle).await;
    assert_eq!(a, "a");
    let res = res.await.unwrap().unwrap();
    assert_eq!(gate.in_flight(), 1);
    // The gate is full, and a ready inner service makes admission ready all the same: the
    // refusal (or the queue) comes in `call`.
    handle.allow(1);
    assert!(matches!(svc.poll_ready(), Poll::Ready(Ok(()))));
    // An inner readiness error is admission's.
    handle.send_error(TransportError);
    let err = svc.poll_ready().map_err(|e| e.to_string());
    assert_eq!(err, Poll::Ready(Err(TransportError.to_string())));
    drop((res, feed));
    assert_eq!(gate.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_is_sent_on_the_service_it_was_made_ready_on() {
    let layer = BoundedAdmissionLayer::new(1).with_queue_timeout(Duration::from_secs(60));
    let gate = layer.handle();
    let (mut svc, mut handle) = spawn(layer);
    let a = tokio::spawn(svc.get_mut().ready().await.unwrap().call(request("a")));
    let (_, feed_a) = answer_fed(&mut handle).await;
    let a = a.await.unwrap().unwrap();
    // b is made ready, called, and queued: the gate is full.
    let b = tokio::spawn(svc.get_mut().ready().await.unwrap().call(request("b")));
    settle().await;
    assert_eq!((gate.in_flight(), gate.queued()), (1, 1));
    assert!(
        none_sent(&mut handle),
        "b waits in admission, not in the inner service"
    );
    // The inner service is not ready for anyone else now; b keeps the readiness it had.
    handle.allow(0);
    assert!(svc.poll_ready().is_pending());
    // a's stream ends: b is admitted and sent at once, without another poll_ready.
    drop(feed_a);
    drain(a.into_body()).await.unwrap();
    let (req, send) = handle.next_request().await.unwrap();
    assert_eq!(id(&req), "b");
    send.send_response(Response::new(ScriptBody::new([data(DONE)])));
    let b = b.await.unwrap().unwrap();
    assert_eq!(b.status(), StatusCode::OK);
    assert_eq!(&drain(b.into_body()).await.unwrap()[..], DONE.as_bytes());
    assert_eq!((gate.in_flight(), gate.queued()), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn a_queued_request_that_times_out_never_reaches_the_inner_service() {
    let layer = BoundedAdmissionLayer::new(1)
        .with_queue_timeout(Duration::from_millis(300))
        .with_codel(None);
    let (mut svc, mut handle) = spawn(layer);
    let a = tokio::spawn(svc.get_mut().ready().await.unwrap().call(request("a")));
    let (_, _feed_a) = answer_fed(&mut handle).await;
    let _a = a.await.unwrap().unwrap();
    let b = svc
        .get_mut()
        .ready()
        .await
        .unwrap()
        .call(request("b"))
        .await;
    assert_eq!(b.unwrap().status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(none_sent(&mut handle), "b was refused before any call");
}
