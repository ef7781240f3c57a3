//! Newline-delimited JSON framing.

use bytes::Buf;
use memchr::memchr;

use crate::error::ScanError;
use crate::scan::{Captured, DEFAULT_MAX_EVENT_BYTES, Event, capture, feed_chunks};

/// Incremental scanner for NDJSON / JSON Lines bodies: each non-blank line (LF or CRLF ended)
/// is an [`Event::Line`], without its line end. A last line without a line end is reported by
/// [`finish`](NdjsonScanner::finish).
///
/// ```
/// use tailguard_core::scan::{Event, NdjsonScanner};
///
/// let mut scanner = NdjsonScanner::new();
/// let mut lines = Vec::new();
/// let mut push = |event: Event<'_>| {
///     if let Event::Line { data } = event {
///         lines.push(data.bytes.to_vec())
///     }
/// };
/// scanner.feed(b"{\"a\":1}\r\n\n{\"b\"", &mut push).unwrap();
/// scanner.feed(b":2}", &mut push).unwrap();
/// scanner.finish(&mut push).unwrap();
/// assert_eq!(lines, [b"{\"a\":1}".to_vec(), b"{\"b\":2}".to_vec()]);
/// ```
#[derive(Debug)]
pub struct NdjsonScanner {
    max: usize,
    capture: usize,
    line_len: usize,
    non_blank: bool,
    last_cr: bool,
    data: Vec<u8>,
    pending: usize,
    error: Option<ScanError>,
}

impl Default for NdjsonScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl NdjsonScanner {
    /// A scanner with the default cap ([`DEFAULT_MAX_EVENT_BYTES`]) that captures whole lines.
    pub fn new() -> Self {
        NdjsonScanner {
            max: DEFAULT_MAX_EVENT_BYTES,
            capture: usize::MAX,
            line_len: 0,
            non_blank: false,
            last_cr: false,
            data: Vec::new(),
            pending: 0,
            error: None,
        }
    }

    /// Sets the cap on one line.
    pub fn with_max_event_bytes(mut self, max: usize) -> Self {
        self.max = max;
        self
    }

    /// Copies at most `limit` bytes of each line out of the stream; [`Captured::len`] still
    /// reports the full length. Default: everything (bounded by the cap).
    pub fn set_capture(&mut self, limit: usize) {
        self.capture = limit;
    }

    /// Bytes fed since the last line end.
    pub fn pending_bytes(&self) -> usize {
        self.pending
    }

    /// Feeds one contiguous chunk; calls `on_event` for each complete non-blank line.
    ///
    /// After an error the scanner is spent: every later call returns the same error.
    pub fn feed(
        &mut self,
        chunk: &[u8],
        mut on_event: impl FnMut(Event<'_>),
    ) -> Result<(), ScanError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        let result = self.feed_inner(chunk, &mut on_event);
        self.error = result.err();
        result
    }

    /// Feeds every chunk of `buf` (without consuming it), see [`for_each_chunk`](crate::scan::for_each_chunk).
    pub fn feed_buf<B: Buf + ?Sized>(
        &mut self,
        buf: &B,
        mut on_event: impl FnMut(Event<'_>),
    ) -> Result<(), ScanError> {
        feed_chunks(buf, |chunk| self.feed(chunk, &mut on_event))
    }

    /// Ends the body: a last non-blank line without a line end is reported.
    pub fn finish(&mut self, mut on_event: impl FnMut(Event<'_>)) -> Result<(), ScanError> {
        if let Some(e) = self.error {
            return Err(e);
        }
        self.line_end(&mut on_event);
        Ok(())
    }

    fn feed_inner(
        &mut self,
        mut chunk: &[u8],
        on_event: &mut impl FnMut(Event<'_>),
    ) -> Result<(), ScanError> {
        while !chunk.is_empty() {
            match memchr(b'\n', chunk) {
                Some(i) => {
                    self.segment(&chunk[..i])?;
                    self.line_end(on_event);
                    chunk = &chunk[i + 1..];
                }
                None => {
                    self.segment(chunk)?;
                    break;
                }
            }
        }
        Ok(())
    }

    fn segment(&mut self, seg: &[u8]) -> Result<(), ScanError> {
        self.pending += seg.len();
        self.line_len += seg.len();
        if self.line_len > self.max {
            return Err(ScanError::too_long("ndjson line", self.max));
        }
        if let Some(&last) = seg.last() {
            self.last_cr = last == b'\r';
            if !self.non_blank {
                self.non_blank = seg.iter().any(|b| !b.is_ascii_whitespace());
            }
            capture(&mut self.data, self.capture, seg);
        }
        Ok(())
    }

    fn line_end(&mut self, on_event: &mut impl FnMut(Event<'_>)) {
        if self.non_blank {
            let len = self.line_len - usize::from(self.last_cr);
            let n = self.data.len().min(len);
            on_event(Event::Line {
                data: Captured {
                    bytes: &self.data[..n],
                    len,
                },
            });
        }
        self.line_len = 0;
        self.non_blank = false;
        self.last_cr = false;
        self.data.clear();
        self.pending = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn collect(
        s: &mut NdjsonScanner,
        frames: &[&[u8]],
    ) -> Result<Vec<(Vec<u8>, usize)>, ScanError> {
        let mut out = Vec::new();
        let mut push = |e: Event<'_>| match e {
            Event::Line { data } => out.push((data.bytes.to_vec(), data.len)),
            other => panic!("{other:?}"),
        };
        for f in frames {
            s.feed(f, &mut push)?;
        }
        s.finish(&mut push)?;
        Ok(out)
    }

    fn lines(input: &[u8]) -> Vec<(Vec<u8>, usize)> {
        let whole = collect(&mut NdjsonScanner::new(), &[input]).unwrap();
        let bytewise: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(
            collect(&mut NdjsonScanner::new(), &bytewise).unwrap(),
            whole
        );
        whole
    }

    fn line(s: &str) -> (Vec<u8>, usize) {
        (s.into(), s.len())
    }

    #[test]
    fn lf_and_crlf_lines_blank_lines_skipped() {
        assert_eq!(
            lines(b"{\"a\":1}\n\n  \r\n{\"b\":2}\r\n\r\n{\"c\":3}"),
            vec![line("{\"a\":1}"), line("{\"b\":2}"), line("{\"c\":3}")]
        );
    }

    #[test]
    fn last_line_without_newline_is_flushed_by_finish() {
        let mut s = NdjsonScanner::new();
        let mut n = 0;
        s.feed(b"{}\n{\"x\"", |_| n += 1).unwrap();
        assert_eq!((n, s.pending_bytes()), (1, 4));
        s.finish(|_| n += 1).unwrap();
        assert_eq!((n, s.pending_bytes()), (2, 0));
        // A last line that ends in a bare CR loses it.
        assert_eq!(lines(b"{}\r"), vec![line("{}")]);
    }

    #[test]
    fn capture_and_cap() {
        let mut s = NdjsonScanner::new();
        s.set_capture(3);
        assert_eq!(
            collect(&mut s, &[b"{\"done\":true}\r\n"]).unwrap(),
            vec![(b"{\"d".to_vec(), 13)]
        );
        let mut s = NdjsonScanner::new().with_max_event_bytes(4);
        let err = collect(&mut s, &[b"1234", b"5\n"]).unwrap_err();
        assert_eq!((err.what(), err.limit()), ("ndjson line", 4));
        assert_eq!(s.feed(b"\n", |_| panic!()).unwrap_err(), err);
    }
}
