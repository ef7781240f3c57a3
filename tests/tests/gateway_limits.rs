//! The gateway's hardening, in-process over loopback on a paused clock: hop-by-hop
//! headers dropped both ways, 415 for a non-JSON body, the header-read and keep-alive
//! timeouts, the connection cap, and `TCP_NODELAY` towards the upstreams.

use std::io::ErrorKind;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tailguard_gateway::{Args, Config, Gateway, upstream_connector};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::time::{Instant, sleep};
use tower::ServiceExt;

const CHAT: &str =
    r#"{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"Hello!"}]}"#;
const HEALTHZ: &[u8] = b"GET /healthz HTTP/1.1\r\nhost: gw\r\n\r\n";

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn test_config() -> Config {
    let mut c = Config::resolve(Default::default(), &Args::default()).unwrap();
    c.listen = SocketAddr::from(([127, 0, 0, 1], 0));
    c.mock.replicas = 1;
    c.mock.script = "ttft=10ms,tokens=2".into();
    c
}

fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build_http()
}

async fn body_text(res: http::Response<hyper::body::Incoming>) -> String {
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

/// Reads until the peer closes (`None`) or the read fails.
async fn until_closed(s: &mut TcpStream) -> Option<ErrorKind> {
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf).await {
            Ok(0) => return None,
            Ok(_) => {}
            Err(e) => return Some(e.kind()),
        }
    }
}

/// One `/healthz` round trip on a kept-alive raw connection.
async fn healthz(s: &mut TcpStream) {
    s.write_all(HEALTHZ).await.unwrap();
    let mut buf = [0u8; 4096];
    let n = s.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200 OK"), "{:?}", &buf[..n]);
}

#[tokio::test(start_paused = true)]
async fn hop_by_hop_request_headers_are_not_forwarded() {
    let gw = Gateway::start(test_config()).await.unwrap();
    let req = Request::post(format!("http://{}/v1/chat/completions", gw.addr()))
        .header("content-type", "application/json")
        .header("connection", "keep-alive, x-hop")
        .header("x-hop", "for this connection only")
        .header("keep-alive", "timeout=5")
        .header("proxy-connection", "keep-alive")
        .header("te", "trailers")
        .header("trailer", "x-checksum")
        .header("transfer-encoding", "chunked")
        .header("x-end-to-end", "kept")
        .body(Full::new(Bytes::from_static(CHAT.as_bytes())))
        .unwrap();
    let res = client().request(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    body_text(res).await;
    let seen = &gw.mocks()[0].stats().log[0].headers;
    for hop in [
        "connection",
        "x-hop",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
    ] {
        assert!(
            !seen.contains_key(hop),
            "{hop} reached the upstream: {seen:?}"
        );
    }
    assert_eq!(seen["x-end-to-end"], "kept");
    gw.shutdown().await.unwrap();
}

/// An upstream that answers every request with a JSON completion carrying hop-by-hop headers.
async fn hop_by_hop_upstream() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut req = Vec::new();
                let mut buf = [0u8; 4096];
                while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                    match s.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => req.extend_from_slice(&buf[..n]),
                    }
                }
                let body = r#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}]}"#;
                let res = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\
                     connection: keep-alive, x-hop\r\nx-hop: upstream connection only\r\n\
                     keep-alive: timeout=5\r\nproxy-connection: keep-alive\r\n\
                     trailer: x-checksum\r\nupgrade: h2c\r\nx-end-to-end: kept\r\n\r\n{body}",
                    body.len()
                );
                let _ = s.write_all(res.as_bytes()).await;
            });
        }
    });
    addr
}

#[tokio::test(start_paused = true)]
async fn hop_by_hop_response_headers_do_not_reach_the_client() {
    let upstream = hop_by_hop_upstream().await;
    let mut config = test_config();
    config.upstreams = vec![format!("http://{upstream}").parse().unwrap()];
    let gw = Gateway::start(config).await.unwrap();
    let req = Request::post(format!("http://{}/v1/chat/completions", gw.addr()))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(
            br#"{"model":"m","messages":[{"role":"user","content":"Hi"}]}"#,
        )))
        .unwrap();
    let res = client().request(req).await.unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let h = res.headers().clone();
    for hop in [
        "connection",
        "x-hop",
        "keep-alive",
        "proxy-connection",
        "trailer",
        "upgrade",
    ] {
        assert!(!h.contains_key(hop), "{hop} reached the client: {h:?}");
    }
    assert_eq!(h["x-end-to-end"], "kept");
    assert!(body_text(res).await.contains("\"content\":\"hi\""));
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_non_json_content_type_is_answered_415_in_openai_shape() {
    let gw = Gateway::start(test_config()).await.unwrap();
    let send = |content_type: Option<&'static str>| {
        let mut b = Request::post(format!("http://{}/v1/chat/completions", gw.addr()));
        if let Some(ct) = content_type {
            b = b.header("content-type", ct);
        }
        client().request(
            b.body(Full::new(Bytes::from_static(CHAT.as_bytes())))
                .unwrap(),
        )
    };
    for ct in [
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data",
    ] {
        let res = send(Some(ct)).await.unwrap();
        assert_eq!(res.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE, "{ct}");
        assert_eq!(res.headers()["content-type"], "application/json");
        let v: serde_json::Value = serde_json::from_str(&body_text(res).await).unwrap();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "unsupported_media_type");
        assert!(v["error"]["message"].as_str().unwrap().contains(ct));
    }
    assert_eq!(
        gw.mocks()[0].stats().requests,
        0,
        "nothing reached the upstream"
    );
    for ct in [
        Some("application/json; charset=utf-8"),
        Some("application/vnd.api+json"),
        None,
    ] {
        let res = send(ct).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{ct:?}");
        body_text(res).await;
    }
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_slowloris_connection_is_closed_after_the_header_read_timeout() {
    let mut config = test_config();
    config.header_read_timeout = ms(1000);
    let gw = Gateway::start(config).await.unwrap();
    // A head trickled one header line every 300 ms never completes.
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    let start = Instant::now();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\n")
        .await
        .unwrap();
    let (mut rd, mut wr) = s.split();
    let trickle = async {
        loop {
            sleep(ms(300)).await;
            if wr.write_all(b"x-slow: 1\r\n").await.is_err() {
                return;
            }
        }
    };
    let closed = async {
        let mut buf = [0u8; 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::select! {
        () = closed => {}
        () = trickle => {}
    }
    assert_eq!(start.elapsed(), ms(1000), "closed when the head was due");
    // A connection that sends nothing at all is closed the same way.
    let mut silent = TcpStream::connect(gw.addr()).await.unwrap();
    let start = Instant::now();
    until_closed(&mut silent).await;
    assert_eq!(start.elapsed(), ms(1000));
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn kept_alive_connections_idle_for_the_keep_alive_timeout() {
    let mut config = test_config();
    config.header_read_timeout = ms(1000);
    config.keep_alive_timeout = ms(3000);
    let gw = Gateway::start(config).await.unwrap();
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    healthz(&mut s).await;
    // Idle longer than the header read timeout: still open, the next request is served.
    sleep(ms(2000)).await;
    healthz(&mut s).await;
    let idle_from = Instant::now();
    assert_eq!(until_closed(&mut s).await, None, "a clean close");
    assert_eq!(idle_from.elapsed(), ms(3000));
    // A head begun on an idle connection is due within the header read timeout.
    let mut s = TcpStream::connect(gw.addr()).await.unwrap();
    healthz(&mut s).await;
    sleep(ms(500)).await;
    s.write_all(b"GET /healthz HTTP/1.1\r\n").await.unwrap();
    let begun = Instant::now();
    until_closed(&mut s).await;
    assert_eq!(begun.elapsed(), ms(1000));
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn connections_beyond_the_cap_are_closed() {
    let mut config = test_config();
    config.max_connections = 2;
    let gw = Gateway::start(config).await.unwrap();
    let mut first = TcpStream::connect(gw.addr()).await.unwrap();
    let second = TcpStream::connect(gw.addr()).await.unwrap();
    let mut third = TcpStream::connect(gw.addr()).await.unwrap();
    let start = Instant::now();
    let _ = third.write_all(HEALTHZ).await;
    let end = until_closed(&mut third).await;
    assert!(
        matches!(end, None | Some(ErrorKind::ConnectionReset)),
        "{end:?}"
    );
    assert_eq!(start.elapsed(), Duration::ZERO, "closed at once");
    // The connections within the cap are served.
    healthz(&mut first).await;
    // Once one closes, a new connection is served again.
    drop(second);
    let mut served = false;
    for _ in 0..100 {
        let mut next = TcpStream::connect(gw.addr()).await.unwrap();
        next.write_all(HEALTHZ).await.unwrap();
        let mut buf = [0u8; 64];
        if let Ok(n) = next.read(&mut buf).await
            && buf[..n].starts_with(b"HTTP/1.1 200 OK")
        {
            served = true;
            break;
        }
        sleep(ms(10)).await;
    }
    assert!(served, "a freed place is taken again");
    gw.shutdown().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn upstream_connections_have_nodelay() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let uri = format!("http://{}", listener.local_addr().unwrap())
        .parse()
        .unwrap();
    let io = upstream_connector().oneshot(uri).await.unwrap();
    assert!(io.inner().nodelay().unwrap());
}

#[test]
fn connection_limits_come_from_flags_the_file_and_defaults() {
    use clap::Parser;
    let c = Config::resolve(Default::default(), &Args::default()).unwrap();
    assert_eq!(
        (
            c.header_read_timeout,
            c.keep_alive_timeout,
            c.max_connections
        ),
        (Duration::from_secs(10), Duration::from_secs(75), 4096)
    );
    let file = "header_read_timeout = \"2s\"\nkeep_alive_timeout = \"30s\"\nmax_connections = 10\n";
    let args = Args::try_parse_from(["gateway", "--max-connections", "20"]).unwrap();
    let c = Config::resolve(Config::parse_file(file).unwrap(), &args).unwrap();
    assert_eq!(
        (
            c.header_read_timeout,
            c.keep_alive_timeout,
            c.max_connections
        ),
        (Duration::from_secs(2), Duration::from_secs(30), 20)
    );
    let resolve = |toml: &str| {
        Config::resolve(Config::parse_file(toml).unwrap(), &Args::default())
            .map(|_| ())
            .unwrap_err()
            .to_string()
    };
    assert!(resolve("max_connections = 0").contains("max_connections"));
    assert!(resolve("header_read_timeout = \"0ms\"").contains("header_read_timeout"));
    assert!(resolve("keep_alive_timeout = \"0s\"").contains("keep_alive_timeout"));
}

#[tokio::test(start_paused = true)]
async fn http2_connections_are_served_and_idle_past_the_header_read_timeout() {
    let mut config = test_config();
    config.header_read_timeout = ms(1000);
    config.keep_alive_timeout = ms(3000);
    let gw = Gateway::start(config).await.unwrap();
    let h2: Client<HttpConnector, Full<Bytes>> = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build_http();
    for _ in 0..2 {
        let req = Request::post(format!("http://{}/v1/chat/completions", gw.addr()))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from_static(CHAT.as_bytes())))
            .unwrap();
        let res = h2.request(req).await.unwrap();
        assert_eq!(res.version(), http::Version::HTTP_2);
        let text = body_text(res).await;
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        // Idle longer than the header read timeout, shorter than the keep-alive timeout.
        sleep(ms(2000)).await;
    }
    gw.shutdown().await.unwrap();
}
