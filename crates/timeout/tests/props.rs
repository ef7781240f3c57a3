//! Property tests on a paused clock.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use proptest::prelude::*;
use tailguard_test_support::*;
use tailguard_timeout::SseIdleTimeoutLayer;
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

const LIMIT: u64 = 1000;

#[derive(Clone, Copy, Debug)]
enum Ev {
    Token,
    Role,
    Keepalive,
}

async fn play(layer: SseIdleTimeoutLayer, steps: Vec<Step>) -> (Collected, Probe) {
    let (body, probe) = ScriptBody::new(steps).probed();
    let body = std::sync::Mutex::new(Some(body));
    let svc = layer.layer(tower::service_fn(move |_req: Request<()>| {
        let body = body.lock().unwrap().take().unwrap();
        async move {
            Ok::<_, std::convert::Infallible>(
                Response::builder()
                    .header("content-type", "text/event-stream")
                    .body(body)
                    .unwrap(),
            )
        }
    }));
    let start = Instant::now();
    let res = svc.oneshot(Request::new(())).await.unwrap();
    (collect(res.into_body(), start).await, probe)
}

fn gap() -> impl Strategy<Value = u64> {
    // Multiples of 250 ms, so gaps of exactly the limit (ties) come up often.
    prop_oneof![(0u64..=6).prop_map(|k| k * 250), 0u64..2500]
}

fn ev() -> impl Strategy<Value = Ev> {
    prop_oneof![
        3 => Just(Ev::Token),
        1 => Just(Ev::Role),
        3 => Just(Ev::Keepalive),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    /// After a first token at 0, for any script of gaps, tokens, meta chunks and keepalives
    /// (then `[DONE]`), the idle timer fires iff some gap between progress events (or between the last one and
    /// the end of the stream) exceeds the limit, and then exactly at that progress event plus
    /// the limit, with every event up to then delivered.
    #[test]
    fn idle_fires_iff_a_progress_gap_exceeds_the_limit(
        script in proptest::collection::vec((gap(), ev()), 0..40)
    ) {
        let mut steps = vec![data(token("t0"))];
        let mut t = 0u64;
        let mut progress = vec![0u64];
        let mut timeline = vec![(0u64, true)];
        for (g, e) in &script {
            steps.push(wait_ms(*g));
            t += g;
            steps.push(match e {
                Ev::Token => data(token("x")),
                Ev::Role => data(ROLE),
                Ev::Keepalive => data(KEEPALIVE),
            });
            let is_progress = !matches!(e, Ev::Keepalive);
            if is_progress {
                progress.push(t);
            }
            timeline.push((t, is_progress));
        }
        // The stream ends with its terminal event (an OpenAI stream without it was cut short).
        steps.push(data(END));
        // Two events: the finish chunk and `[DONE]`.
        timeline.extend([(t, true), (t, true)]);
        let end = t;
        let mut marks = progress.clone();
        marks.push(end);
        let expected_fire = marks.windows(2).find(|w| w[1] - w[0] > LIMIT).map(|w| w[0] + LIMIT);

        let layer = SseIdleTimeoutLayer::new().with_idle_timeout(Duration::from_millis(LIMIT));
        let (seen, probe) = paused_runtime().block_on(play(layer, steps));
        let events = seen.events();
        let fired = events.iter().any(|e| e.contains("idle_timeout"));
        prop_assert_eq!(fired, expected_fire.is_some(), "events: {:?}", events);
        match expected_fire {
            Some(at) => {
                prop_assert_eq!(seen.ended_at, Duration::from_millis(at));
                // Everything due up to the firing instant was delivered, nothing after it.
                let due = timeline.iter().filter(|(when, _)| *when <= at).count();
                prop_assert_eq!(events.len(), due + 2);
                prop_assert!(probe.cancelled());
            }
            None => {
                prop_assert_eq!(events.len(), timeline.len());
                prop_assert_eq!(seen.ended_at, Duration::from_millis(end));
                prop_assert!(!probe.cancelled());
            }
        }
    }

    /// However the upstream splits a stream into frames, and wherever it stalls, the client
    /// never waits holding half an event, and gets every whole event before the stall.
    #[test]
    fn no_split_or_stall_leaves_half_an_event(
        cuts in proptest::collection::vec(1usize..40, 1..60),
        stall_at in 0usize..60,
    ) {
        let whole: String = (0..6)
            .map(|i| format!("data: {{\"choices\":[{{\"delta\":{{\"content\":\"t{i}\"}}}}]}}\n\n"))
            .collect::<String>()
            + ": keepalive\n\n"
            + END;
        let bytes = whole.as_bytes();
        let mut steps = Vec::new();
        let mut pos = 0;
        let mut stalled_at_byte = None;
        for (i, c) in cuts.iter().cycle().enumerate() {
            if pos >= bytes.len() {
                break;
            }
            let end = (pos + c).min(bytes.len());
            steps.push(Step::Data(Bytes::copy_from_slice(&bytes[pos..end])));
            steps.push(wait_ms(10));
            pos = end;
            if i == stall_at {
                steps.push(wait_ms(60_000));
                stalled_at_byte = Some(pos);
            }
        }
        let layer = SseIdleTimeoutLayer::new()
            .with_first_token_timeout(Duration::from_secs(5))
            .with_idle_timeout(Duration::from_secs(2));
        let (seen, _) = paused_runtime().block_on(play(layer, steps));
        seen.assert_whole_events_at_every_instant();
        let text = seen.text();
        match stalled_at_byte.filter(|b| *b < bytes.len()) {
            None => prop_assert_eq!(text, whole),
            Some(b) => {
                // The whole events the upstream had sent before the stall, then the error.
                let sent = &whole[..b];
                let complete = &sent[..sent.rfind("\n\n").map_or(0, |i| i + 2)];
                prop_assert!(text.starts_with(complete), "{text:?} vs {complete:?}");
                let rest = &text[complete.len()..];
                let rest = rest.strip_prefix(": keepalive\n").unwrap_or(rest);
                prop_assert!(
                    rest.starts_with("data: {\"error\"") || complete.ends_with("data: [DONE]\n\n"),
                    "{rest:?}"
                );
            }
        }
    }
}
