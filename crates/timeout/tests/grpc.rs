//! gRPC through tonic over loopback against `tailguard-mock`'s `Generate` service, on a paused
//! clock: a tonic client behind the layer gets `Status` `DeadlineExceeded`.

use std::time::Duration;

use tailguard_core::{EndReason, EndReport};
use tailguard_mock::grpc::{GenerateClient, GenerateRequest};
use tailguard_mock::{MockServer, Script};
use tailguard_test_support::ms;
use tailguard_timeout::SseIdleTimeoutLayer;
use tokio::time::Instant;
use tonic::Code;
use tower::ServiceBuilder;

/// A `GenerateClient` over a tonic `Channel` wrapped in `layer`, with no glue: the body keeps
/// the `Bytes` data the client asks for, and the error type is the `Channel`'s.
async fn client(
    server: &MockServer,
    layer: SseIdleTimeoutLayer,
    report: EndReport,
) -> GenerateClient<
    impl tonic::client::GrpcService<
        tonic::body::Body,
        Error = tonic::transport::Error,
        ResponseBody = impl http_body::Body<Data = bytes::Bytes, Error = tailguard_core::BoxError>
                       + Send
                       + 'static,
    > + Clone,
> {
    let channel = tonic::transport::Channel::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    let svc = ServiceBuilder::new()
        .map_request(move |mut req: http::Request<tonic::body::Body>| {
            req.extensions_mut().insert(report.clone());
            req
        })
        .layer(layer)
        .service(channel);
    GenerateClient::new(svc)
}

fn request() -> GenerateRequest {
    GenerateRequest {
        prompt: "hello there".into(),
        max_tokens: 0,
        model: "m".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn a_stalled_grpc_stream_ends_with_deadline_exceeded() {
    let script = Script::new()
        .ttft(ms(100))
        .gap(ms(100))
        .tokens(10)
        .stall_after(3, None);
    let server = MockServer::start(script).await.unwrap();
    let report = EndReport::new();
    let layer = SseIdleTimeoutLayer::new()
        .with_first_token_timeout(ms(1050))
        .with_idle_timeout(ms(750));
    let mut client = client(&server, layer, report.clone()).await;
    let start = Instant::now();
    let mut stream = client.generate(request()).await.unwrap().into_inner();
    let mut texts = Vec::new();
    let status = loop {
        match stream.message().await {
            Ok(Some(m)) => texts.push(m.text),
            Ok(None) => panic!("stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().starts_with("idle timeout"), "{status:?}");
    assert_eq!(texts.len(), 3, "every token before the stall: {texts:?}");
    // Token 3 at 0.1 + 2 * 0.1 = 0.3 s; the idle limit passes at 1.05 s.
    assert_eq!(start.elapsed(), ms(1050));
    assert_eq!(report.get(), Some(EndReason::IdleTimeout));
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!((s.cancelled, s.completed), (1, 0));
}

#[tokio::test(start_paused = true)]
async fn a_grpc_head_timeout_is_deadline_exceeded() {
    let server = MockServer::start(Script::new().head_delay(Duration::from_secs(30)))
        .await
        .unwrap();
    let report = EndReport::new();
    let layer = SseIdleTimeoutLayer::new().with_head_timeout(ms(800));
    let mut client = client(&server, layer, report.clone()).await;
    let start = Instant::now();
    let status = client.generate(request()).await.unwrap_err();
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().starts_with("head timeout"), "{status:?}");
    assert_eq!(start.elapsed(), ms(800));
    assert_eq!(report.get(), Some(EndReason::HeadTimeout));
    server.wait_idle().await;
    assert_eq!(server.stats().cancelled, 1);
}

#[tokio::test(start_paused = true)]
async fn a_healthy_grpc_stream_passes() {
    let script = Script::new().ttft(ms(100)).gap(ms(100)).tokens(20);
    let server = MockServer::start(script).await.unwrap();
    let layer = SseIdleTimeoutLayer::new()
        .with_first_token_timeout(ms(1000))
        .with_idle_timeout(ms(150));
    let mut client = client(&server, layer, EndReport::new()).await;
    let mut stream = client.generate(request()).await.unwrap().into_inner();
    let mut n = 0;
    while let Some(m) = stream.message().await.unwrap() {
        if m.finish_reason.is_none() {
            n += 1;
        }
    }
    assert_eq!(n, 20);
    server.wait_idle().await;
    let s = server.stats();
    // (The mock records a gRPC stream whose trailers went out as "cancelled" even without this
    // layer, because hyper does not poll a body again after its trailers; so check what it
    // sent.)
    assert_eq!(s.log[0].tokens_sent, 20, "{s:?}");
}

#[tokio::test(start_paused = true)]
async fn a_grpc_reset_mid_stream_is_unavailable_with_every_message_before_it() {
    let script = Script::new()
        .ttft(ms(100))
        .gap(ms(100))
        .tokens(10)
        .reset_after_tokens(3);
    let server = MockServer::start(script).await.unwrap();
    let report = EndReport::new();
    let mut client = client(&server, SseIdleTimeoutLayer::new(), report.clone()).await;
    let mut stream = client.generate(request()).await.unwrap().into_inner();
    let mut texts = Vec::new();
    let status = loop {
        match stream.message().await {
            Ok(Some(m)) => texts.push(m.text),
            Ok(None) => panic!("stream ended without a status"),
            Err(status) => break status,
        }
    };
    assert_eq!(status.code(), Code::Unavailable, "{status:?}");
    assert!(
        status.message().contains("connection failed mid-stream"),
        "{status:?}"
    );
    assert_eq!(texts.len(), 3, "{texts:?}");
    assert_eq!(
        report.get(),
        Some(EndReason::UpstreamError(
            tailguard_core::UpstreamFailure::Transport
        ))
    );
}

#[tokio::test(start_paused = true)]
async fn a_grpc_timeout_ends_the_call_at_the_clients_deadline_and_travels_on() {
    // The first token never comes; the layer's own limits are far away.
    let server = MockServer::start(Script::new().ttft(Duration::from_secs(60)))
        .await
        .unwrap();
    let report = EndReport::new();
    let layer = SseIdleTimeoutLayer::new()
        .with_first_token_timeout(Duration::from_secs(30))
        .with_total_timeout(Duration::from_secs(300));
    let mut client = client(&server, layer, report.clone()).await;
    let mut req = tonic::Request::new(request());
    req.set_timeout(Duration::from_secs(2));
    let start = Instant::now();
    let status = match client.generate(req).await {
        Ok(res) => res.into_inner().message().await.unwrap_err(),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::DeadlineExceeded, "{status:?}");
    assert!(status.message().starts_with("total timeout"), "{status:?}");
    assert_eq!(start.elapsed(), Duration::from_secs(2));
    assert_eq!(report.get(), Some(EndReason::Deadline));
    server.wait_idle().await;
    let stats = server.stats();
    // The upstream was told the budget left, in gRPC's own header.
    assert_eq!(stats.log[0].headers["grpc-timeout"], "2000m");
    assert_eq!(stats.cancelled, 1);
}
