//! Fuzz the ndjson scanner: it never panics, and feeding the input whole, split at two points
//! chosen by the input, or one byte per frame gives the same events and the same result.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tailguard_core::scan::NdjsonScanner;

fuzz_target!(|data: &[u8]| tailguard_fuzz::differential::<NdjsonScanner>(data));
