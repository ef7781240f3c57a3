//! [`TokenBudgetLayer`]: the budgets' configuration.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Once};

use http::Request;
use http::header::CONTENT_LENGTH;
use tailguard_core::RequestFacts;
use tower_layer::Layer;

use crate::limit::{Limit, Tokens};
use crate::local::LocalStore;
use crate::service::TokenBudget;
use crate::store::Store;

/// The output reserved for a request that sets no output limit, by default.
pub const DEFAULT_MAX_TOKENS: u32 = 1024;
/// The prompt bytes counted as one input token when the prompt was not counted in tokens, by
/// default.
pub const DEFAULT_BYTES_PER_TOKEN: u32 = 4;

/// Token budgets per tenant; builds [`TokenBudget`] services. See the [crate docs](crate) for
/// the semantics.
///
/// Every tenant has the [default limits](Self::with_default_limits) unless it has
/// [limits of its own](Self::with_tenant_limits), which replace them (an empty list exempts
/// the tenant). With no limits at all (the state [`new`](Self::new) starts in) every request
/// passes untouched.
///
/// One layer value is one set of budgets: clones of the layer and every service it builds
/// share its [`Store`].
#[derive(Clone)]
pub struct TokenBudgetLayer {
    pub(crate) cfg: Arc<Config>,
}

#[derive(Clone)]
pub(crate) struct Config {
    pub(crate) store: Arc<dyn Store>,
    default: Arc<[Limit]>,
    tenants: HashMap<Arc<str>, Arc<[Limit]>>,
    default_max_tokens: u32,
    bytes_per_token: u32,
    /// The metric descriptions were sent.
    described: Arc<Once>,
}

impl TokenBudgetLayer {
    /// No limits yet, the [`LocalStore`], [`DEFAULT_MAX_TOKENS`] and
    /// [`DEFAULT_BYTES_PER_TOKEN`].
    pub fn new() -> Self {
        TokenBudgetLayer {
            cfg: Arc::new(Config {
                store: Arc::new(LocalStore::new()),
                default: Arc::from([]),
                tenants: HashMap::new(),
                default_max_tokens: DEFAULT_MAX_TOKENS,
                bytes_per_token: DEFAULT_BYTES_PER_TOKEN,
                described: Arc::new(Once::new()),
            }),
        }
    }

    fn cfg(&mut self) -> &mut Config {
        Arc::make_mut(&mut self.cfg)
    }

    /// The limits of every tenant without limits of its own (repeated limits count once).
    pub fn with_default_limits(mut self, limits: impl IntoIterator<Item = Limit>) -> Self {
        self.cfg().default = distinct(limits);
        self
    }

    /// The limits of tenant `id` ([`Tenant::id`](tailguard_core::Tenant::id)), in place of the
    /// default ones; an empty list exempts it.
    pub fn with_tenant_limits(
        mut self,
        id: impl Into<Arc<str>>,
        limits: impl IntoIterator<Item = Limit>,
    ) -> Self {
        let limits = distinct(limits);
        self.cfg().tenants.insert(id.into(), limits);
        self
    }

    /// The output reserved for a request that sets no output limit (none of `max_tokens`,
    /// `max_completion_tokens`, `max_output_tokens`); [`DEFAULT_MAX_TOKENS`] by default.
    pub fn with_default_max_tokens(mut self, tokens: u32) -> Self {
        self.cfg().default_max_tokens = tokens;
        self
    }

    /// The prompt bytes counted as one input token when the prompt was not counted in tokens
    /// (rounded up; 0 is taken as 1); [`DEFAULT_BYTES_PER_TOKEN`] by default, about right for
    /// English text with the tokenizers of current models, short for code and many other
    /// languages (the estimate only sizes the reservation: the stream's usage settles it).
    pub fn with_bytes_per_token(mut self, bytes: u32) -> Self {
        self.cfg().bytes_per_token = bytes.max(1);
        self
    }

    /// Keeps the buckets in `store` instead of a [`LocalStore`] of this layer's own.
    pub fn with_store(mut self, store: impl Store) -> Self {
        self.cfg().store = Arc::new(store);
        self
    }

    /// The limits of tenant `id`.
    pub fn limits(&self, id: &str) -> &[Limit] {
        self.cfg.limits(id)
    }

    /// The tokens reserved for `req`: see [reservations](crate#reservations).
    ///
    /// ```
    /// use http::Request;
    /// use tailguard_core::RequestFacts;
    /// use tailguard_tenant::{TokenBudgetLayer, Tokens};
    ///
    /// let layer = TokenBudgetLayer::new();
    /// let mut req = Request::new(());
    /// req.extensions_mut().insert(RequestFacts::new().with_prompt_bytes(10).with_max_tokens(64));
    /// assert_eq!(layer.reservation(&req), Tokens::new(3, 64));
    /// ```
    pub fn reservation<B>(&self, req: &Request<B>) -> Tokens {
        self.cfg.reservation(req)
    }
}

impl Config {
    pub(crate) fn limits(&self, id: &str) -> &[Limit] {
        self.tenants.get(id).unwrap_or(&self.default)
    }

    pub(crate) fn shared_limits(&self, id: &str) -> Arc<[Limit]> {
        self.tenants.get(id).unwrap_or(&self.default).clone()
    }

    pub(crate) fn reservation<B>(&self, req: &Request<B>) -> Tokens {
        let facts = req.extensions().get::<RequestFacts>();
        let bytes = facts.and_then(|f| f.prompt_bytes).or_else(|| {
            let len = req.headers().get(CONTENT_LENGTH)?;
            len.to_str().ok()?.parse::<u64>().ok()
        });
        let input = facts
            .and_then(|f| f.prompt_tokens)
            .or_else(|| bytes.map(|b| b.div_ceil(u64::from(self.bytes_per_token))))
            .unwrap_or(0);
        let output = facts
            .and_then(|f| f.max_tokens)
            .unwrap_or(self.default_max_tokens);
        Tokens::new(input, u64::from(output))
    }

    /// Sends the metric descriptions, once per layer (on its first budgeted request, so the
    /// recorder installed by then gets them).
    pub(crate) fn describe(&self) {
        self.described.call_once(crate::metrics::describe);
    }
}

/// `limits` without repeats, in order.
fn distinct(limits: impl IntoIterator<Item = Limit>) -> Arc<[Limit]> {
    let mut out: Vec<Limit> = Vec::new();
    for l in limits {
        if !out.contains(&l) {
            out.push(l);
        }
    }
    out.into()
}

impl Default for TokenBudgetLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for TokenBudgetLayer {
    type Service = TokenBudget<S>;

    fn layer(&self, inner: S) -> TokenBudget<S> {
        TokenBudget::from_config(inner, self.cfg.clone())
    }
}

impl fmt::Debug for TokenBudgetLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TokenBudgetLayer")
            .field("default", &self.cfg.default)
            .field("tenants", &self.cfg.tenants)
            .field("default_max_tokens", &self.cfg.default_max_tokens)
            .field("bytes_per_token", &self.cfg.bytes_per_token)
            .field("store", &self.cfg.store)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Kind;

    fn req(facts: Option<RequestFacts>, content_length: Option<&str>) -> Request<()> {
        let mut b = Request::post("/v1/chat/completions");
        if let Some(len) = content_length {
            b = b.header("content-length", len);
        }
        let mut r = b.body(()).unwrap();
        if let Some(f) = facts {
            r.extensions_mut().insert(f);
        }
        r
    }

    #[test]
    fn the_reservation_counts_the_prompt_and_the_output_limit() {
        let layer = TokenBudgetLayer::new().with_default_max_tokens(500);
        let counted = RequestFacts::new()
            .with_prompt_tokens(7)
            .with_prompt_bytes(400)
            .with_max_tokens(20);
        assert_eq!(
            layer.reservation(&req(Some(counted), None)),
            Tokens::new(7, 20)
        );
        let sized = RequestFacts::new().with_prompt_bytes(401);
        assert_eq!(
            layer.reservation(&req(Some(sized), Some("9000"))),
            Tokens::new(101, 500)
        );
        // No facts: the body's length stands for the prompt.
        assert_eq!(
            layer.reservation(&req(None, Some("41"))),
            Tokens::new(11, 500)
        );
        assert_eq!(layer.reservation(&req(None, None)), Tokens::new(0, 500));
        let per_byte = TokenBudgetLayer::new().with_bytes_per_token(0);
        assert_eq!(
            per_byte.reservation(&req(None, Some("41"))),
            Tokens::new(41, 1024)
        );
    }

    #[test]
    fn tenant_limits_replace_the_defaults_and_repeats_count_once() {
        let minute = Limit::per_minute(Kind::Output, 60);
        let day = Limit::per_day(Kind::Total, 10_000);
        let layer = TokenBudgetLayer::new()
            .with_default_limits([minute, day, minute])
            .with_tenant_limits("big", [Limit::per_minute(Kind::Output, 6000)])
            .with_tenant_limits("free", []);
        assert_eq!(layer.limits("anyone"), [minute, day]);
        assert_eq!(layer.limits("big"), [Limit::per_minute(Kind::Output, 6000)]);
        assert!(layer.limits("free").is_empty());
    }
}
