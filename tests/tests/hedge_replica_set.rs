//! `FirstTokenHedge` over `tailguard-route`'s `ReplicaSet`: each attempt goes to a replica not
//! yet tried, a replica that is not ready (or fails `poll_ready`) holds only its own attempt
//! back, and a slow replica's attempt is cancelled upstream. Moved from
//! `crates/hedge/tests/{race,readiness,loopback}.rs` when the set got a crate of its own: the
//! hedge and the set depend on core's attempt protocol and not on each other, so what tests
//! them together lives here, with the hedge tests' in-process upstream.

#[path = "../../crates/hedge/tests/common/mod.rs"]
mod common;

/// In-process, scripted upstreams (from `crates/hedge/tests/race.rs`).
mod race {
    use super::common::*;
    use tailguard_core::HedgeOutcome;
    use tailguard_route::ReplicaSet;
    use tower::{Layer, ServiceExt};

    /// The outcome without its cost fields.
    fn outcome<B>(res: &http::Response<B>) -> Option<HedgeOutcome> {
        outcome_without_costs(res)
    }

    #[tokio::test(start_paused = true)]
    async fn replica_set_sends_each_attempt_to_a_replica_not_yet_tried() {
        let slow = Upstream::new(vec![Plan::sse(ms(10_000))]);
        let fast1 = Upstream::new(vec![Plan::sse(ms(10))]);
        let fast2 = Upstream::new(vec![Plan::sse(ms(10))]);
        let svc = layer().layer(ReplicaSet::new([
            slow.clone(),
            fast1.clone(),
            fast2.clone(),
        ]));
        // Round robin starts at replica 0 (the slow one): the backup must go elsewhere.
        let res = svc.clone().oneshot(chat_request()).await.unwrap();
        assert_eq!(outcome(&res), Some(HedgeOutcome::new(2, 1, Some(ms(500)))));
        assert_eq!(slow.seen().len(), 1);
        assert!(slow.seen()[0].cancelled);
        let backup = fast1.seen();
        assert_eq!(backup.len(), 1);
        assert_eq!(backup[0].attempt, Some(1));
        assert_eq!(
            backup[0].tried, 2,
            "the primary's replica and its own are recorded"
        );
        assert!(fast2.seen().is_empty());
    }
}

/// tower-test's mock services as replicas (from `crates/hedge/tests/readiness.rs`).
mod readiness {
    use std::task::Poll;

    use super::common::*;
    use bytes::Bytes;
    use http::{Request, Response};
    use http_body_util::Full;
    use tailguard_core::attempt::Attempt;
    use tailguard_core::{HedgeOutcome, ReplayBody};
    use tailguard_route::ReplicaSet;
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
    async fn a_backup_to_a_replica_that_is_not_ready_waits_in_its_attempt() {
        let (a, mut ha) = pair();
        let (b, mut hb) = pair();
        hb.allow(0);
        let start = Instant::now();
        let race = tokio::spawn(
            layer()
                .layer(ReplicaSet::new([a, b]))
                .oneshot(chat_request()),
        );
        let (_, send) = ha.next_request().await.unwrap();
        let _primary = answer(send, Plan::sse(ms(800)));
        let res = race.await.unwrap().unwrap();
        assert_eq!(start.elapsed(), ms(800));
        assert_eq!(
            outcome(&res),
            HedgeOutcome::new(2, 0, Some(ms(500))),
            "the backup went to its replica, which never became ready"
        );
        assert!(none_sent(&mut hb), "replica b was never called");
    }

    #[tokio::test(start_paused = true)]
    async fn a_replica_whose_poll_ready_errors_fails_over_at_once() {
        let (a, mut ha) = pair();
        let (b, mut hb) = pair();
        let (c, mut hc) = pair();
        hb.send_error(TransportError);
        let svc = layer()
            .with_max_attempts(3)
            .layer(ReplicaSet::new([a, b, c]));
        let start = Instant::now();
        let race = tokio::spawn(svc.oneshot(chat_request()));
        let (_, send) = ha.next_request().await.unwrap();
        let primary = answer(send, Plan::sse(ms(10_000)));
        let (third, send) = hc.next_request().await.unwrap();
        assert_eq!(start.elapsed(), ms(500), "sent with the failed backup");
        assert_eq!(attempt(&third), 2);
        let _third = answer(send, Plan::sse(ms(30)));
        let res = race.await.unwrap().unwrap();
        assert_eq!(outcome(&res), HedgeOutcome::new(3, 2, Some(ms(500))));
        assert!(primary.cancelled());
        assert!(none_sent(&mut hb), "replica b was never called");
    }
}

/// Real loopback sockets: a hyper client in front of `tailguard-mock` replicas (from
/// `crates/hedge/tests/loopback.rs`).
mod loopback {
    use http::{Response, StatusCode};
    use tailguard_core::HedgeOutcome;
    use tailguard_mock::{MockServer, Outcome, Script};
    use tailguard_route::ReplicaSet;
    use tailguard_test_support::{CHAT, MESSAGES, client as plain_client, ms, post, read_all};
    use tokio::time::Instant;
    use tower::{Layer, ServiceExt};

    use super::common::layer;
    use super::common::loopback::{client, replica};

    /// The bytes a direct call (no hedge) to `server` returns.
    async fn direct(
        server: &MockServer,
        path: &str,
        body: &str,
        headers: &[(&str, &str)],
    ) -> Vec<u8> {
        let res = plain_client()
            .request(post(&format!("{}{path}", server.url()), body, headers))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let (bytes, err) = read_all(res.into_body()).await;
        assert!(!err);
        bytes
    }

    /// The outcome without its cost fields.
    fn outcome<B>(res: &Response<B>) -> HedgeOutcome {
        let mut o = res.extensions().get::<HedgeOutcome>().cloned().unwrap();
        o.losers.clear();
        o.wasted_prompt_bytes = 0;
        o.wasted_prompt_tokens = None;
        o
    }

    fn script() -> Script {
        Script::new().ttft(ms(80)).tokens(5).gap(ms(10))
    }

    #[tokio::test(start_paused = true)]
    async fn slow_first_token_backup_wins_and_the_primary_is_cancelled_upstream() {
        // Two replicas: the primary goes to `slow` (headers at once, first token after 10 s), the
        // backup to `fast`.
        let slow = MockServer::start(script().ttft(ms(10_000))).await.unwrap();
        let fast = MockServer::start(script()).await.unwrap();
        let reference = MockServer::start(script()).await.unwrap();
        let expected = direct(&reference, "/v1/chat/completions", CHAT, &[]).await;

        let c = client();
        let svc = layer().layer(ReplicaSet::new([
            replica(c.clone(), slow.url()),
            replica(c.clone(), fast.url()),
        ]));
        let start = Instant::now();
        let res = svc
            .oneshot(post("/v1/chat/completions", CHAT, &[]))
            .await
            .unwrap();
        let ttft = start.elapsed();
        assert!(ttft >= ms(580) && ttft < ms(600), "{ttft:?}");
        assert_eq!(outcome(&res), HedgeOutcome::new(2, 1, Some(ms(500))));
        let (bytes, err) = read_all(res.into_body()).await;
        assert!(!err);
        assert_eq!(
            bytes, expected,
            "the client gets the backup's stream exactly"
        );

        slow.wait_idle().await;
        let s = slow.stats();
        assert_eq!((s.requests, s.cancelled), (1, 1));
        assert_eq!(s.log[0].outcome, Outcome::Cancelled);
        assert_eq!(s.log[0].tokens_sent, 0);
        let f = fast.stats();
        assert_eq!((f.requests, f.completed), (1, 1));
        assert_eq!(f.log[0].attempt.as_deref(), Some("1"));
        assert_eq!(f.log[0].started - s.log[0].started, ms(500));
    }

    #[tokio::test(start_paused = true)]
    async fn anthropic_stream_is_hedged_on_its_first_content_delta() {
        let slow = MockServer::start(script().ttft(ms(10_000))).await.unwrap();
        let fast = MockServer::start(script()).await.unwrap();
        let reference = MockServer::start(script()).await.unwrap();
        let expected = direct(&reference, "/v1/messages", MESSAGES, &[]).await;
        let c = client();
        let svc = layer().layer(ReplicaSet::new([
            replica(c.clone(), slow.url()),
            replica(c.clone(), fast.url()),
        ]));
        let res = svc
            .oneshot(post("/v1/messages", MESSAGES, &[]))
            .await
            .unwrap();
        assert_eq!(outcome(&res).winner, Some(1));
        let (bytes, _) = read_all(res.into_body()).await;
        assert_eq!(bytes, expected);
        assert!(String::from_utf8_lossy(&bytes).contains("message_start"));
        slow.wait_idle().await;
        assert_eq!(slow.stats().cancelled, 1);
    }
}
