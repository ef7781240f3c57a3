//! Short tailguard example programs, each readable in one screen; run them from the repository
//! root with `cargo run --release --example NAME` (`axum_router`, `tonic_client`,
//! `hyper_proxy`). This library is empty: the programs are in `examples/`. The gateway is the
//! `tailguard-gateway` crate.
