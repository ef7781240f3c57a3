//! The two modes of a layer that can refuse or end a request itself: [`Respond`] and [`Fail`].

/// Response mode (the default of every layer): the layer renders its own refusals and timeouts
/// as responses (an OpenAI-shaped JSON error with the right status, or a trailers-only gRPC
/// response for a gRPC request) and its service keeps the inner service's error type, like
/// tower-http's `TimeoutLayer`. So the layer fits under axum's `Router::layer` and
/// `route_service` over an `Infallible` handler with no `HandleErrorLayer`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Respond;

/// Error mode, for stacks that render errors in one place (tonic clients, `BoxError` stacks):
/// the layer's refusals and timeouts are `Err`s of a typed error (`Overloaded`,
/// `TimeoutError`, `UpstreamError`) boxed as a [`BoxError`](crate::BoxError), which is then the
/// service's error type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Fail;
