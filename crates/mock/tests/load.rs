//! The load generator against scripted upstreams with known distributions, on a paused clock.

use std::time::Duration;

use http::{HeaderName, HeaderValue};
use tailguard_mock::load::{EndReason, LoadConfig, Percentiles, run};
use tailguard_mock::{Latency, MockServer, SCRIPT_HEADER, Script};

const MS: fn(u64) -> Duration = Duration::from_millis;

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs()
}

/// tokio's timer fires on 1 ms ticks, so a request is sent up to 1 ms after its scheduled
/// (sub-millisecond) time; the histograms keep 3 significant digits.
const TICK: f64 = 0.001;

fn within_tick(measured: f64, want: f64) -> bool {
    measured >= want * (1.0 - 1e-3) && measured <= (want + TICK) * (1.0 + 1e-3)
}

#[tokio::test(start_paused = true)]
async fn fixed_latencies_give_flat_percentiles() {
    let server = MockServer::start(Script::new().ttft(MS(50)).tokens(5).gap(MS(10)))
        .await
        .unwrap();
    let report = run(LoadConfig::new(server.url())
        .rate(100.0)
        .duration(Duration::from_secs(2)))
    .await
    .unwrap();
    let n = report.scheduled;
    assert!((150..=250).contains(&n), "{n}");
    assert_eq!(report.count(EndReason::Completed), n);
    assert_eq!(report.statuses[&200], n);
    assert_eq!(report.tokens, 5 * n);
    let s = report.summary();
    for (p, want) in [(&s.ttft, 0.050), (&s.total, 0.090)] {
        // Measured from the scheduled time: p50 == p99 == max within the clock resolution.
        assert!(p.p99 - p.p50 <= TICK, "{p:?}");
        for q in [p.min, p.p50, p.p90, p.p99, p.p999, p.max] {
            assert!(within_tick(q, want), "{p:?} vs {want}");
        }
    }
    // Gaps are measured between arrivals, not from the schedule: exact.
    assert_eq!(s.gap.p50, s.gap.p999);
    assert!(close(s.gap.min, 0.010, 1e-3) && close(s.gap.max, 0.010, 1e-3));
    assert_eq!(s.ttft.count, n);
    assert_eq!(s.gap.count, 4 * n);
    // The mock saw exactly the requests the generator sent, and all completed.
    let st = server.stats();
    assert_eq!((st.requests, st.completed, st.cancelled), (n, n, 0));
}

#[tokio::test(start_paused = true)]
async fn lognormal_percentiles_match_the_distribution() {
    let server = MockServer::start(
        Script::new()
            .ttft(Latency::log_normal(MS(100), 0.5))
            .tokens(2),
    )
    .await
    .unwrap();
    let report = run(LoadConfig::new(server.url())
        .rate(200.0)
        .duration(Duration::from_secs(5))
        .max_requests(800))
    .await
    .unwrap();
    assert_eq!(report.count(EndReason::Completed), report.scheduled);
    let p = Percentiles::of(&report.ttft);
    // Median e^0 * 100ms; p90 = 100ms * e^(0.5*1.2816); p99 = 100ms * e^(0.5*2.3263).
    assert!(close(p.p50, 0.100, 0.08), "{p:?}");
    assert!(close(p.p90, 0.1898, 0.12), "{p:?}");
    assert!(close(p.p99, 0.3201, 0.25), "{p:?}");
}

#[tokio::test(start_paused = true)]
async fn latency_is_measured_from_the_schedule_not_the_send() {
    // One slot, 100ms per request, arrivals at ~20/s: twice the capacity. A closed-loop
    // generator would report 100ms for every request; an open-loop one sees the queue grow.
    let server = MockServer::start(Script::new().single_slot(true).ttft(MS(100)).tokens(1))
        .await
        .unwrap();
    let report = run(LoadConfig::new(server.url())
        .rate(20.0)
        .duration(Duration::from_secs(2))
        .seed(3))
    .await
    .unwrap();
    let n = report.scheduled;
    assert!(n >= 25, "{n}");
    assert_eq!(report.count(EndReason::Completed), n);
    let p = Percentiles::of(&report.ttft);
    // The last of n requests waits for all before it: at least n*100ms - 2s.
    let lower = n as f64 * 0.1 - 2.0;
    assert!(p.max >= lower, "{p:?} n={n}");
    assert!(p.p50 > 0.2, "{p:?}");
    assert!(server.stats().peak_concurrent > 5);
}

#[tokio::test(start_paused = true)]
async fn statuses_and_end_reasons_are_counted() {
    let server = MockServer::start(
        Script::new()
            .status(http::StatusCode::SERVICE_UNAVAILABLE)
            .status_fraction(0.5),
    )
    .await
    .unwrap();
    let r = run(LoadConfig::new(server.url())
        .rate(100.0)
        .duration(Duration::from_secs(1)))
    .await
    .unwrap();
    let failed = r.statuses[&503];
    assert_eq!(failed + r.statuses[&200], r.scheduled);
    assert_eq!(r.count(EndReason::HttpStatus), failed);
    assert_eq!(r.count(EndReason::Completed), r.scheduled - failed);
    // An error status has no TTFT.
    assert_eq!(r.ttft.len(), r.scheduled - failed);

    for (script, reason) in [
        ("error_after=2", EndReason::ErrorEvent),
        ("reset_after=2", EndReason::Transport),
        ("reset=before_headers", EndReason::Transport),
    ] {
        let r = run(LoadConfig::new(server.url())
            .rate(50.0)
            .duration(Duration::from_millis(500))
            .header(
                HeaderName::from_static(SCRIPT_HEADER),
                HeaderValue::from_str(&format!("{script},status=none")).unwrap(),
            ))
        .await
        .unwrap();
        assert!(r.scheduled > 0);
        assert_eq!(r.count(reason), r.scheduled, "{script}: {r}");
    }
}

#[tokio::test(start_paused = true)]
async fn stalled_streams_time_out_and_are_cancelled_upstream() {
    let server = MockServer::start(Script::new().stall_after(1, None).keepalive_every(MS(50)))
        .await
        .unwrap();
    let r = run(LoadConfig::new(server.url())
        .rate(20.0)
        .duration(Duration::from_secs(1))
        .request_timeout(MS(500)))
    .await
    .unwrap();
    assert!(r.scheduled > 0);
    assert_eq!(r.count(EndReason::Timeout), r.scheduled);
    server.wait_idle().await;
    assert_eq!(server.stats().cancelled, r.scheduled);
}

#[tokio::test(start_paused = true)]
async fn bounded_by_count_and_drain() {
    let server = MockServer::start(Script::new().stall_after(0, None))
        .await
        .unwrap();
    let start = tokio::time::Instant::now();
    let r = run(LoadConfig::new(server.url())
        .rate(1000.0)
        .duration(Duration::from_secs(3600))
        .max_requests(25)
        .drain_timeout(Duration::from_secs(2)))
    .await
    .unwrap();
    assert_eq!(r.scheduled, 25);
    assert_eq!(r.count(EndReason::Unfinished), 25);
    assert!(start.elapsed() < Duration::from_secs(3));
    server.wait_idle().await;
    assert_eq!(server.stats().cancelled, 25);
}

#[tokio::test(start_paused = true)]
async fn anthropic_and_http2_and_json() {
    let server = MockServer::start(Script::new().ttft(MS(30)).tokens(3).gap(MS(5)))
        .await
        .unwrap();
    let r = run(LoadConfig::new(server.url())
        .path("/v1/messages")
        .body(r#"{"model":"claude","stream":true,"max_tokens":64,"messages":[]}"#)
        .http2(true)
        .rate(50.0)
        .duration(Duration::from_secs(1)))
    .await
    .unwrap();
    assert_eq!(r.count(EndReason::Completed), r.scheduled);
    assert_eq!(r.tokens, 3 * r.scheduled);
    let s = r.summary();
    assert!(within_tick(s.ttft.p50, 0.030) && within_tick(s.ttft.p99, 0.030));
    let json: serde_json::Value = serde_json::from_str(&s.to_json()).unwrap();
    assert_eq!(json["end_reasons"]["completed"], r.scheduled);
    assert!(json["ttft"]["p999"].as_f64().unwrap() > 0.0);
    let text = r.to_string();
    assert!(text.contains("ttft") && text.contains("p99.9"), "{text}");
}

#[tokio::test(start_paused = true)]
async fn non_streamed_responses_and_bad_config() {
    let server = MockServer::start(Script::new().ttft(MS(20))).await.unwrap();
    let r = run(LoadConfig::new(server.url())
        .body(r#"{"messages":[]}"#)
        .rate(10.0)
        .duration(Duration::from_secs(1)))
    .await
    .unwrap();
    assert_eq!(r.count(EndReason::Completed), r.scheduled);
    assert!(within_tick(Percentiles::of(&r.ttft).p50, 0.020));
    assert!(run(LoadConfig::new(server.url()).rate(0.0)).await.is_err());
    assert!(run(LoadConfig::new("not a url")).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn ollama_ndjson_streams() {
    let server = MockServer::start(Script::new().ttft(MS(40)).tokens(4).gap(MS(2)))
        .await
        .unwrap();
    let r = run(LoadConfig::new(server.url())
        .path("/api/generate")
        .body(r#"{"model":"llama3","prompt":"hi"}"#)
        .rate(20.0)
        .duration(Duration::from_secs(1)))
    .await
    .unwrap();
    assert!(r.scheduled > 0);
    assert_eq!(r.count(EndReason::Completed), r.scheduled);
    assert_eq!(r.tokens, 4 * r.scheduled);
    let s = r.summary();
    assert!(within_tick(s.ttft.p50, 0.040) && within_tick(s.ttft.p99, 0.040));
    assert!(close(s.gap.p50, 0.002, 1e-2));
}
