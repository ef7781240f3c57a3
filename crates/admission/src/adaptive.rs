//! [`AdaptiveLimit`]: a concurrency limit that finds the upstream's knee from its time to first
//! token.
//!
//! An LLM server's throughput grows with its batch until its KV cache or compute saturate; past
//! that knee every extra stream only queues inside the server, where the gateway can neither
//! prioritise nor shed it. The time to first token (TTFT) the upstream adds — its own queueing
//! and prefill — is the signal that moves at the knee (the whole-body time is dominated by how
//! many tokens each answer has). The controller is a gradient controller in the spirit of
//! Envoy's adaptive concurrency filter and Netflix's Gradient2, on TTFT instead of round-trip
//! time.
//!
//! # Samples
//!
//! A request's TTFT runs from the moment its permit is granted (so its wait in the gateway's own
//! queue is excluded; in cluster mode, from the moment its lease is granted) to the first output
//! token of its response body, found by core's
//! [`StreamTracker`](tailguard_core::StreamTracker) on a 2xx streamed response
//! ([`Dialect::Auto`](tailguard_core::Dialect)). A 2xx response that is not a stream gives no
//! sample (its time is the whole answer, not a first token). A request that ends before its
//! first token — an inner error, a non-2xx answer, a body error, a body that ends without a
//! token, or the client going away — gives a **censored** sample: its TTFT is at least the time
//! it ran.
//!
//! # Windows and the censoring rule
//!
//! Samples are collected in a window of at least [`with_window`](AdaptiveLimit::with_window)'s
//! duration and sample count (a window ends at the first sample that meets both). Its statistic
//! is the 75th percentile (nearest rank): one or two huge prompts among eight samples cannot
//! move it, yet it sees a quarter of the requests queueing. The median would not: when one
//! replica loses capacity while the balancer still sends it a minority of the traffic, only
//! that minority queues, and a median-driven limit kept rising while it did (scenario E's
//! capacity drop in `benches/`). A censored
//! sample `t` counts, as the value `t`, only when `t` exceeds the *reference*: the statistic of the
//! window's uncensored samples, or, when it has none, the previous window's statistic. So a
//! censored sample can only raise the statistic (its true TTFT is above `t`, above the
//! reference): clients that cancel early, or an upstream that fails fast, cannot make the
//! upstream look faster than it is. A window with no uncensored sample and no censored one above
//! the reference carries no information and leaves the limit alone.
//!
//! # The update
//!
//! At the end of each window, with `s` its statistic and `b` the baseline:
//!
//! ```text
//! gradient = clamp(b × (1 + tolerance) / s, 0.5, 1.0)
//! target   = limit × gradient + √limit
//! limit    = clamp((1 − smoothing) × limit + smoothing × target, min, max)
//! ```
//!
//! * `tolerance` ([`DEFAULT_TOLERANCE`], 0.25): TTFT carries prefill noise (prompt sizes vary
//!   from window to window), so a statistic up to 25% above the baseline still counts as no
//!   queueing. Larger values let the server's queue grow further before backing off.
//! * The clamp `[0.5, 1.0]`: one window can at most halve the target, so a single bad window
//!   cannot collapse the limit; and, as in Gradient2, a good window never multiplies it: the
//!   limit grows only by the headroom, so it nears the knee in small steps and overshoots it by
//!   about one window's headroom. A server's queue shows in TTFT only once the streams admitted
//!   into it reach their prefill, a window later; with Envoy's upper clamp of 2 the limit grew
//!   by a quarter per window meanwhile and overshot the knee by half (scenario E at 1x
//!   capacity in `benches/`: p99 TTFT 2.2x the best static limit's).
//! * Headroom `√limit` (Envoy's, and Gradient2's queue size): lets the limit probe above the current
//!   concurrency and grow when the upstream has room. It is added only after a window without
//!   queueing (gradient 1): added to a queueing window too, as Gradient2 does, it holds the
//!   limit where the gradient is `1 − 1/√limit`, a standing queue of about √limit streams
//!   inside the upstream, which every admitted request waits behind (issue 29's batching
//!   upstream: the admitted's p99 TTFT 5–8x the unloaded one).
//! * `smoothing` ([`DEFAULT_SMOOTHING`], 0.5): the limit moves half way to the target per
//!   window, so with the clamp one window costs at most a quarter of the limit, while a real
//!   capacity drop is followed within a few windows; growth is `√limit / 2` per window (from 16,
//!   2 per second).
//! * While the window's peak of units in use stays below half the limit, the limit does not
//!   rise, and moves toward twice that peak: a gate used lightly says nothing about the
//!   upstream's room, and a limit far above the concurrency it has seen (the initial one is
//!   the ceiling) would let the next burst into the server's queue. This is how TCP decays an
//!   application-limited congestion window (RFC 7661); twice the peak leaves the burst room
//!   to double before the gradient has to let it grow.
//! * A window's statistic below the baseline lowers the baseline to it (a loaded TTFT is never
//!   below the no-load one, so the baseline was measured high).
//!
//! # The knee
//!
//! Under a steady overload the limit would still climb past the knee by its headroom, queue,
//! and back off, window after window; each climb makes the requests admitted meanwhile wait
//! inside the upstream for a stream to end. So the controller remembers where a climb failed,
//! as TCP CUBIC remembers the window of its last loss:
//!
//! * A raise of the limit is *blamed* for queueing seen within two windows of it (the queue of
//!   a batching server shows once the streams admitted into it reach their prefill). The limit
//!   it reached becomes the **knee**, and the limit is held below the knee for a **hold** of
//!   windows without queueing: 1 after the first failure, doubling per failure to at most 16.
//! * After the hold the limit may rise to the knee or past it again (a *re-probe*). The first
//!   sample above the tolerance from a request admitted after a re-probe fails it at once, not
//!   at the window's end: under a steady overload a re-probe costs the few requests admitted
//!   around it, not a window of them. (A threshold of twice the baseline, to be surer that
//!   the one sample waited for a slot, read no better in `batching_overload`: 1.98x and
//!   3.04x against 1.57x and 3.04x.)
//! * A window without queueing after a re-probe forgets the knee and the backoff: the upstream
//!   has gained room, and the limit grows by its headroom again.
//!
//! So a capacity that rises is found within about 16 windows plus the climb; a capacity that
//! falls is followed as before (the gradient does not wait for a raise to blame). The price is
//! paid at exactly the capacity under bursty arrivals: a burst that queues right after a raise
//! is taken for the knee, and the limit spends a hold below it while the gate's queue takes
//! the bursts (scenario E at 1x in `benches/`: p99 TTFT 1.6x the best static limit's, 1.36x
//! before; goodput 0.95x, 0.97x before).
//!
//! # The baseline
//!
//! The baseline (no-load TTFT) is measured as Envoy does: the limit is held at `min`, the
//! samples of requests admitted from then on (they run with at most `min` in flight) are
//! collected until [`with_probe_samples`](AdaptiveLimit::with_probe_samples) of them, and their
//! statistic (the same 75th percentile, with the same censoring rule against the previous
//! baseline) becomes the baseline.
//! A probe lasts at most [`with_probe_timeout`](AdaptiveLimit::with_probe_timeout) and then
//! uses the samples it has; with none the baseline stays (without any baseline the limit stays
//! at its initial value: traffic without TTFT samples, such as non-streamed answers, sees a
//! static gate). The gate starts in such a probe (the seed), then runs at the initial limit;
//! the seed ends after `min` samples (one round: the gate starts empty, so the first `min`
//! requests run with nothing else in flight, and a second round would hold new traffic at
//! `min` for a whole stream);
//! afterwards a probe starts every [`with_probe_interval`](AdaptiveLimit::with_probe_interval),
//! jittered by ±15% ([`with_probe_jitter`](AdaptiveLimit::with_probe_jitter)) so that several
//! gateways in front of one upstream do not probe in lockstep. Nothing is revoked when the
//! limit falls below what is in use: new admissions wait until the units in use are below the
//! limit; when it rises, waiters are admitted at once.
//!
//! Time comes from `tokio::time::Instant`; the controller runs on the samples (under the gate's
//! lock) and needs no task of its own: a gate without traffic does not move.

use std::time::Duration;

/// Default minimum limit: 4 (Envoy's default minimum concurrency is 3): a batching LLM server
/// is at its least efficient below a few sequences, and probes run at this limit.
pub const DEFAULT_MIN_LIMIT: u32 = 4;
/// Default window: 1 s, a few first tokens' worth of time for an LLM server, short enough that a
/// capacity drop is followed within seconds.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(1);
/// Default minimum samples per window: 8, so that the 75th percentile ignores up to two odd
/// requests.
pub const DEFAULT_WINDOW_SAMPLES: usize = 8;
/// Default tolerance: 0.25 (see the [module docs](self)).
pub const DEFAULT_TOLERANCE: f64 = 0.25;
/// Default smoothing: 0.5 (see the [module docs](self)).
pub const DEFAULT_SMOOTHING: f64 = 0.5;
/// Default probe interval: 60 s (Envoy's default): the no-load TTFT drifts slowly (model,
/// hardware, prompt mix), and each probe costs throughput while the limit is held at `min`.
pub const DEFAULT_PROBE_INTERVAL: Duration = Duration::from_secs(60);
/// Default samples per probe: 8, two rounds at the default minimum limit; the 75th percentile
/// of 8 is not moved by one or two long prompts.
pub const DEFAULT_PROBE_SAMPLES: usize = 8;
/// Default probe timeout: 10 s, time for the streams in flight to drain to `min` and two rounds
/// at `min` to reach their first token for typical chat answers, while bounding what a probe
/// costs when the traffic gives few samples (non-streamed answers give none).
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default log threshold: a change of more than 10% of the limit since the last logged value.
pub const DEFAULT_LOG_CHANGE: f64 = 0.1;
/// Default jitter of the probe interval: ±15%, so that gateways started together drift apart
/// within a few probes while the interval stays close to the configured one.
pub const DEFAULT_PROBE_JITTER: f64 = 0.15;

/// The configuration of an adaptive limit, given to
/// [`BoundedAdmissionLayer::with_adaptive_limit`](crate::BoundedAdmissionLayer::with_adaptive_limit).
///
/// The layer's capacity becomes the ceiling; the gate admits up to the current limit, which
/// moves between [`with_min`](Self::with_min) and [`with_max`](Self::with_max). See the
/// [module docs](self) for the algorithm.
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptiveLimit {
    pub(crate) min: u32,
    pub(crate) max: Option<u32>,
    pub(crate) initial: Option<u32>,
    pub(crate) window: Duration,
    pub(crate) window_samples: usize,
    pub(crate) tolerance: f64,
    pub(crate) smoothing: f64,
    pub(crate) probe_interval: Duration,
    pub(crate) probe_samples: usize,
    pub(crate) probe_jitter: f64,
    pub(crate) probe_timeout: Duration,
    pub(crate) log_change: f64,
}

impl Default for AdaptiveLimit {
    fn default() -> Self {
        Self::new()
    }
}

impl AdaptiveLimit {
    /// The defaults: min [`DEFAULT_MIN_LIMIT`], max and initial limit the layer's capacity (the
    /// gate starts as a static one would, after the seed probe), window [`DEFAULT_WINDOW`] and
    /// [`DEFAULT_WINDOW_SAMPLES`], [`DEFAULT_TOLERANCE`], [`DEFAULT_SMOOTHING`], probes every
    /// [`DEFAULT_PROBE_INTERVAL`] (± [`DEFAULT_PROBE_JITTER`]) of [`DEFAULT_PROBE_SAMPLES`] within
    /// [`DEFAULT_PROBE_TIMEOUT`], log at [`DEFAULT_LOG_CHANGE`].
    pub fn new() -> Self {
        AdaptiveLimit {
            min: DEFAULT_MIN_LIMIT,
            max: None,
            initial: None,
            window: DEFAULT_WINDOW,
            window_samples: DEFAULT_WINDOW_SAMPLES,
            tolerance: DEFAULT_TOLERANCE,
            smoothing: DEFAULT_SMOOTHING,
            probe_interval: DEFAULT_PROBE_INTERVAL,
            probe_samples: DEFAULT_PROBE_SAMPLES,
            probe_jitter: DEFAULT_PROBE_JITTER,
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
            log_change: DEFAULT_LOG_CHANGE,
        }
    }

    /// Sets the lowest limit (at least 1, at most the maximum); probes run at it.
    pub fn with_min(mut self, min: u32) -> Self {
        self.min = min.max(1);
        self
    }

    /// Sets the highest limit (at most the layer's capacity, which it defaults to).
    pub fn with_max(mut self, max: u32) -> Self {
        self.max = Some(max.max(1));
        self
    }

    /// Sets the limit the gate runs at after the seed probe (default: the maximum); clamped to
    /// `[min, max]`.
    pub fn with_initial(mut self, initial: u32) -> Self {
        self.initial = Some(initial);
        self
    }

    /// Sets a window's least duration and least number of samples.
    pub fn with_window(mut self, duration: Duration, samples: usize) -> Self {
        self.window = duration;
        self.window_samples = samples.max(1);
        self
    }

    /// Sets the tolerance: how far above the baseline (as a fraction) a window's TTFT may be
    /// and still count as no queueing.
    pub fn with_tolerance(mut self, tolerance: f64) -> Self {
        self.tolerance = if tolerance.is_finite() {
            tolerance.max(0.0)
        } else {
            DEFAULT_TOLERANCE
        };
        self
    }

    /// Sets the smoothing: the fraction of the way to its target the limit moves per window
    /// (`0.0..=1.0`; 0 freezes the limit).
    pub fn with_smoothing(mut self, smoothing: f64) -> Self {
        self.smoothing = if smoothing.is_nan() {
            DEFAULT_SMOOTHING
        } else {
            smoothing.clamp(0.0, 1.0)
        };
        self
    }

    /// Sets the interval between baseline probes.
    pub fn with_probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// Sets the longest a probe holds the limit at `min`; one that runs out uses the samples it
    /// has (none: the baseline stays as it was).
    pub fn with_probe_timeout(mut self, timeout: Duration) -> Self {
        self.probe_timeout = timeout;
        self
    }

    /// Sets the probe interval's random jitter, as a fraction (`0.0..=1.0`) either way; 0 makes
    /// the probes strictly periodic (and a test's run repeatable).
    pub fn with_probe_jitter(mut self, fraction: f64) -> Self {
        self.probe_jitter = if fraction.is_nan() {
            0.0
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// Sets the samples a probe collects (at least 1).
    pub fn with_probe_samples(mut self, samples: usize) -> Self {
        self.probe_samples = samples.max(1);
        self
    }

    /// Sets the fraction by which the limit must change since the last logged value for an
    /// `info` log line.
    pub fn with_log_change(mut self, fraction: f64) -> Self {
        self.log_change = if fraction.is_nan() { 0.0 } else { fraction };
        self
    }
}
