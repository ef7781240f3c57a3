//! Shared code of the tailguard example programs.
//!
//! The [`gateway`] module is the OpenAI-compatible gateway that `cargo run --release --example
//! gateway` starts; it lives in this library so that tests can start it in-process.

pub mod gateway;
