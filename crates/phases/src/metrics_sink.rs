//! The `metrics` output: names, labels, recommended buckets, and [`MetricsSink`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use metrics::{Key, KeyName, Label, Level, Metadata, Recorder, SharedString, Unit};

use crate::report::{PhaseLabels, PhaseReport, end_reason_label};
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
/// public so a scheme can be adjusted; keep names `'static`, they are registered per request.
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
/// Handles are registered once per request, at the end (and, for gaps, when headers arrive);
/// nothing is registered per frame.
#[derive(Clone, Default)]
pub struct MetricsSink {
    names: MetricNames,
    recorder: Option<Arc<dyn Recorder + Send + Sync>>,
}

impl fmt::Debug for MetricsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsSink")
            .field("names", &self.names)
            .field("own_recorder", &self.recorder.is_some())
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
        self
    }

    /// Emits into `recorder` instead of the `metrics` facade's (useful when several recorders
    /// coexist, and in tests).
    pub fn with_recorder(mut self, recorder: impl Recorder + Send + Sync + 'static) -> Self {
        self.recorder = Some(Arc::new(recorder));
        self
    }

    /// Emits into a shared `recorder`.
    pub fn with_shared_recorder(mut self, recorder: Arc<dyn Recorder + Send + Sync>) -> Self {
        self.recorder = Some(recorder);
        self
    }

    /// The names in use.
    pub fn names(&self) -> &MetricNames {
        &self.names
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

    fn base_labels(&self, l: &PhaseLabels) -> Vec<Label> {
        let n = &self.names;
        let mut v = Vec::with_capacity(7);
        v.push(Label::new(
            n.route_label,
            SharedString::from(l.route.clone()),
        ));
        v.push(Label::new(
            n.model_label,
            SharedString::from(l.model.clone()),
        ));
        v.push(Label::new(
            n.upstream_label,
            SharedString::from(l.upstream.clone()),
        ));
        v.push(Label::new(n.priority_label, l.priority().to_owned()));
        v.push(Label::from_static_parts(n.streamed_label, l.streamed_str()));
        v
    }
}

impl PhaseSink for MetricsSink {
    fn gap_histogram(&self, labels: &PhaseLabels) -> Option<metrics::Histogram> {
        let key = Key::from_parts(self.names.inter_token_gap, self.base_labels(labels));
        Some(self.with(|r| r.register_histogram(&key, &METADATA)))
    }

    fn on_report(&self, rep: &PhaseReport) {
        let n = &self.names;
        let mut labels = self.base_labels(&rep.labels);
        labels.push(Label::from_static_parts(
            n.end_reason_label,
            end_reason_label(&rep.end_reason),
        ));
        self.with(|r| {
            let hist = |name: &'static str, extra: Option<Label>| {
                let mut l = labels.clone();
                l.extend(extra);
                r.register_histogram(&Key::from_parts(name, l), &METADATA)
            };
            let secs = |name: &'static str, d: Option<Duration>| {
                if let Some(d) = d {
                    hist(name, None).record(d.as_secs_f64());
                }
            };
            r.register_counter(&Key::from_parts(n.requests, labels.clone()), &METADATA)
                .increment(1);
            secs(n.request_duration, Some(rep.total));
            secs(n.queue_wait, rep.queue_wait);
            secs(n.time_to_headers, rep.time_to_headers);
            secs(n.time_to_first_token, rep.time_to_first_token);
            secs(n.time_per_output_token, rep.time_per_output_token);
            if rep.labels.streamed {
                hist(n.output_events, None).record(rep.output_events as f64);
            }
            if let Some(u) = rep.usage {
                for (ty, v) in [("input", u.prompt_tokens), ("output", u.completion_tokens)] {
                    if let Some(v) = v {
                        hist(
                            n.usage_tokens,
                            Some(Label::from_static_parts(n.token_type_label, ty)),
                        )
                        .record(v as f64);
                    }
                }
            }
            if let Some(h) = &rep.hedge {
                hist(n.hedge_attempts, None).record(f64::from(h.attempts));
                if h.attempts > 1 {
                    let winner = if h.winner == 0 { "primary" } else { "hedge" };
                    let mut l = labels.clone();
                    l.push(Label::from_static_parts(n.winner_label, winner));
                    r.register_counter(&Key::from_parts(n.hedged_requests, l), &METADATA)
                        .increment(1);
                }
            }
        });
    }
}
