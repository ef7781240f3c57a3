//! The names of every metric and label the [`MetricsSink`](crate::MetricsSink) emits, and the
//! recommended histogram buckets.

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

/// The names of every metric and label the [`MetricsSink`](crate::MetricsSink) emits.
///
/// Two schemes are provided: [`MetricNames::tailguard`] (the default: Prometheus style,
/// `tailguard_` prefix, unit suffix `_seconds`) and [`MetricNames::otel_genai`] (OpenTelemetry
/// GenAI semantic-convention names where a convention exists, `tailguard.*` otherwise). Fields are
/// public so a scheme can be adjusted.
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
