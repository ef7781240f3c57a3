//! The held-back event: bytes of an event the client has not fully received.
//!
//! When the layer ends a stream (a timer, the upstream failing or cutting the stream short), the
//! in-band ending (an error event, gRPC trailers) must not land inside an event the client holds
//! only part of. So while the tracker says the last frame ended inside an event, its bytes wait
//! here, behind any bytes queued before them, until the event is complete; an ending then drops
//! them and the client sees only whole events.

use std::collections::VecDeque;

use bytes::{Buf, Bytes};

/// The queue of held-back frames, and how many bytes at its front are released for sending.
#[derive(Debug)]
pub(crate) struct HeldBack<D> {
    queue: VecDeque<D>,
    /// Bytes in `queue`.
    len: usize,
    /// Bytes at the front of `queue` that may go out (`release <= len`).
    release: usize,
}

impl<D> HeldBack<D> {
    /// An empty queue.
    pub(crate) fn new() -> Self {
        HeldBack {
            queue: VecDeque::new(),
            len: 0,
            release: 0,
        }
    }

    /// Nothing is queued, so a frame that ends on an event boundary may pass at once.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes queued, released or not.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Releases everything queued (the upstream ended the data of a stream whose ending is not
    /// checked: what it sent goes out as it sent it).
    pub(crate) fn release_all(&mut self) {
        self.release = self.len;
    }

    /// Drops everything queued: the bytes of the incomplete event, when the layer ends the
    /// stream inside it. (Released bytes have all gone out by then: the body sends them before
    /// it polls the inner body again.)
    pub(crate) fn clear(&mut self) {
        self.queue.clear();
        self.len = 0;
        self.release = 0;
    }
}

impl<D: Buf> HeldBack<D> {
    /// Queues `data` behind the bytes held back, and releases all but the last `pending` bytes
    /// (the part of an event not complete yet).
    pub(crate) fn push(&mut self, data: D, pending: usize) {
        self.len += data.remaining();
        self.queue.push_back(data);
        self.release = self.len.saturating_sub(pending);
    }
}

impl<D: Buf + From<Bytes>> HeldBack<D> {
    /// The next released bytes, in order: a queued frame as it came when it is released whole,
    /// else a copy of its released front.
    pub(crate) fn next_released(&mut self) -> Option<D> {
        if self.release == 0 {
            return None;
        }
        let front = self.queue.front_mut()?;
        let chunk = if front.remaining() <= self.release {
            self.queue.pop_front()?
        } else {
            D::from(front.copy_to_bytes(self.release))
        };
        let n = chunk.remaining();
        self.release = self.release.saturating_sub(n);
        self.len = self.len.saturating_sub(n);
        Some(chunk)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(chunk: Bytes) -> String {
        let mut chunk = chunk;
        String::from_utf8(chunk.copy_to_bytes(chunk.remaining()).to_vec()).unwrap()
    }

    #[test]
    fn releases_complete_events_and_keeps_the_incomplete_tail() {
        let mut held = HeldBack::new();
        held.push(Bytes::from_static(b"data: a\n\ndata: "), 6);
        assert_eq!(held.len(), 15);
        assert_eq!(
            held.next_released().map(text).as_deref(),
            Some("data: a\n\n")
        );
        assert!(held.next_released().is_none());
        assert_eq!(held.len(), 6);
        held.push(Bytes::from_static(b"b\n\n"), 0);
        assert_eq!(held.next_released().map(text).as_deref(), Some("data: "));
        assert_eq!(held.next_released().map(text).as_deref(), Some("b\n\n"));
        assert!(held.is_empty());
        assert!(held.next_released().is_none());
    }

    #[test]
    fn clear_drops_the_tail_and_release_all_lets_it_out() {
        let mut held = HeldBack::new();
        held.push(Bytes::from_static(b"data: {\"choi"), 12);
        held.clear();
        assert!(held.is_empty());
        assert!(held.next_released().is_none());

        held.push(Bytes::from_static(b"data: [DO"), 9);
        held.release_all();
        assert_eq!(held.next_released().map(text).as_deref(), Some("data: [DO"));
        assert!(held.is_empty());
    }
}
