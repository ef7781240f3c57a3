//! [`BadGatewayLayer`]: an error of the inner service (a transport error before response
//! headers: a refused connection, a reset, a closed pool) answered with a `502` in the client's
//! protocol, so that a stack over a hyper client is `Infallible` and axum takes it as it is.

use std::convert::Infallible;
use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body::Body;
use pin_project_lite::pin_project;
use tower_layer::Layer;
use tower_service::Service;

use crate::answer::AnswerBody;
use crate::error::BoxError;
use crate::headers::is_grpc;
use crate::render::{ErrorInfo, GrpcCode, respond};

/// Answers an error of the inner service with a `502 Bad Gateway` in the client's protocol: an
/// OpenAI-style JSON error (`"type":"upstream_error"`, `"code":"bad_gateway"`, the error in the
/// message), or for a gRPC request a trailers-only response with `UNAVAILABLE`. The service's
/// error type becomes [`Infallible`]: put it outermost over a stack whose upstream client can
/// fail (hyper's `legacy::Error`), and axum's `Router::route_service` takes the stack with no
/// `HandleErrorLayer` and no `map_result`. Responses of the inner service pass through, their
/// body wrapped in an [`AnswerBody`] that adds nothing to their frames.
///
/// The error is logged (`tracing` warning) and not otherwise kept; a layer inside that records
/// end reasons (the recorder) has already seen it.
///
/// ```
/// use std::convert::Infallible;
/// use bytes::Bytes;
/// use http::{Request, Response, StatusCode};
/// use http_body_util::{BodyExt, Full};
/// use tailguard_core::{BadGatewayLayer, BoxError};
/// use tower::{Layer, ServiceExt, service_fn};
///
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let failing = service_fn(|_: Request<()>| async {
///     Err::<Response<Full<Bytes>>, BoxError>("connection refused".into())
/// });
/// let svc = BadGatewayLayer::new().layer(failing);
/// let res: Result<_, Infallible> = svc.oneshot(Request::new(())).await;
/// let res = res.unwrap();
/// assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
/// let body = res.into_body().collect().await.unwrap().to_bytes();
/// assert!(std::str::from_utf8(&body).unwrap().contains("connection refused"));
/// # }
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct BadGatewayLayer {
    _private: (),
}

impl BadGatewayLayer {
    /// The layer.
    pub fn new() -> Self {
        BadGatewayLayer::default()
    }
}

impl<S> Layer<S> for BadGatewayLayer {
    type Service = BadGateway<S>;

    fn layer(&self, inner: S) -> BadGateway<S> {
        BadGateway {
            inner,
            not_ready: None,
        }
    }
}

/// The service of [`BadGatewayLayer`].
#[derive(Clone, Debug)]
pub struct BadGateway<S> {
    inner: S,
    /// The inner service failed to become ready: the next call is answered with it, and the
    /// inner service is not called (tower's contract).
    not_ready: Option<String>,
}

impl<S> BadGateway<S> {
    crate::inner_service_accessors!();
}

impl<S, B, RB> Service<Request<B>> for BadGateway<S>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    RB: Body,
    RB::Data: From<Bytes>,
{
    type Response = Response<AnswerBody<RB>>;
    type Error = Infallible;
    type Future = BadGatewayFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        if self.not_ready.is_some() {
            return Poll::Ready(Ok(()));
        }
        // An inner service that cannot become ready: the next call is answered with its error.
        if let Err(e) = ready!(self.inner.poll_ready(cx)) {
            let e: BoxError = e.into();
            self.not_ready = Some(e.to_string());
        }
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let grpc = is_grpc(req.headers());
        let state = match self.not_ready.take() {
            Some(error) => State::NotReady { error: Some(error) },
            None => State::Calling {
                future: self.inner.call(req),
            },
        };
        BadGatewayFuture { state, grpc }
    }
}

pin_project! {
    /// The response future of [`BadGateway`].
    pub struct BadGatewayFuture<F> {
        #[pin]
        state: State<F>,
        grpc: bool,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<F> {
        Calling { #[pin] future: F },
        NotReady { error: Option<String> },
    }
}

impl<F> fmt::Debug for BadGatewayFuture<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BadGatewayFuture")
            .field("grpc", &self.grpc)
            .finish_non_exhaustive()
    }
}

impl<F, RB, E> Future for BadGatewayFuture<F>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
    RB: Body,
    RB::Data: From<Bytes>,
{
    type Output = Result<Response<AnswerBody<RB>>, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let error = match this.state.project() {
            StateProj::Calling { future } => match ready!(future.poll(cx)) {
                Ok(res) => return Poll::Ready(Ok(res.map(AnswerBody::inner))),
                Err(e) => e.into().to_string(),
            },
            StateProj::NotReady { error } => error.take().unwrap_or_default(),
        };
        tracing::warn!(error = %error, "upstream request failed before headers");
        let message = format!("upstream request failed: {error}");
        let info = ErrorInfo::new(
            StatusCode::BAD_GATEWAY,
            message,
            "upstream_error",
            "bad_gateway",
        )
        .with_grpc(GrpcCode::Unavailable);
        Poll::Ready(Ok(respond(&info, *this.grpc, |json| {
            AnswerBody::answer(json.map(RB::Data::from))
        })))
    }
}

#[cfg(test)]
mod tests {
    use http_body_util::{BodyExt, Full};
    use tower::{ServiceExt, service_fn};

    use super::*;

    #[tokio::test]
    async fn responses_pass_and_errors_become_502s_in_the_clients_protocol() {
        let svc = BadGatewayLayer::new().layer(service_fn(|req: Request<()>| async move {
            if req.uri().path() == "/ok" {
                Ok(Response::new(Full::new(Bytes::from_static(b"fine"))))
            } else {
                Err::<_, BoxError>("connection reset".into())
            }
        }));
        let ok = svc.clone().oneshot(Request::get("/ok").body(()).unwrap());
        let ok = ok.await.unwrap();
        assert_eq!(ok.status(), StatusCode::OK);
        assert_eq!(
            &ok.into_body().collect().await.unwrap().to_bytes()[..],
            b"fine"
        );

        let res = svc.clone().oneshot(Request::new(())).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(res.headers()["content-type"], "application/json");
        let body = res.into_body().collect().await.unwrap().to_bytes();
        let v: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(v["error"]["code"], "bad_gateway");
        assert_eq!(v["error"]["type"], "upstream_error");
        assert!(
            v["error"]["message"]
                .as_str()
                .unwrap()
                .contains("connection reset")
        );

        let grpc = Request::post("/svc/Method")
            .header("content-type", "application/grpc")
            .body(())
            .unwrap();
        let res = svc.oneshot(grpc).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["grpc-status"], "14");
        assert!(
            res.into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .is_empty()
        );
    }
}
