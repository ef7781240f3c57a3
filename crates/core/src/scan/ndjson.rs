//! Newline-delimited JSON framing.

use memchr::memchr;

use crate::error::ScanError;
use crate::scan::{Captured, Event, Framer, Limits, Scanner, capture, last_non_space};

/// Scanner of NDJSON / JSON Lines bodies (see [`Ndjson`]).
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
pub type NdjsonScanner = Scanner<Ndjson>;

/// NDJSON framing: each non-blank line (LF or CRLF ended) is an [`Event::Line`], without its
/// line end. A last line without a line end is reported by [`finish`](Scanner::finish).
#[derive(Debug, Default)]
pub struct Ndjson {
    limits: Limits,
    line_len: usize,
    non_blank: bool,
    last_cr: bool,
    data: Vec<u8>,
    /// See [`Captured::last`].
    last: Option<u8>,
}

impl Framer for Ndjson {
    fn limits(&self) -> &Limits {
        &self.limits
    }

    fn limits_mut(&mut self) -> &mut Limits {
        &mut self.limits
    }

    fn finish(&mut self, on_event: &mut impl FnMut(Event<'_>)) {
        self.line_end(on_event);
    }

    fn feed(
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
}

impl Ndjson {
    fn segment(&mut self, seg: &[u8]) -> Result<(), ScanError> {
        self.limits.pending += seg.len();
        self.line_len += seg.len();
        if self.line_len > self.limits.max {
            return Err(ScanError::too_long("ndjson line", self.limits.max));
        }
        if let Some(&last) = seg.last() {
            self.last_cr = last == b'\r';
            if !self.non_blank {
                self.non_blank = seg.iter().any(|b| !b.is_ascii_whitespace());
            }
            capture(&mut self.data, self.limits.capture, seg);
            self.last = last_non_space(seg, self.last);
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
                    last: self.last,
                },
            });
        }
        self.line_len = 0;
        self.non_blank = false;
        self.last_cr = false;
        self.data.clear();
        self.last = None;
        self.limits.pending = 0;
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
