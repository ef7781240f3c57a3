//! The names of every metric and label the [`MetricsSink`](crate::MetricsSink) emits, and the
//! recommended histogram buckets.

/// Recommended histogram bucket boundaries, so a Prometheus exporter can be configured with real
/// histograms (e.g. `PrometheusBuilder::set_buckets_for_metric`, see
/// [`MetricNames::histogram_buckets`]).
///
/// The `GEN_AI_*` lists are the advisory boundaries of the OpenTelemetry GenAI metrics
/// conventions (semantic conventions v1.41.0, see [`MetricNames`](crate::MetricNames)), exactly;
/// [`MetricNames::histogram_buckets`] gives them to every metric named by the convention. The
/// others, for the [`MetricNames::tailguard`] names and the `tailguard.*` metrics of the
/// OpenTelemetry presets, are the convention's lists extended with vLLM's longer Prometheus
/// tails, because a gateway sees queued long prompts and generations that run for minutes.
pub mod buckets {
    /// The OpenTelemetry boundaries of `gen_ai.client.operation.duration`,
    /// `gen_ai.client.operation.time_to_first_chunk`,
    /// `gen_ai.client.operation.time_per_output_chunk` and `gen_ai.server.request.duration`:
    /// 10 ms doubling to 81.92 s.
    pub const GEN_AI_DURATION: &[f64] = &[
        0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
    ];

    /// The OpenTelemetry boundaries of `gen_ai.server.time_to_first_token` (1 ms .. 10 s).
    pub const GEN_AI_SERVER_TIME_TO_FIRST_TOKEN: &[f64] = &[
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    ];

    /// The OpenTelemetry boundaries of `gen_ai.server.time_per_output_token` (10 ms .. 2.5 s).
    pub const GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN: &[f64] = &[
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    ];

    /// Time to first token, and time to headers: [`GEN_AI_SERVER_TIME_TO_FIRST_TOKEN`]
    /// followed by vLLM's `vllm:time_to_first_token_seconds` tail (.. 2560 s) for queued long
    /// prompts.
    pub const TIME_TO_FIRST_TOKEN: &[f64] = &[
        0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
    ];

    /// Time per output token and inter-token gaps: [`GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN`]
    /// followed by vLLM's `vllm:time_per_output_token_seconds` / `vllm:inter_token_latency_seconds`
    /// tail (.. 80 s).
    pub const TIME_PER_OUTPUT_TOKEN: &[f64] = &[
        0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
        20.0, 40.0, 80.0,
    ];

    /// Inter-token gaps: the same boundaries as [`TIME_PER_OUTPUT_TOKEN`], as vLLM uses.
    pub const INTER_TOKEN_GAP: &[f64] = TIME_PER_OUTPUT_TOKEN;

    /// Request duration and queue wait: [`GEN_AI_DURATION`], doubled on to 2621.44 s because
    /// long generations run for minutes (vLLM's `e2e_request_latency` reaches 7680 s with a
    /// coarser start).
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
/// Three schemes are provided, and fields are public so a scheme can be adjusted:
///
/// * [`MetricNames::tailguard`], the default: Prometheus style, `tailguard_` prefix, unit suffix
///   `_seconds`;
/// * [`MetricNames::otel_genai`]: the OpenTelemetry GenAI **client** metrics, since the recorder
///   sits in a gateway that is a client of the model servers;
/// * [`MetricNames::otel_genai_server`]: the OpenTelemetry GenAI **model server** metrics.
///
/// Metrics without a convention are `tailguard.*` under both OpenTelemetry schemes.
///
/// | metric | `tailguard()` | `otel_genai()` | `otel_genai_server()` | kind |
/// |---|---|---|---|---|
/// | requests (1 each) | `tailguard_requests_total` | `tailguard.requests` | `tailguard.requests` | counter |
/// | total duration | `tailguard_request_duration_seconds` | `gen_ai.client.operation.duration` | `gen_ai.server.request.duration` | histogram |
/// | admission queue wait | `tailguard_queue_wait_seconds` | `tailguard.queue.wait` | `tailguard.queue.wait` | histogram |
/// | time to headers | `tailguard_time_to_headers_seconds` | `tailguard.time_to_headers` | `tailguard.time_to_headers` | histogram |
/// | time to first token (streamed, with a token) | `tailguard_time_to_first_token_seconds` | `gen_ai.client.operation.time_to_first_chunk` | `gen_ai.server.time_to_first_token` | histogram |
/// | every inter-token gap, live | `tailguard_inter_token_gap_seconds` | `gen_ai.client.operation.time_per_output_chunk` | `tailguard.inter_token_gap` | histogram |
/// | time per output token (events > 1) | `tailguard_time_per_output_token_seconds` | `tailguard.time_per_output_token` | `gen_ai.server.time_per_output_token` | histogram |
/// | output events per streamed request | `tailguard_output_events` | `tailguard.output_events` | `tailguard.output_events` | histogram |
/// | usage the stream reported | `tailguard_usage_tokens` | `gen_ai.client.token.usage` | `gen_ai.client.token.usage` | histogram |
/// | attempts per hedge-eligible request | `tailguard_hedge_attempts` | `tailguard.hedge.attempts` | `tailguard.hedge.attempts` | histogram |
/// | requests with a hedge sent and an attempt won, by winner | `tailguard_hedged_requests_total` | `tailguard.hedged_requests` | `tailguard.hedged_requests` | counter |
/// | how long each losing attempt ran | `tailguard_hedge_loser_duration_seconds` | `tailguard.hedge.loser.duration` | `tailguard.hedge.loser.duration` | histogram |
/// | request body bytes sent on losing attempts | `tailguard_hedge_wasted_prompt_bytes_total` | `tailguard.hedge.wasted_prompt.bytes` | `tailguard.hedge.wasted_prompt.bytes` | counter |
/// | prompt tokens sent on losing attempts (when known) | `tailguard_hedge_wasted_prompt_tokens_total` | `tailguard.hedge.wasted_prompt.tokens` | `tailguard.hedge.wasted_prompt.tokens` | counter |
///
/// The metrics recorded at the end of a request carry the first six labels below, and under the
/// OpenTelemetry schemes the operation and the provider too, and the error type when the request
/// did not complete; the inter-token gaps, recorded as they happen, carry the same but the end
/// reason and the error type. Usage adds the token type, the hedged-requests counter the winner.
///
/// | label | `tailguard()` | OpenTelemetry schemes | values |
/// |---|---|---|---|
/// | route | `route` | `http.route` | [`PhaseLabels::route`](crate::PhaseLabels::route) |
/// | model | `model` | `gen_ai.request.model` | [`PhaseLabels::model`](crate::PhaseLabels::model) |
/// | upstream | `upstream` | `tailguard.upstream` | [`PhaseLabels::upstream`](crate::PhaseLabels::upstream) |
/// | priority | `priority` | `tailguard.priority` | [`PhaseLabels::priority`](crate::PhaseLabels::priority) |
/// | end reason | `end_reason` | `tailguard.end_reason` | [`end_reason_label`](crate::end_reason_label) |
/// | streamed | `streamed` | `tailguard.streamed` | `true` / `false` |
/// | operation | none | `gen_ai.operation.name` | [`PhaseLabels::operation`](crate::PhaseLabels::operation) |
/// | provider | none | `gen_ai.provider.name` | [`PhaseLabels::provider`](crate::PhaseLabels::provider) |
/// | error type | none | `error.type` | the end reason, on requests that did not complete |
/// | token type | `token_type` | `gen_ai.token.type` | `input` / `output` |
/// | hedge winner | `winner` | `tailguard.hedge.winner` | `primary` / `hedge` |
///
/// # OpenTelemetry
///
/// Names, instruments, units, attributes and bucket boundaries are those of the GenAI metrics
/// conventions of [OpenTelemetry semantic conventions v1.41.0][semconv] (status
/// *Development*; unchanged in v1.41.1, the last release of
/// `open-telemetry/semantic-conventions` to carry the GenAI conventions, which have since moved
/// to their own repository). Every GenAI metric is a histogram, of unit `s`, or `{token}`
/// for `gen_ai.client.token.usage` ([`MetricsSink::describe`](crate::MetricsSink::describe)
/// gives them as `Unit::Seconds` and `Unit::Count`: the `metrics` crate has no annotated
/// units). The attributes the conventions require or conditionally require are set as follows:
///
/// * `gen_ai.operation.name` (required): per route, from
///   [`DEFAULT_OPERATIONS`](crate::DEFAULT_OPERATIONS) (`chat` for chat completions, Responses
///   and Anthropic Messages, `text_completion` for completions, `embeddings`) or
///   [`with_operations`](crate::LatencyPhaseRecorderLayer::with_operations), else the route
///   label itself (a custom value, which the conventions allow);
/// * `gen_ai.provider.name` (required):
///   [`with_provider`](crate::LatencyPhaseRecorderLayer::with_provider), `openai` by default;
/// * `gen_ai.request.model` (conditionally required, if available): the bounded model label,
///   a configured model name rather than the raw requested string, `other` for a model not
///   configured and `unknown` when the request named none;
/// * `error.type` (conditionally required on the durations, if the operation ended in an
///   error): set on every metric of a request that did not complete, never on a `completed`
///   one, to its end reason: `head_timeout`, `first_token_timeout`, `idle_timeout`,
///   `liveness_timeout`, `deadline`, `client_disconnect`, `rejected`, `upstream_error_4xx`, `upstream_error_5xx`,
///   `upstream_error_other_status`, `upstream_error_transport`, `upstream_error_in_band`,
///   `upstream_error_protocol`, `upstream_error_truncated` (or `upstream_error` for a class
///   this version does not know);
/// * `gen_ai.token.type` (required on usage): `input` or `output`;
/// * `server.address` and `server.port` (recommended, and required only with an address) are
///   not set: [`upstream`](crate::LatencyPhaseRecorderLayer::with_upstream) is a name, not an
///   address; nor is the recommended `gen_ai.response.model`.
///
/// `time_to_first_chunk` is the time to the first *token* (a role-only chunk, a keepalive or a
/// `ping` is not counted) and `time_per_output_chunk` gets one gap per body frame carrying
/// output after the first token (chunks arriving in the same frame are one arrival); both are
/// recorded for streamed responses only, as the conventions ask. The server scheme records
/// `time_to_first_token` and `time_per_output_token` whenever they were measured, failed
/// requests included (select `error.type` absent for the conventions' successful responses).
///
/// [semconv]: https://github.com/open-telemetry/semantic-conventions/blob/v1.41.0/docs/gen-ai/gen-ai-metrics.md
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
    /// Histogram of how long each losing hedge attempt ran before it was cancelled or failed.
    pub hedge_loser_duration: &'static str,
    /// Counter of request body bytes sent on losing hedge attempts.
    pub hedge_wasted_prompt_bytes: &'static str,
    /// Counter of prompt tokens sent on losing hedge attempts (when the request's facts know
    /// them).
    pub hedge_wasted_prompt_tokens: &'static str,
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
    /// Label key: operation name, or `None` for no such label.
    pub operation_label: Option<&'static str>,
    /// Label key: provider name, or `None` for no such label.
    pub provider_label: Option<&'static str>,
    /// Label key: error type (the end reason of a request that did not complete, absent on a
    /// completed one), or `None` for no such label.
    pub error_type_label: Option<&'static str>,
    /// Label key: token type (`input` / `output`).
    pub token_type_label: &'static str,
    /// Label key: hedge winner (`primary` / `hedge`).
    pub winner_label: &'static str,
}

/// The OpenTelemetry names with a bucket recommendation, as the conventions spell them.
mod otel {
    pub(super) const CLIENT_OPERATION_DURATION: &str = "gen_ai.client.operation.duration";
    pub(super) const CLIENT_TIME_TO_FIRST_CHUNK: &str =
        "gen_ai.client.operation.time_to_first_chunk";
    pub(super) const CLIENT_TIME_PER_OUTPUT_CHUNK: &str =
        "gen_ai.client.operation.time_per_output_chunk";
    pub(super) const CLIENT_TOKEN_USAGE: &str = "gen_ai.client.token.usage";
    pub(super) const SERVER_REQUEST_DURATION: &str = "gen_ai.server.request.duration";
    pub(super) const SERVER_TIME_TO_FIRST_TOKEN: &str = "gen_ai.server.time_to_first_token";
    pub(super) const SERVER_TIME_PER_OUTPUT_TOKEN: &str = "gen_ai.server.time_per_output_token";
}

impl MetricNames {
    /// The default, Prometheus-style scheme (see the tables above).
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
            hedge_loser_duration: "tailguard_hedge_loser_duration_seconds",
            hedge_wasted_prompt_bytes: "tailguard_hedge_wasted_prompt_bytes_total",
            hedge_wasted_prompt_tokens: "tailguard_hedge_wasted_prompt_tokens_total",
            route_label: "route",
            model_label: "model",
            upstream_label: "upstream",
            priority_label: "priority",
            end_reason_label: "end_reason",
            streamed_label: "streamed",
            operation_label: None,
            provider_label: None,
            error_type_label: None,
            token_type_label: "token_type",
            winner_label: "winner",
        }
    }

    /// The OpenTelemetry GenAI client metrics (see [OpenTelemetry](MetricNames#opentelemetry)):
    /// `gen_ai.client.operation.duration`, `gen_ai.client.operation.time_to_first_chunk`,
    /// `gen_ai.client.operation.time_per_output_chunk`, `gen_ai.client.token.usage`, with
    /// `gen_ai.operation.name`, `gen_ai.provider.name`, `gen_ai.request.model`, `error.type`
    /// and `gen_ai.token.type`; everything without a convention is `tailguard.*`.
    pub const fn otel_genai() -> Self {
        MetricNames {
            request_duration: otel::CLIENT_OPERATION_DURATION,
            time_to_first_token: otel::CLIENT_TIME_TO_FIRST_CHUNK,
            inter_token_gap: otel::CLIENT_TIME_PER_OUTPUT_CHUNK,
            time_per_output_token: "tailguard.time_per_output_token",
            ..Self::otel_genai_server()
        }
    }

    /// The OpenTelemetry GenAI model server metrics (see
    /// [OpenTelemetry](MetricNames#opentelemetry)): `gen_ai.server.request.duration`,
    /// `gen_ai.server.time_to_first_token`, `gen_ai.server.time_per_output_token`, and
    /// `gen_ai.client.token.usage` for usage, with the same attributes as
    /// [`otel_genai`](MetricNames::otel_genai); everything without a convention is
    /// `tailguard.*`.
    pub const fn otel_genai_server() -> Self {
        MetricNames {
            requests: "tailguard.requests",
            request_duration: otel::SERVER_REQUEST_DURATION,
            queue_wait: "tailguard.queue.wait",
            time_to_headers: "tailguard.time_to_headers",
            time_to_first_token: otel::SERVER_TIME_TO_FIRST_TOKEN,
            inter_token_gap: "tailguard.inter_token_gap",
            time_per_output_token: otel::SERVER_TIME_PER_OUTPUT_TOKEN,
            output_events: "tailguard.output_events",
            usage_tokens: otel::CLIENT_TOKEN_USAGE,
            hedge_attempts: "tailguard.hedge.attempts",
            hedged_requests: "tailguard.hedged_requests",
            hedge_loser_duration: "tailguard.hedge.loser.duration",
            hedge_wasted_prompt_bytes: "tailguard.hedge.wasted_prompt.bytes",
            hedge_wasted_prompt_tokens: "tailguard.hedge.wasted_prompt.tokens",
            route_label: "http.route",
            model_label: "gen_ai.request.model",
            upstream_label: "tailguard.upstream",
            priority_label: "tailguard.priority",
            end_reason_label: "tailguard.end_reason",
            streamed_label: "tailguard.streamed",
            operation_label: Some("gen_ai.operation.name"),
            provider_label: Some("gen_ai.provider.name"),
            error_type_label: Some("error.type"),
            token_type_label: "gen_ai.token.type",
            winner_label: "tailguard.hedge.winner",
        }
    }

    /// Every histogram name with its recommended [`buckets`]: the convention's boundaries for a
    /// name the OpenTelemetry conventions define (whichever field carries it), else tailguard's.
    pub fn histogram_buckets(&self) -> [(&'static str, &'static [f64]); 10] {
        let pick =
            |name: &'static str, ours: &'static [f64]| (name, convention(name).unwrap_or(ours));
        [
            pick(self.request_duration, buckets::REQUEST_DURATION),
            pick(self.queue_wait, buckets::QUEUE_WAIT),
            pick(self.time_to_headers, buckets::TIME_TO_FIRST_TOKEN),
            pick(self.time_to_first_token, buckets::TIME_TO_FIRST_TOKEN),
            pick(self.inter_token_gap, buckets::INTER_TOKEN_GAP),
            pick(self.time_per_output_token, buckets::TIME_PER_OUTPUT_TOKEN),
            pick(self.output_events, buckets::TOKENS),
            pick(self.usage_tokens, buckets::TOKENS),
            pick(self.hedge_attempts, buckets::TOKENS),
            pick(self.hedge_loser_duration, buckets::TIME_TO_FIRST_TOKEN),
        ]
    }
}

/// The OpenTelemetry conventions' advisory boundaries for `name`, if they define the name.
fn convention(name: &str) -> Option<&'static [f64]> {
    match name {
        otel::CLIENT_OPERATION_DURATION
        | otel::CLIENT_TIME_TO_FIRST_CHUNK
        | otel::CLIENT_TIME_PER_OUTPUT_CHUNK
        | otel::SERVER_REQUEST_DURATION => Some(buckets::GEN_AI_DURATION),
        otel::SERVER_TIME_TO_FIRST_TOKEN => Some(buckets::GEN_AI_SERVER_TIME_TO_FIRST_TOKEN),
        otel::SERVER_TIME_PER_OUTPUT_TOKEN => Some(buckets::GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN),
        otel::CLIENT_TOKEN_USAGE => Some(buckets::TOKENS),
        _ => None,
    }
}

impl Default for MetricNames {
    fn default() -> Self {
        Self::tailguard()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// tailguard's lists extend the conventions' (as the bucket docs say), so the two agree
    /// where they overlap.
    #[test]
    fn tailguard_buckets_extend_the_conventions() {
        for (ours, theirs) in [
            (buckets::REQUEST_DURATION, buckets::GEN_AI_DURATION),
            (
                buckets::TIME_TO_FIRST_TOKEN,
                buckets::GEN_AI_SERVER_TIME_TO_FIRST_TOKEN,
            ),
            (
                buckets::TIME_PER_OUTPUT_TOKEN,
                buckets::GEN_AI_SERVER_TIME_PER_OUTPUT_TOKEN,
            ),
        ] {
            assert!(ours.len() > theirs.len());
            assert_eq!(&ours[..theirs.len()], theirs);
            assert!(ours.windows(2).all(|w| w[0] < w[1]));
        }
    }

    /// A name outside the conventions keeps tailguard's buckets, whichever scheme it is in.
    #[test]
    fn only_convention_names_get_convention_buckets() {
        let buckets = |n: MetricNames| n.histogram_buckets().to_vec();
        for (name, b) in buckets(MetricNames::tailguard()) {
            assert!(convention(name).is_none() && !b.is_empty(), "{name}");
        }
        let client = buckets(MetricNames::otel_genai());
        let tpot = client
            .iter()
            .find(|(n, _)| *n == "tailguard.time_per_output_token")
            .unwrap();
        assert_eq!(tpot.1, buckets::TIME_PER_OUTPUT_TOKEN);
    }
}
