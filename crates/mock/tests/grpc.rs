//! The gRPC `Generate` service through the hand-written tonic client over a real `Channel`.

use std::time::Duration;

use tailguard_mock::grpc::{GenerateClient, GenerateRequest};
use tailguard_mock::{MockServer, Outcome, Script};
use tokio::time::Instant;
use tonic::transport::Channel;

const MS: fn(u64) -> Duration = Duration::from_millis;

async fn client(server: &MockServer) -> GenerateClient<Channel> {
    let ch = Channel::from_shared(server.url())
        .unwrap()
        .connect()
        .await
        .unwrap();
    GenerateClient::new(ch)
}

fn req(max_tokens: u32) -> GenerateRequest {
    GenerateRequest {
        prompt: "tell me".into(),
        max_tokens,
        model: "m".into(),
    }
}

#[tokio::test(start_paused = true)]
async fn streams_tokens_then_ok_status() {
    let server = MockServer::start(Script::new().ttft(MS(200)).tokens(4).gap(MS(10)))
        .await
        .unwrap();
    let mut c = client(&server).await;
    let start = Instant::now();
    let mut stream = c.generate(req(0)).await.unwrap().into_inner();
    let mut got = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        got.push((start.elapsed(), m));
    }
    assert_eq!(got.len(), 5);
    assert_eq!(got[0].0, MS(200));
    assert_eq!(got[3].0, MS(230));
    assert_eq!(got[0].1.text, "Hello");
    assert_eq!(got[0].1.index, 0);
    assert_eq!(got[4].1.finish_reason.as_deref(), Some("stop"));
    assert_eq!(got[4].1.index, 4);
    // trailers: grpc-status 0 (message() returned Ok(None), so the status was OK)
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!(s.completed, 1);
    assert_eq!(s.log[0].path, tailguard_mock::grpc::GENERATE_PATH);
}

#[tokio::test(start_paused = true)]
async fn max_tokens_caps_and_says_length() {
    let server = MockServer::start(Script::new().tokens(10)).await.unwrap();
    let mut stream = client(&server)
        .await
        .generate(req(2))
        .await
        .unwrap()
        .into_inner();
    let mut n = 0;
    let mut last = None;
    while let Some(m) = stream.message().await.unwrap() {
        n += 1;
        last = m.finish_reason;
    }
    assert_eq!((n, last.as_deref()), (3, Some("length")));
}

#[tokio::test(start_paused = true)]
async fn error_status_maps_to_grpc_codes() {
    for (status, code) in [
        (429, tonic::Code::ResourceExhausted),
        (503, tonic::Code::Unavailable),
        (500, tonic::Code::Internal),
    ] {
        let server =
            MockServer::start(Script::new().status(http::StatusCode::from_u16(status).unwrap()))
                .await
                .unwrap();
        let err = client(&server).await.generate(req(0)).await.unwrap_err();
        assert_eq!(err.code(), code, "{status}");
        assert_eq!(server.stats().status_errors, 1);
    }
}

#[tokio::test(start_paused = true)]
async fn in_band_error_is_a_trailer_status() {
    let server = MockServer::start(Script::new().error_event_after(2))
        .await
        .unwrap();
    let mut stream = client(&server)
        .await
        .generate(req(0))
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().is_some());
    assert!(stream.message().await.unwrap().is_some());
    let err = stream.message().await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::Internal);
    assert_eq!(err.message(), "mock upstream error");
    server.wait_idle().await;
    assert_eq!(server.stats().log[0].outcome, Outcome::ErrorEvent(2));
}

#[tokio::test(start_paused = true)]
async fn dropping_the_stream_cancels_upstream() {
    let server = MockServer::start(Script::new().stall_after(1, None))
        .await
        .unwrap();
    let mut c = client(&server).await;
    let mut stream = c.generate(req(0)).await.unwrap().into_inner();
    assert!(stream.message().await.unwrap().is_some());
    drop(stream);
    server.wait_idle().await;
    let s = server.stats();
    assert_eq!((s.cancelled, s.completed), (1, 0));
    // The channel (HTTP/2 connection) still works.
    server.set_script(Script::new().tokens(1));
    let mut stream = c.generate(req(0)).await.unwrap().into_inner();
    while stream.message().await.unwrap().is_some() {}
    assert_eq!(server.stats().completed, 1);
}

#[tokio::test(start_paused = true)]
async fn reset_after_tokens_fails_the_stream() {
    let server = MockServer::start(Script::new().reset_after_tokens(1))
        .await
        .unwrap();
    let mut stream = client(&server)
        .await
        .generate(req(0))
        .await
        .unwrap()
        .into_inner();
    assert!(stream.message().await.unwrap().is_some());
    assert!(stream.message().await.is_err());
    server.wait_idle().await;
    assert_eq!(server.stats().resets, 1);
}
