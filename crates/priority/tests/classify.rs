//! PriorityClass: rule precedence, header allowlist and ceiling, policy insertion.

use std::convert::Infallible;
use std::time::Duration;

use http::{Method, Request, Response};
use tailguard_core::{ClassPolicy, Priority};
use tailguard_priority::{PolicyTable, PriorityClassLayer, Source};
use tower::{Layer, ServiceExt, service_fn};

fn req(method: Method, path: &str, headers: &[(&str, &str)]) -> Request<()> {
    let mut b = Request::builder().method(method).uri(path);
    for (k, v) in headers {
        b = b.header(*k, *v);
    }
    b.body(()).unwrap()
}

fn classify(layer: &PriorityClassLayer, r: Request<()>) -> (Priority, Source) {
    let (parts, _) = r.into_parts();
    let c = layer.classify(&parts);
    (c.priority, c.source)
}

#[test]
fn header_goes_through_the_allowlist() {
    let l = PriorityClassLayer::new();
    let get = |v: &str| {
        classify(
            &l,
            req(Method::POST, "/v1/chat/completions", &[("x-priority", v)]),
        )
    };
    assert_eq!(
        get("interactive"),
        (Priority::interactive(), Source::Header)
    );
    assert_eq!(get("  BATCH "), (Priority::batch(), Source::Header));
    assert_eq!(get("sheddable"), (Priority::sheddable(), Source::Header));
    // Clients cannot name `critical` by default, nor invent classes.
    assert_eq!(get("critical"), (Priority::standard(), Source::Default));
    assert_eq!(get("urgent"), (Priority::standard(), Source::Default));
    assert_eq!(get("99"), (Priority::standard(), Source::Default));
    // Non-UTF-8/opaque bytes are ignored, not a panic.
    let mut r = req(Method::POST, "/", &[]);
    r.headers_mut().insert(
        "x-priority",
        http::HeaderValue::from_bytes(b"\xffinteractive").unwrap(),
    );
    assert_eq!(classify(&l, r), (Priority::standard(), Source::Default));
    // No header at all: the default class.
    assert_eq!(
        classify(&l, req(Method::GET, "/", &[])),
        (Priority::standard(), Source::Default)
    );
}

#[test]
fn allowlist_and_aliases_are_configurable() {
    let l = PriorityClassLayer::new()
        .with_header(Some(http::HeaderName::from_static("x-class")))
        .with_header_allowlist([Priority::batch()])
        .with_header_alias("high", Priority::interactive())
        .with_default(Priority::sheddable());
    let get = |h: &str, v: &str| classify(&l, req(Method::GET, "/", &[(h, v)])).0;
    assert_eq!(get("x-class", "batch"), Priority::batch());
    assert_eq!(get("x-class", "High"), Priority::interactive());
    assert_eq!(get("x-class", "interactive"), Priority::sheddable());
    assert_eq!(
        get("x-priority", "batch"),
        Priority::sheddable(),
        "old header ignored"
    );
    let off = PriorityClassLayer::new().with_header(None);
    assert_eq!(
        classify(&off, req(Method::GET, "/", &[("x-priority", "batch")])).0,
        Priority::standard()
    );
}

#[test]
fn ceiling_caps_header_claims_only() {
    let l = PriorityClassLayer::new()
        .with_route(Some(Method::GET), "/health", Priority::critical())
        .with_ceiling(|p| (!p.headers.contains_key("authorization")).then(Priority::standard));
    let anon = |v: &str| classify(&l, req(Method::POST, "/v1/chat", &[("x-priority", v)]));
    assert_eq!(anon("interactive"), (Priority::standard(), Source::Header));
    // Claims below the ceiling are kept.
    assert_eq!(anon("batch"), (Priority::batch(), Source::Header));
    let authed = classify(
        &l,
        req(
            Method::POST,
            "/v1/chat",
            &[("x-priority", "interactive"), ("authorization", "Bearer x")],
        ),
    );
    assert_eq!(authed, (Priority::interactive(), Source::Header));
    // The server's own route table is trusted: no ceiling.
    assert_eq!(
        classify(&l, req(Method::GET, "/health", &[])),
        (Priority::critical(), Source::Route)
    );
}

#[test]
fn closure_beats_routes_beats_header() {
    let l = PriorityClassLayer::new()
        .with_classifier(|p| {
            p.headers
                .contains_key("x-internal")
                .then(Priority::critical)
        })
        .with_route(None, "/v1/batches*", Priority::batch())
        .with_route(
            Some(Method::POST),
            "/v1/chat/completions",
            Priority::interactive(),
        )
        .with_route(None, "/v1/*", Priority::sheddable());
    let c = |m: Method, path: &str, h: &[(&str, &str)]| classify(&l, req(m, path, h));
    assert_eq!(
        c(
            Method::POST,
            "/v1/batches/1",
            &[("x-internal", "1"), ("x-priority", "interactive")]
        ),
        (Priority::critical(), Source::Classifier)
    );
    assert_eq!(
        c(
            Method::POST,
            "/v1/batches/1",
            &[("x-priority", "interactive")]
        ),
        (Priority::batch(), Source::Route)
    );
    // First matching route wins; the method must match.
    assert_eq!(
        c(Method::POST, "/v1/chat/completions", &[]),
        (Priority::interactive(), Source::Route)
    );
    assert_eq!(
        c(Method::GET, "/v1/chat/completions", &[]),
        (Priority::sheddable(), Source::Route)
    );
    // Exact routes do not match longer paths; no route -> header -> default.
    assert_eq!(
        c(Method::POST, "/v2/chat", &[("x-priority", "batch")]),
        (Priority::batch(), Source::Header)
    );
    assert_eq!(
        c(Method::POST, "/v2/chat", &[]),
        (Priority::standard(), Source::Default)
    );
}

#[test]
fn closure_may_return_classes_outside_the_table() {
    let l = PriorityClassLayer::new().with_classifier(|_| Some(Priority::new(25, "vip")));
    let (parts, _) = req(Method::GET, "/", &[]).into_parts();
    let c = l.classify(&parts);
    assert_eq!(c.priority.name(), "vip");
    assert_eq!(c.policy, ClassPolicy::new());
    // A returned priority of a known level takes the table's canonical name and policy.
    let l = PriorityClassLayer::new()
        .with_policy(Priority::batch(), ClassPolicy::new().with_hedge(false))
        .with_classifier(|_| Some(Priority::new(10, "bulk")));
    let c = l.classify(&parts);
    assert_eq!(c.priority.name(), "batch");
    assert_eq!(c.policy.hedge, Some(false));
}

#[test]
fn custom_table_sets_the_allowlist() {
    let table = PolicyTable::new()
        .with_class(Priority::new(2, "gold"), ClassPolicy::new())
        .with_class(Priority::new(1, "silver"), ClassPolicy::new())
        .with_class(Priority::new(0, "bronze"), ClassPolicy::new());
    let l = PriorityClassLayer::new()
        .with_table(table)
        .with_default(Priority::new(0, "bronze"));
    let get = |v: &str| classify(&l, req(Method::GET, "/", &[("x-priority", v)])).0;
    assert_eq!(get("silver").name(), "silver");
    assert_eq!(
        get("gold").name(),
        "bronze",
        "the top class is not client-selectable"
    );
    assert_eq!(
        l.table().classes().map(|p| p.name()).collect::<Vec<_>>(),
        ["gold", "silver", "bronze"]
    );
}

#[tokio::test]
async fn service_inserts_priority_and_policy() {
    let policy = ClassPolicy::new()
        .with_reserved_share(0.3)
        .with_first_token_timeout(Duration::from_secs(2));
    let layer = PriorityClassLayer::new().with_policy(Priority::interactive(), policy.clone());
    let svc = layer.layer(service_fn(|r: Request<()>| async move {
        Ok::<_, Infallible>(Response::new((
            r.extensions().get::<Priority>().cloned(),
            r.extensions().get::<ClassPolicy>().cloned(),
        )))
    }));
    // A Priority set by someone upstream is overwritten.
    let mut r = req(Method::POST, "/", &[("x-priority", "interactive")]);
    r.extensions_mut().insert(Priority::critical());
    let (p, pol) = svc.clone().oneshot(r).await.unwrap().into_body();
    assert_eq!(p, Some(Priority::interactive()));
    assert_eq!(pol, Some(policy));
    let (p, pol) = svc
        .oneshot(req(Method::GET, "/", &[]))
        .await
        .unwrap()
        .into_body();
    assert_eq!(p, Some(Priority::standard()));
    assert_eq!(pol, Some(ClassPolicy::new()));
}

#[tokio::test]
async fn response_carries_the_priority_for_outer_layers() {
    let svc = PriorityClassLayer::new().layer(service_fn(|_req: Request<()>| async {
        Ok::<_, Infallible>(Response::new(()))
    }));
    let res = svc
        .clone()
        .oneshot(req(
            Method::POST,
            "/v1/chat/completions",
            &[("x-priority", "batch")],
        ))
        .await
        .unwrap();
    assert_eq!(res.extensions().get::<Priority>(), Some(&Priority::batch()));

    // A class an inner layer already wrote into the response wins.
    let inner = service_fn(|_req: Request<()>| async {
        let mut res = Response::new(());
        res.extensions_mut().insert(Priority::sheddable());
        Ok::<_, Infallible>(res)
    });
    let res = PriorityClassLayer::new()
        .layer(inner)
        .oneshot(req(
            Method::POST,
            "/v1/chat/completions",
            &[("x-priority", "batch")],
        ))
        .await
        .unwrap();
    assert_eq!(
        res.extensions().get::<Priority>(),
        Some(&Priority::sheddable())
    );
}
