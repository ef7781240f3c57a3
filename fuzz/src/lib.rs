//! The shared harness of the scanner fuzz targets: the differential check that feeding an input
//! whole, split at two points chosen by the input, or one byte per frame gives the same events
//! and the same result.

#![warn(missing_docs)]

use tailguard_core::ScanError;
use tailguard_core::scan::{Event, GrpcScanner, NdjsonScanner, SseScanner};

/// The surface the three scanners share (they have the same inherent methods, no common trait).
pub trait Scanner {
    /// A new scanner with `max_event_bytes` as its event size limit.
    fn with_max(max_event_bytes: usize) -> Self;
    /// See the scanners' `set_capture`.
    fn set_capture(&mut self, limit: usize);
    /// See the scanners' `feed`.
    fn feed(&mut self, chunk: &[u8], on_event: &mut dyn FnMut(Event<'_>)) -> Result<(), ScanError>;
    /// See the scanners' `pending_bytes`.
    fn pending_bytes(&self) -> usize;
    /// See the scanners' `finish`.
    fn finish(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> Result<(), ScanError>;
}

macro_rules! scanner {
    ($($ty:ident),*) => {$(
        impl Scanner for $ty {
            fn with_max(max_event_bytes: usize) -> Self {
                $ty::new().with_max_event_bytes(max_event_bytes)
            }
            fn set_capture(&mut self, limit: usize) {
                $ty::set_capture(self, limit)
            }
            fn feed(
                &mut self,
                chunk: &[u8],
                on_event: &mut dyn FnMut(Event<'_>),
            ) -> Result<(), ScanError> {
                $ty::feed(self, chunk, on_event)
            }
            fn pending_bytes(&self) -> usize {
                $ty::pending_bytes(self)
            }
            fn finish(&mut self, on_event: &mut dyn FnMut(Event<'_>)) -> Result<(), ScanError> {
                $ty::finish(self, on_event)
            }
        }
    )*};
}

scanner!(SseScanner, GrpcScanner, NdjsonScanner);

/// Feeds `input` cut at `cuts` (ascending) to a fresh scanner, then finishes it: the events
/// seen (as `Debug` strings), whether no error was met, and the pending bytes before `finish`.
fn run<S: Scanner>(
    input: &[u8],
    cuts: &[usize],
    max: usize,
    capture: usize,
) -> (Vec<String>, bool, Option<usize>) {
    let mut scanner = S::with_max(max);
    scanner.set_capture(capture);
    let mut out = Vec::new();
    let mut push = |e: Event<'_>| out.push(format!("{e:?}"));
    let mut ok = true;
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&input.len())) {
        let cut = cut.clamp(at, input.len());
        if ok {
            ok = scanner.feed(&input[at..cut], &mut push).is_ok();
        }
        at = cut;
    }
    let pending = ok.then(|| scanner.pending_bytes());
    if ok {
        ok = scanner.finish(&mut push).is_ok();
    }
    (out, ok, pending)
}

/// One fuzz case: the first three bytes pick the event size limit, the capture limit and two
/// cut points; the rest is the input. Whole, split and bytewise runs must agree.
///
/// # Panics
///
/// When the runs disagree (or the scanner panics): that is the finding.
pub fn differential<S: Scanner>(data: &[u8]) {
    let Some((&[a, b, c], input)) = data.split_first_chunk::<3>() else {
        return;
    };
    let max = 1 + usize::from(a) * 4;
    let capture = usize::from(b % 32);
    let len = input.len().max(1);
    let cuts = [usize::from(b) % len, usize::from(c) % len];
    let mut sorted = cuts;
    sorted.sort_unstable();
    let whole = run::<S>(input, &[], max, capture);
    assert_eq!(run::<S>(input, &sorted, max, capture), whole);
    let bytewise: Vec<usize> = (1..input.len()).collect();
    assert_eq!(run::<S>(input, &bytewise, max, capture), whole);
}
