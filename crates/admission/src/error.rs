//! Errors of the error mode.
//!
//! A refusal in the error mode ([`Fail`](crate::Fail)) is an [`Overloaded`] boxed as a
//! [`BoxError`]; recover it with `downcast_ref::<Overloaded>()`. Its
//! [`reason`](Overloaded::reason), [`status`](Overloaded::status),
//! [`retry_after`](Overloaded::retry_after) and [`queue_wait`](Overloaded::queue_wait) carry the
//! same facts as the response mode's 429/503.

pub use tailguard_core::{BoxError, OverloadReason, Overloaded};
