//! Errors of `FirstTokenHedge`.
//!
//! In response mode (the default) the service's error type is the inner service's, and its
//! only error is the inner service's own, when every attempt failed without a response (see
//! [`FirstTokenHedge`](crate::FirstTokenHedge) for the rule). In error mode
//! ([`with_error_mode`](crate::FirstTokenHedgeLayer::with_error_mode)) it is a [`BoxError`]:
//! that same inner error (recovered with `downcast_ref`); an
//! [`UpstreamError`](tailguard_core::UpstreamError) when every attempt failed; or a
//! [`RequestBodyError`] when the request body failed while it was being buffered for replay
//! (which response mode answers with a `400`).

use std::fmt;

pub use tailguard_core::BoxError;

/// The request body failed while it was being buffered for replay; no attempt was sent.
#[derive(Debug)]
pub struct RequestBodyError {
    source: BoxError,
}

impl RequestBodyError {
    pub(crate) fn new(source: BoxError) -> Self {
        RequestBodyError { source }
    }

    /// The body's own error.
    pub fn get_ref(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.source
    }
}

impl fmt::Display for RequestBodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request body failed while buffered for replay: {}",
            self.source
        )
    }
}

impl std::error::Error for RequestBodyError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}
