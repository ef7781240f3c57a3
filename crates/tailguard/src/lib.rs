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
