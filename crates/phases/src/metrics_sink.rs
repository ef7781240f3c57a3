//! [`MetricsSink`]: the `metrics` output.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};
use std::time::Duration;

use metrics::{Counter, Histogram, Key, KeyName, Label, Level, Metadata, Recorder, Unit};
use tailguard_core::EndReason;

use crate::metric_names::MetricNames;
use crate::report::{PhaseLabels, PhaseReport, end_reason_label};
use crate::sink::PhaseSink;

static METADATA: Metadata<'static> =
    Metadata::new("tailguard_phases", Level::INFO, Some(module_path!()));

/// The `metrics` output (see [`MetricNames`] for every name and label).
///
/// Emits into the recorder installed for the `metrics` facade (global, or local to the thread),
/// or into a recorder of its own set with [`with_recorder`](MetricsSink::with_recorder).
/// Nothing is registered per frame: the inter-token gap histogram is registered once per
/// streamed response (when headers arrive), everything else once per request, at its end.
///
/// With the facade, each request registers its metrics with the recorder in use at that moment,
/// as the `metrics` macros do: a global recorder installed after the first requests is used
/// from the next request on, and a `metrics::with_local_recorder` scope receives the requests
/// that end inside it.
///
/// # Caching
///
/// Labels are bounded by design (configured routes and models, upstreams, operations and
/// providers, priorities, end reasons, streamed or not), so the sink builds the metric [`Key`]s
/// of each label set once, on its first use, and keeps them in a map shared by the sink's
/// clones. With a recorder of its own ([`with_recorder`](MetricsSink::with_recorder)) it also
/// keeps the handles it registered for them: registering looks the key up in the recorder's
/// registry, which under the gateway's load was ~35k instructions a request (3.5% of the
/// gateway's), and the recorder cannot change under the sink. (A recorder that removes metrics
/// left idle, such as `metrics-exporter-prometheus` with an idle timeout, would then stop
/// exporting a label set that went idle and came back: give such a recorder to the facade.)
/// With the facade the handles are registered per request, as the `metrics` macros do.
///
/// At most [`MAX_CACHED_LABEL_SETS`] label sets are kept; should a misconfigured route function
/// produce more, the keys of the extra ones are built and registered per request, as without a
/// cache, so memory stays bounded.
#[derive(Clone, Default)]
pub struct MetricsSink {
    names: MetricNames,
    recorder: Option<Arc<dyn Recorder + Send + Sync>>,
    label_sets: Arc<LabelSets>,
}

/// How many label sets a [`MetricsSink`] keeps the keys of; see
/// [Caching](MetricsSink#caching). Far above what bounded labels produce (routes × models ×
/// upstreams × priorities × end reasons × 2), and small enough to be harmless: each set holds
/// a dozen keys.
pub const MAX_CACHED_LABEL_SETS: usize = 4096;

impl fmt::Debug for MetricsSink {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MetricsSink")
            .field("names", &self.names)
            .field("own_recorder", &self.recorder.is_some())
            .field("cached_label_sets", &self.label_sets.len())
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
        self.label_sets = Arc::default();
        self
    }

    /// Emits into `recorder` instead of the `metrics` facade's (useful when several recorders
    /// coexist, and in tests).
    pub fn with_recorder(self, recorder: impl Recorder + Send + Sync + 'static) -> Self {
        self.with_shared_recorder(Arc::new(recorder))
    }

    /// Emits into a shared `recorder`.
    pub fn with_shared_recorder(mut self, recorder: Arc<dyn Recorder + Send + Sync>) -> Self {
        self.recorder = Some(recorder);
        self.label_sets = Arc::default();
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
        self.label_sets.len()
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
                (
                    n.hedge_loser_duration,
                    "How long each losing hedge attempt ran before it was cancelled",
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
                "Requests for which a hedge was sent and an attempt won, by winner".into(),
            );
            r.describe_counter(
                d(n.hedge_wasted_prompt_bytes),
                Some(Unit::Bytes),
                "Request body bytes sent on losing hedge attempts".into(),
            );
            r.describe_counter(
                d(n.hedge_wasted_prompt_tokens),
                Some(Unit::Count),
                "Prompt tokens sent on losing hedge attempts".into(),
            );
        });
    }

    /// Runs `f` with the recorder in use: this sink's own, or the facade's current one.
    fn with<T>(&self, f: impl FnOnce(&dyn Recorder) -> T) -> T {
        match &self.recorder {
            Some(r) => f(&**r),
            None => metrics::with_recorder(f),
        }
    }

    /// The metrics of `labels` with `end_reason` (in [`Metric::ALL`] order), or without one the
    /// inter-token gap histogram alone.
    fn metrics(&self, labels: &PhaseLabels, end_reason: Option<&'static str>) -> Arc<Metrics> {
        let set = LabelSet {
            route: labels.route.clone(),
            model: labels.model.clone(),
            upstream: labels.upstream.clone(),
            operation: labels.operation.clone(),
            provider: labels.provider.clone(),
            priority: Arc::from(labels.priority()),
            streamed: labels.streamed,
            end_reason,
        };
        self.label_sets.get_or_build(set, |set| {
            Metrics::new(set.keys(&self.names), self.recorder.is_some())
        })
    }

    /// Records every metric of `rep` in `metrics`.
    fn emit(&self, rep: &PhaseReport, metrics: &Metrics) {
        self.with(|r| {
            let add = |m: Metric, n: u64| metrics.counter(r, m as usize).increment(n);
            let count = |m: Metric| add(m, 1);
            let record = |m: Metric, value: f64| metrics.histogram(r, m as usize).record(value);
            let secs = |m: Metric, d: Option<Duration>| {
                if let Some(d) = d {
                    record(m, d.as_secs_f64());
                }
            };
            count(Metric::Requests);
            secs(Metric::RequestDuration, Some(rep.total));
            secs(Metric::QueueWait, rep.queue_wait);
            secs(Metric::TimeToHeaders, rep.time_to_headers);
            secs(Metric::TimeToFirstToken, rep.time_to_first_token);
            secs(Metric::TimePerOutputToken, rep.time_per_output_token);
            if rep.labels.streamed {
                record(Metric::OutputEvents, rep.output_events as f64);
            }
            if let Some(u) = rep.usage {
                if let Some(v) = u.prompt_tokens {
                    record(Metric::UsageInput, v as f64);
                }
                if let Some(v) = u.completion_tokens {
                    record(Metric::UsageOutput, v as f64);
                }
            }
            if let Some(h) = &rep.hedge {
                record(Metric::HedgeAttempts, f64::from(h.attempts));
                // A request whose every attempt failed has no winner to count.
                match h.winner {
                    Some(0) if h.attempts > 1 => count(Metric::HedgedPrimary),
                    Some(_) if h.attempts > 1 => count(Metric::HedgedHedge),
                    _ => {}
                }
                for l in &h.losers {
                    record(Metric::HedgeLoserDuration, l.ran.as_secs_f64());
                }
                if h.wasted_prompt_bytes > 0 {
                    add(Metric::HedgeWastedPromptBytes, h.wasted_prompt_bytes);
                }
                if let Some(t) = h.wasted_prompt_tokens.filter(|&t| t > 0) {
                    add(Metric::HedgeWastedPromptTokens, t);
                }
            }
        });
    }
}

impl PhaseSink for MetricsSink {
    fn gap_histogram(&self, labels: &PhaseLabels) -> Option<Histogram> {
        let metrics = self.metrics(labels, None);
        Some(self.with(|r| metrics.histogram(r, 0)))
    }

    fn on_report(&self, rep: &PhaseReport) {
        let metrics = self.metrics(&rep.labels, Some(end_reason_label(&rep.end_reason)));
        self.emit(rep, &metrics);
    }
}

/// The metrics of a report, in key order.
#[derive(Clone, Copy)]
enum Metric {
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
    HedgeLoserDuration,
    HedgeWastedPromptBytes,
    HedgeWastedPromptTokens,
}

impl Metric {
    const ALL: [Metric; 15] = [
        Metric::Requests,
        Metric::RequestDuration,
        Metric::QueueWait,
        Metric::TimeToHeaders,
        Metric::TimeToFirstToken,
        Metric::TimePerOutputToken,
        Metric::OutputEvents,
        Metric::UsageInput,
        Metric::UsageOutput,
        Metric::HedgeAttempts,
        Metric::HedgedPrimary,
        Metric::HedgedHedge,
        Metric::HedgeLoserDuration,
        Metric::HedgeWastedPromptBytes,
        Metric::HedgeWastedPromptTokens,
    ];

    /// The metric's name, and the label it adds to the report's labels, if any.
    fn name_and_label(self, n: &MetricNames) -> (&'static str, Option<Label>) {
        let label = |key: &'static str, value: &'static str| Some(Label::new(key, value));
        match self {
            Metric::Requests => (n.requests, None),
            Metric::RequestDuration => (n.request_duration, None),
            Metric::QueueWait => (n.queue_wait, None),
            Metric::TimeToHeaders => (n.time_to_headers, None),
            Metric::TimeToFirstToken => (n.time_to_first_token, None),
            Metric::TimePerOutputToken => (n.time_per_output_token, None),
            Metric::OutputEvents => (n.output_events, None),
            Metric::UsageInput => (n.usage_tokens, label(n.token_type_label, "input")),
            Metric::UsageOutput => (n.usage_tokens, label(n.token_type_label, "output")),
            Metric::HedgeAttempts => (n.hedge_attempts, None),
            Metric::HedgedPrimary => (n.hedged_requests, label(n.winner_label, "primary")),
            Metric::HedgedHedge => (n.hedged_requests, label(n.winner_label, "hedge")),
            Metric::HedgeLoserDuration => (n.hedge_loser_duration, None),
            Metric::HedgeWastedPromptBytes => (n.hedge_wasted_prompt_bytes, None),
            Metric::HedgeWastedPromptTokens => (n.hedge_wasted_prompt_tokens, None),
        }
    }
}

/// One label set: the cache's key.
#[derive(Clone, PartialEq, Eq, Hash)]
struct LabelSet {
    route: Arc<str>,
    model: Arc<str>,
    upstream: Arc<str>,
    operation: Arc<str>,
    provider: Arc<str>,
    priority: Arc<str>,
    streamed: bool,
    /// `None` for the inter-token gaps, which are recorded before the end.
    end_reason: Option<&'static str>,
}

impl LabelSet {
    /// The metric keys of this label set (see [`MetricsSink::metrics`]).
    fn keys(&self, n: &MetricNames) -> Arc<[Key]> {
        let mut labels = vec![
            Label::new(n.route_label, self.route.clone()),
            Label::new(n.model_label, self.model.clone()),
            Label::new(n.upstream_label, self.upstream.clone()),
            Label::new(n.priority_label, self.priority.clone()),
            Label::new(
                n.streamed_label,
                if self.streamed { "true" } else { "false" },
            ),
        ];
        if let Some(key) = n.operation_label {
            labels.push(Label::new(key, self.operation.clone()));
        }
        if let Some(key) = n.provider_label {
            labels.push(Label::new(key, self.provider.clone()));
        }
        let Some(reason) = self.end_reason else {
            return Arc::new([Key::from_parts(n.inter_token_gap, labels)]);
        };
        labels.push(Label::new(n.end_reason_label, reason));
        // Set only on a request that did not complete, as `error.type` is.
        if let Some(key) = n
            .error_type_label
            .filter(|_| reason != EndReason::Completed.as_str())
        {
            labels.push(Label::new(key, reason));
        }
        Metric::ALL
            .iter()
            .map(|m| {
                let (name, extra) = m.name_and_label(n);
                let mut labels = labels.clone();
                labels.extend(extra);
                Key::from_parts(name, labels)
            })
            .collect()
    }
}

/// One label set's metrics: their keys and, with the sink's own recorder, the handles
/// registered for them (see [Caching](MetricsSink#caching)).
struct Metrics {
    keys: Arc<[Key]>,
    /// One slot per key, registered on first use; `None` with the facade.
    counters: Option<Box<[OnceLock<Counter>]>>,
    histograms: Option<Box<[OnceLock<Histogram>]>>,
}

impl Metrics {
    fn new(keys: Arc<[Key]>, own_recorder: bool) -> Self {
        fn slots<T>(n: usize, on: bool) -> Option<Box<[OnceLock<T>]>> {
            on.then(|| (0..n).map(|_| OnceLock::new()).collect())
        }
        Metrics {
            counters: slots(keys.len(), own_recorder),
            histograms: slots(keys.len(), own_recorder),
            keys,
        }
    }

    /// The counter of key `i` in `r`.
    fn counter(&self, r: &dyn Recorder, i: usize) -> Counter {
        let register = || r.register_counter(&self.keys[i], &METADATA);
        match &self.counters {
            Some(kept) => kept[i].get_or_init(register).clone(),
            None => register(),
        }
    }

    /// The histogram of key `i` in `r`.
    fn histogram(&self, r: &dyn Recorder, i: usize) -> Histogram {
        let register = || r.register_histogram(&self.keys[i], &METADATA);
        match &self.histograms {
            Some(kept) => kept[i].get_or_init(register).clone(),
            None => register(),
        }
    }
}

/// The metrics of the label sets seen so far, at most [`MAX_CACHED_LABEL_SETS`] of them.
#[derive(Default)]
struct LabelSets(RwLock<HashMap<LabelSet, Arc<Metrics>>>);

impl LabelSets {
    /// The cached metrics of `set`, else `build`'s, cached unless the cache is full.
    fn get_or_build(
        &self,
        set: LabelSet,
        build: impl FnOnce(&LabelSet) -> Metrics,
    ) -> Arc<Metrics> {
        let cached = self
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&set)
            .cloned();
        if let Some(metrics) = cached {
            return metrics;
        }
        let metrics = Arc::new(build(&set));
        let mut map = self.0.write().unwrap_or_else(PoisonError::into_inner);
        if let Some(cached) = map.get(&set) {
            // Another request built them first.
            return cached.clone();
        }
        if map.len() < MAX_CACHED_LABEL_SETS {
            map.insert(set, metrics.clone());
        }
        metrics
    }

    fn len(&self) -> usize {
        self.0.read().unwrap_or_else(PoisonError::into_inner).len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keys are indexed by `Metric as usize`: `ALL` lists every metric in that order.
    #[test]
    fn all_lists_the_metrics_in_key_order() {
        for (i, m) in Metric::ALL.iter().enumerate() {
            assert_eq!(*m as usize, i);
        }
    }
}
