//! Bounded metric labels: route, model, upstream, operation.

use std::fmt;
use std::sync::Arc;

use http::request::Parts;

/// The label value used when a route or model is not in the configured list.
pub const OTHER: &str = "other";

/// The label value used when a request carries no model, or no priority.
pub const UNKNOWN: &str = "unknown";

/// The route of a request, as a bounded label (a route template such as
/// `/v1/chat/completions`, never a raw path with ids in it).
///
/// Insert it into the request extensions to set the route of a request directly; it wins over
/// the [route function](crate::LatencyPhaseRecorderLayer::with_route_fn) and the
/// [configured routes](crate::LatencyPhaseRecorderLayer::with_routes).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Route(Arc<str>);

impl Route {
    /// A route label.
    pub fn new(route: impl Into<Arc<str>>) -> Self {
        Route(route.into())
    }

    /// The label value.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn into_arc(self) -> Arc<str> {
        self.0
    }
}

impl From<&str> for Route {
    fn from(s: &str) -> Self {
        Route::new(s)
    }
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Route({})", &*self.0)
    }
}

/// The operation names (OpenTelemetry `gen_ai.operation.name`) of the OpenAI and Anthropic
/// routes, as route label and operation: chat completions, the Responses API and Anthropic
/// Messages are `chat` (the conventions' inference operation of each), legacy completions
/// `text_completion`, embeddings `embeddings`. A route with no entry here or in
/// [`with_operations`](crate::LatencyPhaseRecorderLayer::with_operations) is its own
/// operation name.
pub const DEFAULT_OPERATIONS: &[(&str, &str)] = &[
    ("/v1/chat/completions", "chat"),
    ("/v1/responses", "chat"),
    ("/v1/messages", "chat"),
    ("/v1/completions", "text_completion"),
    ("/v1/embeddings", "embeddings"),
];

/// Route labels and their operation names.
#[derive(Clone, Debug)]
pub(crate) struct OperationTable(Vec<(Arc<str>, Arc<str>)>);

impl Default for OperationTable {
    fn default() -> Self {
        let mut table = OperationTable(Vec::new());
        table.add(
            DEFAULT_OPERATIONS
                .iter()
                .map(|&(route, op)| (Arc::from(route), Arc::from(op))),
        );
        table
    }
}

impl OperationTable {
    /// Adds `entries`, each replacing an earlier one for the same route.
    pub(crate) fn add(&mut self, entries: impl IntoIterator<Item = (Arc<str>, Arc<str>)>) {
        for (route, op) in entries {
            self.0.retain(|(r, _)| !same_route(r, &route));
            self.0.push((route, op));
        }
    }

    /// The operation of the route labelled `route` (a trailing `/` ignored), else `route`.
    pub(crate) fn name(&self, route: &Arc<str>) -> Arc<str> {
        self.0
            .iter()
            .find(|(r, _)| same_route(r, route))
            .map_or_else(|| route.clone(), |(_, op)| op.clone())
    }
}

fn same_route(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

/// A user function that names the route of a request (e.g. from axum's `MatchedPath`).
pub(crate) type RouteFn = Arc<dyn Fn(&Parts) -> Option<Route> + Send + Sync>;

/// Configured route or model labels, longest first, so the first match is the longest.
#[derive(Clone, Debug, Default)]
pub(crate) struct LabelTable(Vec<Arc<str>>);

impl LabelTable {
    pub(crate) fn new(labels: impl IntoIterator<Item = Arc<str>>) -> Self {
        let mut labels: Vec<_> = labels.into_iter().collect();
        labels.sort_by(|a, b| b.len().cmp(&a.len()).then_with(|| a.cmp(b)));
        labels.dedup();
        LabelTable(labels)
    }

    /// The route of `path`: a configured route that `path` equals or continues after a `/`.
    pub(crate) fn find(&self, path: &str) -> Option<&Arc<str>> {
        self.0.iter().find(|route| {
            // A configured trailing `/` matches with or without it.
            let prefix = route.trim_end_matches('/');
            path.strip_prefix(prefix)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
    }

    /// The configured name of a client-supplied model: one that `model` equals (ASCII
    /// case-insensitively) or continues after `-`, `:`, `@` or `.` (so `gpt-4o` covers
    /// `gpt-4o-2024-08-06`; configure `gpt-4o-mini` too if it must be told apart). Anything else
    /// is `None` (the label [`OTHER`]), so a client cannot create label values.
    pub(crate) fn normalise(&self, model: &str) -> Option<&Arc<str>> {
        self.0.iter().find(|m| {
            let m = m.as_bytes();
            let s = model.as_bytes();
            s.len() >= m.len()
                && s[..m.len()].eq_ignore_ascii_case(m)
                && (s.len() == m.len() || matches!(s[m.len()], b'-' | b':' | b'@' | b'.'))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_match_on_segment_boundaries_longest_first() {
        let t = LabelTable::new(["/v1".into(), "/v1/chat/completions".into()]);
        assert_eq!(
            &**t.find("/v1/chat/completions").unwrap(),
            "/v1/chat/completions"
        );
        assert_eq!(
            &**t.find("/v1/chat/completions/x").unwrap(),
            "/v1/chat/completions"
        );
        assert_eq!(&**t.find("/v1/models").unwrap(), "/v1");
        assert!(t.find("/v10").is_none());
        assert!(t.find("/").is_none());
        // A configured trailing slash matches with or without it; the label keeps it.
        let t = LabelTable::new(["/v2/".into(), "/".into()]);
        assert_eq!(&**t.find("/v2").unwrap(), "/v2/");
        assert_eq!(&**t.find("/v2/x").unwrap(), "/v2/");
        assert_eq!(&**t.find("/v2/").unwrap(), "/v2/");
        assert_eq!(&**t.find("/v3").unwrap(), "/");
        assert_eq!(&**t.find("").unwrap(), "/");
    }

    #[test]
    fn operations_default_to_the_openai_and_anthropic_routes() {
        let t = OperationTable::default();
        let op = |route: &str| t.name(&Arc::from(route)).to_string();
        assert_eq!(op("/v1/chat/completions"), "chat");
        assert_eq!(op("/v1/chat/completions/"), "chat");
        assert_eq!(op("/v1/messages"), "chat");
        assert_eq!(op("/v1/completions"), "text_completion");
        assert_eq!(op("/v1/embeddings"), "embeddings");
        assert_eq!(op("/generate"), "/generate");
        assert_eq!(op(OTHER), OTHER);
        let mut t = t;
        t.add([
            (Arc::from("/v1/completions/"), Arc::from("chat")),
            (Arc::from("/generate"), Arc::from("text_completion")),
        ]);
        let op = |route: &str| t.name(&Arc::from(route)).to_string();
        assert_eq!(op("/v1/completions"), "chat");
        assert_eq!(op("/generate"), "text_completion");
        assert_eq!(op("/v1/chat/completions"), "chat");
    }

    #[test]
    fn models_normalise_to_the_configured_list() {
        let t = LabelTable::new(["gpt-4o".into(), "gpt-4o-mini".into(), "llama3".into()]);
        assert_eq!(&**t.normalise("gpt-4o").unwrap(), "gpt-4o");
        assert_eq!(&**t.normalise("GPT-4o-2024-08-06").unwrap(), "gpt-4o");
        assert_eq!(&**t.normalise("gpt-4o-mini-2024").unwrap(), "gpt-4o-mini");
        assert_eq!(&**t.normalise("llama3:8b").unwrap(), "llama3");
        assert!(t.normalise("gpt-4").is_none());
        assert!(t.normalise("gpt-4ox").is_none());
        assert!(t.normalise("").is_none());
    }
}
