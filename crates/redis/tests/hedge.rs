//! A hedge budget shared by three gateways through a real redis-server.

mod common;

use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use common::{pool, redis_url};
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::{BodyExt, Full};
use tailguard_core::{HedgeOutcome, ReplayBody};
use tailguard_hedge::{FirstTokenHedgeLayer, HedgeBudget, SharedBudget};
use tailguard_redis::{Redis, RedisBudget};
use tokio::time::Sleep;
use tower::{Layer, ServiceExt};

/// An SSE body whose first token comes after a delay.
struct TokenBody {
    sleep: Pin<Box<Sleep>>,
    done: bool,
}

impl Body for TokenBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.done {
            return Poll::Ready(None);
        }
        ready!(self.sleep.as_mut().poll(cx));
        self.done = true;
        let token = "data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}\n\ndata: [DONE]\n\n";
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(token.as_bytes())))))
    }
}

/// Three gateways (each its own layer, budget allowance and connection) share one budget of
/// ratio 0.05 and max balance 10 over an upstream whose first token is slow for half the
/// requests: the extra attempts of all three stay within the one shared budget (local budgets
/// would allow three max balances).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_share_one_hedge_budget_under_a_half_slow_upstream() {
    let Some(url) = redis_url("three_gateways_share_one_hedge_budget") else {
        return;
    };
    let calls = Arc::new(AtomicUsize::new(0));
    let up = {
        let calls = calls.clone();
        tower::service_fn(move |req: Request<ReplayBody<Full<Bytes>>>| {
            calls.fetch_add(1, Ordering::SeqCst);
            let slow = req.headers().contains_key("x-slow");
            let d = Duration::from_millis(if slow { 300 } else { 5 });
            let body = TokenBody {
                sleep: Box::pin(tokio::time::sleep(d)),
                done: false,
            };
            std::future::ready(Ok::<_, Infallible>(Response::new(body)))
        })
    };
    let name = pool("hedge");
    let gateways: Vec<_> = (0..3)
        .map(|_| {
            let redis = Redis::new(&url, Duration::from_millis(200)).expect("url");
            let shared =
                SharedBudget::new(Arc::new(RedisBudget::new(redis, "tailguard-test", &name)));
            let budget = HedgeBudget::new()
                .with_ratio(0.05)
                .with_floor(0.0)
                .with_max_balance(10.0)
                .with_shared(shared);
            FirstTokenHedgeLayer::new()
                .with_delay(Duration::from_millis(50))
                .with_budget(budget)
                .layer(up.clone())
        })
        .collect();
    let n = 300usize;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..n {
        let svc = gateways[i % 3].clone();
        let mut req = Request::post("/v1/chat/completions")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(
                br#"{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}"#,
            )))
            .expect("request");
        if i % 2 == 1 {
            req.headers_mut()
                .insert("x-slow", "1".parse().expect("header"));
        }
        tasks.spawn(async move {
            let res = svc.oneshot(req).await.expect("answer");
            let o = res.extensions().get::<HedgeOutcome>().cloned();
            let _ = res.into_body().collect().await;
            o.map_or(0, |o| usize::from(o.attempts) - 1)
        });
        tokio::time::sleep(Duration::from_millis(4)).await;
    }
    let hedged: usize = tasks.join_all().await.into_iter().sum();
    let bound = 0.05 * n as f64 + 10.0;
    eprintln!(
        "{n} requests over 3 gateways, half slow: {hedged} extra attempts (shared bound {bound}, \
         three local budgets would allow {})",
        0.05 * n as f64 + 30.0
    );
    assert_eq!(calls.load(Ordering::SeqCst), n + hedged);
    assert!(hedged as f64 <= bound, "{hedged} > {bound}");
    assert!(hedged >= 5, "the shared budget was used: {hedged}");
}
