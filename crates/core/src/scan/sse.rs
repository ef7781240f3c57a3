//! Server-sent events, per the WHATWG event-stream interpretation rules.

use memchr::{memchr, memchr2};

use crate::error::ScanError;
use crate::scan::{Captured, Event, Framer, Limits, Scanner, capture, last_non_space};

const BOM: [u8; 3] = [0xEF, 0xBB, 0xBF];

/// How many bytes of an `event` field the scanner keeps: every real event name is far shorter,
/// and a longer one is reported by its first [`MAX_EVENT_NAME_BYTES`] bytes.
pub const MAX_EVENT_NAME_BYTES: usize = 64;

/// The longest field name the scanner knows (`event`, `retry`).
const MAX_FIELD_NAME: usize = 5;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Data,
    Event,
    Id,
    Retry,
    Ignore,
    Comment,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Line {
    /// Nothing of the current line seen yet.
    #[default]
    Start,
    /// Inside a field name (no colon yet).
    Name,
    /// Just after the colon: a single space here is dropped.
    AfterColon(Field),
    /// Inside a field value or a comment.
    Value(Field),
}

/// Scanner of `text/event-stream` bodies (see [`Sse`]).
///
/// ```
/// use tailguard_core::scan::{Event, SseScanner};
///
/// let mut scanner = SseScanner::new();
/// let mut events = Vec::new();
/// for frame in [&b"event: delta\r\ndata: {\"a\""[..], b":1}\r", b"\n\r\n: ping\n"] {
///     scanner
///         .feed(frame, |event| match event {
///             Event::Sse { name, data } => events.push((name.to_vec(), data.bytes.to_vec())),
///             Event::Comment { .. } => events.push((b"comment".to_vec(), Vec::new())),
///             _ => {}
///         })
///         .unwrap();
/// }
/// assert_eq!(events[0], (b"delta".to_vec(), b"{\"a\":1}".to_vec()));
/// assert_eq!(events[1].0, b"comment");
/// assert_eq!(scanner.pending_bytes(), 0);
/// ```
pub type SseScanner = Scanner<Sse>;

/// Server-sent events framing.
///
/// Follows the WHATWG event-stream interpretation: LF, CR and CRLF line ends (a CR at the end of
/// one frame and the LF at the start of the next make one line end), a byte-order mark at the
/// start (even split across frames), `:` comments (reported as [`Event::Comment`]), the
/// `data`/`event`/`id`/`retry` fields (one space after the colon dropped, a line without a colon
/// is a field name with an empty value, unknown fields ignored), `data` lines joined with `\n`,
/// and a blank line that dispatches an [`Event::Sse`] only when the event had a `data` field. At
/// the end of the body an incomplete event is discarded. The cap
/// ([`with_max_event_bytes`](Scanner::with_max_event_bytes)) bounds one line and one event (its
/// raw bytes, with every line end but the last one; comments inside the event included).
///
/// Lines are never buffered: each frame is cut into line segments with `memchr`, and only the
/// field being read, the captured data and the event name are kept, in buffers that are reused,
/// so a warm scanner does not allocate per frame.
#[derive(Debug, Default)]
pub struct Sse {
    limits: Limits,
    bom_matched: u8,
    bom_done: bool,
    line: Line,
    after_cr: bool,
    line_len: usize,
    in_event: bool,
    name: [u8; MAX_FIELD_NAME],
    name_len: usize,
    has_data: bool,
    data: Vec<u8>,
    data_len: usize,
    data_last: Option<u8>,
    event_name: Vec<u8>,
    comment: Vec<u8>,
    comment_len: usize,
    comment_last: Option<u8>,
}

impl Framer for Sse {
    fn limits(&self) -> &Limits {
        &self.limits
    }

    fn limits_mut(&mut self) -> &mut Limits {
        &mut self.limits
    }

    fn feed(
        &mut self,
        mut chunk: &[u8],
        on_event: &mut impl FnMut(Event<'_>),
    ) -> Result<(), ScanError> {
        if !self.bom_done {
            while let Some((&b, rest)) = chunk.split_first() {
                if b == BOM[usize::from(self.bom_matched)] {
                    self.bom_matched += 1;
                    self.limits.pending += 1;
                    chunk = rest;
                    if usize::from(self.bom_matched) == BOM.len() {
                        self.bom_done = true;
                        break;
                    }
                } else {
                    self.bom_done = true;
                    // A partial BOM followed by something else was line content after all
                    // (already counted as pending).
                    let m = usize::from(self.bom_matched);
                    if m > 0 {
                        self.check_line(m)?;
                        self.segment(&BOM[..m]);
                    }
                    break;
                }
            }
            if !self.bom_done {
                return Ok(());
            }
        }
        while !chunk.is_empty() {
            if self.after_cr {
                self.after_cr = false;
                if chunk[0] == b'\n' {
                    if self.in_event {
                        self.limits.pending += 1;
                    }
                    chunk = &chunk[1..];
                    continue;
                }
            }
            match memchr2(b'\n', b'\r', chunk) {
                Some(i) => {
                    // The line end itself does not count against the cap.
                    self.limits.pending += i;
                    self.check_line(i)?;
                    self.limits.pending += 1;
                    self.segment(&chunk[..i]);
                    self.after_cr = chunk[i] == b'\r';
                    self.line_end(on_event);
                    chunk = &chunk[i + 1..];
                }
                None => {
                    self.limits.pending += chunk.len();
                    self.check_line(chunk.len())?;
                    self.segment(chunk);
                    break;
                }
            }
        }
        Ok(())
    }
}

impl Sse {
    /// Adds `n` bytes to the current line and checks both caps.
    fn check_line(&mut self, n: usize) -> Result<(), ScanError> {
        self.line_len += n;
        // `pending` (the event so far) is never less than `line_len`, so the event cap is
        // crossed first, or at the same byte when the line is the whole event: the kind of error
        // depends on the bytes only, never on how they were split into frames.
        if self.limits.pending > self.limits.max || self.line_len > self.limits.max {
            let what = if self.line_len >= self.limits.pending {
                "sse line"
            } else {
                "sse event"
            };
            return Err(ScanError::too_long(what, self.limits.max));
        }
        Ok(())
    }

    /// Processes a piece of a line that holds no line end.
    fn segment(&mut self, mut seg: &[u8]) {
        while let Some(&first) = seg.first() {
            match self.line {
                Line::Start => {
                    if first == b':' {
                        self.line = Line::Value(Field::Comment);
                        self.comment.clear();
                        self.comment_len = 0;
                        self.comment_last = None;
                        seg = &seg[1..];
                    } else {
                        self.line = Line::Name;
                        self.name_len = 0;
                        self.in_event = true;
                    }
                }
                Line::Name => match memchr(b':', seg) {
                    Some(i) => {
                        self.push_name(&seg[..i]);
                        let field = self.field();
                        self.begin_field(field);
                        self.line = Line::AfterColon(field);
                        seg = &seg[i + 1..];
                    }
                    None => {
                        self.push_name(seg);
                        return;
                    }
                },
                Line::AfterColon(field) => {
                    if first == b' ' {
                        seg = &seg[1..];
                    }
                    self.line = Line::Value(field);
                }
                Line::Value(field) => {
                    self.value(field, seg);
                    return;
                }
            }
        }
    }

    fn push_name(&mut self, bytes: &[u8]) {
        if self.name_len < MAX_FIELD_NAME {
            let n = (MAX_FIELD_NAME - self.name_len).min(bytes.len());
            self.name[self.name_len..self.name_len + n].copy_from_slice(&bytes[..n]);
        }
        // Counts past the buffer so that a longer name never matches a known one.
        self.name_len = self.name_len.saturating_add(bytes.len());
    }

    fn field(&self) -> Field {
        if self.name_len > MAX_FIELD_NAME {
            return Field::Ignore;
        }
        match &self.name[..self.name_len] {
            b"data" => Field::Data,
            b"event" => Field::Event,
            b"id" => Field::Id,
            b"retry" => Field::Retry,
            _ => Field::Ignore,
        }
    }

    fn begin_field(&mut self, field: Field) {
        match field {
            Field::Data => {
                if self.has_data {
                    self.push_data(b"\n");
                }
                self.has_data = true;
            }
            Field::Event => self.event_name.clear(),
            // `id` and `retry` do not concern token tracking; they are recognised (so they are
            // not "unknown") and otherwise left to the client.
            Field::Id | Field::Retry | Field::Ignore | Field::Comment => {}
        }
    }

    fn push_data(&mut self, bytes: &[u8]) {
        self.data_len += bytes.len();
        self.data_last = last_non_space(bytes, self.data_last);
        capture(&mut self.data, self.limits.capture, bytes);
    }

    fn value(&mut self, field: Field, bytes: &[u8]) {
        match field {
            Field::Data => self.push_data(bytes),
            Field::Event => capture(&mut self.event_name, MAX_EVENT_NAME_BYTES, bytes),
            Field::Comment => {
                self.comment_len += bytes.len();
                self.comment_last = last_non_space(bytes, self.comment_last);
                capture(&mut self.comment, self.limits.capture, bytes);
            }
            Field::Id | Field::Retry | Field::Ignore => {}
        }
    }

    fn line_end(&mut self, on_event: &mut impl FnMut(Event<'_>)) {
        match self.line {
            Line::Start => {
                // A blank line: dispatch (when there was a data field) and start over.
                if self.has_data {
                    let n = self.data.len().min(self.data_len);
                    on_event(Event::Sse {
                        name: &self.event_name,
                        data: Captured {
                            bytes: &self.data[..n],
                            len: self.data_len,
                            last: self.data_last,
                        },
                    });
                }
                self.has_data = false;
                self.data.clear();
                self.data_len = 0;
                self.data_last = None;
                self.event_name.clear();
                self.in_event = false;
                self.limits.pending = 0;
            }
            Line::Name => {
                let field = self.field();
                self.begin_field(field);
            }
            Line::AfterColon(Field::Comment) | Line::Value(Field::Comment) => {
                on_event(Event::Comment {
                    text: Captured {
                        bytes: &self.comment,
                        len: self.comment_len,
                        last: self.comment_last,
                    },
                });
                if !self.in_event {
                    self.limits.pending = 0;
                }
            }
            Line::AfterColon(_) | Line::Value(_) => {}
        }
        self.line = Line::Start;
        self.line_len = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Eq)]
    enum Ev {
        Comment(Vec<u8>, usize),
        Sse(Vec<u8>, Vec<u8>, usize),
    }

    fn feed_all(scanner: &mut SseScanner, frames: &[&[u8]]) -> Result<Vec<Ev>, ScanError> {
        let mut out = Vec::new();
        for frame in frames {
            scanner.feed(frame, |e| push(&mut out, e))?;
        }
        scanner.finish(|e| push(&mut out, e))?;
        Ok(out)
    }

    fn push(out: &mut Vec<Ev>, e: Event<'_>) {
        match e {
            Event::Comment { text } => out.push(Ev::Comment(text.bytes.to_vec(), text.len)),
            Event::Sse { name, data } => {
                out.push(Ev::Sse(name.to_vec(), data.bytes.to_vec(), data.len))
            }
            other => panic!("unexpected {other:?}"),
        }
    }

    fn events(input: &[u8]) -> Vec<Ev> {
        let whole = feed_all(&mut SseScanner::new(), &[input]).unwrap();
        let bytewise: Vec<&[u8]> = input.chunks(1).collect();
        assert_eq!(feed_all(&mut SseScanner::new(), &bytewise).unwrap(), whole);
        whole
    }

    fn sse(name: &str, data: &str) -> Ev {
        Ev::Sse(name.into(), data.into(), data.len())
    }

    #[test]
    fn lf_cr_and_crlf_line_ends() {
        let want = vec![sse("", "a"), sse("", "b"), sse("", "c")];
        assert_eq!(events(b"data: a\n\ndata: b\r\rdata: c\r\n\r\n"), want);
        assert_eq!(events(b"data: a\r\n\r\ndata: b\n\ndata: c\r\r"), want);
    }

    #[test]
    fn cr_at_end_of_frame_and_lf_at_start_of_next_are_one_line_end() {
        let mut s = SseScanner::new();
        let got = feed_all(&mut s, &[b"data: a\r", b"\n\r", b"\ndata: b\r", b"\r"]).unwrap();
        assert_eq!(got, vec![sse("", "a"), sse("", "b")]);
        // A CR then an LF that starts a *blank* line would be two line ends; here it is one,
        // so `data: a\r` + `\n` + `data: x\n\n` is one event with data `x` after `a`.
        let got = feed_all(&mut SseScanner::new(), &[b"data: a\r", b"\ndata: x\n\n"]).unwrap();
        assert_eq!(got, vec![sse("", "a\nx")]);
    }

    #[test]
    fn bom_at_start_is_skipped_even_split() {
        assert_eq!(events(b"\xEF\xBB\xBFdata: a\n\n"), vec![sse("", "a")]);
        let got = feed_all(
            &mut SseScanner::new(),
            &[b"\xEF", b"\xBB", b"\xBFdata: a\n\n"],
        )
        .unwrap();
        assert_eq!(got, vec![sse("", "a")]);
        // Only at the very start: a second BOM is part of the field name (unknown field).
        assert_eq!(events(b"\xEF\xBB\xBF\xEF\xBB\xBFdata: a\n\n"), vec![]);
    }

    #[test]
    fn partial_bom_is_line_content() {
        // `\xEF` then `d`: not a BOM; the line's field name is `\xEFdata`, unknown.
        assert_eq!(events(b"\xEFdata: a\n\ndata: b\n\n"), vec![sse("", "b")]);
        assert_eq!(events(b"\xEF\xBB:c\n"), vec![]);
        // `\xEF\xBB` then `:`... the field name is `\xEF\xBB`, not a comment.
        assert_eq!(events(b":c\n"), vec![Ev::Comment(b"c".to_vec(), 1)]);
    }

    #[test]
    fn comments_are_events() {
        assert_eq!(
            events(b": keepalive\n:\ndata: a\n: inside\n\n"),
            vec![
                Ev::Comment(b" keepalive".to_vec(), 10),
                Ev::Comment(Vec::new(), 0),
                Ev::Comment(b" inside".to_vec(), 7),
                sse("", "a"),
            ]
        );
    }

    #[test]
    fn multi_line_data_is_joined_with_lf() {
        assert_eq!(
            events(b"data: a\ndata:b\ndata:  c\n\n"),
            vec![sse("", "a\nb\n c")]
        );
    }

    #[test]
    fn only_one_space_after_the_colon_is_dropped() {
        assert_eq!(events(b"data:  x\n\n"), vec![sse("", " x")]);
        assert_eq!(events(b"data:x\n\n"), vec![sse("", "x")]);
        assert_eq!(events(b"data:\tx\n\n"), vec![sse("", "\tx")]);
    }

    #[test]
    fn line_without_colon_is_a_field_with_empty_value() {
        assert_eq!(events(b"data\n\n"), vec![sse("", "")]);
        assert_eq!(events(b"data\ndata\n\n"), vec![sse("", "\n")]);
        assert_eq!(events(b"event\ndata: a\n\n"), vec![sse("", "a")]);
    }

    #[test]
    fn data_alone_dispatches_empty_data() {
        assert_eq!(events(b"data:\n\n"), vec![sse("", "")]);
    }

    #[test]
    fn events_without_data_are_not_dispatched() {
        assert_eq!(events(b"event: x\n\nid: 1\n\nretry: 5\n\n\n\n"), vec![]);
        // ...and the event name does not leak into the next event.
        assert_eq!(events(b"event: x\n\ndata: a\n\n"), vec![sse("", "a")]);
    }

    #[test]
    fn event_field_names_the_event_last_one_wins() {
        assert_eq!(
            events(b"event: a\nevent: ping\ndata: {}\n\n"),
            vec![sse("ping", "{}")]
        );
        assert_eq!(events(b"data: {}\nevent: x\n\n"), vec![sse("x", "{}")]);
    }

    #[test]
    fn unknown_fields_and_id_retry_are_ignored() {
        assert_eq!(
            events(b"foo: bar\nid: 7\nretry: 10\ndatax: y\nDATA: z\ndata: a\n\n"),
            vec![sse("", "a")]
        );
    }

    #[test]
    fn long_event_name_is_truncated() {
        let name = "n".repeat(100);
        let input = format!("event: {name}\ndata: a\n\n");
        assert_eq!(
            events(input.as_bytes()),
            vec![sse(&name[..MAX_EVENT_NAME_BYTES], "a")]
        );
    }

    #[test]
    fn incomplete_event_at_end_is_discarded() {
        let mut s = SseScanner::new();
        assert_eq!(
            feed_all(&mut s, &[b"data: a\n\ndata: b\n"]).unwrap(),
            vec![sse("", "a")]
        );
        assert_eq!(s.pending_bytes(), 8);
        assert_eq!(
            feed_all(&mut SseScanner::new(), &[b"data: a"]).unwrap(),
            vec![]
        );
    }

    #[test]
    fn pending_bytes_count_since_the_last_boundary() {
        let mut s = SseScanner::new();
        let mut n = 0;
        s.feed(b"data: a\n", |_| n += 1).unwrap();
        assert_eq!(s.pending_bytes(), 8);
        s.feed(b"\ndata: b", |_| n += 1).unwrap();
        assert_eq!((n, s.pending_bytes()), (1, 7));
        s.feed(b"\r\n\r", |_| n += 1).unwrap();
        assert_eq!((n, s.pending_bytes()), (2, 0));
        // The LF of a CRLF after a boundary is not pending.
        s.feed(b"\n", |_| n += 1).unwrap();
        assert_eq!(s.pending_bytes(), 0);
        // A comment between events is a boundary of its own...
        s.feed(b": c\n", |_| n += 1).unwrap();
        assert_eq!(s.pending_bytes(), 0);
        // ...but not inside an event.
        s.feed(b"data: x\n: c\n", |_| n += 1).unwrap();
        assert_eq!(s.pending_bytes(), 12);
    }

    #[test]
    fn capture_limits_the_copy_but_not_the_length() {
        let mut s = SseScanner::new();
        s.set_capture(4);
        let got = feed_all(&mut s, &[b"data: [DONE]xyz\ndata: 12\n\n: comment\n"]).unwrap();
        assert_eq!(
            got,
            vec![
                Ev::Sse(Vec::new(), b"[DON".to_vec(), 12),
                Ev::Comment(b" com".to_vec(), 8)
            ]
        );
        let mut s = SseScanner::new();
        s.set_capture(0);
        let got = feed_all(&mut s, &[b"data: abc\n\n"]).unwrap();
        assert_eq!(got, vec![Ev::Sse(Vec::new(), Vec::new(), 3)]);
    }

    #[test]
    fn line_over_the_cap_is_an_error_even_when_not_capturing() {
        let mut s = SseScanner::new().with_max_event_bytes(16);
        s.set_capture(0);
        let err = s.feed(&[b'x'; 17], |_| {}).unwrap_err();
        assert_eq!((err.what(), err.limit()), ("sse line", 16));
        // The scanner is spent.
        assert_eq!(s.feed(b"\n\n", |_| panic!()).unwrap_err(), err);
        assert_eq!(s.finish(|_| panic!()).unwrap_err(), err);

        // Fed byte by byte, the same.
        let mut s = SseScanner::new().with_max_event_bytes(16);
        let mut result = Ok(());
        for _ in 0..17 {
            result = result.and_then(|()| s.feed(b":", |_| {}));
        }
        assert_eq!(result.unwrap_err().what(), "sse line");
        // An event of exactly the cap (line ends but the last included) is fine.
        let mut s = SseScanner::new().with_max_event_bytes(16);
        let got = feed_all(&mut s, &[b"data: 012345678", b"\n\n"]).unwrap();
        assert_eq!(got, vec![sse("", "012345678")]);
        let mut s = SseScanner::new().with_max_event_bytes(16);
        let got = feed_all(&mut s, &[b":123456789012345", b"\n"]).unwrap();
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn event_over_the_cap_is_an_error() {
        let mut s = SseScanner::new().with_max_event_bytes(16);
        let err = feed_all(&mut s, &[b"data: 12345\ndata: 12345\n"]).unwrap_err();
        assert_eq!(err.what(), "sse event");
        // Comments between events do not add up.
        let mut s = SseScanner::new().with_max_event_bytes(16);
        let input = b": 0123456789\n".repeat(10);
        assert_eq!(feed_all(&mut s, &[&input]).unwrap().len(), 10);
    }

    #[test]
    fn lines_are_not_buffered_fed_one_byte_at_a_time() {
        // A 200 KB data line fed one byte per frame with a 16-byte capture: only the captured
        // prefix is kept, whatever the line's length (so the work per byte is constant).
        let mut s = SseScanner::new();
        s.set_capture(16);
        let mut input = b"event: content_block_delta\ndata: ".to_vec();
        input.extend(std::iter::repeat_n(b'x', 200_000));
        input.extend_from_slice(b"\n: also a long comment ");
        input.extend(std::iter::repeat_n(b'y', 50_000));
        input.extend_from_slice(b"\n\n");
        let mut got = Vec::new();
        for byte in input.chunks(1) {
            s.feed(byte, |e| push(&mut got, e)).unwrap();
            assert!(s.framing.data.capacity() <= 64 && s.framing.comment.capacity() <= 64);
        }
        assert_eq!(
            got,
            vec![
                Ev::Comment(b" also a long com".to_vec(), 50_000 + 21),
                Ev::Sse(
                    b"content_block_delta".to_vec(),
                    b"xxxxxxxxxxxxxxxx".to_vec(),
                    200_000
                ),
            ]
        );
    }

    #[test]
    fn feed_buf_sees_every_chunk() {
        let buf = bytes::Buf::chain(&b"data: a"[..], &b"b\n\n"[..]);
        let mut s = SseScanner::new();
        let mut out = Vec::new();
        s.feed_buf(&buf, |e| push(&mut out, e)).unwrap();
        assert_eq!(out, vec![sse("", "ab")]);
    }
}
