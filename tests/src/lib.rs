//! Cross-crate tests of tailguard live in `tests/`; this library holds their shared helpers.
