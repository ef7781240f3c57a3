//! tailguard-phases: under construction.
