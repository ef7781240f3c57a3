//! The tests' upstream and request builders.
#![allow(dead_code, unreachable_pub)]

use std::io;
use std::time::Duration;

use http::{Request, Response, StatusCode};
use tailguard_core::{RequestFacts, Tenant};
use tailguard_tenant::{Limit, LocalStore, TokenBudget, TokenBudgetLayer};
use tailguard_test_support::{DONE, ScriptBody, Step, data, token};
use tower::Service;
use tower::service_fn;

/// What the upstream answers a request with (carried in its extensions).
#[derive(Clone, Debug)]
pub struct Plan {
    pub status: StatusCode,
    pub content_type: &'static str,
    pub steps: Vec<Step>,
    /// The head is this late.
    pub head_delay: Option<Duration>,
    /// The service fails instead of answering.
    pub fail: bool,
    /// More response headers.
    pub headers: Vec<(&'static str, &'static str)>,
    /// The body's exact size hint (a `content-length`).
    pub hint: Option<u64>,
}

impl Plan {
    /// A `200` SSE stream of `steps`.
    pub fn sse(steps: impl IntoIterator<Item = Step>) -> Plan {
        Plan {
            status: StatusCode::OK,
            content_type: "text/event-stream",
            steps: steps.into_iter().collect(),
            head_delay: None,
            fail: false,
            headers: Vec::new(),
            hint: None,
        }
    }

    /// A stream that never ends (and sends nothing).
    pub fn open() -> Plan {
        Plan::sse([Step::Pending])
    }

    pub fn with_status(mut self, status: StatusCode, content_type: &'static str) -> Plan {
        self.status = status;
        self.content_type = content_type;
        self
    }

    /// A `200` JSON answer (not a stream) of `steps`.
    pub fn json(steps: impl IntoIterator<Item = Step>) -> Plan {
        Plan::sse(steps).with_status(StatusCode::OK, "application/json")
    }
}

/// `n` content chunks, then `[DONE]`.
pub fn tokens(n: usize) -> Vec<Step> {
    let mut v: Vec<Step> = (0..n).map(|i| data(token(&format!("t{i}")))).collect();
    v.push(data(DONE));
    v
}

/// A usage-only chunk (`include_usage`).
pub fn usage(prompt: u64, completion: u64) -> Step {
    data(format!(
        "data: {{\"choices\":[],\"usage\":{{\"prompt_tokens\":{prompt},\"completion_tokens\":{completion}}}}}\n\n"
    ))
}

/// The upstream: answers each request as its [`Plan`] says.
pub fn upstream()
-> impl Service<Request<()>, Response = Response<ScriptBody>, Error = io::Error, Future = impl Send>
+ Clone
+ Send
+ 'static {
    service_fn(|req: Request<()>| async move {
        let plan = req
            .extensions()
            .get::<Plan>()
            .cloned()
            .unwrap_or_else(|| Plan::sse(tokens(1)));
        if let Some(d) = plan.head_delay {
            tokio::time::sleep(d).await;
        }
        if plan.fail {
            return Err(io::Error::other("upstream down"));
        }
        let mut body = ScriptBody::new(plan.steps);
        if let Some(n) = plan.hint {
            body = body.with_exact_hint(n);
        }
        let mut res = Response::new(body);
        *res.status_mut() = plan.status;
        res.headers_mut()
            .insert("content-type", plan.content_type.parse().unwrap());
        for (k, v) in plan.headers {
            res.headers_mut().insert(k, v.parse().unwrap());
        }
        Ok(res)
    })
}

/// The budget over [`upstream`], with its store.
pub fn budget(
    layer: TokenBudgetLayer,
) -> (
    TokenBudget<
        impl Service<
            Request<()>,
            Response = Response<ScriptBody>,
            Error = io::Error,
            Future = impl Send,
        > + Clone
        + Send
        + 'static,
    >,
    LocalStore,
) {
    let store = LocalStore::new();
    let layer = layer.with_store(store.clone());
    (TokenBudget::new(upstream(), &layer), store)
}

/// A layer with these default limits.
pub fn limits(limits: impl IntoIterator<Item = Limit>) -> TokenBudgetLayer {
    TokenBudgetLayer::new().with_default_limits(limits)
}

/// A request of `tenant` (none: `None`) to `path`, with `facts`, answered as `plan` says.
pub fn request(tenant: Option<&str>, path: &str, facts: RequestFacts, plan: Plan) -> Request<()> {
    let mut req = Request::post(path).body(()).unwrap();
    req.extensions_mut().insert(facts);
    req.extensions_mut().insert(plan);
    if let Some(t) = tenant {
        req.extensions_mut().insert(Tenant::new(t));
    }
    req
}

/// A chat request of tenant `acme` asking for `max_tokens`, answered as `plan` says.
pub fn chat(max_tokens: u32, plan: Plan) -> Request<()> {
    request(
        Some("acme"),
        "/v1/chat/completions",
        RequestFacts::new().with_max_tokens(max_tokens),
        plan,
    )
}
