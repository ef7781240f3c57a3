//! Hand-made bodies and a report-collecting sink for the recorder's tests.
#![allow(dead_code, unreachable_pub)]

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tailguard_phases::{LatencyPhaseRecorderLayer, MetricsSink, PhaseReport};
use tokio::time::Sleep;

/// One step of a scripted body.
#[derive(Clone, Debug)]
pub enum Step {
    Wait(Duration),
    Data(&'static str),
    Trailers(HeaderMap),
    Error,
    /// Pending forever (an upstream that holds the body open): never yields, never ends.
    Pending,
}

pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A body that yields frames after scripted waits on tokio's clock.
pub struct Scripted {
    steps: VecDeque<Step>,
    sleep: Option<Pin<Box<Sleep>>>,
    /// When true, `is_end_stream` turns true as soon as the last step has been yielded.
    pub eager_end: bool,
}

impl Scripted {
    pub fn new(steps: impl IntoIterator<Item = Step>) -> Self {
        Scripted {
            steps: steps.into_iter().collect(),
            sleep: None,
            eager_end: false,
        }
    }

    pub fn eager(mut self) -> Self {
        self.eager_end = true;
        self
    }
}

#[derive(Debug)]
pub struct ScriptError;

impl std::fmt::Display for ScriptError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("scripted body error")
    }
}

impl std::error::Error for ScriptError {}

impl Body for Scripted {
    type Data = Bytes;
    type Error = ScriptError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, ScriptError>>> {
        loop {
            if let Some(s) = self.sleep.as_mut() {
                std::task::ready!(s.as_mut().poll(cx));
                self.sleep = None;
            }
            match self.steps.pop_front() {
                None => return Poll::Ready(None),
                Some(Step::Wait(d)) => self.sleep = Some(Box::pin(tokio::time::sleep(d))),
                Some(Step::Data(s)) => {
                    return Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(s.as_bytes())))));
                }
                Some(Step::Trailers(t)) => return Poll::Ready(Some(Ok(Frame::trailers(t)))),
                Some(Step::Error) => return Poll::Ready(Some(Err(ScriptError))),
                Some(Step::Pending) => {
                    self.steps.push_front(Step::Pending);
                    return Poll::Pending;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.eager_end && self.steps.is_empty()
    }
}

use std::future::Future;

pub const ROLE: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\"}}]}\n\n";
pub const TOKEN: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}]}\n\n";
pub const TWO_TOKENS: &str = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"}}]}\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"b\"}}]}\n\n";
pub const KEEPALIVE: &str = ": keepalive\n\n";
pub const DONE: &str = "data: [DONE]\n\n";
pub const USAGE: &str = "data: {\"choices\":[],\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":4,\"total_tokens\":15}}\n\n";
pub const IN_BAND_ERROR: &str =
    "data: {\"error\":{\"message\":\"boom\",\"type\":\"server_error\"}}\n\n";

/// Collects every report.
#[derive(Clone, Default)]
pub struct Reports(pub Arc<Mutex<Vec<PhaseReport>>>);

impl Reports {
    pub fn all(&self) -> Vec<PhaseReport> {
        self.0.lock().unwrap().clone()
    }

    pub fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    pub fn one(&self) -> PhaseReport {
        let all = self.all();
        assert_eq!(
            all.len(),
            1,
            "expected exactly one report, got {}",
            all.len()
        );
        all.into_iter().next().unwrap()
    }
}

/// A recorder layer reporting into `Reports` and a debugging recorder.
pub fn layer() -> (LatencyPhaseRecorderLayer, Reports, Snapshotter) {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let reports = Reports::default();
    let r = reports.clone();
    let layer = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(MetricsSink::new().with_recorder(rec))
        .with_sink(move |rep: &PhaseReport| r.0.lock().unwrap().push(rep.clone()));
    (layer, reports, snap)
}

/// A metric as seen by the debugging recorder.
#[derive(Debug, Clone)]
pub struct Seen {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: Value,
}

/// A cloneable copy of a `DebugValue`.
#[derive(Debug, Clone)]
pub enum Value {
    Counter(u64),
    Histogram(Vec<f64>),
    Other,
}

impl Seen {
    pub fn label(&self, k: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    }

    pub fn hist(&self) -> Vec<f64> {
        match &self.value {
            Value::Histogram(v) => v.clone(),
            other => panic!("{} is not a histogram: {other:?}", self.name),
        }
    }

    pub fn counter(&self) -> u64 {
        match &self.value {
            Value::Counter(v) => *v,
            other => panic!("{} is not a counter: {other:?}", self.name),
        }
    }
}

pub fn snapshot(s: &Snapshotter) -> Vec<Seen> {
    s.snapshot()
        .into_vec()
        .into_iter()
        .map(|(ck, _, _, value)| {
            let key = ck.key();
            Seen {
                name: key.name().to_owned(),
                labels: key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect(),
                value: match value {
                    DebugValue::Counter(c) => Value::Counter(c),
                    DebugValue::Histogram(h) => {
                        Value::Histogram(h.iter().map(|f| f.into_inner()).collect())
                    }
                    DebugValue::Gauge(_) => Value::Other,
                },
            }
        })
        .collect()
}

/// The single series named `name`.
pub fn metric(all: &[Seen], name: &str) -> Seen {
    let found: Vec<_> = all.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "series of {name}: {found:#?}");
    found[0].clone()
}

pub fn has(all: &[Seen], name: &str) -> bool {
    all.iter().any(|s| s.name == name)
}

pub fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

pub fn assert_secs(values: &[f64], expected: &[f64]) {
    assert_eq!(values.len(), expected.len(), "{values:?} vs {expected:?}");
    for (v, e) in values.iter().zip(expected) {
        assert!(close(*v, *e), "{values:?} vs {expected:?}");
    }
}
