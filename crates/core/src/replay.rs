//! Request bodies that can be sent more than once.
//!
//! A hedge (or any retrying layer) must send the same request body to two replicas. [`ReplayBody`]
//! buffers a request body once, up to a cap (default [`DEFAULT_REPLAY_CAP`]), and hands out clones
//! that each replay it from the start. A body over the cap is *not replayable*: it is handed on
//! exactly once, the buffered prefix first and then the rest of the original body, so nothing is
//! lost or reordered. A body whose `size_hint` already says it is over the cap is not read at all.
//!
//! Works for any [`http_body::Body`]: axum's `Body`, hyper's `Incoming`, `Full<Bytes>`, tonic's
//! `Body`. Buffered data is kept as [`Bytes`] (taken with `Buf::copy_to_bytes`, which does not copy
//! when the data already is `Bytes`) and yielded as the body's own data type (`B::Data:
//! From<Bytes>`, which every hyper, axum and tonic body has), so a `ReplayBody<B>` has the data
//! type of `B`.

use std::collections::VecDeque;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use pin_project_lite::pin_project;

/// Default replay cap: 4 MiB.
///
/// Chat requests with long conversations run to a few hundred KiB; multimodal requests with
/// inline images can be larger and are better left unhedged than held in memory twice.
pub const DEFAULT_REPLAY_CAP: usize = 4 << 20;

#[derive(Debug)]
struct Buffered {
    frames: Vec<Bytes>,
    trailers: Option<HeaderMap>,
    len: usize,
}

pin_project! {
    /// A request body that is either fully buffered and replayable, or passed on once.
    ///
    /// Built by [`ReplayBody::buffer`] (reads the body up to the cap) or
    /// [`ReplayBody::passthrough`] (never replayable, no cost).
    pub struct ReplayBody<B> {
        #[pin]
        inner: Inner<B>,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner<B> {
        Replay { buf: Arc<Buffered>, next: usize, trailers_sent: bool },
        Prefixed { prefix: VecDeque<Bytes>, #[pin] rest: B },
        Passthrough { #[pin] body: B },
    }
}

impl<B> fmt::Debug for ReplayBody<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.inner {
            Inner::Replay { buf, next, .. } => f
                .debug_struct("ReplayBody::Replay")
                .field("len", &buf.len)
                .field("next_frame", next)
                .finish(),
            Inner::Prefixed { prefix, .. } => f
                .debug_struct("ReplayBody::Prefixed")
                .field("buffered_frames", &prefix.len())
                .finish_non_exhaustive(),
            Inner::Passthrough { .. } => f.write_str("ReplayBody::Passthrough"),
        }
    }
}

impl<B> ReplayBody<B> {
    /// Wraps `body` without buffering: never replayable.
    pub fn passthrough(body: B) -> Self {
        ReplayBody {
            inner: Inner::Passthrough { body },
        }
    }

    /// A replayable body made of `data` (and no trailers).
    pub fn from_bytes(data: Bytes) -> Self {
        let len = data.len();
        let frames = if data.is_empty() {
            Vec::new()
        } else {
            vec![data]
        };
        replay(frames, None, len)
    }

    /// Reads `body` up to `cap` bytes. The future resolves to a replayable body when the whole
    /// body fit, or to a not-replayable one that still yields every byte otherwise. A body that
    /// fails while being read resolves to its error.
    pub fn buffer(body: B, cap: usize) -> Buffering<B>
    where
        B: Body,
    {
        Buffering {
            body: Some(body),
            cap,
            frames: Vec::new(),
            len: 0,
        }
    }

    /// For a replayable body: its bytes in one piece, and the body (replaying that one piece
    /// when it was buffered in several frames; trailers kept).
    pub(crate) fn contiguous(self) -> Option<(Bytes, Self)> {
        let joined = self.bytes()?;
        let Inner::Replay { buf, .. } = &self.inner else {
            return None;
        };
        if let [] | [_] = buf.frames.as_slice() {
            return Some((joined, self));
        }
        let body = replay(vec![joined.clone()], buf.trailers.clone(), buf.len);
        Some((joined, body))
    }

    /// For a replayable body: its bytes in one piece (copied when it was buffered in several
    /// frames), for a layer that reads the request it replays (to build a continuation, say).
    pub fn bytes(&self) -> Option<Bytes> {
        let Inner::Replay { buf, .. } = &self.inner else {
            return None;
        };
        Some(match buf.frames.as_slice() {
            [] => Bytes::new(),
            [one] => one.clone(),
            frames => {
                let mut joined = BytesMut::with_capacity(buf.len);
                for frame in frames {
                    joined.extend_from_slice(frame);
                }
                joined.freeze()
            }
        })
    }

    /// Whether [`try_clone`](ReplayBody::try_clone) succeeds.
    pub fn is_replayable(&self) -> bool {
        matches!(self.inner, Inner::Replay { .. })
    }

    /// The buffered length in bytes, for a replayable body.
    pub fn replay_len(&self) -> Option<usize> {
        match &self.inner {
            Inner::Replay { buf, .. } => Some(buf.len),
            _ => None,
        }
    }

    /// A fresh copy that replays the body from its start, when the body is replayable.
    pub fn try_clone(&self) -> Option<Self> {
        match &self.inner {
            Inner::Replay { buf, .. } => Some(ReplayBody {
                inner: Inner::Replay {
                    buf: buf.clone(),
                    next: 0,
                    trailers_sent: false,
                },
            }),
            _ => None,
        }
    }
}

impl<B> Body for ReplayBody<B>
where
    B: Body,
    B::Data: From<Bytes>,
{
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        match self.project().inner.project() {
            InnerProj::Replay {
                buf,
                next,
                trailers_sent,
            } => {
                if let Some(f) = buf.frames.get(*next) {
                    *next += 1;
                    return Poll::Ready(Some(Ok(Frame::data(f.clone().into()))));
                }
                if !*trailers_sent {
                    *trailers_sent = true;
                    if let Some(t) = &buf.trailers {
                        return Poll::Ready(Some(Ok(Frame::trailers(t.clone()))));
                    }
                }
                Poll::Ready(None)
            }
            InnerProj::Prefixed { prefix, rest } => {
                if let Some(f) = prefix.pop_front() {
                    return Poll::Ready(Some(Ok(Frame::data(f.into()))));
                }
                rest.poll_frame(cx)
            }
            InnerProj::Passthrough { body } => body.poll_frame(cx),
        }
    }

    fn is_end_stream(&self) -> bool {
        match &self.inner {
            Inner::Replay {
                buf,
                next,
                trailers_sent,
            } => *next >= buf.frames.len() && (*trailers_sent || buf.trailers.is_none()),
            Inner::Prefixed { prefix, rest } => prefix.is_empty() && rest.is_end_stream(),
            Inner::Passthrough { body } => body.is_end_stream(),
        }
    }

    fn size_hint(&self) -> SizeHint {
        match &self.inner {
            Inner::Replay { buf, next, .. } => {
                let left: usize = buf.frames[(*next).min(buf.frames.len())..]
                    .iter()
                    .map(Bytes::len)
                    .sum();
                SizeHint::with_exact(left as u64)
            }
            Inner::Prefixed { prefix, rest } => {
                let pre: u64 = prefix.iter().map(|b| b.len() as u64).sum();
                let h = rest.size_hint();
                let mut out = SizeHint::new();
                out.set_lower(h.lower() + pre);
                if let Some(u) = h.upper() {
                    out.set_upper(u + pre);
                }
                out
            }
            Inner::Passthrough { body } => body.size_hint(),
        }
    }
}

/// Future of [`ReplayBody::buffer`].
pub struct Buffering<B> {
    body: Option<B>,
    cap: usize,
    frames: Vec<Bytes>,
    len: usize,
}

impl<B> fmt::Debug for Buffering<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffering")
            .field("cap", &self.cap)
            .field("buffered", &self.len)
            .finish_non_exhaustive()
    }
}

impl<B> Future for Buffering<B>
where
    B: Body + Unpin,
{
    type Output = Result<ReplayBody<B>, B::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        loop {
            let Some(body) = this.body.as_mut() else {
                // Polled after completion: nothing left to give.
                return Poll::Pending;
            };
            let hinted = body.size_hint().lower().saturating_add(this.len as u64);
            if this.frames.is_empty() && hinted > this.cap as u64 {
                let body = this.body.take().expect("checked above");
                return Poll::Ready(Ok(ReplayBody::passthrough(body)));
            }
            if body.is_end_stream() {
                return Poll::Ready(Ok(this.finish(None)));
            }
            match ready!(Pin::new(&mut *body).poll_frame(cx)) {
                None => return Poll::Ready(Ok(this.finish(None))),
                Some(Err(e)) => {
                    this.body = None;
                    return Poll::Ready(Err(e));
                }
                Some(Ok(frame)) => match frame.into_data() {
                    Ok(mut data) => {
                        let n = data.remaining();
                        if n == 0 {
                            continue;
                        }
                        let data = data.copy_to_bytes(n);
                        this.frames.push(data);
                        this.len += n;
                        if this.len > this.cap {
                            let rest = this.body.take().expect("body present");
                            let prefix = std::mem::take(&mut this.frames).into();
                            return Poll::Ready(Ok(ReplayBody {
                                inner: Inner::Prefixed { prefix, rest },
                            }));
                        }
                    }
                    Err(frame) => {
                        let trailers = frame.into_trailers().ok();
                        return Poll::Ready(Ok(this.finish(trailers)));
                    }
                },
            }
        }
    }
}

impl<B> Buffering<B> {
    /// The cap this future buffers up to.
    pub(crate) fn cap(&self) -> usize {
        self.cap
    }

    fn finish(&mut self, trailers: Option<HeaderMap>) -> ReplayBody<B> {
        self.body = None;
        replay(std::mem::take(&mut self.frames), trailers, self.len)
    }
}

fn replay<B>(frames: Vec<Bytes>, trailers: Option<HeaderMap>, len: usize) -> ReplayBody<B> {
    ReplayBody {
        inner: Inner::Replay {
            buf: Arc::new(Buffered {
                frames,
                trailers,
                len,
            }),
            next: 0,
            trailers_sent: false,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Full};

    async fn collect<B>(b: ReplayBody<B>) -> Vec<u8>
    where
        B: Body,
        B::Data: From<Bytes>,
        B::Error: fmt::Debug,
    {
        b.collect().await.unwrap().to_bytes().to_vec()
    }

    #[tokio::test]
    async fn small_body_replays_many_times() {
        let body = ReplayBody::buffer(Full::new(Bytes::from_static(b"{\"stream\":true}")), 1024)
            .await
            .unwrap();
        assert!(body.is_replayable());
        assert_eq!(body.replay_len(), Some(15));
        let a = body.try_clone().unwrap();
        let b = body.try_clone().unwrap();
        assert_eq!(a.size_hint().exact(), Some(15));
        assert_eq!(collect(a).await, b"{\"stream\":true}");
        assert_eq!(collect(b).await, b"{\"stream\":true}");
        assert_eq!(collect(body).await, b"{\"stream\":true}");
    }

    #[tokio::test]
    async fn over_cap_by_hint_is_not_read() {
        let body = ReplayBody::buffer(Full::new(Bytes::from(vec![7u8; 100])), 10)
            .await
            .unwrap();
        assert!(!body.is_replayable());
        assert!(body.try_clone().is_none());
        assert_eq!(collect(body).await, vec![7u8; 100]);
    }

    #[tokio::test]
    async fn over_cap_while_reading_keeps_every_byte_in_order() {
        let frames: Vec<Frame<Bytes>> = (0u8..10)
            .map(|i| Frame::data(Bytes::from(vec![i; 4])))
            .chain(std::iter::once(Frame::trailers(HeaderMap::new())))
            .collect();
        let body = ReplayBody::buffer(frames_body(frames), 9).await.unwrap();
        assert!(!body.is_replayable());
        let expected: Vec<u8> = (0u8..10).flat_map(|i| vec![i; 4]).collect();
        assert_eq!(collect(body).await, expected);
    }

    #[tokio::test]
    async fn trailers_are_replayed() {
        let mut t = HeaderMap::new();
        t.insert("x-check", "1".parse().unwrap());
        let frames = vec![
            Frame::data(Bytes::from_static(b"ab")),
            Frame::data(Bytes::from_static(b"cd")),
            Frame::trailers(t),
        ];
        let body = ReplayBody::buffer(frames_body(frames), 64).await.unwrap();
        assert!(body.is_replayable());
        for _ in 0..2 {
            let c = body.try_clone().unwrap().collect().await.unwrap();
            assert_eq!(c.trailers().unwrap()["x-check"], "1");
            assert_eq!(c.to_bytes(), Bytes::from_static(b"abcd"));
        }
    }

    /// Polls `b` by hand, checking `size_hint` and `is_end_stream` before every frame, and
    /// returns the data and whether trailers came.
    fn drain<B: Body + Unpin>(mut b: ReplayBody<B>, len: u64) -> (Vec<u8>, bool)
    where
        B::Data: From<Bytes>,
        B::Error: fmt::Debug,
    {
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let (mut out, mut trailers) = (Vec::new(), false);
        assert_eq!(b.size_hint().exact(), Some(len));
        assert_eq!(b.is_end_stream(), len == 0);
        loop {
            let left = len - out.len() as u64;
            assert_eq!(b.size_hint().exact(), Some(left));
            match Pin::new(&mut b).poll_frame(&mut cx) {
                Poll::Ready(Some(Ok(f))) => match f.into_data() {
                    Ok(mut d) => out.extend_from_slice(&d.copy_to_bytes(d.remaining())),
                    Err(f) => trailers = f.is_trailers(),
                },
                Poll::Ready(None) => break,
                other => panic!("unexpected poll: {:?}", other.map(|o| o.map(|r| r.is_ok()))),
            }
        }
        assert!(b.is_end_stream());
        assert_eq!(b.size_hint().exact(), Some(0));
        assert!(matches!(
            Pin::new(&mut b).poll_frame(&mut cx),
            Poll::Ready(None)
        ));
        (out, trailers)
    }

    #[tokio::test]
    async fn one_frame_body_replays_identically_many_times() {
        let data = Bytes::from_static(b"{\"model\":\"m\",\"stream\":true}");
        let n = data.len();
        let body = ReplayBody::buffer(Full::new(data.clone()), 1024)
            .await
            .unwrap();
        assert!(body.is_replayable());
        assert_eq!(body.replay_len(), Some(n));
        assert!(!body.is_end_stream());
        assert_eq!(body.size_hint().exact(), Some(n as u64));
        // Same as a body built from the bytes directly.
        assert_eq!(
            format!("{body:?}"),
            format!("{:?}", ReplayBody::<Full<Bytes>>::from_bytes(data.clone()))
        );
        for _ in 0..50 {
            let c = body.try_clone().unwrap();
            assert_eq!(c.replay_len(), Some(n));
            // A clone of a clone replays from the start too.
            let cc = c.try_clone().unwrap();
            assert_eq!(drain(c, n as u64), (data.to_vec(), false));
            assert_eq!(drain(cc, n as u64), (data.to_vec(), false));
        }
        // The original is untouched by its clones, and a drained body still clones whole.
        assert_eq!(body.replay_len(), Some(n));
        assert_eq!(body.size_hint().exact(), Some(n as u64));
        let again = body.try_clone().unwrap();
        assert_eq!(drain(body, n as u64), (data.to_vec(), false));
        assert_eq!(drain(again, n as u64), (data.to_vec(), false));
    }

    #[tokio::test]
    async fn one_frame_body_matches_the_multi_frame_path() {
        // One frame without trailers, one frame with trailers, and the same bytes split in two
        // give the same data and the same hints at every step.
        let mut t = HeaderMap::new();
        t.insert("x-check", "1".parse().unwrap());
        let one = ReplayBody::buffer(
            frames_body(vec![Frame::data(Bytes::from_static(b"abcd"))]),
            64,
        )
        .await
        .unwrap();
        let one_t = ReplayBody::buffer(
            frames_body(vec![
                Frame::data(Bytes::from_static(b"abcd")),
                Frame::trailers(t),
            ]),
            64,
        )
        .await
        .unwrap();
        let two = ReplayBody::buffer(
            frames_body(vec![
                Frame::data(Bytes::from_static(b"ab")),
                Frame::data(Bytes::from_static(b"cd")),
            ]),
            64,
        )
        .await
        .unwrap();
        for b in [&one, &one_t, &two] {
            assert!(b.is_replayable());
            assert_eq!(b.replay_len(), Some(4));
        }
        for _ in 0..3 {
            assert_eq!(
                drain(one.try_clone().unwrap(), 4),
                (b"abcd".to_vec(), false)
            );
            assert_eq!(
                drain(one_t.try_clone().unwrap(), 4),
                (b"abcd".to_vec(), true)
            );
            assert_eq!(
                drain(two.try_clone().unwrap(), 4),
                (b"abcd".to_vec(), false)
            );
        }
    }

    #[tokio::test]
    async fn empty_and_one_frame_over_cap_bodies() {
        let empty = ReplayBody::buffer(frames_body(vec![]), 8).await.unwrap();
        assert!(empty.is_replayable());
        assert_eq!(empty.replay_len(), Some(0));
        assert!(empty.is_end_stream());
        assert_eq!(drain(empty.try_clone().unwrap(), 0), (vec![], false));
        let from_empty = ReplayBody::<Full<Bytes>>::from_bytes(Bytes::new());
        assert_eq!(drain(from_empty, 0), (vec![], false));
        // A single frame over the cap (no hint) is handed on once, whole.
        let over = ReplayBody::buffer(frames_body(vec![Frame::data(Bytes::from(vec![3u8; 9]))]), 8)
            .await
            .unwrap();
        assert!(!over.is_replayable());
        assert_eq!(over.replay_len(), None);
        assert_eq!(collect(over).await, vec![3u8; 9]);
    }

    #[tokio::test]
    async fn passthrough_is_never_replayable() {
        let body = ReplayBody::passthrough(Full::new(Bytes::from_static(b"x")));
        assert!(!body.is_replayable());
        assert_eq!(collect(body).await, b"x");
    }

    /// A body that yields the given frames, with no size hint.
    fn frames_body(items: Vec<Frame<Bytes>>) -> FramesBody {
        FramesBody(items.into_iter().collect())
    }

    struct FramesBody(VecDeque<Frame<Bytes>>);

    impl Body for FramesBody {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(Ok))
        }
    }
}
