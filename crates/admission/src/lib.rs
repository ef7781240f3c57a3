//! tailguard-admission: under construction.
