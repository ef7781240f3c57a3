//! What the two batching-replica benches (`adaptive_limit`, scenario E, and
//! `batching_overload`, issue 29) share: the replicas' script, the request they send, the
//! percentile of a histogram in milliseconds, and the adaptive limit read from the gateway's
//! metrics.

use hdrhistogram::Histogram;
use tailguard_gateway::metrics_handle;

/// The replicas' script: 30 ms plus 0.5 ms per prompt token (50 ms for the benches' 100-word
/// prompt) to the first token, then 32 tokens about 25 ms apart.
pub const SCRIPT: &str =
    "ttft=lognormal(30ms,0.3),prefill_per_token=500us,tokens=32,gap=lognormal(25ms,0.2)";

/// The gauge of the adaptive limit.
const LIMIT_GAUGE: &str = "tailguard_admission_limit";

/// A streamed chat request with a 100-word prompt.
pub fn body() -> String {
    let prompt = vec!["word"; 100].join(" ");
    format!(
        r#"{{"model":"mock-model","stream":true,"messages":[{{"role":"user","content":"{prompt}"}}]}}"#
    )
}

/// The `q` quantile of a histogram of microseconds, in milliseconds (`None` when empty).
pub fn ms(h: &Histogram<u64>, q: f64) -> Option<f64> {
    (!h.is_empty()).then(|| h.value_at_quantile(q) as f64 / 1e3)
}

/// The adaptive limit from the gateway's metrics (the last sample of the gauge).
pub fn adaptive_limit() -> Option<f64> {
    let text = metrics_handle().render();
    text.lines()
        .filter(|l| l.starts_with(LIMIT_GAUGE) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .next_back()
}
