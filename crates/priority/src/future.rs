//! Response future of [`PriorityClass`](crate::PriorityClass).

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use http::Response;
use pin_project_lite::pin_project;
use tailguard_core::Priority;

pin_project! {
    /// Resolves to the inner service's response with the request's [`Priority`] copied into
    /// the response extensions (unless an inner layer already put one there), so that a layer
    /// *outside* `PriorityClass` — the recorder in the recommended order — can read the class.
    #[derive(Debug)]
    pub struct ResponseFuture<F> {
        #[pin]
        inner: F,
        priority: Option<Priority>,
    }
}

impl<F> ResponseFuture<F> {
    pub(crate) fn new(inner: F, priority: Priority) -> Self {
        ResponseFuture {
            inner,
            priority: Some(priority),
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F>
where
    F: Future<Output = Result<Response<B>, E>>,
{
    type Output = Result<Response<B>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let mut res = ready!(this.inner.poll(cx));
        if let (Ok(res), Some(p)) = (&mut res, this.priority.take())
            && res.extensions().get::<Priority>().is_none()
        {
            res.extensions_mut().insert(p);
        }
        Poll::Ready(res)
    }
}
