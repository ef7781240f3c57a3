//! [`PriorityClassLayer`]: how requests are classified.

use std::fmt;
use std::sync::Arc;

use http::Method;
use http::header::HeaderName;
use http::request::Parts;
use tailguard_core::{ClassPolicy, Priority};
use tower_layer::Layer;

use crate::service::PriorityClass;
use crate::table::PolicyTable;

/// The header a client may name its class in, by default: `x-priority`.
pub const DEFAULT_HEADER: &str = "x-priority";

type ClassifyFn = dyn Fn(&Parts) -> Option<Priority> + Send + Sync;

/// Where a classification came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// The user closure ([`PriorityClassLayer::with_classifier`]).
    Classifier,
    /// The route table ([`PriorityClassLayer::with_route`]).
    Route,
    /// The client's header, through the allowlist (and ceiling).
    Header,
    /// Nothing matched: the default class.
    Default,
}

impl Source {
    /// A bounded label: `"classifier"`, `"route"`, `"header"` or `"default"`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Source::Classifier => "classifier",
            Source::Route => "route",
            Source::Header => "header",
            Source::Default => "default",
        }
    }
}

/// The result of classifying one request.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct Classification {
    /// The class.
    pub priority: Priority,
    /// The class's policy (empty when the class is not in the table).
    pub policy: ClassPolicy,
    /// Which rule decided.
    pub source: Source,
}

#[derive(Clone)]
struct Route {
    method: Option<Method>,
    path: String,
    prefix: bool,
    priority: Priority,
}

impl Route {
    fn matches(&self, parts: &Parts) -> bool {
        if self.method.as_ref().is_some_and(|m| *m != parts.method) {
            return false;
        }
        let path = parts.uri.path();
        if self.prefix {
            path.starts_with(&self.path)
        } else {
            path == self.path
        }
    }
}

impl fmt::Debug for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}{} => {}",
            self.method.as_ref().map_or("*", Method::as_str),
            self.path,
            if self.prefix { "*" } else { "" },
            self.priority
        )
    }
}

#[derive(Clone)]
pub(crate) struct Classifier {
    table: PolicyTable,
    classifier: Option<Arc<ClassifyFn>>,
    routes: Vec<Route>,
    header: Option<HeaderName>,
    /// Accepted header values (compared ASCII case-insensitively) and the class each names.
    allow: Vec<(String, Priority)>,
    ceiling: Option<Arc<ClassifyFn>>,
    default: Priority,
}

impl fmt::Debug for Classifier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PriorityClassLayer")
            .field("table", &self.table)
            .field("classifier", &self.classifier.as_ref().map(|_| ".."))
            .field("routes", &self.routes)
            .field("header", &self.header)
            .field("allow", &self.allow)
            .field("ceiling", &self.ceiling.as_ref().map(|_| ".."))
            .field("default", &self.default)
            .finish()
    }
}

impl Classifier {
    /// Canonical class and policy for `p`: the table's entry of the same level, if any.
    fn resolve(&self, p: Priority, source: Source) -> Classification {
        match self.table.get(&p) {
            Some((q, policy)) => Classification {
                priority: q.clone(),
                policy: policy.clone(),
                source,
            },
            None => Classification {
                priority: p,
                policy: ClassPolicy::new(),
                source,
            },
        }
    }

    fn header_class(&self, parts: &Parts) -> Option<Priority> {
        let name = self.header.as_ref()?;
        // Several values: the first accepted one counts; never more than one header's worth.
        let value = parts.headers.get(name)?.to_str().ok()?.trim();
        let p = self
            .allow
            .iter()
            .find(|(v, _)| v.eq_ignore_ascii_case(value))
            .map(|(_, p)| p.clone())?;
        match self.ceiling.as_ref().and_then(|c| c(parts)) {
            Some(ceiling) if ceiling < p => Some(ceiling),
            _ => Some(p),
        }
    }

    pub(crate) fn classify(&self, parts: &Parts) -> Classification {
        if let Some(p) = self.classifier.as_ref().and_then(|f| f(parts)) {
            return self.resolve(p, Source::Classifier);
        }
        if let Some(r) = self.routes.iter().find(|r| r.matches(parts)) {
            return self.resolve(r.priority.clone(), Source::Route);
        }
        if let Some(p) = self.header_class(parts) {
            return self.resolve(p, Source::Header);
        }
        self.resolve(self.default.clone(), Source::Default)
    }
}

/// Classifies each request into one of an ordered set of named classes and inserts the
/// [`Priority`] and the class's [`ClassPolicy`] into the request extensions.
///
/// Rules, in order (the first that answers wins):
///
/// 1. the user closure ([`with_classifier`](Self::with_classifier));
/// 2. the route/method table ([`with_route`](Self::with_route)), first match wins;
/// 3. the client's header (default `x-priority`), whose value must be on the allowlist, so
///    clients cannot invent classes; a ceiling ([`with_ceiling`](Self::with_ceiling)) caps it;
/// 4. the default class (`standard`).
///
/// The closure and the route table are the server's own rules and are trusted; the ceiling
/// applies to what a client claims in the header. A class not in the [`PolicyTable`] (a closure
/// may return any [`Priority`]) gets an empty policy. A [`Priority`] already in the extensions
/// is overwritten: this layer is the one place that classifies.
#[derive(Clone, Debug)]
pub struct PriorityClassLayer {
    cls: Arc<Classifier>,
}

impl Default for PriorityClassLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl PriorityClassLayer {
    /// The standard table ([`PolicyTable::standard`]) with empty policies; no closure and no
    /// routes; header `x-priority` with an allowlist of every class but the most important
    /// (`critical` is for traffic the server classifies itself, never for a client's say-so);
    /// no ceiling; default class `standard` (unclassified traffic is neither favoured nor
    /// shed first).
    pub fn new() -> Self {
        let table = PolicyTable::standard();
        let allow = default_allow(&table);
        PriorityClassLayer {
            cls: Arc::new(Classifier {
                table,
                classifier: None,
                routes: Vec::new(),
                header: Some(HeaderName::from_static(DEFAULT_HEADER)),
                allow,
                ceiling: None,
                default: Priority::standard(),
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Classifier)) -> Self {
        f(Arc::make_mut(&mut self.cls));
        self
    }

    /// Replaces the class table; the header allowlist becomes every class of `table` but the
    /// most important.
    pub fn with_table(self, table: PolicyTable) -> Self {
        self.with(|c| {
            c.allow = default_allow(&table);
            c.table = table;
        })
    }

    /// Sets the policy of one class (adding the class to the table if it is new).
    pub fn with_policy(self, priority: Priority, policy: ClassPolicy) -> Self {
        self.with(|c| c.table = std::mem::take(&mut c.table).with_class(priority, policy))
    }

    /// Sets the user closure, consulted first; `None` from it falls through to the next rule.
    pub fn with_classifier<F>(self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<Priority> + Send + Sync + 'static,
    {
        self.with(|c| c.classifier = Some(Arc::new(f)))
    }

    /// Adds a route rule: requests with `method` (any method when `None`) whose path equals
    /// `path` — or starts with it, when `path` ends in `*` — are of class `priority`.
    pub fn with_route(self, method: Option<Method>, path: &str, priority: Priority) -> Self {
        let (path, prefix) = match path.strip_suffix('*') {
            Some(p) => (p.to_owned(), true),
            None => (path.to_owned(), false),
        };
        self.with(|c| {
            c.routes.push(Route {
                method,
                path,
                prefix,
                priority,
            })
        })
    }

    /// Sets the header a client names its class in (`None`: clients have no say).
    pub fn with_header(self, header: Option<HeaderName>) -> Self {
        self.with(|c| c.header = header)
    }

    /// Replaces the allowlist: the classes a client may name in the header (by class name).
    pub fn with_header_allowlist(self, classes: impl IntoIterator<Item = Priority>) -> Self {
        let allow = classes
            .into_iter()
            .map(|p| (p.name().to_owned(), p))
            .collect();
        self.with(|c| c.allow = allow)
    }

    /// Accepts the header value `value` (ASCII case-insensitive) as naming `priority`.
    pub fn with_header_alias(self, value: &str, priority: Priority) -> Self {
        let value = value.trim().to_owned();
        self.with(|c| c.allow.push((value, priority)))
    }

    /// Caps what the header may claim: when `f` returns a class, a header-derived class above it
    /// is lowered to it (e.g. unauthenticated callers never above `standard`).
    pub fn with_ceiling<F>(self, f: F) -> Self
    where
        F: Fn(&Parts) -> Option<Priority> + Send + Sync + 'static,
    {
        self.with(|c| c.ceiling = Some(Arc::new(f)))
    }

    /// Sets the class of requests no rule classified.
    pub fn with_default(self, priority: Priority) -> Self {
        self.with(|c| c.default = priority)
    }

    /// The class table.
    pub fn table(&self) -> &PolicyTable {
        &self.cls.table
    }

    /// Classifies a request head as the service would.
    pub fn classify(&self, parts: &Parts) -> Classification {
        self.cls.classify(parts)
    }
}

fn default_allow(table: &PolicyTable) -> Vec<(String, Priority)> {
    table
        .classes()
        .skip(1)
        .map(|p| (p.name().to_owned(), p.clone()))
        .collect()
}

impl<S> Layer<S> for PriorityClassLayer {
    type Service = PriorityClass<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PriorityClass::from_classifier(inner, self.cls.clone())
    }
}
