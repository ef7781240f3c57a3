//! grpc framing (to be implemented).

use crate::error::ScanError;
use crate::scan::Event;

/// Incremental grpc scanner.
#[derive(Debug, Default)]
pub struct GrpcScanner {
    _private: (),
}

impl GrpcScanner {
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
