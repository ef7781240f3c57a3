//! Server-sent events, per the WHATWG event-stream interpretation rules.

use bytes::Buf;
use memchr::{memchr, memchr2};

use crate::error::ScanError;
use crate::scan::{Captured, DEFAULT_MAX_EVENT_BYTES, Event, for_each_chunk};

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Line {
    /// Nothing of the current line seen yet.
    Start,
    /// Inside a field name (no colon yet).
    Name,
    /// Just after the colon: a single space here is dropped.
    AfterColon(Field),
    /// Inside a field value or a comment.
    Value(Field),
}

/// Incremental scanner for `text/event-stream` bodies.
///
/// Follows the WHATWG event-stream interpretation: LF, CR and CRLF line ends (a CR at the end of
/// one frame and the LF at the start of the next make one line end), a byte-order mark at the
/// start (even split across frames), `:` comments (reported as [`Event::Comment`]), the
/// `data`/`event`/`id`/`retry` fields (one space after the colon dropped, a line without a colon
/// is a field name with an empty value, unknown fields ignored), `data` lines joined with `\n`,
/// and a blank line that dispatches an [`Event::Sse`] only when the event had a `data` field. At
/// the end of the body an incomplete event is discarded.
///
/// Lines are never buffered: each frame is cut into line segments with `memchr`, and only what
/// must survive a frame boundary is kept (the field being read, the captured data, the event
/// name), in buffers that are reused, so a warm scanner does not allocate per frame.
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
#[derive(Debug)]
pub struct SseScanner {
    max: usize,
    capture: usize,
    bom_matched: u8,
    bom_done: bool,
    line: Line,
    after_cr: bool,
    line_len: usize,
    pending: usize,
    in_event: bool,
    name: [u8; MAX_FIELD_NAME],
    name_len: usize,
    has_data: bool,
    data: Vec<u8>,
    data_len: usize,
    event_name: Vec<u8>,
    comment: Vec<u8>,
    comment_len: usize,
    error: Option<ScanError>,
}

impl Default for SseScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl SseScanner {
    /// A scanner with the default cap ([`DEFAULT_MAX_EVENT_BYTES`]) that captures whole events.
    pub fn new() -> Self {
        SseScanner {
            max: DEFAULT_MAX_EVENT_BYTES,
            capture: usize::MAX,
            bom_matched: 0,
            bom_done: false,
            line: Line::Start,
            after_cr: false,
            line_len: 0,
            pending: 0,
            in_event: false,
            name: [0; MAX_FIELD_NAME],
            name_len: 0,
            has_data: false,
            data: Vec::new(),
            data_len: 0,
            event_name: Vec::new(),
            comment: Vec::new(),
            comment_len: 0,
            error: None,
        }
    }

    /// Sets the cap on one line and on one event (its raw bytes, line ends included).
    pub fn with_max_event_bytes(mut self, max: usize) -> Self {
        self.max = max;
        self
    }

    /// Copies at most `limit` bytes of each event's data (and of each comment) out of the
    /// stream; [`Captured::len`] still reports the full length. Default: everything (bounded by
    /// the cap). Takes effect for data not yet seen.
    pub fn set_capture(&mut self, limit: usize) {
        self.capture = limit;
    }

    /// Bytes fed since the last event boundary: the part of the stream that belongs to an
    /// event (or a line) not complete yet.
    pub fn pending_bytes(&self) -> usize {
        self.pending
    }

    /// Feeds one contiguous chunk; calls `on_event` for each complete event.
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
        if let Err(e) = result {
            self.error = Some(e);
        }
        result
    }

    /// Feeds every chunk of `buf` (without consuming it), see [`for_each_chunk`].
    pub fn feed_buf<B: Buf + ?Sized>(
        &mut self,
        buf: &B,
        mut on_event: impl FnMut(Event<'_>),
    ) -> Result<(), ScanError> {
        let mut result = Ok(());
        for_each_chunk(buf, |chunk| {
            if result.is_ok() {
                result = self.feed(chunk, &mut on_event);
            }
        });
        result
    }

    /// Ends the body. An incomplete event is discarded (per WHATWG); returns the error the
    /// scanner met, if any.
    pub fn finish(&mut self, on_event: impl FnMut(Event<'_>)) -> Result<(), ScanError> {
        let _ = on_event;
        match self.error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    fn feed_inner(
        &mut self,
        mut chunk: &[u8],
        on_event: &mut impl FnMut(Event<'_>),
    ) -> Result<(), ScanError> {
        if !self.bom_done {
            while let Some((&b, rest)) = chunk.split_first() {
                if b == BOM[usize::from(self.bom_matched)] {
                    self.bom_matched += 1;
                    self.pending += 1;
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
                        self.pending += 1;
                    }
                    chunk = &chunk[1..];
                    continue;
                }
            }
            match memchr2(b'\n', b'\r', chunk) {
                Some(i) => {
                    self.pending += i + 1;
                    self.check_line(i)?;
                    self.segment(&chunk[..i]);
                    self.after_cr = chunk[i] == b'\r';
                    self.line_end(on_event);
                    chunk = &chunk[i + 1..];
                }
                None => {
                    self.pending += chunk.len();
                    self.check_line(chunk.len())?;
                    self.segment(chunk);
                    break;
                }
            }
        }
        Ok(())
    }

    /// Adds `n` bytes to the current line and checks both caps.
    fn check_line(&mut self, n: usize) -> Result<(), ScanError> {
        self.line_len += n;
        if self.line_len > self.max {
            return Err(ScanError::too_long("sse line", self.max));
        }
        if self.pending > self.max {
            return Err(ScanError::too_long("sse event", self.max));
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
        let room = MAX_FIELD_NAME.saturating_sub(self.name_len);
        let n = room.min(bytes.len());
        self.name[self.name_len..self.name_len + n].copy_from_slice(&bytes[..n]);
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
        let room = self.capture.saturating_sub(self.data.len());
        if room > 0 {
            self.data.extend_from_slice(&bytes[..room.min(bytes.len())]);
        }
    }

    fn value(&mut self, field: Field, bytes: &[u8]) {
        match field {
            Field::Data => self.push_data(bytes),
            Field::Event => {
                let room = MAX_EVENT_NAME_BYTES.saturating_sub(self.event_name.len());
                self.event_name
                    .extend_from_slice(&bytes[..room.min(bytes.len())]);
            }
            Field::Comment => {
                self.comment_len += bytes.len();
                let room = self.capture.saturating_sub(self.comment.len());
                self.comment
                    .extend_from_slice(&bytes[..room.min(bytes.len())]);
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
                        },
                    });
                }
                self.has_data = false;
                self.data.clear();
                self.data_len = 0;
                self.event_name.clear();
                self.in_event = false;
                self.pending = 0;
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
                    },
                });
                if !self.in_event {
                    self.pending = 0;
                }
            }
            Line::AfterColon(_) | Line::Value(_) => {}
        }
        self.line = Line::Start;
        self.line_len = 0;
    }
}
