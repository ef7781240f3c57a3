//! Property: every split of the same bytes into frames yields the same events and the same
//! classes, for SSE, gRPC and NDJSON, including one byte per frame.

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::HeaderMap;
use proptest::prelude::*;
use tailguard_core::classify::{Class, Classify, LlmSseClassifier, NdjsonClassifier};
use tailguard_core::scan::{Event, GrpcScanner, NdjsonScanner, SseScanner};
use tailguard_core::{Dialect, Framing, ScanError, StreamTracker};

/// An owned copy of an event.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Owned {
    Comment(Vec<u8>, usize),
    Sse(Vec<u8>, Vec<u8>, usize),
    Grpc(bool, Vec<u8>, usize),
    Line(Vec<u8>, usize),
}

fn own(e: Event<'_>) -> Owned {
    match e {
        Event::Comment { text } => Owned::Comment(text.bytes.to_vec(), text.len),
        Event::Sse { name, data } => Owned::Sse(name.to_vec(), data.bytes.to_vec(), data.len),
        Event::Grpc { compressed, data } => Owned::Grpc(compressed, data.bytes.to_vec(), data.len),
        Event::Line { data } => Owned::Line(data.bytes.to_vec(), data.len),
        other => panic!("{other:?}"),
    }
}

/// Events and the final result (error or not), and pending bytes at the end (meaningless, so
/// not compared, after an error).
type Outcome = (Vec<Owned>, Result<(), ScanError>, Option<usize>);

trait Scanner {
    fn make(max: usize) -> Self;
    fn feed(&mut self, chunk: &[u8], out: &mut Vec<Owned>) -> Result<(), ScanError>;
    fn finish(&mut self, out: &mut Vec<Owned>) -> Result<(), ScanError>;
    fn pending(&self) -> usize;
}

macro_rules! scanner {
    ($t:ty) => {
        impl Scanner for $t {
            fn make(max: usize) -> Self {
                <$t>::new().with_max_event_bytes(max)
            }
            fn feed(&mut self, chunk: &[u8], out: &mut Vec<Owned>) -> Result<(), ScanError> {
                <$t>::feed(self, chunk, |e| out.push(own(e)))
            }
            fn finish(&mut self, out: &mut Vec<Owned>) -> Result<(), ScanError> {
                <$t>::finish(self, |e| out.push(own(e)))
            }
            fn pending(&self) -> usize {
                self.pending_bytes()
            }
        }
    };
}
scanner!(SseScanner);
scanner!(GrpcScanner);
scanner!(NdjsonScanner);

fn run<S: Scanner>(bytes: &[u8], cuts: &[usize], max: usize) -> Outcome {
    let mut s = S::make(max);
    let mut out = Vec::new();
    let mut result = Ok(());
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
        let cut = cut.clamp(at, bytes.len());
        if result.is_ok() {
            result = s.feed(&bytes[at..cut], &mut out);
        }
        at = cut;
    }
    let pending = result.is_ok().then(|| s.pending());
    if result.is_ok() {
        result = s.finish(&mut out);
    }
    (out, result, pending)
}

fn cuts_of(bytes: &[u8], raw: &[usize]) -> Vec<usize> {
    let mut cuts: Vec<usize> = raw.iter().map(|c| c % (bytes.len() + 1)).collect();
    cuts.sort_unstable();
    cuts
}

fn check<S: Scanner>(bytes: &[u8], raw_cuts: &[usize], max: usize) -> Result<(), TestCaseError> {
    let whole = run::<S>(bytes, &[], max);
    let split = run::<S>(bytes, &cuts_of(bytes, raw_cuts), max);
    let bytewise: Vec<usize> = (1..bytes.len()).collect();
    let one = run::<S>(bytes, &bytewise, max);
    // Events before an error may differ in number only if the error came at a different point;
    // an error is a property of the bytes, so it must agree too.
    prop_assert_eq!(&split, &whole);
    prop_assert_eq!(&one, &whole);
    Ok(())
}

/// Classes through a tracker (which lowers the capture after the first token at frame
/// boundaries): must not depend on the framing either.
fn classes(bytes: &[u8], cuts: &[usize], framing: Framing) -> Vec<Class> {
    let log: Arc<Mutex<Vec<Class>>> = Arc::default();
    let logger = Logger {
        framing,
        log: log.clone(),
    };
    let mut t = StreamTracker::new(&Dialect::custom(framing, logger), &HeaderMap::new());
    let mut at = 0;
    for &cut in cuts.iter().chain(std::iter::once(&bytes.len())) {
        let cut = cut.clamp(at, bytes.len());
        t.observe(&Bytes::copy_from_slice(&bytes[at..cut]));
        at = cut;
    }
    t.finish();
    log.lock().unwrap().clone()
}

/// Classifies with the preset of the framing and logs each class.
struct Logger {
    framing: Framing,
    log: Arc<Mutex<Vec<Class>>>,
}

impl Classify for Logger {
    fn classify(&self, e: &Event<'_>, first: bool) -> Class {
        let class = match self.framing {
            Framing::Ndjson => NdjsonClassifier.classify(e, first),
            _ => LlmSseClassifier.classify(e, first),
        };
        self.log.lock().unwrap().push(class);
        class
    }

    fn capture_after_first_token(&self) -> usize {
        match self.framing {
            Framing::Ndjson => NdjsonClassifier.capture_after_first_token(),
            _ => LlmSseClassifier.capture_after_first_token(),
        }
    }
}

fn check_classes(bytes: &[u8], raw_cuts: &[usize], framing: Framing) -> Result<(), TestCaseError> {
    let whole = classes(bytes, &[], framing);
    prop_assert_eq!(&classes(bytes, &cuts_of(bytes, raw_cuts), framing), &whole);
    let bytewise: Vec<usize> = (1..bytes.len()).collect();
    prop_assert_eq!(&classes(bytes, &bytewise, framing), &whole);
    Ok(())
}

/// SSE made of realistic pieces and hostile ones.
fn sse_stream() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(&b"data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}"[..]),
        Just(&b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}]}"[..]),
        Just(&b"data: {\"choices\":[{\"delta\":{},\"finish_reason\":\"stop\"}]}"[..]),
        Just(&b"data: {\"error\":{\"message\":\"x\"}}"[..]),
        Just(&b"data: [DONE]"[..]),
        Just(&b"data: {\"cut"[..]),
        Just(&b"data:"[..]),
        Just(&b"data"[..]),
        Just(&b"event: ping"[..]),
        Just(&b"event: content_block_delta"[..]),
        Just(&b"event: message_stop"[..]),
        Just(&b"id: 1"[..]),
        Just(&b"retry: 10"[..]),
        Just(&b"foo: bar"[..]),
        Just(&b": keepalive"[..]),
        Just(&b":"[..]),
        Just(&b"\xEF\xBB\xBF"[..]),
        Just(&b"\xEF"[..]),
        Just(&b"\n"[..]),
        Just(&b"\r"[..]),
        Just(&b"\r\n"[..]),
        Just(&b" "[..]),
    ];
    prop::collection::vec(piece, 0..40).prop_map(|pieces| pieces.concat())
}

fn grpc_stream() -> impl Strategy<Value = Vec<u8>> {
    let msg = (any::<bool>(), prop::collection::vec(any::<u8>(), 0..40));
    (prop::collection::vec(msg, 0..12), 0usize..5).prop_map(|(msgs, tail)| {
        let mut v = Vec::new();
        for (compressed, m) in msgs {
            v.push(u8::from(compressed));
            v.extend_from_slice(&u32::try_from(m.len()).unwrap().to_be_bytes());
            v.extend_from_slice(&m);
        }
        // A truncated header at the end, sometimes.
        v.extend(std::iter::repeat_n(0, tail));
        v
    })
}

fn ndjson_stream() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        Just(&b"{\"response\":\"Hi\",\"done\":false}"[..]),
        Just(&b"{\"response\":\"\",\"done\":true}"[..]),
        Just(&b"{\"error\":\"boom\"}"[..]),
        Just(&b"{\"cut"[..]),
        Just(&b"\n"[..]),
        Just(&b"\r\n"[..]),
        Just(&b"\r"[..]),
        Just(&b"  "[..]),
    ];
    prop::collection::vec(piece, 0..30).prop_map(|pieces| pieces.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn sse_any_split(bytes in sse_stream(), cuts in prop::collection::vec(any::<usize>(), 0..8)) {
        check::<SseScanner>(&bytes, &cuts, 1 << 20)?;
        check_classes(&bytes, &cuts, Framing::Sse)?;
    }

    #[test]
    fn sse_any_split_small_cap(bytes in sse_stream(), cuts in prop::collection::vec(any::<usize>(), 0..8)) {
        check::<SseScanner>(&bytes, &cuts, 40)?;
    }

    #[test]
    fn sse_arbitrary_bytes(
        bytes in prop::collection::vec(prop::sample::select(&b"da:t \r\n\xEF\xBB\xBFe"[..]), 0..200),
        cuts in prop::collection::vec(any::<usize>(), 0..8),
    ) {
        check::<SseScanner>(&bytes, &cuts, 24)?;
        check::<SseScanner>(&bytes, &cuts, 1 << 20)?;
    }

    #[test]
    fn grpc_any_split(bytes in grpc_stream(), cuts in prop::collection::vec(any::<usize>(), 0..8)) {
        check::<GrpcScanner>(&bytes, &cuts, 1 << 20)?;
        check::<GrpcScanner>(&bytes, &cuts, 20)?;
        check_classes(&bytes, &cuts, Framing::Grpc)?;
    }

    #[test]
    fn ndjson_any_split(bytes in ndjson_stream(), cuts in prop::collection::vec(any::<usize>(), 0..8)) {
        check::<NdjsonScanner>(&bytes, &cuts, 1 << 20)?;
        check::<NdjsonScanner>(&bytes, &cuts, 30)?;
        check_classes(&bytes, &cuts, Framing::Ndjson)?;
    }
}
