//! tailguard-priority: under construction.
