//! tailguard-hedge: under construction.
