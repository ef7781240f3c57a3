//! The tracing output: one `llm_request` span per request carrying every phase as a field, and
//! one event at the end inside it. Captured by a minimal subscriber.

mod common;

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use common::*;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty};
use tailguard_core::RequestFacts;
use tailguard_phases::LatencyPhaseRecorderLayer;
use tower::{Layer, ServiceExt, service_fn};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

#[derive(Default)]
struct Captured {
    spans: HashMap<u64, (String, HashMap<String, String>)>,
    events: Vec<(Option<u64>, String, HashMap<String, String>)>,
    /// `record` calls on a span that carried no value (a `None`).
    empty_records: usize,
}

#[derive(Clone, Default)]
struct Capture {
    next: Arc<AtomicU64>,
    seen: Arc<Mutex<Captured>>,
}

struct Fields<'a>(&'a mut HashMap<String, String>);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let id = self.next.fetch_add(1, Ordering::Relaxed) + 1;
        let mut fields = HashMap::new();
        span.record(&mut Fields(&mut fields));
        self.seen
            .lock()
            .unwrap()
            .spans
            .insert(id, (span.metadata().name().to_owned(), fields));
        Id::from_u64(id)
    }
    fn record(&self, span: &Id, values: &Record<'_>) {
        let mut recorded = HashMap::new();
        values.record(&mut Fields(&mut recorded));
        let mut seen = self.seen.lock().unwrap();
        seen.empty_records += usize::from(recorded.is_empty());
        if let Some((_, fields)) = seen.spans.get_mut(&span.into_u64()) {
            fields.extend(recorded);
        }
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut fields = HashMap::new();
        event.record(&mut Fields(&mut fields));
        self.seen.lock().unwrap().events.push((
            event.parent().map(Id::into_u64),
            event.metadata().level().to_string(),
            fields,
        ));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// What one request with `facts` (its upstream streams two tokens) left in a [`Capture`].
fn capture_one(facts: RequestFacts) -> Arc<Mutex<Captured>> {
    let capture = Capture::default();
    let seen = capture.seen.clone();
    tracing::subscriber::with_default(capture, || {
        paused_runtime().block_on(async {
            let svc = LatencyPhaseRecorderLayer::new()
                .with_models(["gpt-4o"])
                .layer(service_fn(|_req: Request<Empty<Bytes>>| async {
                    tokio::time::sleep(ms(20)).await;
                    Ok::<_, Infallible>(
                        Response::builder()
                            .header("content-type", "text/event-stream")
                            .body(ScriptBody::new([
                                data(ROLE),
                                Step::Wait(ms(80)),
                                data(TOKEN),
                                Step::Wait(ms(10)),
                                data(TOKEN),
                                data(END),
                            ]))
                            .unwrap(),
                    )
                }));
            let mut req = Request::builder()
                .header("x-request-id", "req-7")
                .body(Empty::new())
                .unwrap();
            req.extensions_mut().insert(facts);
            let res = svc.oneshot(req).await.unwrap();
            res.into_body().collect().await.unwrap();
        });
    });
    seen
}

#[test]
fn one_span_with_every_phase_and_one_event() {
    let seen = capture_one(
        RequestFacts::new()
            .with_model("gpt-4o-mini-x")
            .with_max_tokens(9),
    );
    let seen = seen.lock().unwrap();
    let spans: Vec<_> = seen
        .spans
        .iter()
        .filter(|(_, (n, _))| n == "llm_request")
        .collect();
    assert_eq!(spans.len(), 1, "one span per request");
    let (id, (_, f)) = spans[0];
    let get = |k: &str| f.get(k).map(String::as_str);
    assert_eq!(get("request_id"), Some("req-7"));
    assert_eq!(get("requested_model"), Some("gpt-4o-mini-x"));
    assert_eq!(get("end_reason"), Some("completed"));
    assert_eq!(get("streamed"), Some("true"));
    assert_eq!(get("status"), Some("200"));
    assert_eq!(get("time_to_headers_s"), Some("0.02"));
    assert_eq!(get("ttft_s"), Some("0.1"));
    assert_eq!(get("total_s"), Some("0.11"));
    assert_eq!(get("tpot_s"), Some("0.01"));
    assert_eq!(get("output_events"), Some("2"));
    assert_eq!(get("gaps"), Some("1"));
    assert_eq!(get("max_gap_s"), Some("0.01"));
    assert_eq!(get("max_tokens"), Some("9"));
    assert_eq!(get("priority"), Some("unknown"));
    assert_eq!(
        get("model"),
        Some("gpt-4o"),
        "normalised: gpt-4o-mini is not configured"
    );
    assert_eq!(get("upstream"), Some("default"));

    let ends: Vec<_> = seen
        .events
        .iter()
        .filter(|(_, _, f)| f.get("message").map(String::as_str) == Some("llm request finished"))
        .collect();
    assert_eq!(ends.len(), 1, "one event at the end");
    let (parent, level, fields) = ends[0];
    assert_eq!(*parent, Some(*id), "inside the request's span");
    assert_eq!(level, "INFO");
    assert_eq!(
        fields.get("end_reason").map(String::as_str),
        Some("completed")
    );
    assert_eq!(fields.get("request_id").map(String::as_str), Some("req-7"));
}

/// A phase the request did not have (no admission queue, no `max_tokens`) is not recorded on
/// the span at all: recording `None` records no value, yet `tracing_subscriber`'s `fmt` output
/// writes a separator for it (a double space in the log line).
#[test]
fn a_phase_the_request_did_not_have_is_not_recorded() {
    let seen = capture_one(RequestFacts::new().with_model("gpt-4o"));
    let seen = seen.lock().unwrap();
    assert_eq!(seen.empty_records, 0, "no record call without a value");
    let (_, f) = seen
        .spans
        .values()
        .find(|(n, _)| n == "llm_request")
        .expect("the request's span");
    assert_eq!(f.get("ttft_s").map(String::as_str), Some("0.1"));
    assert!(!f.contains_key("max_tokens") && !f.contains_key("queue_wait_s"));
}
