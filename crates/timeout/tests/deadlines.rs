//! The `Deadlines` the layer hands to the inner service: the request's effective first-token
//! and total deadlines, after every override, tightening any already there.

use std::sync::{Arc, Mutex};

use http::{HeaderName, Request, Response};
use tailguard_core::{ClassPolicy, ClientDeadline, Deadlines, Phase, Priority};
use tailguard_test_support::{ms, secs};
use tailguard_timeout::{FirstTokenClock, SseIdleTimeoutLayer, Timeouts};
use tokio::time::Instant;
use tower::{Layer, ServiceExt};

/// Sends `req` through `layer` and returns the `Deadlines` the inner service saw.
async fn seen(layer: &SseIdleTimeoutLayer, req: Request<()>) -> Option<Deadlines> {
    let saw = Arc::new(Mutex::new(None));
    let s = saw.clone();
    let svc = layer.layer(tower::service_fn(move |req: Request<()>| {
        *s.lock().unwrap() = req.extensions().get::<Deadlines>().copied();
        async {
            Ok::<_, std::convert::Infallible>(Response::new(
                http_body_util::Empty::<bytes::Bytes>::new(),
            ))
        }
    }));
    svc.oneshot(req).await.unwrap();
    saw.lock().unwrap().take()
}

#[tokio::test(start_paused = true)]
async fn the_inner_service_sees_the_effective_deadlines() {
    let layer = SseIdleTimeoutLayer::new()
        .with_first_token_timeout(secs(10))
        .with_total_timeout(secs(100))
        .with_priority_timeouts(Priority::batch(), Timeouts::new().with_total(secs(50)))
        .with_override_header(Phase::FirstToken, HeaderName::from_static("x-ttft-ms"));
    let t0 = Instant::now();
    let d = |ft: u64, total: u64| Deadlines {
        first_token: Some(t0 + secs(ft)),
        total: Some(t0 + secs(total)),
    };

    assert_eq!(seen(&layer, Request::new(())).await, Some(d(10, 100)));

    // Header, ClassPolicy and per-Priority overrides, field by field.
    let mut req = Request::builder()
        .header("x-ttft-ms", "2000")
        .body(())
        .unwrap();
    req.extensions_mut().insert(Priority::batch());
    assert_eq!(seen(&layer, req).await, Some(d(2, 50)));
    let mut req = Request::new(());
    req.extensions_mut()
        .insert(ClassPolicy::new().with_first_token_timeout(secs(3)));
    req.extensions_mut()
        .insert(Timeouts::new().with_total(secs(30)));
    assert_eq!(seen(&layer, req).await, Some(d(3, 30)));

    // Deadlines already there are tightened, never loosened.
    let mut req = Request::new(());
    req.extensions_mut().insert(Deadlines {
        first_token: Some(t0 + secs(5)),
        total: Some(t0 + secs(500)),
    });
    assert_eq!(seen(&layer, req).await, Some(d(5, 100)));

    // No timer: nothing is inserted; one already there is left as it is.
    let plain = SseIdleTimeoutLayer::new();
    assert_eq!(seen(&plain, Request::new(())).await, None);
    let mut req = Request::new(());
    req.extensions_mut().insert(d(1, 2));
    assert_eq!(seen(&plain, req).await, Some(d(1, 2)));
}

#[tokio::test(start_paused = true)]
async fn a_first_token_clock_from_headers_gives_the_latest_first_token_deadline() {
    let t0 = Instant::now();
    let layer = SseIdleTimeoutLayer::new()
        .with_first_token_clock(FirstTokenClock::FromHeaders)
        .with_first_token_timeout(secs(10));
    let d = seen(&layer, Request::new(())).await;
    assert_eq!(
        d, None,
        "unknown until the headers come, without a head timeout"
    );
    let d = seen(&layer.with_head_timeout(secs(2)), Request::new(())).await;
    assert_eq!(
        d,
        Some(Deadlines {
            first_token: Some(t0 + secs(12)),
            total: None,
        })
    );
}

/// Sends `req` through `layer` and returns the `Deadlines` and headers the inner service saw.
async fn seen_head(
    layer: &SseIdleTimeoutLayer,
    req: Request<()>,
) -> (Option<Deadlines>, http::HeaderMap) {
    let saw = Arc::new(Mutex::new(None));
    let s = saw.clone();
    let svc = layer.layer(tower::service_fn(move |req: Request<()>| {
        let d = req.extensions().get::<Deadlines>().copied();
        *s.lock().unwrap() = Some((d, req.headers().clone()));
        async {
            Ok::<_, std::convert::Infallible>(Response::new(
                http_body_util::Empty::<bytes::Bytes>::new(),
            ))
        }
    }));
    svc.oneshot(req).await.unwrap();
    saw.lock().unwrap().take().unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_client_deadline_tightens_the_total_and_travels_on_when_asked() {
    let t0 = Instant::now();
    let layer = SseIdleTimeoutLayer::new()
        .with_first_token_timeout(secs(10))
        .with_total_timeout(secs(100));
    let req = || {
        Request::builder()
            .header("x-request-timeout", "2.5")
            .body(())
            .unwrap()
    };
    let (d, headers) = seen_head(&layer, req()).await;
    let d = d.unwrap();
    assert_eq!(d.total, Some(t0 + ms(2500)), "min(100 s, 2.5 s)");
    assert_eq!(d.first_token, Some(t0 + secs(10)));
    assert_eq!(d.first_token_left(t0), Some(ms(2500)));
    assert_eq!(
        headers["x-request-timeout"], "2.5",
        "not rewritten by default"
    );

    // A configured header, sent on with what is left; a longer client deadline is capped.
    let name = HeaderName::from_static("x-deadline");
    let layer = layer.with_client_deadline(
        ClientDeadline::new()
            .with_header(name.clone())
            .with_propagation(true),
    );
    let short = Request::builder()
        .header("x-deadline", "1500ms")
        .body(())
        .unwrap();
    let (d, headers) = seen_head(&layer, short).await;
    assert_eq!(d.unwrap().total, Some(t0 + ms(1500)));
    assert_eq!(headers["x-deadline"], "1500ms");
    let bad = Request::builder()
        .header("x-deadline", "1h")
        .body(())
        .unwrap();
    let (d, headers) = seen_head(&layer, bad).await;
    assert_eq!(
        d.unwrap().total,
        Some(t0 + secs(100)),
        "unparseable: ignored"
    );
    assert_eq!(headers["x-deadline"], "100000ms", "the layer's own budget");

    // Disabled: the header is not read.
    let off = SseIdleTimeoutLayer::new().with_client_deadline(ClientDeadline::disabled());
    let (d, _) = seen_head(&off, req()).await;
    assert_eq!(d, None);
}

#[tokio::test(start_paused = true)]
async fn grpc_timeout_in_and_out() {
    let t0 = Instant::now();
    let layer = SseIdleTimeoutLayer::new().with_total_timeout(secs(30));
    let grpc = |timeout: &str| {
        Request::builder()
            .header("content-type", "application/grpc")
            .header("grpc-timeout", timeout)
            .body(())
            .unwrap()
    };
    let (d, headers) = seen_head(&layer, grpc("2S")).await;
    assert_eq!(d.unwrap().total, Some(t0 + secs(2)));
    assert_eq!(headers["grpc-timeout"], "2000m");
    // A longer deadline is capped by the layer's own, and the upstream is told so.
    let (d, headers) = seen_head(&layer, grpc("5M")).await;
    assert_eq!(d.unwrap().total, Some(t0 + secs(30)));
    assert_eq!(headers["grpc-timeout"], "30000m");
}
