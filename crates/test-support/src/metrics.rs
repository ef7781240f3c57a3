//! Snapshots of metrics-util's debugging recorder (feature `metrics`).

use metrics_util::debugging::{DebugValue, Snapshotter};

/// One series as the debugging recorder saw it.
#[derive(Debug, Clone)]
pub struct Series {
    /// The metric name.
    pub name: String,
    /// Its labels, in order.
    pub labels: Vec<(String, String)>,
    /// Its value.
    pub value: Value,
}

/// A cloneable copy of a `DebugValue`.
#[derive(Debug, Clone)]
pub enum Value {
    /// A counter.
    Counter(u64),
    /// A histogram's samples.
    Histogram(Vec<f64>),
    /// A gauge.
    Gauge(f64),
}

impl Series {
    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The histogram's samples; panics on another kind.
    pub fn hist(&self) -> Vec<f64> {
        match &self.value {
            Value::Histogram(v) => v.clone(),
            other => panic!("{} is not a histogram: {other:?}", self.name),
        }
    }

    /// The counter's value; panics on another kind.
    pub fn counter(&self) -> u64 {
        match &self.value {
            Value::Counter(v) => *v,
            other => panic!("{} is not a counter: {other:?}", self.name),
        }
    }
}

/// Every series in `s` now. (A snapshot drains the recorder's histograms: take one, then read
/// everything from it.)
pub fn snapshot(s: &Snapshotter) -> Vec<Series> {
    s.snapshot()
        .into_vec()
        .into_iter()
        .map(|(ck, _, _, value)| {
            let key = ck.key();
            Series {
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
                    DebugValue::Gauge(g) => Value::Gauge(g.into_inner()),
                },
            }
        })
        .collect()
}

/// The single series named `name`; panics unless there is exactly one.
pub fn metric(all: &[Series], name: &str) -> Series {
    let found: Vec<_> = all.iter().filter(|s| s.name == name).collect();
    assert_eq!(found.len(), 1, "series of {name}: {found:#?}");
    found[0].clone()
}

/// Whether a series named `name` exists.
pub fn has(all: &[Series], name: &str) -> bool {
    all.iter().any(|s| s.name == name)
}

/// Panics unless `values` are `expected`, each within 1e-9.
pub fn assert_secs(values: &[f64], expected: &[f64]) {
    assert_eq!(values.len(), expected.len(), "{values:?} vs {expected:?}");
    for (v, e) in values.iter().zip(expected) {
        assert!((v - e).abs() < 1e-9, "{values:?} vs {expected:?}");
    }
}
