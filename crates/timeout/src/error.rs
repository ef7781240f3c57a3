//! Errors of [`SseIdleTimeout`](crate::SseIdleTimeout).
//!
//! The layer's error type is [`BoxError`]: the inner service's and the inner body's errors pass
//! through unchanged, and a timer that expires yields a [`TimeoutError`] (in the error flavour
//! before headers, or as a body error with [`OnExpiry::BodyError`](crate::OnExpiry::BodyError)).
//! Recover it with `downcast_ref::<TimeoutError>()`; it carries the [`Phase`] that timed out,
//! its limit, the time since `call`, the events seen and the time since the last progress event.

pub use tailguard_core::{BoxError, Phase, TimeoutError};
