//! The OpenTelemetry presets against the conventions they follow: the tables below are copied
//! from OpenTelemetry semantic conventions v1.41.0, `docs/gen-ai/gen-ai-metrics.md` (name,
//! instrument type, unit, required and conditionally required attributes, the advisory
//! `ExplicitBucketBoundaries`), and checked against what each preset emits on real requests
//! through a debugging recorder and through the Prometheus exporter.

mod common;

use std::convert::Infallible;

use bytes::Bytes;
use common::*;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Empty};
use metrics::Unit;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
use metrics_util::MetricKind;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tailguard_core::RequestFacts;
use tailguard_phases::{LatencyPhaseRecorderLayer, MetricNames, MetricsSink, PhaseReport};
use tower::{Layer, ServiceExt, service_fn};

/// When a `Conditionally Required` attribute is required, in the convention's words.
#[derive(Clone, Copy, Debug)]
enum When {
    /// "If available." (`gen_ai.request.model`): every request below names a model.
    Available,
    /// "if the operation ended in an error" (`error.type`).
    Error,
    /// "If `server.address` is set." (`server.port`): the presets set no address.
    ServerAddress,
}

/// One metric of the convention.
struct Row {
    name: &'static str,
    instrument: &'static str,
    unit: &'static str,
    required: &'static [&'static str],
    conditionally_required: &'static [(&'static str, When)],
    buckets: &'static [f64],
    /// "This metrics SHOULD be reported for streaming calls and SHOULD NOT be reported
    /// otherwise."
    streaming_only: bool,
}

const DURATION_BUCKETS: &[f64] = &[
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
];

const TOKEN_USAGE: Row = Row {
    name: "gen_ai.client.token.usage",
    instrument: "Histogram",
    unit: "{token}",
    required: &[
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.token.type",
    ],
    conditionally_required: &[
        ("gen_ai.request.model", When::Available),
        ("server.port", When::ServerAddress),
    ],
    buckets: &[
        1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
        4194304.0, 16777216.0, 67108864.0,
    ],
    streaming_only: false,
};

/// "Generative AI client metrics".
const CLIENT: &[Row] = &[
    TOKEN_USAGE,
    Row {
        name: "gen_ai.client.operation.duration",
        instrument: "Histogram",
        unit: "s",
        required: &["gen_ai.operation.name", "gen_ai.provider.name"],
        conditionally_required: &[
            ("error.type", When::Error),
            ("gen_ai.request.model", When::Available),
            ("server.port", When::ServerAddress),
        ],
        buckets: DURATION_BUCKETS,
        streaming_only: false,
    },
    Row {
        name: "gen_ai.client.operation.time_to_first_chunk",
        instrument: "Histogram",
        unit: "s",
        required: &["gen_ai.operation.name", "gen_ai.provider.name"],
        conditionally_required: &[
            ("gen_ai.request.model", When::Available),
            ("server.port", When::ServerAddress),
        ],
        buckets: DURATION_BUCKETS,
        streaming_only: true,
    },
    Row {
        name: "gen_ai.client.operation.time_per_output_chunk",
        instrument: "Histogram",
        unit: "s",
        required: &["gen_ai.operation.name", "gen_ai.provider.name"],
        conditionally_required: &[
            ("gen_ai.request.model", When::Available),
            ("server.port", When::ServerAddress),
        ],
        buckets: DURATION_BUCKETS,
        streaming_only: true,
    },
];

/// "Generative AI model server metrics", and the token usage the server preset keeps.
const SERVER: &[Row] = &[
    TOKEN_USAGE,
    Row {
        name: "gen_ai.server.request.duration",
        instrument: "Histogram",
        unit: "s",
        required: &["gen_ai.operation.name", "gen_ai.provider.name"],
        conditionally_required: &[
            ("error.type", When::Error),
            ("gen_ai.request.model", When::Available),
            ("server.port", When::ServerAddress),
        ],
        buckets: DURATION_BUCKETS,
        streaming_only: false,
    },
    Row {
        name: "gen_ai.server.time_per_output_token",
        instrument: "Histogram",
        unit: "s",
        required: &["gen_ai.operation.name", "gen_ai.provider.name"],
        conditionally_required: &[
            ("gen_ai.request.model", When::Available),
            ("server.port", When::ServerAddress),
        ],
        buckets: &[
            0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
        ],
        streaming_only: false,
    },
    Row {
        name: "gen_ai.server.time_to_first_token",
        instrument: "Histogram",
        unit: "s",
        required: &["gen_ai.operation.name", "gen_ai.provider.name"],
        conditionally_required: &[
            ("gen_ai.request.model", When::Available),
            ("server.port", When::ServerAddress),
        ],
        buckets: &[
            0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
            10.0,
        ],
        streaming_only: false,
    },
];

/// The convention's instrument type as a `metrics` kind.
fn kind(instrument: &str) -> MetricKind {
    match instrument {
        "Histogram" => MetricKind::Histogram,
        "Counter" => MetricKind::Counter,
        other => panic!("instrument {other}"),
    }
}

/// The convention's UCUM unit as a `metrics` unit: `{token}` is an annotated count, which the
/// `metrics` crate can only call a count.
fn unit(ucum: &str) -> Unit {
    match ucum {
        "s" => Unit::Seconds,
        "{token}" => Unit::Count,
        other => panic!("unit {other}"),
    }
}

/// The scripted upstream: `x-script: fail` streams two tokens and fails, `x-script: json`
/// answers with a JSON completion, `x-script: 503` with a 503, anything else streams three
/// token frames (one with two tokens), usage and `[DONE]`.
fn upstream()
-> impl tower::Service<Request<Empty<Bytes>>, Response = Response<ScriptBody>, Error = Infallible>
+ Clone {
    service_fn(|req: Request<Empty<Bytes>>| async move {
        let script = req.headers().get("x-script").map(|v| v.as_bytes().to_vec());
        let sse = |steps: Vec<Step>| {
            Response::builder()
                .header("content-type", "text/event-stream")
                .body(ScriptBody::new(steps))
                .unwrap()
        };
        let res = match script.as_deref() {
            Some(b"fail") => sse(vec![
                Step::Wait(ms(40)),
                data(TOKEN),
                Step::Wait(ms(20)),
                data(TOKEN),
                Step::Error,
            ]),
            Some(b"json") => Response::builder()
                .header("content-type", "application/json")
                .body(ScriptBody::new([Step::Wait(ms(30)), data("{}")]))
                .unwrap(),
            Some(b"503") => Response::builder()
                .status(StatusCode::SERVICE_UNAVAILABLE)
                .body(ScriptBody::new([]))
                .unwrap(),
            _ => sse(vec![
                data(ROLE),
                Step::Wait(ms(90)),
                data(TOKEN),
                Step::Wait(ms(30)),
                data(TOKEN),
                Step::Wait(ms(30)),
                data(TWO_TOKENS),
                data(USAGE),
                data(END),
            ]),
        };
        Ok::<_, Infallible>(res)
    })
}

/// Sends one request for `path` with `script`, naming model `gpt-4o-2024-08-06`, and drains
/// the response (a body error is the script's).
async fn send(layer: &LatencyPhaseRecorderLayer, path: &str, script: &str) {
    let mut req = Request::post(path)
        .header("x-script", script)
        .body(Empty::new())
        .unwrap();
    req.extensions_mut()
        .insert(RequestFacts::new().with_model("gpt-4o-2024-08-06"));
    let res = layer.layer(upstream()).oneshot(req).await.unwrap();
    let _ = res.into_body().collect().await;
}

/// One series of the debugging recorder, with its kind and unit.
struct Series {
    name: String,
    kind: MetricKind,
    unit: Option<Unit>,
    labels: Vec<(String, String)>,
}

impl Series {
    fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

fn series(snap: &Snapshotter) -> Vec<Series> {
    snap.snapshot()
        .into_vec()
        .into_iter()
        .map(|(ck, unit, _, value)| {
            assert!(!matches!(value, DebugValue::Gauge(_)));
            let (kind, key) = ck.into_parts();
            Series {
                name: key.name().to_owned(),
                kind,
                unit,
                labels: key
                    .labels()
                    .map(|l| (l.key().to_owned(), l.value().to_owned()))
                    .collect(),
            }
        })
        .collect()
}

/// A streamed success, a streamed failure and a JSON success through `names`, described.
async fn emitted(names: MetricNames) -> Vec<Series> {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let sink = MetricsSink::new().with_names(names).with_recorder(rec);
    sink.describe();
    let layer = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(sink)
        .with_routes(["/v1/chat/completions"])
        .with_models(["gpt-4o"]);
    for script in ["stream", "fail", "json"] {
        send(&layer, "/v1/chat/completions", script).await;
    }
    series(&snap)
}

/// Every row of `table` is emitted by `names` as the convention states it.
fn check(names: &MetricNames, table: &[Row], all: &[Series]) {
    for row in table {
        let found: Vec<_> = all.iter().filter(|s| s.name == row.name).collect();
        assert!(!found.is_empty(), "{} not emitted", row.name);
        for s in &found {
            assert_eq!(s.kind, kind(row.instrument), "{}", row.name);
            assert_eq!(s.unit, Some(unit(row.unit)), "{}", row.name);
            for key in row.required {
                let value = s
                    .label(key)
                    .unwrap_or_else(|| panic!("{} lacks {key}", row.name));
                assert!(!value.is_empty(), "{} {key}", row.name);
            }
            for &(key, when) in row.conditionally_required {
                match when {
                    When::Available => assert_eq!(s.label(key), Some("gpt-4o"), "{}", row.name),
                    When::Error => {
                        let reason = s.label("tailguard.end_reason").unwrap();
                        let error = (reason != "completed").then_some(reason);
                        assert_eq!(s.label(key), error, "{} {key}", row.name);
                    }
                    When::ServerAddress => {
                        assert!(s.label("server.address").is_none() && s.label(key).is_none())
                    }
                }
            }
            if row.streaming_only {
                assert_eq!(s.label("tailguard.streamed"), Some("true"), "{}", row.name);
            }
        }
        if row
            .conditionally_required
            .iter()
            .any(|(k, _)| *k == "error.type")
        {
            // The failed request has its series, with the end reason as its error type.
            assert!(
                found
                    .iter()
                    .any(|s| s.label("error.type") == Some("upstream_error_transport")),
                "{}",
                row.name
            );
        }
        assert!(
            names.histogram_buckets().contains(&(row.name, row.buckets)),
            "{} buckets",
            row.name
        );
    }
    // Metrics without a convention stay `tailguard.*`.
    for s in all {
        assert!(
            table.iter().any(|r| r.name == s.name) || s.name.starts_with("tailguard."),
            "{}",
            s.name
        );
    }
}

#[tokio::test(start_paused = true)]
async fn client_preset_matches_the_convention() {
    let names = MetricNames::otel_genai();
    let all = emitted(names.clone()).await;
    check(&names, CLIENT, &all);
    let s = all
        .iter()
        .find(|s| s.name == "gen_ai.client.operation.duration")
        .unwrap();
    assert_eq!(s.label("gen_ai.operation.name"), Some("chat"));
    assert_eq!(s.label("gen_ai.provider.name"), Some("openai"));
    assert_eq!(s.label("http.route"), Some("/v1/chat/completions"));
    let usage: Vec<_> = all
        .iter()
        .filter_map(|s| s.label("gen_ai.token.type"))
        .collect();
    assert!(usage.contains(&"input") && usage.contains(&"output"));
    // Gaps are recorded as they happen, before the end: no end reason, so no error type.
    for s in all
        .iter()
        .filter(|s| s.name == "gen_ai.client.operation.time_per_output_chunk")
    {
        assert!(s.label("error.type").is_none() && s.label("tailguard.end_reason").is_none());
    }
}

#[tokio::test(start_paused = true)]
async fn server_preset_matches_the_convention() {
    let names = MetricNames::otel_genai_server();
    let all = emitted(names.clone()).await;
    check(&names, SERVER, &all);
    assert!(all.iter().any(|s| s.name == "tailguard.inter_token_gap"));
}

/// The Prometheus exporter configured from `histogram_buckets`, as the gateway does,
/// renders the convention's boundaries for every conventional histogram.
#[tokio::test(start_paused = true)]
async fn prometheus_renders_the_convention_buckets() {
    for (names, table) in [
        (MetricNames::otel_genai(), CLIENT),
        (MetricNames::otel_genai_server(), SERVER),
    ] {
        let mut builder = PrometheusBuilder::new();
        for (name, b) in names.histogram_buckets() {
            builder = builder
                .set_buckets_for_metric(Matcher::Full(name.into()), b)
                .unwrap();
        }
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        let layer = LatencyPhaseRecorderLayer::new()
            .without_sinks()
            .with_sink(MetricsSink::new().with_names(names).with_recorder(recorder))
            .with_routes(["/v1/chat/completions"])
            .with_models(["gpt-4o"]);
        send(&layer, "/v1/chat/completions", "stream").await;
        let text = handle.render();
        for row in table {
            let prefix = format!("{}_bucket{{", row.name.replace('.', "_"));
            let mut les = Vec::new();
            for line in text.lines().filter(|l| l.starts_with(&prefix)) {
                let le = line
                    .split("le=\"")
                    .nth(1)
                    .unwrap()
                    .split('"')
                    .next()
                    .unwrap();
                if !les.iter().any(|l: &String| l == le) {
                    les.push(le.to_owned());
                }
            }
            let mut expected: Vec<_> = row.buckets.iter().map(|b| b.to_string()).collect();
            expected.push("+Inf".into());
            assert_eq!(les, expected, "{} in\n{text}", row.name);
        }
    }
}

/// `gen_ai.operation.name` follows the route, `gen_ai.provider.name` the layer, and
/// `error.type` is the end reason of a request that did not complete, absent otherwise.
#[tokio::test(start_paused = true)]
async fn operation_provider_and_error_type() {
    let rec = DebuggingRecorder::new();
    let snap = rec.snapshotter();
    let reports = Recorded::<PhaseReport>::default();
    let r = reports.clone();
    let layer = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(
            MetricsSink::new()
                .with_names(MetricNames::otel_genai())
                .with_recorder(rec),
        )
        .with_sink(move |rep: &PhaseReport| r.push(rep.clone()))
        .with_routes([
            "/v1/completions",
            "/v1/messages",
            "/generate",
            "/v1/embeddings/",
        ])
        .with_operations([("/v1/embeddings", "custom_embed")])
        .with_provider("anthropic");
    send(&layer, "/v1/completions", "stream").await;
    send(&layer, "/v1/messages", "503").await;
    send(&layer, "/generate", "json").await;
    send(&layer, "/v1/embeddings", "json").await;
    send(&layer, "/unrouted", "json").await;
    let all = series(&snap);
    let duration = |route: &str| {
        let found: Vec<_> = all
            .iter()
            .filter(|s| {
                s.name == "gen_ai.client.operation.duration" && s.label("http.route") == Some(route)
            })
            .collect();
        assert_eq!(found.len(), 1, "{route}");
        let s = found[0];
        assert_eq!(s.label("gen_ai.provider.name"), Some("anthropic"));
        (
            s.label("gen_ai.operation.name").unwrap().to_owned(),
            s.label("error.type").map(str::to_owned),
        )
    };
    assert_eq!(
        duration("/v1/completions"),
        ("text_completion".into(), None)
    );
    assert_eq!(
        duration("/v1/messages"),
        ("chat".into(), Some("upstream_error_5xx".into()))
    );
    assert_eq!(duration("/generate"), ("/generate".into(), None));
    assert_eq!(duration("/v1/embeddings/"), ("custom_embed".into(), None));
    assert_eq!(duration("other"), ("other".into(), None));
    let ops: Vec<_> = reports
        .all()
        .iter()
        .map(|r| {
            (
                r.labels.operation().to_owned(),
                r.labels.provider().to_owned(),
            )
        })
        .collect();
    assert_eq!(ops[0], ("text_completion".into(), "anthropic".into()));
    assert_eq!(ops.len(), 5);
}

/// The default scheme is unchanged: no operation, provider or error type labels.
#[tokio::test(start_paused = true)]
async fn tailguard_scheme_has_no_otel_labels() {
    let all = emitted(MetricNames::tailguard()).await;
    assert!(!all.is_empty());
    for s in &all {
        assert!(s.name.starts_with("tailguard_"), "{}", s.name);
        assert!(s.labels.iter().all(|(k, _)| !k.contains('.')), "{}", s.name);
    }
}
