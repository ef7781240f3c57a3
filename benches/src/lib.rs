//! Benchmarks of tailguard live in `benches/`; this library holds their shared helpers.
