//! The `metrics` output: names, labels, recommended buckets, and [`MetricsSink`].

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasher, BuildHasherDefault, Hasher, RandomState};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::Duration;

use metrics::{
    Counter, Histogram, Key, KeyName, Label, Level, Metadata, Recorder, SharedString, Unit,
};

use crate::report::{END_REASON_SLOTS, PhaseLabels, PhaseReport, end_reason_slot};
use crate::sink::PhaseSink;

/// Recommended histogram bucket boundaries, so a Prometheus exporter can be configured with real
/// histograms (e.g. `PrometheusBuilder::set_buckets_for_metric`, see
/// [`MetricNames::histogram_buckets`]).
///
/// They follow the OpenTelemetry GenAI semantic conventions' advisory buckets and vLLM's
/// Prometheus histograms, which agree where they overlap: vLLM's lists are OpenTelemetry's
/// extended with a longer tail.
pub mod buckets {
    /// Time to first token, and time to headers: the OpenTelemetry
    /// `gen_ai.server.time_to_first_token` boundaries (1 ms .. 10 s) followed by vLLM's
    /// `vllm:time_to_first_token_seconds` tail (.. 2560 s) for queued long prompts.
    pub const TIME_TO_FIRST_TOKEN: &[f64] = &[
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ];

    /// Time per output token and inter-token gaps: the OpenTelemetry
    /// `gen_ai.server.time_per_output_token` boundaries (10 ms .. 2.5 s) followed by vLLM's
    /// `vllm:time_per_output_token_seconds` / `vllm:inter_token_latency_seconds` tail (.. 80 s).
    pub const TIME_PER_OUTPUT_TOKEN: &[f64] = &[
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0,
    ];

    /// Inter-token gaps: the same boundaries as [`TIME_PER_OUTPUT_TOKEN`], as vLLM uses.
    pub const INTER_TOKEN_GAP: &[f64] = TIME_PER_OUTPUT_TOKEN;

    /// Request duration and queue wait: the OpenTelemetry `gen_ai.server.request.duration`
    /// boundaries (10 ms doubling to 81.92 s), doubled on to 2621.44 s because long generations
    /// run for minutes (vLLM's `e2e_request_latency` reaches 7680 s with a coarser start).
    pub const REQUEST_DURATION: &[f64] = &[
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
        163.84, 327.68, 655.36, 1310.72, 2621.44,
    ];

    /// Queue wait: the same boundaries as [`REQUEST_DURATION`] (vLLM uses its request latency
    /// buckets for `vllm:request_queue_time_seconds`).
    pub const QUEUE_WAIT: &[f64] = REQUEST_DURATION;

    /// Token and event counts: the OpenTelemetry `gen_ai.client.token.usage` boundaries
    /// (powers of 4 from 1 to 67,108,864).
    pub const TOKENS: &[f64] = &[
        1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
        4194304.0, 16777216.0, 67108864.0,
    ];
}

/// The names of every metric and label the [`MetricsSink`] emits.
///
/// Two schemes are provided: [`MetricNames::tailguard`] (the default: Prometheus style,
/// `tailguard_` prefix, unit suffix `_seconds`) and [`MetricNames::otel_genai`] (OpenTelemetry
/// GenAI semantic-convention names where a convention exists, `tailguard.*` otherwise). Fields are
/// public so a scheme can be adjusted (names are `'static`: the sink builds its keys from them
/// once per label set, see [`MetricsSink`]).
///
/// | metric (tailguard scheme) | kind | labels | value |
/// |---|---|---|---|
/// | `tailguard_requests_total` | counter | all six | 1 per request |
/// | `tailguard_request_duration_seconds` | histogram | all six | total |
/// | `tailguard_queue_wait_seconds` | histogram | all six | admission queue wait |
/// | `tailguard_time_to_headers_seconds` | histogram | all six | time to response headers |
/// | `tailguard_time_to_first_token_seconds` | histogram | all six | TTFT (streamed, with a token) |
/// | `tailguard_inter_token_gap_seconds` | histogram | all but `end_reason` | every gap, live |
/// | `tailguard_time_per_output_token_seconds` | histogram | all six | TPOT (when events > 1) |
/// | `tailguard_output_events` | histogram | all six | output events per streamed request |
/// | `tailguard_usage_tokens` | histogram | all six + `token_type` | usage the stream reported |
/// | `tailguard_hedge_attempts` | histogram | all six | attempts per hedged-eligible request |
/// | `tailguard_hedged_requests_total` | counter | all six + `winner` | requests with a hedge sent |
///
/// The six labels are `route`, `model`, `upstream`, `priority`, `end_reason`, `streamed`;
/// `token_type` is `input` or `output`, `winner` is `primary` or `hedge`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MetricNames {
    /// Counter of requests.
    pub requests: &'static str,
    /// Histogram of total durations.
    pub request_duration: &'static str,
    /// Histogram of admission queue waits.
    pub queue_wait: &'static str,
    /// Histogram of times to headers.
    pub time_to_headers: &'static str,
    /// Histogram of times to first token.
    pub time_to_first_token: &'static str,
    /// Histogram of inter-token gaps.
    pub inter_token_gap: &'static str,
    /// Histogram of times per output token.
    pub time_per_output_token: &'static str,
    /// Histogram of output events per streamed request.
    pub output_events: &'static str,
    /// Histogram of usage tokens per request.
    pub usage_tokens: &'static str,
    /// Histogram of hedge attempts per request.
    pub hedge_attempts: &'static str,
    /// Counter of requests for which a hedge was sent.
    pub hedged_requests: &'static str,
    /// Label key: route.
    pub route_label: &'static str,
    /// Label key: model.
    pub model_label: &'static str,
    /// Label key: upstream.
    pub upstream_label: &'static str,
    /// Label key: priority.
    pub priority_label: &'static str,
    /// Label key: end reason.
    pub end_reason_label: &'static str,
    /// Label key: streamed or not.
    pub streamed_label: &'static str,
    /// Label key: token type (`input` / `output`).
    pub token_type_label: &'static str,
    /// Label key: hedge winner (`primary` / `hedge`).
    pub winner_label: &'static str,
}

impl MetricNames {
    /// The default, Prometheus-style scheme (see the table above).
    pub const fn tailguard() -> Self {
        MetricNames {
            requests: "tailguard_requests_total",
            request_duration: "tailguard_request_duration_seconds",
            queue_wait: "tailguard_queue_wait_seconds",
            time_to_headers: "tailguard_time_to_headers_seconds",
            time_to_first_token: "tailguard_time_to_first_token_seconds",
            inter_token_gap: "tailguard_inter_token_gap_seconds",
            time_per_output_token: "tailguard_time_per_output_token_seconds",
            output_events: "tailguard_output_events",
            usage_tokens: "tailguard_usage_tokens",
            hedge_attempts: "tailguard_hedge_attempts",
            hedged_requests: "tailguard_hedged_requests_total",
            route_label: "route",
            model_label: "model",
            upstream_label: "upstream",
            priority_label: "priority",
            end_reason_label: "end_reason",
            streamed_label: "streamed",
            token_type_label: "token_type",
            winner_label: "winner",
        }
    }

    /// OpenTelemetry GenAI semantic-convention names: `gen_ai.server.request.duration`,
    /// `gen_ai.server.time_to_first_token`, `gen_ai.server.time_per_output_token`,
    /// `gen_ai.client.token.usage` (with `gen_ai.token.type`), labels `http.route`,
    /// `gen_ai.request.model`; everything without a convention is `tailguard.*`.
    pub const fn otel_genai() -> Self {
        MetricNames {
            requests: "tailguard.requests",
            request_duration: "gen_ai.server.request.duration",
            queue_wait: "tailguard.queue.wait",
            time_to_headers: "tailguard.time_to_headers",
            time_to_first_token: "gen_ai.server.time_to_first_token",
            inter_token_gap: "tailguard.inter_token_gap",
            time_per_output_token: "gen_ai.server.time_per_output_token",
            output_events: "tailguard.output_events",
            usage_tokens: "gen_ai.client.token.usage",
            hedge_attempts: "tailguard.hedge.attempts",
            hedged_requests: "tailguard.hedged_requests",
            route_label: "http.route",
            model_label: "gen_ai.request.model",
            upstream_label: "tailguard.upstream",
            priority_label: "tailguard.priority",
            end_reason_label: "tailguard.end_reason",
            streamed_label: "tailguard.streamed",
            token_type_label: "gen_ai.token.type",
            winner_label: "tailguard.hedge.winner",
        }
    }

    /// Every histogram name with its recommended [`buckets`].
    pub fn histogram_buckets(&self) -> [(&'static str, &'static [f64]); 9] {
        [
            (self.request_duration, buckets::REQUEST_DURATION),
            (self.queue_wait, buckets::QUEUE_WAIT),
            (self.time_to_headers, buckets::TIME_TO_FIRST_TOKEN),
            (self.time_to_first_token, buckets::TIME_TO_FIRST_TOKEN),
            (self.inter_token_gap, buckets::INTER_TOKEN_GAP),
            (self.time_per_output_token, buckets::TIME_PER_OUTPUT_TOKEN),
            (self.output_events, buckets::TOKENS),
            (self.usage_tokens, buckets::TOKENS),
            (self.hedge_attempts, buckets::TOKENS),
        ]
    }
}

impl Default for MetricNames {
    fn default() -> Self {
        Self::tailguard()
    }
}

static METADATA: Metadata<'static> =
    Metadata::new("tailguard_phases", Level::INFO, Some(module_path!()));

/// The `metrics` output (see [`MetricNames`] for every name and label).
///
/// Emits into the recorder installed for the `metrics` facade (global, or local to the thread),
/// or into a recorder of its own set with [`with_recorder`](MetricsSink::with_recorder).
/// Nothing is registered per frame: the inter-token gap histogram is resolved once per streamed
/// response (when headers arrive), everything else once per request, at its end.
///
/// # Caching
///
/// Labels are bounded by design (configured routes and models, upstreams, priorities, end
/// reasons, streamed or not), so the sink builds the metric [`Key`]s of each label set once, on
/// its first use, and keeps them: a steady-state request does one lookup (a hash of its labels;
/// the first label sets are found in a write-once table without taking a lock, later ones in a
/// map under a read lock) and no allocation in this crate. Configured with
/// [`with_sink`](crate::LatencyPhaseRecorderLayer::with_sink) (or by default), the recorder
/// resolves a streamed response's gap series once, when headers arrive, and the report series
/// at the end follows from it by end reason, without a second lookup; as a shared
/// `Arc<dyn PhaseSink>` the sink looks its series up on each call of the trait methods, with
/// the same results. What is cached beyond the keys depends on where the sink emits:
///
/// * **its own recorder** ([`with_recorder`](MetricsSink::with_recorder),
///   [`with_shared_recorder`](MetricsSink::with_shared_recorder)): the handles too. Each metric
///   is registered once per label set, the first time a request records into it, and its handle
///   is reused from then on (the recorder cannot change, so the handles stay valid). This is
///   the fastest setup: to have it with a recorder that is also installed globally, install an
///   `Arc` of it with `metrics::set_global_recorder` and hand a clone to
///   [`with_shared_recorder`](MetricsSink::with_shared_recorder).
/// * **the facade** (the default): the keys only. Every request registers its keys against the
///   recorder current at that moment, so a global recorder installed after the first requests
///   is used from the next request on, and a `metrics::with_local_recorder` scope receives the
///   requests that end inside it, exactly as with the `metrics` macros. With no recorder
///   installed this costs a few calls into the no-op recorder; with one installed it costs one
///   registry lookup per metric (the keys' hashes are computed once and cached in the keys).
///
/// At most [`MAX_CACHED_LABEL_SETS`] label sets are cached per sink (and its clones); should a
/// misconfigured route function produce more, the extra ones are built per request, as
/// without a cache, so memory stays bounded.
#[derive(Clone, Default)]
pub struct MetricsSink {
    names: MetricNames,
    recorder: Option<Arc<dyn Recorder + Send + Sync>>,
    cache: Arc<SeriesCache>,
}

/// How many label sets a [`MetricsSink`] caches keys (and handles) for; see
/// [Caching](MetricsSink#caching). Far above what bounded labels produce (routes × models ×
/// upstreams × priorities × end reasons × 2), and small enough to be harmless: each set holds
/// a dozen keys.
pub const MAX_CACHED_LABEL_SETS: usize = 4096;

impl fmt::Debug for MetricsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsSink")
            .field("names", &self.names)
            .field("own_recorder", &self.recorder.is_some())
            .field("cached_label_sets", &self.cache.len())
            .finish()
    }
}

impl MetricsSink {
    /// A sink with the [`MetricNames::tailguard`] scheme, emitting to the facade's recorder.
    pub fn new() -> Self {
        Self::default()
    }

    /// Uses the names of `names` (e.g. [`MetricNames::otel_genai`]).
    pub fn with_names(mut self, names: MetricNames) -> Self {
        self.names = names;
        self.cache = Arc::default();
        self
    }

    /// Emits into `recorder` instead of the `metrics` facade's (useful when several recorders
    /// coexist, and in tests).
    pub fn with_recorder(mut self, recorder: impl Recorder + Send + Sync + 'static) -> Self {
        self.recorder = Some(Arc::new(recorder));
        self.cache = Arc::default();
        self
    }

    /// Emits into a shared `recorder`.
    pub fn with_shared_recorder(mut self, recorder: Arc<dyn Recorder + Send + Sync>) -> Self {
        self.recorder = Some(recorder);
        self.cache = Arc::default();
        self
    }

    /// The names in use.
    pub fn names(&self) -> &MetricNames {
        &self.names
    }

    /// How many label sets this sink (and its clones, which share the cache) has cached so far:
    /// one per label set with an end reason, plus one per label set of a streamed response (its
    /// inter-token gaps). At most [`MAX_CACHED_LABEL_SETS`]; see [Caching](MetricsSink#caching).
    pub fn cached_label_sets(&self) -> usize {
        self.cache.len()
    }

    /// Describes every metric (unit and help text) to the recorder; call once at start-up.
    pub fn describe(&self) {
        let n = &self.names;
        self.with(|r| {
            let d = |name: &'static str| KeyName::from_const_str(name);
            r.describe_counter(d(n.requests), Some(Unit::Count), "LLM requests".into());
            for (name, help) in [
                (
                    n.request_duration,
                    "Time from the request to the end of its response",
                ),
                (n.queue_wait, "Time spent in the admission queue"),
                (
                    n.time_to_headers,
                    "Time from the request to the response headers",
                ),
                (
                    n.time_to_first_token,
                    "Time from the request to the first output token",
                ),
                (
                    n.inter_token_gap,
                    "Gap between output events after the first token",
                ),
                (
                    n.time_per_output_token,
                    "(total - TTFT) / (output events - 1)",
                ),
            ] {
                r.describe_histogram(d(name), Some(Unit::Seconds), help.into());
            }
            for (name, help) in [
                (n.output_events, "Output events per streamed response"),
                (n.usage_tokens, "Tokens the stream reported as used"),
                (
                    n.hedge_attempts,
                    "Attempts sent per request, the primary included",
                ),
            ] {
                r.describe_histogram(d(name), Some(Unit::Count), help.into());
            }
            r.describe_counter(
                d(n.hedged_requests),
                Some(Unit::Count),
                "Requests for which a hedge was sent, by winner".into(),
            );
        });
    }

    fn with<T>(&self, f: impl FnOnce(&dyn Recorder) -> T) -> T {
        match &self.recorder {
            Some(r) => f(&**r),
            None => metrics::with_recorder(f),
        }
    }

    /// The series of `labels` (with `end_reason`, or the gap series without), and whether it
    /// is in the cache (it is not once the cache is full).
    fn series(&self, labels: &PhaseLabels, end_reason: Option<&'static str>) -> (Found<'_>, bool) {
        let id = SeriesRef {
            route: ArcLabel(&labels.route),
            model: ArcLabel(&labels.model),
            upstream: ArcLabel(&labels.upstream),
            priority: labels.priority(),
            streamed: labels.streamed,
            end_reason,
        };
        let hash = self.cache.hasher.hash_one(&id);
        if let Some(series) = self.cache.get(hash, &id) {
            return (series, true);
        }
        let series = Arc::new(Series::new(&self.names, &id, hash));
        match self.cache.insert(hash, series) {
            Ok(cached) => (Found::Owned(cached), true),
            Err(series) => (Found::Owned(series), false),
        }
    }

    /// The gap series of a streamed response's `labels`: its histogram receives the gaps, and
    /// it finds the report series of the same labels by end reason without another lookup
    /// ([`report_with`](Self::report_with)).
    pub(crate) fn gap_series(&self, labels: &PhaseLabels) -> Arc<Series> {
        match self.series(labels, None).0 {
            Found::Fast(s) => s.clone(),
            Found::Owned(s) => s,
        }
    }

    /// The gap histogram of a gap series, registered with the recorder current now (facade) or
    /// once (own recorder).
    pub(crate) fn gap_histogram_of(&self, series: &Series) -> Histogram {
        let slot = &series.slots[Slot::Gap as usize];
        match &self.recorder {
            Some(r) => slot
                .histogram
                .get_or_init(|| r.register_histogram(&slot.key, &METADATA))
                .clone(),
            None => metrics::with_recorder(|r| r.register_histogram(&slot.key, &METADATA)),
        }
    }

    /// Emits `rep`; `gap` is the gap series of its labels when the recorder resolved it at
    /// headers, which keeps the report series of each end reason (cached ones only), so that
    /// only the first request of a label set and end reason looks the report series up.
    pub(crate) fn report_with(&self, rep: &PhaseReport, gap: Option<&Series>) {
        let (slot, reason) = end_reason_slot(&rep.end_reason);
        let cell = gap.zip(slot).and_then(|(g, i)| g.reports.get(i));
        if let Some(series) = cell.and_then(OnceLock::get) {
            return self.emit(rep, series);
        }
        let (series, cached) = self.series(&rep.labels, Some(reason));
        if cached && let Some(cell) = cell {
            let _ = cell.set(series.arc());
        }
        self.emit(rep, &series);
    }

    /// Records every metric of `rep` into `s`, with one look at the current recorder.
    fn emit(&self, rep: &PhaseReport, s: &Series) {
        self.with(|r| {
            let secs = |slot: Slot, d: Option<Duration>| {
                if let Some(d) = d {
                    self.record(r, s, slot, d.as_secs_f64());
                }
            };
            self.increment(r, s, Slot::Requests);
            secs(Slot::RequestDuration, Some(rep.total));
            secs(Slot::QueueWait, rep.queue_wait);
            secs(Slot::TimeToHeaders, rep.time_to_headers);
            secs(Slot::TimeToFirstToken, rep.time_to_first_token);
            secs(Slot::TimePerOutputToken, rep.time_per_output_token);
            if rep.labels.streamed {
                self.record(r, s, Slot::OutputEvents, rep.output_events as f64);
            }
            if let Some(u) = rep.usage {
                if let Some(v) = u.prompt_tokens {
                    self.record(r, s, Slot::UsageInput, v as f64);
                }
                if let Some(v) = u.completion_tokens {
                    self.record(r, s, Slot::UsageOutput, v as f64);
                }
            }
            if let Some(h) = &rep.hedge {
                self.record(r, s, Slot::HedgeAttempts, f64::from(h.attempts));
                if h.attempts > 1 {
                    let winner = if h.winner == 0 {
                        Slot::HedgedPrimary
                    } else {
                        Slot::HedgedHedge
                    };
                    self.increment(r, s, winner);
                }
            }
        });
    }

    /// Records `value` into histogram `slot` of `series`; `r` is the recorder in use (this
    /// sink's own, or the facade's current one).
    #[inline]
    fn record(&self, r: &dyn Recorder, series: &Series, slot: Slot, value: f64) {
        let slot = &series.slots[slot as usize];
        if self.recorder.is_some() {
            slot.histogram
                .get_or_init(|| r.register_histogram(&slot.key, &METADATA))
                .record(value);
        } else {
            r.register_histogram(&slot.key, &METADATA).record(value);
        }
    }

    /// Increments counter `slot` of `series` (see [`record`](Self::record)).
    #[inline]
    fn increment(&self, r: &dyn Recorder, series: &Series, slot: Slot) {
        let slot = &series.slots[slot as usize];
        if self.recorder.is_some() {
            slot.counter
                .get_or_init(|| r.register_counter(&slot.key, &METADATA))
                .increment(1);
        } else {
            r.register_counter(&slot.key, &METADATA).increment(1);
        }
    }
}

/// The metrics of one label set, in [`Series::new`] order.
#[derive(Clone, Copy)]
enum Slot {
    /// The gap series has this one slot only.
    Gap = 0,
    Requests,
    RequestDuration,
    QueueWait,
    TimeToHeaders,
    TimeToFirstToken,
    TimePerOutputToken,
    OutputEvents,
    UsageInput,
    UsageOutput,
    HedgeAttempts,
    HedgedPrimary,
    HedgedHedge,
}

/// One metric of a label set: its key, and its handle once registered (own recorder only).
struct SeriesSlot {
    key: Key,
    counter: OnceLock<Counter>,
    histogram: OnceLock<Histogram>,
}

impl SeriesSlot {
    fn new(name: &'static str, labels: Vec<Label>) -> Self {
        SeriesSlot {
            key: Key::from_parts(name, labels),
            counter: OnceLock::new(),
            histogram: OnceLock::new(),
        }
    }
}

/// Everything cached for one label set.
pub(crate) struct Series {
    route: Arc<str>,
    model: Arc<str>,
    upstream: Arc<str>,
    priority: Arc<str>,
    streamed: bool,
    end_reason: Option<&'static str>,
    /// Indexed by [`Slot`]: the gap series holds [`Slot::Gap`] only, a report series holds an
    /// unused placeholder there and every other slot after it.
    slots: Box<[SeriesSlot]>,
    /// Gap series only: the report series of the same labels, by end reason
    /// ([`end_reason_slot`]), filled as requests end (with cached series only, so that memory
    /// stays bounded by the cache's limit).
    reports: Box<[OnceLock<Arc<Series>>]>,
    /// The hash of its [`SeriesRef`], to skip most mismatches in the lock-free table cheaply.
    hash: u64,
}

/// A series found in the cache: borrowed from its lock-free table, or an `Arc` of its own.
enum Found<'a> {
    Fast(&'a Arc<Series>),
    Owned(Arc<Series>),
}

impl Found<'_> {
    fn arc(&self) -> Arc<Series> {
        match self {
            Found::Fast(s) => Arc::clone(s),
            Found::Owned(s) => s.clone(),
        }
    }
}

impl std::ops::Deref for Found<'_> {
    type Target = Series;

    fn deref(&self) -> &Series {
        match self {
            Found::Fast(s) => s,
            Found::Owned(s) => s,
        }
    }
}

impl Series {
    fn new(n: &MetricNames, id: &SeriesRef<'_>, hash: u64) -> Self {
        // The request's own `Arc`s (from the configuration, mostly): a later lookup with the
        // same ones compares pointers, not strings.
        let route = id.route.0.clone();
        let model = id.model.0.clone();
        let upstream = id.upstream.0.clone();
        let priority = Arc::<str>::from(id.priority);
        let label = |key: &'static str, value: &Arc<str>| {
            Label::new(key, SharedString::from(value.clone()))
        };
        let mut base = Vec::with_capacity(8);
        base.push(label(n.route_label, &route));
        base.push(label(n.model_label, &model));
        base.push(label(n.upstream_label, &upstream));
        base.push(label(n.priority_label, &priority));
        base.push(Label::from_static_parts(
            n.streamed_label,
            if id.streamed { "true" } else { "false" },
        ));
        let slots: Box<[SeriesSlot]> = match id.end_reason {
            None => Box::new([SeriesSlot::new(n.inter_token_gap, base)]),
            Some(reason) => {
                base.push(Label::from_static_parts(n.end_reason_label, reason));
                let with = |extra: Label| {
                    let mut l = base.clone();
                    l.push(extra);
                    l
                };
                let token = |ty| with(Label::from_static_parts(n.token_type_label, ty));
                let winner = |w| with(Label::from_static_parts(n.winner_label, w));
                Box::new([
                    // The placeholder for `Slot::Gap`: never registered.
                    SeriesSlot::new(n.inter_token_gap, Vec::new()),
                    SeriesSlot::new(n.requests, base.clone()),
                    SeriesSlot::new(n.request_duration, base.clone()),
                    SeriesSlot::new(n.queue_wait, base.clone()),
                    SeriesSlot::new(n.time_to_headers, base.clone()),
                    SeriesSlot::new(n.time_to_first_token, base.clone()),
                    SeriesSlot::new(n.time_per_output_token, base.clone()),
                    SeriesSlot::new(n.output_events, base.clone()),
                    SeriesSlot::new(n.usage_tokens, token("input")),
                    SeriesSlot::new(n.usage_tokens, token("output")),
                    SeriesSlot::new(n.hedge_attempts, base.clone()),
                    SeriesSlot::new(n.hedged_requests, winner("primary")),
                    SeriesSlot::new(n.hedged_requests, winner("hedge")),
                ])
            }
        };
        let reports = match id.end_reason {
            None => (0..END_REASON_SLOTS).map(|_| OnceLock::new()).collect(),
            Some(_) => Box::default(),
        };
        Series {
            route,
            model,
            upstream,
            priority,
            streamed: id.streamed,
            end_reason: id.end_reason,
            slots,
            reports,
            hash,
        }
    }

    fn is(&self, id: &SeriesRef<'_>) -> bool {
        self.streamed == id.streamed
            && self.end_reason == id.end_reason
            && id.route.is(&self.route)
            && id.model.is(&self.model)
            && id.upstream.is(&self.upstream)
            && *self.priority == *id.priority
    }
}

/// A label value held in an `Arc`: equal when the pointers are (the common case, values from
/// the configuration), else when the strings are. Hashes as its string.
#[derive(Clone, Copy)]
struct ArcLabel<'a>(&'a Arc<str>);

impl ArcLabel<'_> {
    #[inline]
    fn is(&self, other: &Arc<str>) -> bool {
        Arc::ptr_eq(self.0, other) || **self.0 == **other
    }
}

impl std::hash::Hash for ArcLabel<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        (**self.0).hash(state);
    }
}

/// A label set as a request sees it: borrowed, so a lookup allocates nothing.
#[derive(Hash)]
struct SeriesRef<'a> {
    route: ArcLabel<'a>,
    model: ArcLabel<'a>,
    upstream: ArcLabel<'a>,
    priority: &'a str,
    streamed: bool,
    end_reason: Option<&'static str>,
}

/// The label sets seen so far, by the hash of their [`SeriesRef`].
struct SeriesCache {
    hasher: LabelHasher,
    /// The first label sets, readable without a lock: an open-addressing table of
    /// [`FAST_SLOTS`] write-once cells, filled (under the map's write lock) in probe order and
    /// never emptied, so a reader may stop at the first empty cell of its probe sequence.
    fast: Box<[OnceLock<Arc<Series>>]>,
    map: RwLock<SeriesMap>,
}

/// Cells of the lock-free table (a power of two): far more than the label sets of a typical
/// deployment, at 16 bytes each.
const FAST_SLOTS: usize = 256;

/// Cells probed per lookup in the lock-free table.
const FAST_PROBES: usize = 4;

impl Default for SeriesCache {
    fn default() -> Self {
        SeriesCache {
            hasher: LabelHasher::default(),
            fast: (0..FAST_SLOTS).map(|_| OnceLock::new()).collect(),
            map: RwLock::default(),
        }
    }
}

/// Hashes a [`SeriesRef`] eight bytes at a time (the labels are a few short strings, where
/// SipHash's per-write cost dominates), from a random per-cache seed: a label set cannot be
/// chosen to collide without knowing it, and a bucket is scanned linearly anyway.
struct LabelHasher {
    seed: u64,
}

impl Default for LabelHasher {
    fn default() -> Self {
        LabelHasher {
            seed: RandomState::new().hash_one(0x7461_696c_6775_6172_u64),
        }
    }
}

impl BuildHasher for LabelHasher {
    type Hasher = FoldHasher;

    fn build_hasher(&self) -> FoldHasher {
        FoldHasher(self.seed)
    }
}

/// A multiply-rotate hash over eight-byte words (the FxHash scheme), finished with a
/// multiply-xorshift so that both the high and the low bits depend on every input bit.
struct FoldHasher(u64);

const FOLD_K: u64 = 0x9e37_79b9_7f4a_7c15;

impl FoldHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(FOLD_K);
    }
}

/// The 1 to 7 bytes of `rest` as a little-endian word, zero-padded, without a copy loop: two
/// overlapping loads (or three single bytes) whose overlap holds the same bytes.
#[inline]
fn tail_word(rest: &[u8]) -> u64 {
    let n = rest.len();
    if n >= 4 {
        let lo = u64::from(u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]));
        let hi = u64::from(u32::from_le_bytes([
            rest[n - 4],
            rest[n - 3],
            rest[n - 2],
            rest[n - 1],
        ]));
        lo | hi << (8 * (n - 4))
    } else {
        let (a, b, c) = (rest[0], rest[n / 2], rest[n - 1]);
        u64::from(a) | u64::from(b) << (8 * (n / 2)) | u64::from(c) << (8 * (n - 1))
    }
}

impl Hasher for FoldHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            let mut buf = [0u8; 8];
            buf.copy_from_slice(w);
            self.add(u64::from_le_bytes(buf));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            // The length tells `"ab"` from `"ab\0"`.
            self.add(tail_word(rest) ^ ((rest.len() as u64) << 56));
        }
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n) | 0x100);
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        let h = self.0;
        (h ^ (h >> 29)).wrapping_mul(FOLD_K) ^ (h >> 32)
    }
}

#[derive(Default)]
struct SeriesMap {
    by_hash: HashMap<u64, Vec<Arc<Series>>, BuildHasherDefault<PassThrough>>,
    len: usize,
}

impl SeriesCache {
    fn get(&self, hash: u64, id: &SeriesRef<'_>) -> Option<Found<'_>> {
        for k in 0..FAST_PROBES {
            let cell = &self.fast[(hash as usize).wrapping_add(k) & (FAST_SLOTS - 1)];
            match cell.get() {
                Some(s) if s.hash == hash && s.is(id) => return Some(Found::Fast(s)),
                Some(_) => {}
                None => break,
            }
        }
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let found = map.by_hash.get(&hash)?.iter().find(|s| s.is(id)).cloned();
        found.map(Found::Owned)
    }

    /// Caches `series` unless the cache is full: `Ok` with the cached series of its label set
    /// (another request may have cached one first), `Err` with `series` when full.
    fn insert(&self, hash: u64, series: Arc<Series>) -> Result<Arc<Series>, Arc<Series>> {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let id = SeriesRef {
            route: ArcLabel(&series.route),
            model: ArcLabel(&series.model),
            upstream: ArcLabel(&series.upstream),
            priority: &series.priority,
            streamed: series.streamed,
            end_reason: series.end_reason,
        };
        if let Some(cached) = map
            .by_hash
            .get(&hash)
            .and_then(|b| b.iter().find(|s| s.is(&id)))
        {
            return Ok(cached.clone());
        }
        if map.len >= MAX_CACHED_LABEL_SETS {
            return Err(series);
        }
        map.by_hash.entry(hash).or_default().push(series.clone());
        map.len += 1;
        // Also into the lock-free table when a cell of its probe sequence is free. Only
        // writers fill cells, under the write lock, so none races for a cell.
        for k in 0..FAST_PROBES {
            let cell = &self.fast[(hash as usize).wrapping_add(k) & (FAST_SLOTS - 1)];
            if cell.get().is_none() {
                let _ = cell.set(series.clone());
                break;
            }
        }
        Ok(series)
    }

    fn len(&self) -> usize {
        self.map.read().unwrap_or_else(|e| e.into_inner()).len
    }
}

/// The map's keys are already hashes.
#[derive(Default)]
struct PassThrough(u64);

impl Hasher for PassThrough {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

impl PhaseSink for MetricsSink {
    fn gap_histogram(&self, labels: &PhaseLabels) -> Option<metrics::Histogram> {
        Some(self.gap_histogram_of(&self.gap_series(labels)))
    }

    fn on_report(&self, rep: &PhaseReport) {
        self.report_with(rep, None);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_word_is_the_zero_padded_bytes() {
        let bytes = b"\x01\x82\x03\xf4\x05\x06\xa7";
        for n in 1..=7 {
            let mut buf = [0u8; 8];
            buf[..n].copy_from_slice(&bytes[..n]);
            assert_eq!(tail_word(&bytes[..n]), u64::from_le_bytes(buf), "{n}");
        }
    }

    #[test]
    fn lock_free_table_finds_what_the_map_holds() {
        let sink = MetricsSink::new();
        let labels = |route: &str| PhaseLabels {
            route: Arc::from(route),
            model: Arc::from("m"),
            upstream: Arc::from("u"),
            priority: None,
            streamed: true,
        };
        // Far more sets than cells: the table fills, the rest live in the map only.
        let all: Vec<_> = (0..FAST_SLOTS * 2)
            .map(|i| {
                let l = labels(&format!("/r{i}"));
                let s = sink.gap_series(&l);
                (l, s)
            })
            .collect();
        assert_eq!(sink.cached_label_sets(), FAST_SLOTS * 2);
        for (l, s) in &all {
            // Found again (by equal strings, not the same `Arc`s), and the same series.
            let again = labels(l.route());
            assert!(Arc::ptr_eq(&sink.gap_series(&again), s));
        }
        assert_eq!(sink.cached_label_sets(), FAST_SLOTS * 2);
        assert!(sink.cache.fast.iter().any(|c| c.get().is_some()));
    }
}
