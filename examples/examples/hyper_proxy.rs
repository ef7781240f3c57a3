//! One tailguard policy mixed into an in-house hyper 1 proxy: `SseIdleTimeout` on the pooled
//! hyper client, nothing else.
//!
//! ```text
//! cargo run --release --example hyper_proxy                                   # self-contained demo
//! cargo run --release --example hyper_proxy -- 127.0.0.1:8081 http://127.0.0.1:8000   # serve
//! ```
//!
//! The demo starts a mock upstream whose stream stalls after three tokens while it keeps sending
//! `: keepalive` comments, which would reset tower-http's body timeout forever. Through the proxy
//! the stream ends 500 ms into the stall with an in-band OpenAI error event and `[DONE]`.
//!
//! No glue: the guarded client's response body keeps hyper's `Bytes` data, so the handler
//! returns what the guarded client returns. Core's `BadGatewayLayer` outermost answers an
//! upstream that cannot be reached (or resets before its headers) with a 502 in the client's
//! protocol, where hyper alone would close the connection with no reply.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::Request;
use http::uri::{PathAndQuery, Uri};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tailguard::core::{BadGatewayLayer, BoxError};
use tailguard::timeout::SseIdleTimeoutLayer;
use tailguard_mock::{MockServer, Script};
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt, service_fn};

/// Accepts connections on `listener` and proxies every request to `upstream`.
async fn serve(listener: TcpListener, upstream: Uri) -> Result<(), BoxError> {
    let client = Client::builder(TokioExecutor::new()).build_http::<Incoming>();
    // The tailguard policy: stalls end in-band even behind keepalives; transport errors are 502s.
    let guarded = ServiceBuilder::new()
        .layer(BadGatewayLayer::new())
        .layer(
            SseIdleTimeoutLayer::new()
                .with_first_token_timeout(Duration::from_secs(30))
                .with_idle_timeout(Duration::from_millis(500)),
        )
        .service(client);
    let handler = service_fn(move |mut req: Request<Incoming>| {
        let guarded = guarded.clone();
        let mut parts = upstream.clone().into_parts();
        parts.path_and_query = Some(
            req.uri()
                .path_and_query()
                .cloned()
                .unwrap_or_else(|| PathAndQuery::from_static("/")),
        );
        *req.uri_mut() = Uri::from_parts(parts).expect("scheme, authority and path are set");
        req.headers_mut().remove(http::header::HOST);
        guarded.oneshot(req)
    });
    loop {
        let (stream, _) = listener.accept().await?;
        let service = TowerToHyperService::new(handler.clone());
        tokio::spawn(async move {
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if let [listen, upstream] = &args[..] {
        let listener = TcpListener::bind(listen.parse::<SocketAddr>()?).await?;
        println!("proxying http://{} -> {upstream}", listener.local_addr()?);
        return serve(listener, upstream.parse()?).await;
    }

    // The demo: a mock upstream that stalls after three tokens behind keepalives.
    let mock = MockServer::start(
        Script::new()
            .ttft(Duration::from_millis(50))
            .tokens(8)
            .gap(Duration::from_millis(20))
            .stall_after(3, None)
            .keepalive_every(Duration::from_millis(100)),
    )
    .await?;
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(serve(listener, mock.url().parse()?));
    println!("proxy http://{addr} -> mock {}\n", mock.url());

    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = Request::post(format!("http://{addr}/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"Hi"}]}"#,
        )))?;
    let mut body = client.request(req).await?.into_body();
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame?.into_data() {
            print!("{}", String::from_utf8_lossy(&data));
        }
    }
    mock.wait_idle().await;
    println!(
        "upstream cancelled by the proxy: {}",
        mock.stats().cancelled == 1
    );
    mock.shutdown().await;
    Ok(())
}
