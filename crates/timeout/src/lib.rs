//! tailguard-timeout: under construction.
