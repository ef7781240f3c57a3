//! [`LatencyPhaseRecorderLayer`]: the configuration.

use std::fmt;
use std::sync::Arc;

use http::HeaderName;
use http::request::Parts;
use tailguard_core::Dialect;
use tower_layer::Layer;

use crate::labels::{LabelTable, OTHER, OperationTable, Route, RouteFn, UNKNOWN};
use crate::metrics_sink::MetricsSink;
use crate::request_id::X_REQUEST_ID;
use crate::service::LatencyPhaseRecorder;
use crate::sink::{PhaseSink, Sinks, TracingSink};

/// Records every phase of every request: wraps services in [`LatencyPhaseRecorder`].
///
/// Meant as the outermost tailguard layer, so that its clock starts before admission queueing
/// and it sees what every inner layer did.
///
/// Defaults, each chosen so that a bare `LatencyPhaseRecorderLayer::new()` is useful and safe:
///
/// * dialect [`Dialect::Auto`]: the framing follows each response's `content-type`, which is
///   right for any mix of OpenAI, Anthropic, gRPC and NDJSON upstreams;
/// * usage extraction on: billing needs it, and it makes the output count exact (a finish-only
///   chunk is not output; see
///   [`StreamTracker::with_usage`](tailguard_core::StreamTracker::with_usage));
/// * sinks: a [`MetricsSink`] (the [`MetricNames::tailguard`](crate::MetricNames::tailguard)
///   scheme, to the `metrics` facade's recorder) and a [`TracingSink`]: with no recorder and no
///   subscriber installed they record nothing;
/// * no configured routes and no route function: every route is `other` unless the request
///   carries a [`Route`] extension, because a raw path would be an unbounded label;
/// * no configured models: every model is `other` (or `unknown` when the request carries
///   none), for the same reason;
/// * upstream label `default`;
/// * operation names [`DEFAULT_OPERATIONS`](crate::DEFAULT_OPERATIONS) (the OpenAI and
///   Anthropic routes), else the route label: what the OpenTelemetry conventions name them;
/// * provider `openai`: the OpenTelemetry name of the OpenAI API, which OpenAI and the
///   OpenAI-compatible servers a gateway usually fronts (vLLM, SGLang, llama.cpp) speak; the
///   conventions ask for the client's best knowledge, so set
///   [`with_provider`](Self::with_provider) for another (`anthropic`, ...);
/// * request ids in `x-request-id`, the de-facto standard header (nginx, Envoy, Heroku);
/// * one span per request (`llm_request`, INFO).
#[derive(Clone)]
pub struct LatencyPhaseRecorderLayer {
    pub(crate) cfg: Arc<Config>,
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) dialect: Dialect,
    pub(crate) usage: bool,
    pub(crate) sinks: Sinks,
    pub(crate) routes: LabelTable,
    pub(crate) route_fn: Option<RouteFn>,
    pub(crate) models: LabelTable,
    pub(crate) upstream: Arc<str>,
    pub(crate) operations: OperationTable,
    pub(crate) provider: Arc<str>,
    pub(crate) request_id_header: Option<HeaderName>,
    pub(crate) span: bool,
    pub(crate) other: Arc<str>,
    pub(crate) unknown: Arc<str>,
}

impl fmt::Debug for LatencyPhaseRecorderLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = &self.cfg;
        f.debug_struct("LatencyPhaseRecorderLayer")
            .field("dialect", &c.dialect)
            .field("usage", &c.usage)
            .field("sinks", &c.sinks)
            .field("routes", &c.routes)
            .field("route_fn", &c.route_fn.is_some())
            .field("models", &c.models)
            .field("upstream", &c.upstream)
            .field("operations", &c.operations)
            .field("provider", &c.provider)
            .field("request_id_header", &c.request_id_header)
            .field("span", &c.span)
            .finish()
    }
}

impl Default for LatencyPhaseRecorderLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyPhaseRecorderLayer {
    /// A recorder with the defaults listed above.
    pub fn new() -> Self {
        LatencyPhaseRecorderLayer {
            cfg: Arc::new(Config {
                dialect: Dialect::Auto,
                usage: true,
                sinks: Sinks(vec![
                    Arc::new(MetricsSink::new()),
                    Arc::new(TracingSink::new()),
                ]),
                routes: LabelTable::default(),
                route_fn: None,
                models: LabelTable::default(),
                upstream: Arc::from("default"),
                operations: OperationTable::default(),
                provider: Arc::from("openai"),
                request_id_header: Some(HeaderName::from_static(X_REQUEST_ID)),
                span: true,
                other: Arc::from(OTHER),
                unknown: Arc::from(UNKNOWN),
            }),
        }
    }

    fn cfg(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.cfg)
    }

    /// How tokens are found in response bodies. The stream is read once per request (core's
    /// [`progress`](tailguard_core::progress)): when a layer inside reads it (the timeout), the
    /// recorder follows that reading, in that layer's dialect.
    pub fn with_dialect(mut self, dialect: Dialect) -> Self {
        self.cfg().dialect = dialect;
        self
    }

    /// Whether to extract the usage the stream reports (asked of whichever layer reads the
    /// stream).
    pub fn with_usage(mut self, usage: bool) -> Self {
        self.cfg().usage = usage;
        self
    }

    /// Adds a sink (after the ones already configured).
    pub fn with_sink(mut self, sink: impl PhaseSink) -> Self {
        self.cfg().sinks.0.push(Arc::new(sink));
        self
    }

    /// Adds a shared sink.
    pub fn with_shared_sink(mut self, sink: Arc<dyn PhaseSink>) -> Self {
        self.cfg().sinks.0.push(sink);
        self
    }

    /// Removes every sink, the default metrics and tracing sinks included (add your own with
    /// [`with_sink`](Self::with_sink), e.g. a [`MetricsSink`] with other names).
    pub fn without_sinks(mut self) -> Self {
        self.cfg().sinks.0.clear();
        self
    }

    /// Configures the route labels: a request whose path equals a route, or continues it after a
    /// `/`, gets that route as its label (the longest match wins); any other path is `other`.
    pub fn with_routes<I, R>(mut self, routes: I) -> Self
    where
        I: IntoIterator<Item = R>,
        R: Into<Arc<str>>,
    {
        self.cfg().routes = LabelTable::new(routes.into_iter().map(Into::into));
        self
    }

    /// Names the route of a request with a function of its head, consulted before the
    /// configured routes (a [`Route`] request extension still wins). What it returns must come
    /// from a bounded set.
    ///
    /// axum's `MatchedPath` plugs in here (apply the recorder with `Router::layer`, so it runs
    /// after routing and the extension is present; `tests/axum_route.rs` runs this):
    ///
    /// ```ignore
    /// use axum::extract::MatchedPath;
    /// use tailguard_phases::{LatencyPhaseRecorderLayer, Route};
    ///
    /// let layer = LatencyPhaseRecorderLayer::new().with_route_fn(|parts| {
    ///     parts.extensions.get::<MatchedPath>().map(|p| Route::from(p.as_str()))
    /// });
    /// ```
    pub fn with_route_fn<F>(mut self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<Route> + Send + Sync + 'static,
    {
        self.cfg().route_fn = Some(Arc::new(f));
        self
    }

    /// Configures the model labels: [`RequestFacts::model`](tailguard_core::RequestFacts) is
    /// normalised against `models` (equal ignoring ASCII case, or continuing a name after `-`,
    /// `:`, `@` or `.`, the longest match winning); any other model is `other`.
    pub fn with_models<I, M>(mut self, models: I) -> Self
    where
        I: IntoIterator<Item = M>,
        M: Into<Arc<str>>,
    {
        self.cfg().models = LabelTable::new(models.into_iter().map(Into::into));
        self
    }

    /// The upstream label of this stack (an inner service may override it per response with an
    /// [`Upstream`](tailguard_core::Upstream) response extension).
    pub fn with_upstream(mut self, upstream: impl Into<Arc<str>>) -> Self {
        self.cfg().upstream = upstream.into();
        self
    }

    /// Names the operation of routes (OpenTelemetry `gen_ai.operation.name`, a
    /// [`PhaseLabels::operation`](crate::PhaseLabels::operation)), as route label and operation
    /// name; each pair replaces a [default](crate::DEFAULT_OPERATIONS) or earlier one for the same
    /// route (a trailing `/` ignored). Use the conventions' names where one applies (`chat`,
    /// `text_completion`, `embeddings`, `generate_content`, ...).
    pub fn with_operations<I, R, O>(mut self, operations: I) -> Self
    where
        I: IntoIterator<Item = (R, O)>,
        R: Into<Arc<str>>,
        O: Into<Arc<str>>,
    {
        let entries = operations.into_iter().map(|(r, o)| (r.into(), o.into()));
        self.cfg().operations.add(entries);
        self
    }

    /// The provider label of this stack (OpenTelemetry `gen_ai.provider.name`, a
    /// [`PhaseLabels::provider`](crate::PhaseLabels::provider)): use the conventions' name where
    /// one applies (`openai`, `anthropic`, `aws.bedrock`, `azure.ai.openai`, `gcp.vertex_ai`,
    /// ...).
    pub fn with_provider(mut self, provider: impl Into<Arc<str>>) -> Self {
        self.cfg().provider = provider.into();
        self
    }

    /// The header that carries request ids (`None` turns request ids off: nothing is read,
    /// generated or added).
    pub fn with_request_id_header(mut self, header: Option<HeaderName>) -> Self {
        self.cfg().request_id_header = header;
        self
    }

    /// Whether to open a span per request.
    pub fn with_span(mut self, span: bool) -> Self {
        self.cfg().span = span;
        self
    }
}

impl<S> Layer<S> for LatencyPhaseRecorderLayer {
    type Service = LatencyPhaseRecorder<S>;

    fn layer(&self, inner: S) -> Self::Service {
        LatencyPhaseRecorder::new(inner, self)
    }
}
