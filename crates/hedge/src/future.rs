//! The response future of [`FirstTokenHedge`](crate::FirstTokenHedge).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response};
use http_body::Body;
use pin_project_lite::pin_project;
use tailguard_core::{BoxError, ReplayBody};
use tower_service::Service;

use crate::body::HedgeBody;
use crate::race::Race;

pin_project! {
    /// The response future of [`FirstTokenHedge`](crate::FirstTokenHedge).
    ///
    /// Resolves when a winner is committed (its first token arrived) or every attempt failed.
    /// Dropping it drops every attempt in flight, which cancels their upstream requests.
    pub struct ResponseFuture<S, B, RB>
    where
        S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
        B: Body,
        RB: Body,
    {
        #[pin]
        kind: Kind<S::Future, Box<Race<S, B, RB>>>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, R> {
        Direct { #[pin] fut: F },
        Hedged { race: R },
    }
}

impl<S, B, RB> ResponseFuture<S, B, RB>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    B: Body,
    RB: Body,
{
    pub(crate) fn direct(fut: S::Future) -> Self {
        ResponseFuture {
            kind: Kind::Direct { fut },
        }
    }

    pub(crate) fn hedged(race: Race<S, B, RB>) -> Self {
        ResponseFuture {
            kind: Kind::Hedged {
                race: Box::new(race),
            },
        }
    }
}

impl<S, B, RB> fmt::Debug for ResponseFuture<S, B, RB>
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

impl<S, B, RB> Future for ResponseFuture<S, B, RB>
where
    S: Service<Request<ReplayBody<B>>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    B: Body + Unpin,
    B::Error: Into<BoxError>,
    RB: Body,
    RB::Data: From<Bytes>,
    RB::Error: Into<BoxError>,
{
    type Output = Result<Response<HedgeBody<RB>>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Direct { fut } => Poll::Ready(match ready!(fut.poll(cx)) {
                Ok(res) => Ok(res.map(HedgeBody::direct)),
                Err(e) => Err(e.into()),
            }),
            KindProj::Hedged { race } => race.poll(cx),
        }
    }
}
