//! [`TenantLayer`]: who each request is for, as core's [`Tenant`], for the layers that share
//! capacity and budgets among tenants (admission's fair queueing, `tailguard-tenant`'s token
//! budgets).

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use http::header::{AUTHORIZATION, HeaderName};
use http::request::Parts;
use http::{HeaderMap, Request};
use tailguard_core::Tenant;
use tower_layer::Layer;
use tower_service::Service;

/// The header a tenant is named by, by default.
pub const TENANT_HEADER: &str = "x-tenant";

/// The longest tenant name taken from the header, in bytes.
const MAX_NAME: usize = 64;

/// Identifies the tenant of each request and inserts its [`Tenant`] into the request
/// extensions: the name in a configured header ([`TENANT_HEADER`] by default), else a hash of
/// the request's API key (`key-` and 16 hex digits of the key's XXH3-64: stable across
/// processes and gateways, so budgets shared through Redis count the same key once; the key
/// itself goes nowhere). A request with neither has no tenant.
///
/// ```
/// use std::convert::Infallible;
///
/// use http::{Request, Response};
/// use tailguard_core::Tenant;
/// use tailguard_priority::TenantLayer;
/// use tower::{ServiceBuilder, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let tenants = TenantLayer::new().with_tenant("acme", 2.0);
/// let svc = ServiceBuilder::new().layer(tenants).service(service_fn(|req: Request<()>| async move {
///     Ok::<_, Infallible>(Response::new(req.extensions().get::<Tenant>().cloned()))
/// }));
///
/// let named = Request::builder().header("x-tenant", "acme").body(()).unwrap();
/// let t = svc.clone().oneshot(named).await.unwrap().into_body().unwrap();
/// assert_eq!((t.id(), t.label(), t.weight()), ("acme", "acme", 2.0));
///
/// // A tenant known only by its API key: a stable id, a pooled metric label.
/// let keyed = Request::builder().header("authorization", "Bearer sk-123").body(()).unwrap();
/// let t = svc.clone().oneshot(keyed).await.unwrap().into_body().unwrap();
/// assert!(t.id().starts_with("key-") && t.label() == "other");
///
/// let anonymous = Request::new(());
/// assert!(svc.oneshot(anonymous).await.unwrap().into_body().is_none());
/// # }
/// ```
///
/// **Names.** A header value of 1 to 64 bytes of ASCII letters, digits and `.`, `_`, `-`, `:`,
/// `@` names a tenant; any other value is ignored (the API key decides). Trust the header only
/// where clients cannot set it (an authenticating proxy in front sets it), or switch it off
/// ([`without_header`](Self::without_header)) and let keys decide.
///
/// **Labels** (metrics must stay bounded): a tenant configured with
/// [`with_tenant`](Self::with_tenant) is labelled by its name; the first
/// [`with_label_limit`](Self::with_label_limit) (0 by default) other tenants seen by this
/// layer too; every other tenant shares the label [`Tenant::OTHER`].
#[derive(Clone)]
pub struct TenantLayer {
    cfg: Arc<Config>,
}

#[derive(Clone)]
struct Config {
    header: Option<HeaderName>,
    api_key: bool,
    named: HashMap<Arc<str>, f64>,
    label_limit: usize,
    /// The unconfigured tenants labelled by their ids so far.
    labelled: Arc<Mutex<HashSet<Arc<str>>>>,
}

impl TenantLayer {
    /// Tenants named by [`TENANT_HEADER`], else by their API key; none configured; unnamed
    /// tenants pooled under [`Tenant::OTHER`].
    pub fn new() -> Self {
        TenantLayer {
            cfg: Arc::new(Config {
                header: Some(HeaderName::from_static(TENANT_HEADER)),
                api_key: true,
                named: HashMap::new(),
                label_limit: 0,
                labelled: Arc::default(),
            }),
        }
    }

    fn with(mut self, f: impl FnOnce(&mut Config)) -> Self {
        f(Arc::make_mut(&mut self.cfg));
        self
    }

    /// Names tenants by this header instead.
    pub fn with_header(self, name: HeaderName) -> Self {
        self.with(|c| c.header = Some(name))
    }

    /// Names no tenant by a header: API keys decide.
    pub fn without_header(self) -> Self {
        self.with(|c| c.header = None)
    }

    /// Whether a request the header names no tenant for is the tenant of its API key
    /// (`authorization: Bearer`, `x-api-key`, `api-key`); on by default.
    pub fn with_api_key(self, on: bool) -> Self {
        self.with(|c| c.api_key = on)
    }

    /// A configured tenant: labelled by its name, with this `weight` (its share of contended
    /// capacity against tenants of weight 1; see [`Tenant::with_weight`]).
    pub fn with_tenant(self, name: impl Into<Arc<str>>, weight: f64) -> Self {
        let name = name.into();
        self.with(|c| {
            c.named.insert(name, weight);
        })
    }

    /// Labels the first `n` unconfigured tenants seen by their own ids (the rest:
    /// [`Tenant::OTHER`]).
    pub fn with_label_limit(self, n: usize) -> Self {
        self.with(|c| c.label_limit = n)
    }

    /// The tenant of a request with this head, if any.
    pub fn identify(&self, parts: &Parts) -> Option<Tenant> {
        let cfg = &self.cfg;
        let id: Arc<str> = cfg
            .header
            .as_ref()
            .and_then(|h| named(&parts.headers, h))
            .map(Arc::from)
            .or_else(|| cfg.api_key.then(|| api_key_id(&parts.headers)).flatten())?;
        if let Some(&weight) = cfg.named.get(&id) {
            return Some(Tenant::new(id).with_weight(weight));
        }
        let own = cfg.label_limit > 0 && {
            let mut seen = cfg.labelled.lock().unwrap_or_else(PoisonError::into_inner);
            seen.contains(&id) || (seen.len() < cfg.label_limit && seen.insert(id.clone()))
        };
        let tenant = Tenant::new(id);
        Some(if own {
            tenant
        } else {
            tenant.with_label(Tenant::OTHER)
        })
    }
}

/// The tenant the header names, if its value is a valid name.
fn named<'a>(headers: &'a HeaderMap, header: &HeaderName) -> Option<&'a str> {
    let v = headers.get(header)?.to_str().ok()?.trim();
    let ok = |b: u8| b.is_ascii_alphanumeric() || b".-_:@".contains(&b);
    (!v.is_empty() && v.len() <= MAX_NAME && v.bytes().all(ok)).then_some(v)
}

/// `key-` and the XXH3-64 of the request's API key, in hex.
fn api_key_id(headers: &HeaderMap) -> Option<Arc<str>> {
    let bearer = headers.get(AUTHORIZATION).and_then(|v| {
        let v = v.as_bytes();
        let (scheme, rest) = v.split_at(v.len().min(7));
        scheme.eq_ignore_ascii_case(b"bearer ").then_some(rest)
    });
    let key = bearer
        .or_else(|| headers.get("x-api-key").map(|v| v.as_bytes()))
        .or_else(|| headers.get("api-key").map(|v| v.as_bytes()))?
        .trim_ascii();
    (!key.is_empty()).then(|| {
        let h = xxhash_rust::xxh3::xxh3_64(key);
        Arc::from(format!("key-{h:016x}"))
    })
}

impl Default for TenantLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for TenantLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TenantLayer")
            .field("header", &self.cfg.header)
            .field("api_key", &self.cfg.api_key)
            .field("named", &self.cfg.named.len())
            .field("label_limit", &self.cfg.label_limit)
            .finish()
    }
}

impl<S> Layer<S> for TenantLayer {
    type Service = TenantService<S>;

    fn layer(&self, inner: S) -> TenantService<S> {
        TenantService {
            inner,
            layer: self.clone(),
        }
    }
}

/// The service of [`TenantLayer`].
#[derive(Clone, Debug)]
pub struct TenantService<S> {
    inner: S,
    layer: TenantLayer,
}

impl<S> TenantService<S> {
    tailguard_core::inner_service_accessors!();
}

impl<S, B> Service<Request<B>> for TenantService<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> S::Future {
        let (mut parts, body) = req.into_parts();
        if let Some(t) = self.layer.identify(&parts) {
            parts.extensions.insert(t);
        }
        self.inner.call(Request::from_parts(parts, body))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(headers: &[(&str, &str)]) -> Parts {
        let mut b = Request::builder();
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap().into_parts().0
    }

    fn id(layer: &TenantLayer, headers: &[(&str, &str)]) -> Option<String> {
        layer.identify(&head(headers)).map(|t| t.id().to_owned())
    }

    #[test]
    fn the_header_names_a_tenant_else_the_api_key_does() {
        let l = TenantLayer::new();
        assert_eq!(id(&l, &[("x-tenant", "team-a")]).as_deref(), Some("team-a"));
        let key = id(&l, &[("authorization", "Bearer sk-1")]).unwrap();
        assert_eq!(key.len(), "key-".len() + 16);
        // The same key by any of its headers is the same tenant; another key another.
        assert_eq!(id(&l, &[("x-api-key", "sk-1")]), Some(key.clone()));
        assert_eq!(id(&l, &[("api-key", " sk-1 ")]), Some(key.clone()));
        assert_eq!(
            id(&l, &[("authorization", "bearer sk-1")]),
            Some(key.clone())
        );
        assert_ne!(id(&l, &[("x-api-key", "sk-2")]), Some(key.clone()));
        // An invalid name is ignored: the key decides.
        for bad in ["", "a b", "é", &"x".repeat(65)] {
            let h = [("x-tenant", bad), ("x-api-key", "sk-1")];
            assert_eq!(id(&l, &h), Some(key.clone()), "{bad:?}");
        }
        assert_eq!(id(&l, &[("authorization", "Basic abc")]), None);
        assert_eq!(
            id(&l.clone().with_api_key(false), &[("x-api-key", "k")]),
            None
        );
        let keys_only = TenantLayer::new().without_header();
        assert_eq!(
            id(&keys_only, &[("x-tenant", "a"), ("x-api-key", "sk-1")]),
            Some(key)
        );
    }

    #[test]
    fn labels_are_bounded() {
        let l = TenantLayer::new()
            .with_tenant("acme", 3.0)
            .with_label_limit(2);
        let t = |name: &str| l.identify(&head(&[("x-tenant", name)])).unwrap();
        assert_eq!((t("acme").label(), t("acme").weight()), ("acme", 3.0));
        assert_eq!(t("b").label(), "b");
        assert_eq!(t("c").label(), "c");
        assert_eq!(t("d").label(), "other");
        assert_eq!(t("b").label(), "b", "a labelled tenant keeps its label");
        assert_eq!(t("d").weight(), 1.0);
    }
}
