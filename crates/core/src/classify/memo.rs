//! A per-thread memo of the last few JSON classifications.
//!
//! In a stack of tailguard layers every layer that tracks tokens classifies the same events:
//! `FirstTokenHedge` reads the attempt's pre-token events to find the first token, then
//! `SseIdleTimeout` and `LatencyPhaseRecorder` above it read the same bytes again. Before the
//! first token that means parsing the same JSON up to three times. The JSON decisions are pure
//! functions of the event's bytes, so the last [`ENTRIES`] decisions made on a thread are kept
//! with a copy of the bytes they were made on, and an event whose bytes are equal to a kept
//! copy gets the kept decision: a length check and a `memcmp` instead of a parse.
//!
//! The memo is keyed by content, never by address, so a hit is always the decision the parse
//! would have made. It holds at most [`ENTRIES`] copies of at most [`MAX_BYTES`] bytes per
//! thread (larger events are not memoized), allocated once per thread and reused. A task that
//! moved to another worker thread between two layers' reads just misses.

use std::cell::RefCell;

use super::Class;

/// Decisions kept per thread: enough for the pre-token events of one attempt (a role chunk,
/// comments, the first token chunk) to be found by every layer above it.
const ENTRIES: usize = 4;

/// Events longer than this are classified without the memo (pre-token chunks are a few
/// hundred bytes). Each entry's buffer is allocated at this size on first use, so a warm memo
/// never allocates: 8 KiB per thread.
const MAX_BYTES: usize = 2048;

/// Which JSON decision.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    OpenAi,
    AnthropicType,
    Ndjson,
}

#[derive(Debug)]
struct Entry {
    kind: Kind,
    decision: Option<Class>,
    bytes: Vec<u8>,
}

#[derive(Debug)]
struct Memo {
    entries: Vec<Entry>,
    /// The entry the next new decision replaces, once all are in use.
    next: usize,
}

impl Memo {
    fn get(&self, kind: Kind, bytes: &[u8]) -> Option<Option<Class>> {
        self.entries
            .iter()
            .find(|e| e.kind == kind && e.bytes.len() == bytes.len() && e.bytes == bytes)
            .map(|e| e.decision)
    }

    fn put(&mut self, kind: Kind, bytes: &[u8], decision: Option<Class>) {
        if self.entries.capacity() < ENTRIES {
            self.entries.reserve_exact(ENTRIES);
        }
        if self.entries.len() < ENTRIES {
            let mut copy = Vec::with_capacity(MAX_BYTES);
            copy.extend_from_slice(bytes);
            self.entries.push(Entry {
                kind,
                decision,
                bytes: copy,
            });
            return;
        }
        let entry = &mut self.entries[self.next];
        self.next = (self.next + 1) % ENTRIES;
        entry.kind = kind;
        entry.decision = decision;
        entry.bytes.clear();
        entry.bytes.extend_from_slice(bytes);
    }
}

thread_local! {
    static MEMO: RefCell<Memo> = const {
        RefCell::new(Memo {
            entries: Vec::new(),
            next: 0,
        })
    };
}

/// `decide(bytes)`, or the decision kept for equal bytes of the same `kind`.
#[inline]
pub(super) fn memoized(
    kind: Kind,
    bytes: &[u8],
    decide: impl FnOnce(&[u8]) -> Option<Class>,
) -> Option<Class> {
    if bytes.len() > MAX_BYTES {
        return decide(bytes);
    }
    let kept = MEMO
        .try_with(|m| m.try_borrow().ok().and_then(|m| m.get(kind, bytes)))
        .ok()
        .flatten();
    if let Some(decision) = kept {
        return decision;
    }
    let decision = decide(bytes);
    let _ = MEMO.try_with(|m| {
        if let Ok(mut m) = m.try_borrow_mut() {
            m.put(kind, bytes, decision);
        }
    });
    decision
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    #[test]
    fn equal_bytes_reuse_the_decision_others_are_decided() {
        let calls = Cell::new(0);
        let decide = |b: &[u8]| {
            calls.set(calls.get() + 1);
            b.len().is_multiple_of(2).then_some(Class::Token)
        };
        let a = b"{\"a\":1}".to_vec();
        assert_eq!(memoized(Kind::OpenAi, &a, decide), None);
        assert_eq!(memoized(Kind::OpenAi, &a.clone(), decide), None);
        assert_eq!(calls.get(), 1, "a copy of the same bytes is a hit");
        // Another kind with the same bytes is decided on its own.
        assert_eq!(memoized(Kind::Ndjson, &a, decide), None);
        assert_eq!(calls.get(), 2);
        // Five more distinct events push the first ones out: decided again.
        for i in 0..5u8 {
            memoized(Kind::OpenAi, &[b'x'; 8][..usize::from(i) + 1], decide);
        }
        assert_eq!(calls.get(), 7);
        memoized(Kind::OpenAi, &a, decide);
        assert_eq!(calls.get(), 8);
        // Over the size cap: never kept.
        let big = vec![b' '; MAX_BYTES + 1];
        memoized(Kind::OpenAi, &big, decide);
        memoized(Kind::OpenAi, &big, decide);
        assert_eq!(calls.get(), 10);
        // A decision made while the memo is borrowed (reentrant) is still right.
        let inner = memoized(Kind::AnthropicType, b"{}", |b| {
            memoized(Kind::AnthropicType, b, |_| Some(Class::Meta))
        });
        assert_eq!(inner, Some(Class::Meta));
    }
}
