//! sse framing (to be implemented).

use crate::error::ScanError;
use crate::scan::Event;

/// Incremental sse scanner.
#[derive(Debug, Default)]
pub struct SseScanner {
    _private: (),
}

impl SseScanner {
    /// A scanner with the default cap.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds one contiguous chunk; calls `on_event` for each complete event.
    pub fn feed(&mut self, chunk: &[u8], on_event: impl FnMut(Event<'_>)) -> Result<(), ScanError> {
        let _ = (chunk, on_event);
        todo!()
    }
}
