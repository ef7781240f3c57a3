//! The strategies, each built over the same replica services.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::Full;
use tailguard::admission::BoundedAdmissionLayer;
use tailguard::core::attempt::Attempt;
use tailguard::hedge::{AdaptiveDelay, FirstTokenHedgeLayer, HedgeBudget};
use tailguard::phases::LatencyPhaseRecorderLayer;
use tailguard::priority::PriorityClassLayer;
use tailguard::route::{Ejection, ReplicaSet};
use tailguard::timeout::SseIdleTimeoutLayer;
use tower::ServiceBuilder;
use tower::buffer::Buffer;
use tower::hedge::{Hedge, Policy};
use tower::util::BoxCloneService;

use crate::upstream::{BoxError, Stack, Upstream, box_body};

/// A way to send a request to the replicas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// Round robin (`ReplicaSet::round_robin`), one attempt.
    NoHedge,
    /// `tower::balance::p2c` over each replica's in-flight streams, one attempt (see
    /// [`crate::balance`]).
    P2c,
    /// `tower::hedge` (p90 of latency to headers, 20 data points, 1 s period) over the
    /// round robin. The `FirstTokenHedge` strategies below but `RoundRobinHedge` use the
    /// default `ReplicaSet`, which is load-aware (issue 14).
    TowerHedge,
    /// `FirstTokenHedge` with a fixed delay.
    FixedDelay,
    /// `FirstTokenHedge` with the defaults over `ReplicaSet::round_robin`: the default before
    /// load-aware routing.
    RoundRobinHedge,
    /// `FirstTokenHedge` with the defaults (adaptive delay, p90 of recent TTFTs) over the
    /// default `ReplicaSet` (load-aware, with ejection), as `ReplicaSet::new` builds it.
    Adaptive,
    /// `Adaptive` with every time constant of the defaults scaled by 0.1, as the D scenarios'
    /// time scale is: what the defaults do on issue 14's own time scale.
    AdaptiveScaled,
    /// Recorder → priority → timeouts → admission → adaptive `FirstTokenHedge`.
    FullStack,
    /// No hedge; a router that knows when the other clients' long prompts occupy each replica
    /// (from their own senders) and sends every request to a replica that is free (round robin
    /// otherwise): the best any routing policy could do, a reference for scenarios with
    /// background traffic.
    Oracle,
}

impl Strategy {
    pub(crate) const ALL: [Strategy; 9] = [
        Strategy::NoHedge,
        Strategy::P2c,
        Strategy::TowerHedge,
        Strategy::FixedDelay,
        Strategy::RoundRobinHedge,
        Strategy::Adaptive,
        Strategy::AdaptiveScaled,
        Strategy::FullStack,
        Strategy::Oracle,
    ];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Strategy::NoHedge => "no hedge",
            Strategy::P2c => "tower p2c in-flight",
            Strategy::TowerHedge => "tower::hedge p90",
            Strategy::FixedDelay => "FirstTokenHedge fixed",
            Strategy::RoundRobinHedge => "FirstTokenHedge round robin",
            Strategy::Adaptive => "FirstTokenHedge adaptive p90",
            Strategy::AdaptiveScaled => "FirstTokenHedge adaptive x0.1",
            Strategy::FullStack => "full stack",
            Strategy::Oracle => "oracle router (no hedge)",
        }
    }

    pub(crate) fn key(self) -> &'static str {
        match self {
            Strategy::NoHedge => "no_hedge",
            Strategy::P2c => "tower_p2c",
            Strategy::TowerHedge => "tower_hedge",
            Strategy::FixedDelay => "first_token_hedge_fixed",
            Strategy::RoundRobinHedge => "first_token_hedge_round_robin",
            Strategy::Adaptive => "first_token_hedge_adaptive",
            Strategy::AdaptiveScaled => "first_token_hedge_adaptive_scaled",
            Strategy::FullStack => "full_stack",
            Strategy::Oracle => "oracle",
        }
    }

    /// Whether it hedges on the first token (the strategies the targets are about).
    pub(crate) fn first_token(self) -> bool {
        matches!(
            self,
            Strategy::FixedDelay
                | Strategy::RoundRobinHedge
                | Strategy::Adaptive
                | Strategy::AdaptiveScaled
                | Strategy::FullStack
        )
    }
}

/// `tower::hedge`'s request policy: clone every request; the clone shares the primary's
/// [`Attempt`] so the router sends it to the other replica.
#[derive(Clone, Copy, Debug)]
struct ClonePolicy;

impl Policy<Request<Full<Bytes>>> for ClonePolicy {
    fn clone_request(&self, req: &Request<Full<Bytes>>) -> Option<Request<Full<Bytes>>> {
        let mut clone = Request::new(req.body().clone());
        *clone.method_mut() = req.method().clone();
        *clone.uri_mut() = req.uri().clone();
        *clone.version_mut() = req.version();
        *clone.headers_mut() = req.headers().clone();
        clone
            .headers_mut()
            .insert("x-tailguard-attempt", http::HeaderValue::from_static("1"));
        if let Some(a) = req.extensions().get::<Attempt>() {
            clone.extensions_mut().insert(a.clone());
        }
        Some(clone)
    }

    fn can_retry(&self, _req: &Request<Full<Bytes>>) -> bool {
        true
    }
}

fn boxed_response<B>(res: Response<B>) -> Response<crate::upstream::BoxBody>
where
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    res.map(box_body)
}

/// Other clients' requests in flight on each replica, kept by their senders.
#[derive(Clone, Debug)]
pub(crate) struct Busy(pub(crate) Arc<[AtomicUsize]>);

impl Busy {
    pub(crate) fn new(replicas: usize) -> Self {
        Busy((0..replicas).map(|_| AtomicUsize::new(0)).collect())
    }

    fn is_busy(&self, i: usize) -> bool {
        self.0.get(i).is_some_and(|n| n.load(Ordering::Relaxed) > 0)
    }
}

/// The oracle's router: a replica that is not busy now, round robin among those.
#[derive(Clone)]
struct OracleRouter {
    replicas: Arc<[Upstream]>,
    busy: Busy,
    next: Arc<AtomicUsize>,
}

impl tower::Service<Request<Full<Bytes>>> for OracleRouter {
    type Response = <Upstream as tower::Service<Request<Full<Bytes>>>>::Response;
    type Error = BoxError;
    type Future = <Upstream as tower::Service<Request<Full<Bytes>>>>::Future;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Full<Bytes>>) -> Self::Future {
        let n = self.replicas.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let i = (0..n)
            .map(|k| (start + k) % n)
            .find(|&i| !self.busy.is_busy(i))
            .unwrap_or(start);
        self.replicas[i].clone().call(req)
    }
}

/// A `FirstTokenHedge` with `layer` over `set`, boxed.
fn hedged(layer: FirstTokenHedgeLayer, set: ReplicaSet<Upstream>) -> Stack {
    BoxCloneService::new(
        ServiceBuilder::new()
            .map_response(boxed_response)
            .layer(layer)
            .service(set),
    )
}

/// The defaults with every time constant (and the budgets' floor rates) scaled to a 10x
/// faster time: decay 1 s; slowness ejection from 100 ms, for 3 s to 30 s; delay window 3 s,
/// bounds 5 ms to 1 s; failover budget floor 10/s (the hedge budget has none).
fn scaled(set: ReplicaSet<Upstream>) -> (FirstTokenHedgeLayer, ReplicaSet<Upstream>) {
    let (ms, s) = (Duration::from_millis, Duration::from_secs);
    let set = set.with_decay(s(1)).with_ejection(
        Ejection::new()
            .with_slow_min(ms(100))
            .with_period(s(3), s(30)),
    );
    let delay = AdaptiveDelay::new()
        .with_window(s(3))
        .with_bounds(ms(5), s(1));
    let layer = FirstTokenHedgeLayer::new()
        .with_delay(delay)
        .with_failover_budget(HedgeBudget::failover().with_floor(10.0));
    (layer, set)
}

/// The full stack: recorder, priority, timeouts, admission, then the hedge over `set`.
fn full_stack(set: ReplicaSet<Upstream>) -> Stack {
    BoxCloneService::new(
        ServiceBuilder::new()
            .map_err(Into::<BoxError>::into)
            .map_response(boxed_response)
            .layer(LatencyPhaseRecorderLayer::new().with_routes(["/v1/chat/completions"]))
            .layer(PriorityClassLayer::new())
            .layer(
                SseIdleTimeoutLayer::new()
                    .with_first_token_timeout(Duration::from_secs(5))
                    .with_idle_timeout(Duration::from_secs(2))
                    .with_total_timeout(Duration::from_secs(30)),
            )
            .layer(BoundedAdmissionLayer::new(1024).with_queue_len(1024))
            .layer(FirstTokenHedgeLayer::new())
            .service(set),
    )
}

/// Builds `strategy` over `replicas`; `slots`: the slots per replica the strategy is told of
/// (`ReplicaSet::with_slots`, or a slot per endpoint under tower's p2c).
pub(crate) fn build(
    strategy: Strategy,
    replicas: Vec<Upstream>,
    fixed_delay: Duration,
    slots: Option<u32>,
    busy: Busy,
) -> Stack {
    let round_robin = |r| ReplicaSet::round_robin(r).with_slots(slots);
    let set = |r| ReplicaSet::new(r).with_slots(slots);
    match strategy {
        Strategy::Oracle => {
            BoxCloneService::new(ServiceBuilder::new().map_response(boxed_response).service(
                OracleRouter {
                    replicas: replicas.into(),
                    busy,
                    next: Arc::default(),
                },
            ))
        }
        Strategy::NoHedge => BoxCloneService::new(
            ServiceBuilder::new()
                .map_response(boxed_response)
                .service(round_robin(replicas)),
        ),
        Strategy::P2c => crate::balance::p2c(replicas, slots),
        Strategy::TowerHedge => {
            let hedge = Hedge::new(
                round_robin(replicas),
                ClonePolicy,
                20,
                0.9,
                Duration::from_secs(1),
            );
            BoxCloneService::new(
                ServiceBuilder::new()
                    .map_response(boxed_response)
                    .service(Buffer::new(hedge, 4096)),
            )
        }
        Strategy::FixedDelay => hedged(
            FirstTokenHedgeLayer::new().with_delay(fixed_delay),
            set(replicas),
        ),
        Strategy::RoundRobinHedge => hedged(FirstTokenHedgeLayer::new(), round_robin(replicas)),
        Strategy::Adaptive => hedged(FirstTokenHedgeLayer::new(), set(replicas)),
        Strategy::AdaptiveScaled => {
            let (layer, set) = scaled(set(replicas));
            hedged(layer, set)
        }
        Strategy::FullStack => full_stack(set(replicas)),
    }
}
