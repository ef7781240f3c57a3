//! The response future of [`FirstTokenHedge`](crate::FirstTokenHedge).

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tailguard_core::{BoxError, Fail, ReplayBody, Respond};
use tower_service::Service;

use crate::answer::{self, Escape};
use crate::body::HedgeBody;
use crate::race::{Output, Race};

pin_project! {
    /// The response future of [`FirstTokenHedge`](crate::FirstTokenHedge).
    ///
    /// Resolves when a winner is committed (its first token arrived) or every attempt failed.
    /// Dropping it drops every attempt in flight, which cancels their upstream requests. In
    /// response mode ([`Respond`]) its error is the inner service's; in error mode ([`Fail`])
    /// a [`BoxError`].
    pub struct ResponseFuture<S, B, RB, M = Respond>
    where
        S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
        B: Body,
        RB: Body,
    {
        #[pin]
        kind: Kind<S::Future, Box<Race<S, B, RB>>>,
        _mode: PhantomData<fn() -> M>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, R> {
        Direct { #[pin] fut: F },
        Hedged { race: R },
    }
}

impl<S, B, RB, M> ResponseFuture<S, B, RB, M>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    B: Body,
    RB: Body,
{
    pub(crate) fn direct(fut: S::Future) -> Self {
        ResponseFuture {
            kind: Kind::Direct { fut },
            _mode: PhantomData,
        }
    }

    pub(crate) fn hedged(race: Race<S, B, RB>) -> Self {
        ResponseFuture {
            kind: Kind::Hedged {
                race: Box::new(race),
            },
            _mode: PhantomData,
        }
    }
}

impl<S, B, RB, M> fmt::Debug for ResponseFuture<S, B, RB, M>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    B: Body,
    RB: Body,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            Kind::Direct { .. } => f.write_str("ResponseFuture::Direct"),
            Kind::Hedged { race } => f.debug_tuple("ResponseFuture::Hedged").field(race).finish(),
        }
    }
}

impl<S, B, RB, M> ResponseFuture<S, B, RB, M>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: Body + Unpin,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
    RB: Body,
    RB::Data: From<Bytes>,
    RB::Error: Into<BoxError>,
{
    fn poll_escape(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Output<RB, S::Error>> {
        match self.project().kind.project() {
            KindProj::Direct { fut } => Poll::Ready(match ready!(fut.poll(cx)) {
                Ok(res) => Ok(res.map(HedgeBody::direct)),
                Err(e) => Err(Escape::Inner(e)),
            }),
            KindProj::Hedged { race } => race.poll(cx),
        }
    }
}

impl<S, B, RB> Future for ResponseFuture<S, B, RB, Respond>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: Body + Unpin,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
    RB: Body,
    RB::Data: From<Bytes>,
    RB::Error: Into<BoxError>,
{
    type Output = Result<Response<HedgeBody<RB>>, S::Error>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(match ready!(self.poll_escape(cx)) {
            Ok(res) => Ok(res),
            Err(Escape::Inner(e)) => Err(e),
            Err(Escape::Own(e, grpc)) => Ok(answer::own_failure(&e, grpc)),
        })
    }
}

impl<S, B, RB> Future for ResponseFuture<S, B, RB, Fail>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: Body + Unpin,
    B::Data: From<Bytes>,
    B::Error: Into<BoxError>,
    RB: Body,
    RB::Data: From<Bytes>,
    RB::Error: Into<BoxError>,
{
    type Output = Result<Response<HedgeBody<RB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Poll::Ready(match ready!(self.poll_escape(cx)) {
            Ok(res) => Ok(res),
            Err(Escape::Inner(e)) => Err(e.into()),
            Err(Escape::Own(e, _)) => Err(e),
        })
    }
}
