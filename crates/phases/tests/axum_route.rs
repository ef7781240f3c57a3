//! axum's `MatchedPath` as the route label, through `with_route_fn` (the recorder applied with
//! `Router::layer`, so it runs after routing).

use std::sync::{Arc, Mutex};

use axum::extract::MatchedPath;
use axum::routing::get;
use http::Request;
use tailguard_phases::{LatencyPhaseRecorderLayer, PhaseReport, Route};
use tower::ServiceExt;

#[tokio::test(start_paused = true)]
async fn matched_path_is_the_route_label() {
    let reports = Arc::new(Mutex::new(Vec::<PhaseReport>::new()));
    let sink = reports.clone();
    let recorder = LatencyPhaseRecorderLayer::new()
        .without_sinks()
        .with_sink(move |r: &PhaseReport| sink.lock().unwrap().push(r.clone()))
        .with_route_fn(|parts| {
            parts
                .extensions
                .get::<MatchedPath>()
                .map(|p| Route::from(p.as_str()))
        });
    let app = axum::Router::new()
        .route("/v1/models/{id}", get(|| async { "{}" }))
        .layer(recorder);

    for id in ["gpt-4o", "a-b-c", "x"] {
        let res = app
            .clone()
            .oneshot(
                Request::get(format!("/v1/models/{id}"))
                    .body(axum::body::Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert!(res.headers().contains_key("x-request-id"));
        let _ = axum::body::to_bytes(res.into_body(), 1 << 20)
            .await
            .unwrap();
    }
    let reports = reports.lock().unwrap();
    assert_eq!(reports.len(), 3);
    assert!(
        reports
            .iter()
            .all(|r| r.labels.route() == "/v1/models/{id}")
    );
}
