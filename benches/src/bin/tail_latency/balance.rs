//! tower's p2c balancer as the bench runs it: `tower::balance::p2c::Balance` over
//! `tower::load::PendingRequests`, each request counted in flight until its response body ends
//! (a streaming server sends its head at once, so counting to the head, tower's
//! `CompleteOnResponse`, would count almost nothing), and optionally one slot per replica, also
//! held to the body's end, that the balancer sees as readiness.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use http_body_util::Full;
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use tower::ServiceBuilder;
use tower::balance::p2c::Balance;
use tower::buffer::Buffer;
use tower::discover::ServiceList;
use tower::load::{PendingRequests, TrackCompletion};
use tower::util::BoxCloneService;

use crate::upstream::{BoxError, Stack, Upstream, box_body};

/// A response body holding `H` (an in-flight handle, a slot) until it ends or is dropped.
pub(crate) struct Held<B, H> {
    inner: B,
    held: Option<H>,
}

impl<B: Body + Unpin, H: Unpin> Body for Held<B, H> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        if frame.is_none() || self.inner.is_end_stream() {
            self.held.take();
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A request is complete when its response body ends.
#[derive(Clone, Copy, Debug)]
struct CompleteOnBodyEnd;

impl<H, B> TrackCompletion<H, Response<B>> for CompleteOnBodyEnd {
    type Output = Response<Held<B, H>>;

    fn track_completion(&self, handle: H, res: Response<B>) -> Self::Output {
        res.map(|inner| Held {
            inner,
            held: Some(handle),
        })
    }
}

type Acquire = Pin<Box<dyn Future<Output = Result<OwnedSemaphorePermit, AcquireError>> + Send>>;

/// A replica with one slot: ready while the slot is free; a call holds it until the response
/// body ends.
struct Slotted {
    inner: Upstream,
    slot: Arc<Semaphore>,
    permit: Option<OwnedSemaphorePermit>,
    acquiring: Option<Acquire>,
}

impl tower::Service<Request<Full<Bytes>>> for Slotted {
    type Response = Response<Held<hyper::body::Incoming, OwnedSemaphorePermit>>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        if self.permit.is_none() {
            let slot = &self.slot;
            let acquire = self
                .acquiring
                .get_or_insert_with(|| Box::pin(slot.clone().acquire_owned()));
            let permit = ready!(acquire.as_mut().poll(cx))?;
            self.acquiring = None;
            self.permit = Some(permit);
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Full<Bytes>>) -> Self::Future {
        let permit = self.permit.take();
        let fut = tower::Service::call(&mut self.inner, req);
        Box::pin(async move {
            let res = fut.await?;
            Ok(res.map(|inner| Held {
                inner,
                held: permit,
            }))
        })
    }
}

/// Boxes a balancer over `endpoints` into a strategy's stack (behind a `Buffer`: `Balance` is
/// not `Clone`).
fn stack<S, B>(endpoints: Vec<S>) -> Stack
where
    S: tower::Service<Request<Full<Bytes>>, Response = Response<B>, Error = BoxError>,
    S: Send + 'static,
    S::Future: Send + 'static,
    B: Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    let endpoints = endpoints
        .into_iter()
        .map(|s| PendingRequests::new(s, CompleteOnBodyEnd));
    let balance = Balance::new(ServiceList::new::<Request<Full<Bytes>>>(
        endpoints.collect::<Vec<_>>(),
    ));
    BoxCloneService::new(
        ServiceBuilder::new()
            .map_response(|res: Response<_>| res.map(box_body))
            .service(Buffer::new(balance, 4096)),
    )
}

/// tower's p2c over the replicas' in-flight streams; `slots`: one slot per replica.
pub(crate) fn p2c(replicas: Vec<Upstream>, slots: Option<u32>) -> Stack {
    match slots {
        None => stack(replicas),
        Some(n) => stack(
            replicas
                .into_iter()
                .map(|inner| Slotted {
                    inner,
                    slot: Arc::new(Semaphore::new(n.max(1) as usize)),
                    permit: None,
                    acquiring: None,
                })
                .collect(),
        ),
    }
}
