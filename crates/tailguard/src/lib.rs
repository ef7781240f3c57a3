//! # tailguard
//!
//! Tower middleware that guards the tail latency of LLM streaming calls. This facade re-exports
//! [`tailguard_core`] as [`core`], and each layer crate behind a feature of the same name.
//!
//! ```
//! use tailguard::core::{EndReason, Priority};
//!
//! assert!(Priority::interactive() > Priority::batch());
//! assert_eq!(EndReason::IdleTimeout.as_str(), "idle_timeout");
//! ```

pub use tailguard_core as core;

/// `FirstTokenHedge`: hedge on the first token (feature `hedge`).
#[cfg(feature = "hedge")]
pub use tailguard_hedge as hedge;

/// `SseIdleTimeout`: first-token, idle and total timeouts (feature `timeout`).
#[cfg(feature = "timeout")]
pub use tailguard_timeout as timeout;

/// `BoundedAdmission`: bounded in-flight work and wait queue (feature `admission`).
#[cfg(feature = "admission")]
pub use tailguard_admission as admission;

/// `PriorityClass`: request classification and per-class policy (feature `priority`).
#[cfg(feature = "priority")]
pub use tailguard_priority as priority;

/// `LatencyPhaseRecorder`: every phase of every request (feature `phases`).
#[cfg(feature = "phases")]
pub use tailguard_phases as phases;
