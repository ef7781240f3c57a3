//! The scenarios: replicas, other clients' traffic, the measured load and the strategies run.

use std::time::Duration;

use tailguard_mock::{Latency, Script, SplitMix64};

use crate::slot::SlotMode;
use crate::strategy::Strategy;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// One replica: its script, and optionally a queue of per-request scripts it follows first.
#[derive(Clone, Debug)]
pub(crate) struct Replica {
    pub(crate) script: Script,
    pub(crate) queue: Vec<Script>,
}

impl Replica {
    fn new(script: Script) -> Self {
        Replica {
            script,
            queue: Vec::new(),
        }
    }
}

/// When another client sends its next request.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Pacing {
    /// On a fixed schedule, this far apart (open loop).
    Every(Duration),
    /// This long after its previous request ended (closed loop: one request at a time).
    Think(Duration),
}

/// Another client, outside the measured traffic, sending straight to one replica.
#[derive(Clone, Debug)]
pub(crate) struct Other {
    pub(crate) replica: usize,
    pub(crate) first: Duration,
    pub(crate) pacing: Pacing,
    /// Its requests' `x-mock-script`.
    pub(crate) script: &'static str,
}

#[derive(Clone, Debug)]
pub(crate) struct Scenario {
    pub(crate) key: &'static str,
    pub(crate) title: &'static str,
    pub(crate) description: &'static str,
    pub(crate) replicas: Vec<Replica>,
    /// Other clients, each sending while the measured traffic does.
    pub(crate) others: Vec<Other>,
    pub(crate) rate: f64,
    pub(crate) requests: u64,
    /// Tokens of a measured request's complete answer.
    pub(crate) tokens: u32,
    pub(crate) fixed_delay: Duration,
    /// The TTFT distribution of a healthy, idle replica (for the floor).
    pub(crate) fast: Latency,
    /// The bench's single-slot replicas in front of the mocks (`None`: the mocks are the
    /// replicas).
    pub(crate) slot_mode: Option<SlotMode>,
    /// Slots per replica the strategies are told of.
    pub(crate) slots: Option<u32>,
    pub(crate) strategies: &'static [Strategy],
}

/// The strategies of scenarios A, B and C.
const CLASSIC: &[Strategy] = &[
    Strategy::NoHedge,
    Strategy::TowerHedge,
    Strategy::FixedDelay,
    Strategy::Adaptive,
    Strategy::FullStack,
];

/// Scenario A: a congested replica, the problem statement's numbers scaled by 0.1.
pub(crate) fn a(requests: u64) -> Scenario {
    let fast = Latency::log_normal(ms(50), 0.05);
    let script = |seed| {
        Script::new()
            .ttft(Latency::mixture(fast.clone(), Latency::ms(500), 0.05))
            .tokens(20)
            .gap(ms(5))
            .seed(seed)
    };
    Scenario {
        key: "a",
        title: "A: congested replica",
        description: "2 replicas; TTFT lognormal(50ms, 0.05), 5% of requests land on a congested replica (TTFT 500ms); 20 tokens 5ms apart; 100 req/s",
        replicas: vec![Replica::new(script(11)), Replica::new(script(12))],
        others: Vec::new(),
        rate: 100.0,
        requests,
        tokens: 20,
        fixed_delay: ms(60),
        fast,
        slot_mode: None,
        slots: None,
        strategies: CLASSIC,
    }
}

/// Scenario B: head-of-line blocking behind long prompts on single-slot replicas.
pub(crate) fn b(requests: u64) -> Scenario {
    let fast = Latency::log_normal(ms(20), 0.05);
    let script = |seed| {
        Script::new()
            .ttft(fast.clone())
            .tokens(5)
            .gap(ms(2))
            .single_slot(true)
            .seed(seed)
    };
    let long = |replica, first| Other {
        replica,
        first,
        pacing: Pacing::Every(ms(12_000)),
        script: "ttft=800ms",
    };
    Scenario {
        key: "b",
        title: "B: head-of-line blocking",
        description: "2 single-slot replicas (one generation at a time); measured requests TTFT lognormal(20ms, 0.05), 5 tokens 2ms apart, 20 req/s; other clients' long-prompt requests (TTFT 800ms) reach each replica directly every 12 s (staggered by 6 s), so about 7% of the time a replica is occupied and short requests queue behind it",
        replicas: vec![Replica::new(script(21)), Replica::new(script(22))],
        others: vec![long(0, ms(2000)), long(1, ms(8000))],
        rate: 20.0,
        requests,
        tokens: 5,
        fixed_delay: ms(50),
        fast,
        slot_mode: None,
        slots: None,
        strategies: &[
            Strategy::NoHedge,
            Strategy::TowerHedge,
            Strategy::FixedDelay,
            Strategy::Adaptive,
            Strategy::FullStack,
            Strategy::Oracle,
        ],
    }
}

/// Scenario C: one flaky replica.
pub(crate) fn c(requests: u64) -> Scenario {
    let fast = Latency::log_normal(ms(50), 0.05);
    let healthy = |seed| {
        Script::new()
            .ttft(fast.clone())
            .tokens(20)
            .gap(ms(5))
            .seed(seed)
    };
    // 10% of the flaky replica's requests get a 503, 10% a connection reset, both before the
    // first token; the rest are served normally. One script per request, in arrival order.
    let mut rng = SplitMix64::new(33);
    let queue = (0..requests * 2)
        .map(|_| {
            let x = rng.next_f64();
            if x < 0.1 {
                healthy(32).status(http::StatusCode::SERVICE_UNAVAILABLE)
            } else if x < 0.2 {
                healthy(32).reset_before_headers()
            } else {
                healthy(32)
            }
        })
        .collect();
    Scenario {
        key: "c",
        title: "C: flaky replica",
        description: "2 replicas, TTFT lognormal(50ms, 0.05), 20 tokens 5ms apart; 20% of one replica's requests fail before the first token (10% 503, 10% connection reset); 100 req/s",
        replicas: vec![
            Replica::new(healthy(31)),
            Replica {
                script: healthy(32),
                queue,
            },
        ],
        others: Vec::new(),
        rate: 100.0,
        requests,
        tokens: 20,
        fixed_delay: ms(60),
        fast,
        slot_mode: None,
        slots: None,
        strategies: CLASSIC,
    }
}

/// The strategies of the D scenarios.
const ROUTING: &[Strategy] = &[
    Strategy::NoHedge,
    Strategy::P2c,
    Strategy::RoundRobinHedge,
    Strategy::Adaptive,
    Strategy::AdaptiveScaled,
];

/// Scenario D: hidden congestion, on a 10x faster time scale (long prompts' first token after
/// 350 ms instead of 3.5 s, measured requests at 15/s instead of 1.5/s). `mode`: what the
/// single-slot replicas do with a request while their slot is taken; `slots`: the slots per
/// replica the strategies are told of.
pub(crate) fn d(requests: u64, mode: SlotMode, slots: Option<u32>) -> Scenario {
    let fast = Latency::log_normal(ms(20), 0.05);
    let script = |seed| {
        Script::new()
            .ttft(fast.clone())
            .tokens(5)
            .gap(ms(2))
            .seed(seed)
    };
    let (key, title, description, strategies) = match (mode, slots) {
        (SlotMode::Fifo, None) => (
            "d",
            "D: hidden congestion",
            "2 single-slot replicas (the bench's own: response head at once, first token when the slot frees, waiting requests served FIFO); measured requests TTFT lognormal(20ms, 0.05), 5 tokens 2ms apart, Poisson 15 req/s; another client keeps replica 1 about 90% busy with long prompts sent straight to it (TTFT 350ms; its next one 40ms after the previous ends); the strategies know of no slot limit. Issue 14's scenario D (first token after 3.5 s, 1.5 req/s) on a 10x faster time scale",
            &[
                Strategy::NoHedge,
                Strategy::P2c,
                Strategy::RoundRobinHedge,
                Strategy::Adaptive,
                Strategy::AdaptiveScaled,
                Strategy::Oracle,
            ][..],
        ),
        (SlotMode::Fifo, Some(_)) => (
            "d_slots",
            "D-slots: hidden congestion, 1 slot per replica (FIFO)",
            "scenario D, every strategy told of 1 slot per replica (ReplicaSet::with_slots(Some(1)); under tower's p2c a slot per endpoint, held to the end of the body, as readiness); the replicas queue FIFO",
            ROUTING,
        ),
        (SlotMode::Interrupt, _) => (
            "d_interrupt",
            "D-slots: hidden congestion, 1 slot per replica (interrupting)",
            "scenario D-slots, but a replica whose slot is taken ends the running stream with data: [DONE] after its next frame for the newer request (llama-cpp-python's interrupt_requests, its default; a prompt being processed is not interrupted before its first frame)",
            ROUTING,
        ),
    };
    Scenario {
        key,
        title,
        description,
        replicas: vec![Replica::new(script(41)), Replica::new(script(42))],
        others: vec![Other {
            replica: 1,
            first: Duration::ZERO,
            pacing: Pacing::Think(ms(40)),
            script: "ttft=350ms",
        }],
        rate: 15.0,
        requests,
        tokens: 5,
        fixed_delay: ms(50),
        fast,
        slot_mode: Some(mode),
        slots,
        strategies,
    }
}

/// p99 of the fast replica's scripted TTFT, from 200,000 draws of the mock's own distribution.
pub(crate) fn fast_p99(fast: &Latency) -> Duration {
    let mut rng = SplitMix64::new(99);
    let mut v: Vec<Duration> = (0..200_000).map(|_| fast.sample(&mut rng)).collect();
    v.sort_unstable();
    v[v.len() * 99 / 100]
}
