//! tailguard-mock: under construction.
