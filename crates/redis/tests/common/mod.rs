//! Shared helpers of the Redis tests: the server, a counting upstream with slow bodies.
#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame};
use tailguard_test_support::cannot_run;
use tokio::time::Sleep;

/// The URL of the test Redis (`TAILGUARD_REDIS_URL`, set by scripts/redis.sh), or `None`
/// after saying why the test cannot run ([`cannot_run`]: a failure under CI).
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

/// A pool name unique to this test run, so that tests sharing one server never meet.
pub fn pool(name: &str) -> String {
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

/// A redis-server of the test's own on `port` (to kill and restart), killed on drop.
pub struct OwnRedis {
    child: Child,
    _dir: TempDir,
}

/// A directory removed on drop.
pub struct TempDir(pub std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

impl OwnRedis {
    /// Starts redis-server on `port`, or `None` (after saying so) when it is not installed.
    pub fn start(port: u16) -> Option<Self> {
        let dir = std::env::temp_dir().join(format!("tailguard-redis-{port}"));
        std::fs::create_dir_all(&dir).ok()?;
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no", "--dir"])
            .arg(&dir)
            .stdout(Stdio::null())
            .spawn();
        let Ok(child) = child else {
            cannot_run(
                "own redis-server",
                "redis-server is not installed (scripts/redis.sh installs it)",
            );
            return None;
        };
        for _ in 0..200 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Some(OwnRedis {
            child,
            _dir: TempDir(dir),
        })
    }
}

impl Drop for OwnRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Counts the streams in flight at the upstream, and the most seen at once.
#[derive(Clone, Debug, Default)]
pub struct Streams {
    pub now: Arc<AtomicUsize>,
    pub max: Arc<AtomicUsize>,
    pub total: Arc<AtomicUsize>,
}

impl Streams {
    fn open(&self) {
        let n = self.now.fetch_add(1, Ordering::SeqCst) + 1;
        self.max.fetch_max(n, Ordering::SeqCst);
        self.total.fetch_add(1, Ordering::SeqCst);
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::SeqCst)
    }
}

/// A body that yields one frame after `Sleep` and counts as a stream until then.
pub struct SlowBody {
    sleep: Pin<Box<Sleep>>,
    streams: Option<Streams>,
}

impl SlowBody {
    fn new(d: Duration, streams: &Streams) -> Self {
        streams.open();
        SlowBody {
            sleep: Box::pin(tokio::time::sleep(d)),
            streams: Some(streams.clone()),
        }
    }

    fn close(&mut self) {
        if let Some(s) = self.streams.take() {
            s.now.fetch_sub(1, Ordering::SeqCst);
        }
    }
}

impl Drop for SlowBody {
    fn drop(&mut self) {
        self.close();
    }
}

impl Body for SlowBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        if self.streams.is_none() {
            return Poll::Ready(None);
        }
        ready!(self.sleep.as_mut().poll(cx));
        // The stream ends with this frame: it stops counting before the gate releases.
        self.close();
        Poll::Ready(Some(Ok(Frame::data(Bytes::from_static(
            b"data: [DONE]\n\n",
        )))))
    }

    fn is_end_stream(&self) -> bool {
        self.streams.is_none()
    }
}

/// An upstream whose every answer streams for `d`.
pub fn upstream(
    d: Duration,
    streams: Streams,
) -> impl tower::Service<
    Request<()>,
    Response = Response<SlowBody>,
    Error = Infallible,
    Future = std::future::Ready<Result<Response<SlowBody>, Infallible>>,
> + Clone {
    tower::service_fn(move |_req: Request<()>| {
        std::future::ready(Ok(Response::new(SlowBody::new(d, &streams))))
    })
}
