//! Process-level helpers of the cluster tests: the gateway binary and redis-server as
//! real child processes (killed on drop, so nothing outlives a test), a streaming HTTP client,
//! and the mock replicas in-process (their counters are what the tests assert on).
#![allow(dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use tailguard_mock::MockServer;
use tailguard_test_support::cannot_run;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Far longer than anything here may take: a wait still unfinished then has hung.
pub const HANG: Duration = Duration::from_secs(60);

/// The URL of the test Redis (`TAILGUARD_REDIS_URL`, set by scripts/redis.sh), or `None` after
/// saying why the test cannot run ([`cannot_run`]: a failure under CI).
pub fn redis_url(test: &str) -> Option<String> {
    match std::env::var("TAILGUARD_REDIS_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            cannot_run(
                test,
                "TAILGUARD_REDIS_URL is unset (run scripts/test.sh, which starts a private \
                 redis-server)",
            );
            None
        }
    }
}

/// The gateway binary that cargo builds for this package's integration tests.
pub fn gateway_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tailguard-gateway"))
}

/// Both [`redis_url`] and [`gateway_bin`], or `None` (the test cannot run).
pub fn setup(test: &str) -> Option<(String, PathBuf)> {
    Some((redis_url(test)?, gateway_bin()))
}

/// A cluster name unique to this test run, so that tests sharing one Redis never meet.
pub fn unique(name: &str) -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!("{name}-{}-{}", std::process::id(), t.as_nanos())
}

/// A free port on 127.0.0.1 (nothing listens on it once this returns).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// A mock replica on a free port with `script` as its default script.
pub async fn mock(script: &str) -> MockServer {
    MockServer::start(script.parse().expect("mock script"))
        .await
        .expect("mock replica")
}

/// Polls `cond` every 10 ms until it holds; panics after [`HANG`].
pub async fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(HANG, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    waited
        .await
        .unwrap_or_else(|_| panic!("hung waiting for {what}"));
}

/// A gateway process, SIGKILLed on drop.
pub struct GatewayProc {
    child: Child,
    /// Where it listens.
    pub addr: SocketAddr,
    /// Its output so far (stdout and stderr), for failure messages.
    pub log: Arc<Mutex<String>>,
}

impl GatewayProc {
    /// Starts `bin --listen 127.0.0.1:0 --model mock-llm ARGS` and waits for its address.
    pub async fn start(bin: &PathBuf, args: &[String]) -> GatewayProc {
        let mut child = Command::new(bin)
            .args(["--listen", "127.0.0.1:0", "--model", "mock-llm"])
            .args(args)
            // Warnings, and admission's "cluster backend back".
            .env("RUST_LOG", "warn,tailguard_admission=info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn the gateway");
        let log = Arc::new(Mutex::new(String::new()));
        let (tx, rx) = tokio::sync::oneshot::channel();
        let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        let out = log.clone();
        // Drains stdout for the whole run (a full pipe would block the gateway's logging).
        tokio::spawn(async move {
            let mut tx = Some(tx);
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(a) = line.strip_prefix("tailguard gateway listening on http://")
                    && let (Some(tx), Ok(addr)) = (tx.take(), a.trim().parse::<SocketAddr>())
                {
                    let _ = tx.send(addr);
                }
                push(&out, &line);
            }
        });
        let mut errs = BufReader::new(child.stderr.take().expect("stderr")).lines();
        let out = log.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = errs.next_line().await {
                push(&out, &line);
            }
        });
        let addr = match tokio::time::timeout(HANG, rx).await {
            Ok(Ok(addr)) => addr,
            _ => panic!(
                "the gateway did not start: {}",
                log.lock().unwrap_or_else(|e| e.into_inner())
            ),
        };
        GatewayProc { child, addr, log }
    }

    /// SIGKILL, and waits until the process is gone.
    pub async fn kill(&mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(HANG, self.child.wait()).await;
    }

    /// Its output so far.
    pub fn output(&self) -> String {
        self.log.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn push(log: &Mutex<String>, line: &str) {
    let mut l = log.lock().unwrap_or_else(|e| e.into_inner());
    l.push_str(line);
    l.push('\n');
}

/// A redis-server of the test's own on `port` (to kill and restart), SIGKILLed on drop.
pub struct RedisProc {
    child: Child,
    dir: PathBuf,
}

impl RedisProc {
    /// Starts redis-server on `port` and waits until it answers, or `None` (after saying so)
    /// when it is not installed.
    pub async fn start(port: u16, test: &str) -> Option<RedisProc> {
        let dir = std::env::temp_dir().join(format!("tailguard-cluster-redis-{port}"));
        std::fs::create_dir_all(&dir).ok()?;
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .kill_on_drop(true)
            .spawn();
        let Ok(child) = child else {
            cannot_run(
                test,
                "redis-server is not installed (scripts/redis.sh installs it)",
            );
            return None;
        };
        let up = tokio::time::timeout(HANG, async {
            while tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_err()
            {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        up.await.expect("redis-server did not start");
        Some(RedisProc { child, dir })
    }

    /// SIGKILL, and waits until the process is gone.
    pub async fn kill(mut self) {
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(HANG, self.child.wait()).await;
    }
}

impl Drop for RedisProc {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// An HTTP/1.1 client of the gateways.
#[derive(Clone)]
pub struct Client(HyperClient<HttpConnector, Full<Bytes>>);

/// A finished request: what the client saw.
#[derive(Clone, Debug)]
pub struct Answer {
    /// The status.
    pub status: StatusCode,
    /// Whether a `Retry-After` came with it.
    pub retry_after: bool,
    /// The `code` of an OpenAI error body (empty otherwise).
    pub code: String,
    /// Whether a 200 stream ended with `data: [DONE]`.
    pub done: bool,
}

impl Answer {
    /// Admitted and streamed to its end, or refused with 429/503 and a `Retry-After`.
    pub fn answered(&self) -> bool {
        (self.status == StatusCode::OK && self.done)
            || (matches!(self.status.as_u16(), 429 | 503) && self.retry_after)
    }
}

impl Default for Client {
    fn default() -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        Client(
            HyperClient::builder(TokioExecutor::new())
                .pool_max_idle_per_host(256)
                .build(http),
        )
    }
}

impl Client {
    /// Sends a streamed chat completion with the mock script `script` to `addr` and returns
    /// the response head, its body still streaming (drop it to cancel).
    pub async fn open(&self, addr: SocketAddr, script: &str) -> http::Response<Incoming> {
        self.open_as(addr, script, None).await
    }

    /// [`open`](Self::open), for `tenant` (the `x-tenant` header) when given.
    pub async fn open_as(
        &self,
        addr: SocketAddr,
        script: &str,
        tenant: Option<&str>,
    ) -> http::Response<Incoming> {
        let body =
            r#"{"model":"mock-llm","stream":true,"messages":[{"role":"user","content":"hi"}]}"#;
        let mut req = Request::post(format!("http://{addr}/v1/chat/completions"))
            .header("content-type", "application/json")
            .header(tailguard_mock::SCRIPT_HEADER, script);
        if let Some(t) = tenant {
            req = req.header("x-tenant", t);
        }
        let req = req
            .body(Full::new(Bytes::from_static(body.as_bytes())))
            .expect("request");
        let res = tokio::time::timeout(HANG, self.0.request(req));
        res.await
            .unwrap_or_else(|_| panic!("a request to {addr} hung"))
            .unwrap_or_else(|e| panic!("request to {addr}: {e:?}"))
    }

    /// [`open`](Self::open), then reads the body to its end.
    pub async fn send(&self, addr: SocketAddr, script: &str) -> Answer {
        self.send_as(addr, script, None).await
    }

    /// [`send`](Self::send), for `tenant` (the `x-tenant` header) when given.
    pub async fn send_as(&self, addr: SocketAddr, script: &str, tenant: Option<&str>) -> Answer {
        let res = self.open_as(addr, script, tenant).await;
        let status = res.status();
        let retry_after = res.headers().contains_key(http::header::RETRY_AFTER);
        let body = tokio::time::timeout(HANG, res.into_body().collect())
            .await
            .unwrap_or_else(|_| panic!("a body from {addr} hung"))
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        let text = String::from_utf8_lossy(&body);
        let code = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
            .unwrap_or_default();
        Answer {
            status,
            retry_after,
            code,
            done: text.contains("data: [DONE]"),
        }
    }
}
