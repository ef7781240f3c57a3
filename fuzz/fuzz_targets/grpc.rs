//! Fuzz the grpc scanner: it never panics, and feeding the input whole, split at two points
//! chosen by the input, or one byte per frame gives the same events and the same result.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tailguard_core::scan::{Event, GrpcScanner};

fn run(
    input: &[u8],
    cuts: &[usize],
    max: usize,
    capture: usize,
) -> (Vec<String>, bool, Option<usize>) {
    let mut scanner = GrpcScanner::new().with_max_event_bytes(max);
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

fuzz_target!(|data: &[u8]| {
    let Some((&[a, b, c], input)) = data.split_first_chunk::<3>() else {
        return;
    };
    let max = 1 + usize::from(a) * 4;
    let capture = usize::from(b % 32);
    let len = input.len().max(1);
    let cuts = [usize::from(b) % len, usize::from(c) % len];
    let mut sorted = cuts;
    sorted.sort_unstable();
    let whole = run(input, &[], max, capture);
    assert_eq!(run(input, &sorted, max, capture), whole);
    let bytewise: Vec<usize> = (1..input.len()).collect();
    assert_eq!(run(input, &bytewise, max, capture), whole);
});
