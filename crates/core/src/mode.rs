//! The two modes of a layer that can refuse or end a request itself, [`Respond`] and [`Fail`],
//! and [`Mode`], what the two decide.

use crate::BoxError;

/// Response mode (the default of every layer): the layer renders its own refusals and timeouts
/// as responses (an OpenAI-shaped JSON error with the right status, or a trailers-only gRPC
/// response for a gRPC request) and its service keeps the inner service's error type, like
/// tower-http's `TimeoutLayer`. So the layer fits under axum's `Router::layer` and
/// `route_service` over an `Infallible` handler with no `HandleErrorLayer`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Respond;

/// Error mode, for stacks that render errors in one place (tonic clients, `BoxError` stacks):
/// the layer's refusals and timeouts are `Err`s of a typed error (`Overloaded`,
/// `TimeoutError`, `UpstreamError`) boxed as a [`BoxError`], which is then the service's error
/// type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Fail;

/// What a layer's mode decides, over an inner service whose error type is `E`: the service's
/// error type, and what the caller gets when the inner service fails or the layer ends a
/// request itself.
///
/// A layer's service is `Service` for every `M: Mode<S::Error>`: [`Respond`] is a mode over
/// every `E`, [`Fail`] over every `E: Into<BoxError>`. The trait is sealed: these two are its
/// only implementations.
///
/// ```
/// use std::io;
/// use tailguard_core::{Fail, Mode, Respond};
///
/// // A layer's one implementation: the inner result, or its own refusal.
/// fn answer<M: Mode<io::Error>>(inner: io::Result<u16>, refuse: bool) -> Result<u16, M::Error> {
///     if refuse {
///         return M::own(std::fmt::Error, |_| 429);
///     }
///     inner.map_err(M::inner)
/// }
///
/// assert_eq!(answer::<Respond>(Ok(200), true).unwrap(), 429);
/// assert!(answer::<Fail>(Ok(200), true).unwrap_err().is::<std::fmt::Error>());
/// let inner: io::Error = answer::<Respond>(Err(io::Error::other("down")), false).unwrap_err();
/// assert_eq!(inner.to_string(), "down");
/// ```
pub trait Mode<E>: sealed::Sealed {
    /// The service's error type: `E` in response mode, [`BoxError`] in error mode.
    type Error;

    /// The service's error for the inner service's error `error` (also from `poll_ready`):
    /// `error` as it is in response mode, boxed in error mode.
    fn inner(error: E) -> Self::Error;

    /// What the caller gets when the layer ends a request itself with `failure` (a refusal, a
    /// timeout): in response mode `Ok` of the response `respond` renders from it, in error mode
    /// `Err` of `failure` boxed.
    fn own<F: Into<BoxError>, R>(
        failure: F,
        respond: impl FnOnce(F) -> R,
    ) -> Result<R, Self::Error>;
}

impl<E> Mode<E> for Respond {
    type Error = E;

    fn inner(error: E) -> E {
        error
    }

    fn own<F: Into<BoxError>, R>(failure: F, respond: impl FnOnce(F) -> R) -> Result<R, E> {
        Ok(respond(failure))
    }
}

impl<E: Into<BoxError>> Mode<E> for Fail {
    type Error = BoxError;

    fn inner(error: E) -> BoxError {
        error.into()
    }

    fn own<F: Into<BoxError>, R>(failure: F, _: impl FnOnce(F) -> R) -> Result<R, BoxError> {
        Err(failure.into())
    }
}

mod sealed {
    /// Keeps [`Mode`](super::Mode) to [`Respond`](super::Respond) and [`Fail`](super::Fail).
    pub trait Sealed {}
    impl Sealed for super::Respond {}
    impl Sealed for super::Fail {}
}
