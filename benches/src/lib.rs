//! Benchmarks of tailguard live in `benches/`; this library holds their shared helpers.
//!
//! The in-process pieces the criterion benches share: an OpenAI chat-completions stream as
//! static frames, an in-memory [`Frames`] body, a bare [`upstream`] service, a [`request`]
//! builder, a [`drain`] loop and the [`ClonePolicy`] that `tower::hedge` baselines use.
//!
//! The functions on the per-request and per-frame paths are generic or `#[inline]`, so they are
//! compiled into each bench as if they were written there.
//!
//! Also: [`batching`], what the batching-replica benches share; [`run`], the start time and load average every bench writes into its JSON, and
//! [`tables`], the renderer of the READMEs' benchmark tables from that JSON.

pub mod batching;
pub mod run;
pub mod tables;

use std::convert::Infallible;
use std::hint::black_box;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{Request, Response};
use http_body::{Body, Frame};
use http_body_util::Full;
use tower::{Service, ServiceExt};

/// Content chunks in the long stream of the per-frame benchmarks.
pub const CONTENT_CHUNKS: usize = 1_000;

/// The body of the chat-completions request every bench sends.
pub const REQUEST: &[u8] =
    br#"{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"Say hello"}]}"#;

fn leak(s: String) -> Bytes {
    Bytes::from_static(Box::leak(s.into_boxed_str()).as_bytes())
}

/// Role chunk, `content` content chunks, finish chunk, `[DONE]`: one event per frame, as
/// static bytes (cloning them is free).
pub fn openai_stream(content: usize) -> Arc<[Bytes]> {
    const WORDS: [&str; 8] = [
        " the", " quick", " brown", " fox", " jumps", " over", " a", " dog",
    ];
    let head = r#"{"id":"chatcmpl-8f7a6b5c4d3e2f1a0b9c8d7e","object":"chat.completion.chunk","created":1796053661,"model":"gpt-4o-2024-08-06","system_fingerprint":"fp_5f20662549","choices":[{"index":0,"delta":"#;
    let mut frames = Vec::with_capacity(content + 3);
    frames.push(leak(format!(
        "data: {head}{{\"role\":\"assistant\",\"content\":\"\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
    )));
    for i in 0..content {
        let word = WORDS[i % WORDS.len()];
        frames.push(leak(format!(
            "data: {head}{{\"content\":\"{word}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        )));
    }
    frames.push(leak(format!(
        "data: {head}{{}},\"logprobs\":null,\"finish_reason\":\"stop\"}}]}}\n\n"
    )));
    frames.push(Bytes::from_static(b"data: [DONE]\n\n"));
    frames.into()
}

/// How many versions of a stream a bench upstream serves in turn (see [`variants`]).
pub const VARIANTS: usize = 8;

/// `VARIANTS` versions of `frames` that differ only in their chat id (the byte after
/// `chatcmpl-` is `a`, `b`, …; frames without an id are shared), same length each.
///
/// Real completions each carry their own id, so no two requests' events are byte-identical.
/// Served in turn, the versions keep every request's events new to anything that caches by
/// content (branch predictors, caches of decoded events), as in real traffic. (tailguard-core
/// once kept a per-thread memo of its pre-token decisions, keyed by content, that identical
/// bytes would have let hit across requests; it was removed in commit a6b9e31.)
pub fn variants(frames: &[Bytes]) -> Arc<[Arc<[Bytes]>]> {
    const ID: &[u8] = b"chatcmpl-";
    (0..VARIANTS)
        .map(|k| {
            frames
                .iter()
                .map(|f| match memchr_find(f, ID) {
                    Some(i) if i + ID.len() < f.len() => {
                        let mut v = f.to_vec();
                        v[i + ID.len()] = b'a' + k as u8;
                        // Static, as `openai_stream`'s: cloning never allocates.
                        Bytes::from_static(Box::leak(v.into_boxed_slice()))
                    }
                    _ => f.clone(),
                })
                .collect()
        })
        .collect()
}

fn memchr_find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// An in-memory body whose every frame is ready.
#[derive(Debug)]
pub struct Frames {
    frames: Arc<[Bytes]>,
    next: usize,
}

impl Frames {
    /// A body yielding `frames` in order, one data frame each.
    #[inline]
    pub fn new(frames: Arc<[Bytes]>) -> Self {
        Frames { frames, next: 0 }
    }
}

impl Body for Frames {
    type Data = Bytes;
    type Error = Infallible;

    #[inline]
    fn poll_frame(
        mut self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let i = self.next;
        self.next += 1;
        Poll::Ready(self.frames.get(i).cloned().map(|b| Ok(Frame::data(b))))
    }

    #[inline]
    fn is_end_stream(&self) -> bool {
        self.next >= self.frames.len()
    }
}

/// The upstream: answers every request at once with the stream, each time in the next of its
/// [`variants`] (same bytes but the chat id).
pub fn upstream<B>(
    frames: Arc<[Bytes]>,
) -> impl Service<Request<B>, Response = Response<Frames>, Error = Infallible, Future: Send> + Clone + Send
{
    let versions = variants(&frames);
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    tower::service_fn(move |_req: Request<B>| {
        let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % VARIANTS;
        let frames = versions[k].clone();
        async move {
            Ok(Response::builder()
                .header("content-type", "text/event-stream")
                .body(Frames::new(frames))
                .unwrap())
        }
    })
}

/// A streaming chat-completions request with the [`REQUEST`] body.
#[inline]
pub fn request() -> Request<Full<Bytes>> {
    Request::post("/v1/chat/completions")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from_static(REQUEST)))
        .unwrap()
}

/// Polls every frame; returns the bytes seen.
///
/// # Panics
///
/// On a body error, or if the body is ever `Pending` (an in-memory body is always ready).
pub fn drain<B: Body>(body: B) -> usize {
    let mut body = std::pin::pin!(body);
    let mut cx = Context::from_waker(Waker::noop());
    let mut n = 0;
    loop {
        match body.as_mut().poll_frame(&mut cx) {
            Poll::Ready(Some(Ok(f))) => n += f.data_ref().map_or(0, Buf::remaining),
            Poll::Ready(Some(Err(_))) => panic!("body error"),
            Poll::Ready(None) => return black_box(n),
            Poll::Pending => panic!("in-memory body is always ready"),
        }
    }
}

/// One request through `svc`, its body read to the end.
///
/// # Panics
///
/// If `svc` fails, or as [`drain`] does.
pub async fn one<S, B>(svc: &mut S) -> usize
where
    S: Service<Request<Full<Bytes>>, Response = Response<B>>,
    S::Error: std::fmt::Debug,
    B: Body,
{
    let res = svc.ready().await.unwrap().call(request()).await.unwrap();
    drain(res.into_body())
}

/// The `tower::hedge` policy of the baselines: every request may be retried, and is cloned
/// head and (buffered) body.
#[derive(Clone, Debug)]
pub struct ClonePolicy;

impl tower::hedge::Policy<Request<Full<Bytes>>> for ClonePolicy {
    #[inline]
    fn clone_request(&self, req: &Request<Full<Bytes>>) -> Option<Request<Full<Bytes>>> {
        let mut r = Request::new(req.body().clone());
        *r.method_mut() = req.method().clone();
        *r.uri_mut() = req.uri().clone();
        *r.headers_mut() = req.headers().clone();
        Some(r)
    }

    #[inline]
    fn can_retry(&self, _: &Request<Full<Bytes>>) -> bool {
        true
    }
}

/// `tower::hedge` over `inner` as the baselines configure it: 10 data points, p90, 60 s period.
pub fn tower_hedge<S>(inner: S) -> tower::hedge::Hedge<S, ClonePolicy>
where
    S: Service<Request<Full<Bytes>>> + Clone,
    S::Error: Into<tower::BoxError>,
{
    tower::hedge::Hedge::new(inner, ClonePolicy, 10, 0.9, Duration::from_secs(60))
}
