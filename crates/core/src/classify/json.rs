//! The JSON the presets read before the first token, walked without allocating.
//!
//! A small recursive-descent reader that accepts exactly the documents
//! `serde_json::from_slice::<serde_json::Value>` accepts (UTF-8, control characters and escapes
//! in strings, paired surrogates, number syntax and range, nesting limit of 128, trailing
//! whitespace only) and reads only what a decision needs: whether a string, array or object is
//! empty, whether a value is `null` or `true`, which of a few names a member name or string is.
//! Nothing is built: no `Value`, no owned or unescaped strings (a name with escapes is unescaped
//! into a small stack buffer). A member given twice counts by its last value, as in a `Value`
//! map, so the whole document is always read: a decision known half-way can still be undone by
//! a later duplicate or by a syntax error (which makes the document undecidable).
//!
//! Where the time goes, per byte: strings (most of a chunk) are skipped eight bytes at a time,
//! looking only for `"`, `\` and control characters; member names without escapes are compared
//! in place, with a `match` per object kind; short integers are read here, and the UTF-8 check
//! runs only when a string held a byte over 0x7f (an all-ASCII document is valid UTF-8).
//!
//! Numbers other than short integers are handed to serde_json's own number parser, so that the
//! range (`1e400` is an error) is exactly serde_json's; that allocates nothing unless a crate in
//! the build enables serde_json's `float_roundtrip` or `arbitrary_precision` feature.

use super::{Class, anthropic_event};

/// The document is not JSON (or not the JSON `Value` would accept).
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Malformed;

type Result<T> = std::result::Result<T, Malformed>;

/// What [`openai_json`](super::openai_json) needs from a chunk.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Chunk {
    /// The (last) `error` member is present and not `null`.
    pub(super) error: bool,
    /// The (last) `choices` member is an array with a choice that has output.
    pub(super) token: bool,
}

/// Reads an OpenAI chunk. `None` when it is not an object.
pub(super) fn chunk(bytes: &[u8]) -> Result<Option<Chunk>> {
    Reader::document(bytes, |r| {
        if r.start()? != b'{' {
            r.skip()?;
            return Ok(None);
        }
        let mut chunk = Chunk::default();
        r.object(|r, name| {
            match name {
                b"error" => chunk.error = r.not_null()?,
                b"choices" => chunk.token = r.any_element(Reader::choice)?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(Some(chunk))
    })
}

/// The members of a delta that carry output (see `choice_has_output`), in the order
/// [`output_key`] numbers them.
const OUTPUT_KEYS: [&str; 6] = [
    "content",
    "reasoning_content",
    "reasoning",
    "tool_calls",
    "refusal",
    "function_call",
];

/// The index of `name` in [`OUTPUT_KEYS`].
#[inline]
fn output_key(name: &[u8]) -> Option<usize> {
    Some(match name {
        b"content" => 0,
        b"reasoning_content" => 1,
        b"reasoning" => 2,
        b"tool_calls" => 3,
        b"refusal" => 4,
        b"function_call" => 5,
        _ => return None,
    })
}

/// Anthropic's event names, as `type` values (the names [`anthropic_event`] knows).
const EVENT_NAMES: [&str; 8] = [
    "content_block_delta",
    "ping",
    "message_start",
    "content_block_start",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "error",
];

/// The class an Anthropic event's `type` names: `None` when the document is malformed, not an
/// object, has no `type`, or its (last) `type` is not a string naming an Anthropic event.
pub(super) fn anthropic_type(bytes: &[u8]) -> Option<Class> {
    Reader::document(bytes, |r| {
        if r.start()? != b'{' {
            r.skip()?;
            return Ok(None);
        }
        let mut class = None;
        let mut buf = [0; MAX_NAME];
        r.object(|r, name| {
            match name {
                b"type" if r.start()? == b'"' => {
                    let span = r.string()?;
                    class = anthropic_event(r.text(span, &mut buf));
                }
                b"type" => {
                    r.skip()?;
                    class = None;
                }
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(class)
    })
    .ok()
    .flatten()
}

/// What [`ndjson`](super::ndjson) needs from a line.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Line {
    /// The (last) `error` member is present and not `null`.
    pub(super) error: bool,
    /// The (last) `done` member is `true`.
    pub(super) done: bool,
    /// The (last) `response` is non-empty, or the (last) `message` is an object whose (last)
    /// `content` or (last) `tool_calls` is non-empty.
    pub(super) output: bool,
}

/// Reads an NDJSON line (Ollama's `/api/generate` and `/api/chat`). `None` when it is not an
/// object.
pub(super) fn line(bytes: &[u8]) -> Result<Option<Line>> {
    Reader::document(bytes, |r| {
        if r.start()? != b'{' {
            r.skip()?;
            return Ok(None);
        }
        let mut line = Line::default();
        let (mut response, mut message) = (false, false);
        r.object(|r, name| {
            match name {
                b"error" => line.error = r.not_null()?,
                b"done" => line.done = r.scalar_or_skip()? == Some(Scalar::True),
                b"response" => response = r.non_empty()?,
                b"message" => message = r.message()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        line.output = response || message;
        Ok(Some(line))
    })
}

/// A literal or a number.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Scalar {
    Null,
    True,
    False,
    Number,
}

/// Where a string read lies: its raw bytes (between the quotes) are `start..end`.
#[derive(Clone, Copy)]
struct Span {
    start: usize,
    end: usize,
    /// It has an escape (its raw bytes are not its characters).
    escaped: bool,
}

impl Span {
    /// It has no characters (an escape is at least one).
    fn is_empty(&self) -> bool {
        self.start == self.end
    }
}

/// serde_json's nesting limit: the 128th nested array or object is an error.
const MAX_DEPTH: u8 = 128;

/// Names compared with are at most this long (an escaped string that unescapes to more matches
/// no name).
const MAX_NAME: usize = 24;

// The longest names fit, and none is empty (the empty name stands for "too long to compare").
const _: () = {
    let mut i = 0;
    while i < EVENT_NAMES.len() {
        assert!(EVENT_NAMES[i].len() <= MAX_NAME && !EVENT_NAMES[i].is_empty());
        i += 1;
    }
    let mut i = 0;
    while i < OUTPUT_KEYS.len() {
        assert!(OUTPUT_KEYS[i].len() <= MAX_NAME && !OUTPUT_KEYS[i].is_empty());
        i += 1;
    }
};

/// Eight `0x80` bytes: the high bit of each byte of a word.
const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Levels of nesting left, as serde_json's `remaining_depth`.
    depth: u8,
    /// The bytes of strings seen, or-ed together (and some bytes next to them): a byte with
    /// its high bit set means the document is not all ASCII and needs the UTF-8 check.
    high: u64,
}

impl<'a> Reader<'a> {
    /// Reads `bytes` as one JSON document with `read`, which must consume one value; then only
    /// whitespace may follow.
    fn document<T>(bytes: &'a [u8], read: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        let mut r = Reader {
            bytes,
            at: 0,
            depth: MAX_DEPTH,
            high: 0,
        };
        let out = read(&mut r)?;
        r.whitespace();
        if r.at != r.bytes.len() {
            return Err(Malformed);
        }
        // Outside strings a document that was read is ASCII, and every raw byte of every
        // string went through `plain`: when none had its high bit set the document is ASCII,
        // hence UTF-8. Otherwise this is the UTF-8 check of every string (a run of raw bytes
        // between escapes cannot end inside a character of valid UTF-8).
        if r.high & HIGH != 0 && std::str::from_utf8(bytes).is_err() {
            return Err(Malformed);
        }
        Ok(out)
    }

    #[inline(always)]
    fn whitespace(&mut self) {
        if self.bytes.get(self.at).is_none_or(|&b| b > b' ') {
            return;
        }
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    /// Skips whitespace and returns the first byte of the value that must follow.
    #[inline(always)]
    fn start(&mut self) -> Result<u8> {
        self.whitespace();
        self.bytes.get(self.at).copied().ok_or(Malformed)
    }

    /// Skips whitespace; true (and consumed) when `byte` follows.
    #[inline(always)]
    fn eat(&mut self, byte: u8) -> bool {
        if self.bytes.get(self.at) != Some(&byte) {
            self.whitespace();
            if self.bytes.get(self.at) != Some(&byte) {
                return false;
            }
        }
        self.at += 1;
        true
    }

    /// After a member or element: skips whitespace and consumes a `,` (false) or `close`
    /// (true).
    #[inline(always)]
    fn next(&mut self, close: u8) -> Result<bool> {
        let mut b = *self.bytes.get(self.at).ok_or(Malformed)?;
        if b <= b' ' {
            self.whitespace();
            b = *self.bytes.get(self.at).ok_or(Malformed)?;
        }
        self.at += 1;
        if b == b',' {
            Ok(false)
        } else if b == close {
            Ok(true)
        } else {
            Err(Malformed)
        }
    }

    /// Consumes one value.
    #[inline(always)]
    fn skip(&mut self) -> Result<()> {
        match self.start()? {
            b'"' => self.string().map(drop),
            b'{' => self.skip_object().map(drop),
            b'[' => self.skip_array().map(drop),
            _ => self.scalar().map(drop),
        }
    }

    /// Consumes one value: a non-empty string, array or object?
    #[inline(always)]
    fn non_empty(&mut self) -> Result<bool> {
        Ok(match self.start()? {
            b'"' => !self.string()?.is_empty(),
            b'{' => self.skip_object()? > 0,
            b'[' => self.skip_array()? > 0,
            _ => self.scalar().map(|_| false)?,
        })
    }

    /// Consumes one value: anything but `null`?
    fn not_null(&mut self) -> Result<bool> {
        Ok(self.scalar_or_skip()? != Some(Scalar::Null))
    }

    /// Consumes one value: which scalar, if it is one?
    fn scalar_or_skip(&mut self) -> Result<Option<Scalar>> {
        match self.start()? {
            b'{' | b'[' | b'"' => self.skip().map(|()| None),
            _ => self.scalar().map(Some),
        }
    }

    /// Consumes one value: an array one of whose elements `element` says yes to?
    fn any_element(&mut self, mut element: impl FnMut(&mut Self) -> Result<bool>) -> Result<bool> {
        if self.start()? != b'[' {
            return self.skip().map(|()| false);
        }
        let mut any = false;
        self.array(|r| {
            any |= element(r)?;
            Ok(())
        })?;
        Ok(any)
    }

    /// Consumes one choice: a non-empty `text`, or a `delta` with output.
    fn choice(&mut self) -> Result<bool> {
        if self.start()? != b'{' {
            return self.skip().map(|()| false);
        }
        let (mut text, mut delta) = (false, false);
        self.object(|r, name| {
            match name {
                b"text" => text = r.non_empty()?,
                b"delta" => delta = r.delta()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(text || delta)
    }

    /// Consumes one delta: one of [`OUTPUT_KEYS`] non-empty (the last of duplicates counting)?
    fn delta(&mut self) -> Result<bool> {
        if self.start()? != b'{' {
            return self.skip().map(|()| false);
        }
        let mut found = [false; OUTPUT_KEYS.len()];
        self.object(|r, name| {
            match output_key(name) {
                Some(i) => found[i] = r.non_empty()?,
                None => r.skip()?,
            }
            Ok(())
        })?;
        Ok(found.contains(&true))
    }

    /// Consumes one `message`: an object whose `content` or `tool_calls` is non-empty?
    fn message(&mut self) -> Result<bool> {
        if self.start()? != b'{' {
            return self.skip().map(|()| false);
        }
        let (mut content, mut tool_calls) = (false, false);
        self.object(|r, name| {
            match name {
                b"content" => content = r.non_empty()?,
                b"tool_calls" => tool_calls = r.non_empty()?,
                _ => r.skip()?,
            }
            Ok(())
        })?;
        Ok(content || tool_calls)
    }

    /// One level of nesting deeper.
    #[inline]
    fn enter(&mut self) -> Result<()> {
        self.depth -= 1;
        if self.depth == 0 {
            return Err(Malformed);
        }
        self.at += 1;
        Ok(())
    }

    /// Reads an object (at its `{`), calling `member` with each member's name (its
    /// characters; empty when it has escapes and is longer than any name compared with) to
    /// consume its value.
    #[inline]
    fn object(&mut self, mut member: impl FnMut(&mut Self, &[u8]) -> Result<()>) -> Result<()> {
        self.enter()?;
        if !self.eat(b'}') {
            let mut buf = [0; MAX_NAME];
            loop {
                if self.start()? != b'"' {
                    return Err(Malformed);
                }
                let span = self.string()?;
                if !self.eat(b':') {
                    return Err(Malformed);
                }
                let name = self.text(span, &mut buf);
                member(self, name)?;
                if self.next(b'}')? {
                    break;
                }
            }
        }
        self.depth += 1;
        Ok(())
    }

    /// Reads an object (at its `{`) without looking at it. Returns the number of members.
    #[inline(never)]
    fn skip_object(&mut self) -> Result<usize> {
        self.enter()?;
        let mut members = 0;
        if !self.eat(b'}') {
            loop {
                if self.start()? != b'"' {
                    return Err(Malformed);
                }
                self.string()?;
                if !self.eat(b':') {
                    return Err(Malformed);
                }
                self.skip()?;
                members += 1;
                if self.next(b'}')? {
                    break;
                }
            }
        }
        self.depth += 1;
        Ok(members)
    }

    /// Reads an array (at its `[`) without looking at it. Returns the number of elements.
    #[inline(never)]
    fn skip_array(&mut self) -> Result<usize> {
        let mut elements = 0;
        self.array(|r| {
            elements += 1;
            r.skip()
        })?;
        Ok(elements)
    }

    /// Reads an array (at its `[`), calling `element` to consume each element.
    #[inline]
    fn array(&mut self, mut element: impl FnMut(&mut Self) -> Result<()>) -> Result<()> {
        self.enter()?;
        if !self.eat(b']') {
            loop {
                element(self)?;
                if self.next(b']')? {
                    break;
                }
            }
        }
        self.depth += 1;
        Ok(())
    }

    /// Reads a string (at its `"`).
    #[inline(always)]
    fn string(&mut self) -> Result<Span> {
        self.at += 1;
        let start = self.at;
        self.at = plain(self.bytes, self.at, &mut self.high);
        if self.bytes.get(self.at) == Some(&b'"') {
            let end = self.at;
            self.at += 1;
            return Ok(Span {
                start,
                end,
                escaped: false,
            });
        }
        self.string_escaped(start)
    }

    /// The rest of a string (at the first byte `plain` stopped at that is not its end).
    #[inline(never)]
    fn string_escaped(&mut self, start: usize) -> Result<Span> {
        loop {
            match *self.bytes.get(self.at).ok_or(Malformed)? {
                b'"' => break,
                b'\\' => {
                    self.at += 1;
                    self.escape()?;
                }
                // A control character.
                _ => return Err(Malformed),
            }
            self.at = plain(self.bytes, self.at, &mut self.high);
        }
        let end = self.at;
        self.at += 1;
        Ok(Span {
            start,
            end,
            escaped: true,
        })
    }

    /// The characters of the string read at `span`, to compare with names: its raw bytes when
    /// it has no escape, else unescaped into `buf` (empty when longer than `MAX_NAME` bytes,
    /// matching no name).
    #[inline]
    fn text<'b>(&self, span: Span, buf: &'b mut [u8; MAX_NAME]) -> &'b [u8]
    where
        'a: 'b,
    {
        let raw = &self.bytes[span.start..span.end];
        if span.escaped {
            unescape(raw, buf)
        } else {
            raw
        }
    }

    /// Reads an escape (after its backslash): the character it stands for.
    fn escape(&mut self) -> Result<char> {
        let c = *self.bytes.get(self.at).ok_or(Malformed)?;
        self.at += 1;
        Ok(match c {
            b'"' => '"',
            b'\\' => '\\',
            b'/' => '/',
            b'b' => '\u{8}',
            b'f' => '\u{c}',
            b'n' => '\n',
            b'r' => '\r',
            b't' => '\t',
            b'u' => {
                let n = self.hex4()?;
                match n {
                    // A trailing surrogate first, or a leading one not followed by a trailing
                    // `\u` one: serde_json refuses both in strings.
                    0xDC00..=0xDFFF => return Err(Malformed),
                    0xD800..=0xDBFF => {
                        if self.bytes.get(self.at..self.at + 2) != Some(b"\\u") {
                            return Err(Malformed);
                        }
                        self.at += 2;
                        let n2 = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&n2) {
                            return Err(Malformed);
                        }
                        let c = (u32::from(n - 0xD800) << 10 | u32::from(n2 - 0xDC00)) + 0x1_0000;
                        char::from_u32(c).ok_or(Malformed)?
                    }
                    n => char::from_u32(u32::from(n)).ok_or(Malformed)?,
                }
            }
            _ => return Err(Malformed),
        })
    }

    /// Four hex digits.
    fn hex4(&mut self) -> Result<u16> {
        let digits = self.bytes.get(self.at..self.at + 4).ok_or(Malformed)?;
        let mut n = 0u16;
        for &d in digits {
            let v = match d {
                b'0'..=b'9' => d - b'0',
                b'a'..=b'f' => d - b'a' + 10,
                b'A'..=b'F' => d - b'A' + 10,
                _ => return Err(Malformed),
            };
            n = n << 4 | u16::from(v);
        }
        self.at += 4;
        Ok(n)
    }

    /// Reads `null`, `true`, `false` or a number.
    #[inline(always)]
    fn scalar(&mut self) -> Result<Scalar> {
        let rest = &self.bytes[self.at..];
        let (scalar, len) = match rest.first() {
            Some(b'n') if rest.starts_with(b"null") => (Scalar::Null, 4),
            Some(b't') if rest.starts_with(b"true") => (Scalar::True, 4),
            Some(b'f') if rest.starts_with(b"false") => (Scalar::False, 5),
            Some(b'-' | b'0'..=b'9') => (Scalar::Number, number(rest)?),
            _ => return Err(Malformed),
        };
        self.at += len;
        Ok(scalar)
    }
}

/// The characters of the raw bytes of a string with escapes (already validated), unescaped into
/// `buf`; empty when they do not fit.
#[cold]
fn unescape<'b>(raw: &[u8], buf: &'b mut [u8; MAX_NAME]) -> &'b [u8] {
    let mut r = Reader {
        bytes: raw,
        at: 0,
        depth: MAX_DEPTH,
        high: 0,
    };
    let mut len = 0;
    while r.at < raw.len() {
        let run = r.at;
        r.at = plain(raw, r.at, &mut r.high);
        push(buf, &mut len, &raw[run..r.at]);
        if r.at < raw.len() {
            // A backslash: the string was read, so the escape is valid.
            r.at += 1;
            let Ok(c) = r.escape() else {
                return &[];
            };
            push(buf, &mut len, c.encode_utf8(&mut [0; 4]).as_bytes());
        }
    }
    buf.get(..len).unwrap_or_default()
}

/// The index of the first `"`, `\` or control character in `bytes` from `at` on (or the length).
/// Every byte looked at is or-ed into `high`.
///
/// Eight bytes at a time, as serde_json skips strings: for each of the three tests the classic
/// "has a zero / a smaller byte" bit trick flags the lowest matching byte exactly.
#[inline(always)]
fn plain(bytes: &[u8], mut at: usize, high: &mut u64) -> usize {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const QUOTES: u64 = u64::from_ne_bytes([b'"'; 8]);
    const BACKSLASHES: u64 = u64::from_ne_bytes([b'\\'; 8]);
    const SPACES: u64 = u64::from_ne_bytes([b' '; 8]);
    while let Some(word) = bytes.get(at..at + 8) {
        let mut eight = [0; 8];
        eight.copy_from_slice(word);
        let w = u64::from_le_bytes(eight);
        *high |= w;
        let quote = w ^ QUOTES;
        let backslash = w ^ BACKSLASHES;
        let found = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (w.wrapping_sub(SPACES) & !w);
        let found = found & HIGH;
        if found != 0 {
            // Little-endian: the lowest set bit is the first byte.
            return at + (found.trailing_zeros() / 8) as usize;
        }
        at += 8;
    }
    while let Some(&b) = bytes.get(at) {
        if b == b'"' || b == b'\\' || b < b' ' {
            break;
        }
        *high |= u64::from(b);
        at += 1;
    }
    at
}

/// The length of the number `bytes` starts with.
#[inline(always)]
fn number(bytes: &[u8]) -> Result<usize> {
    // An integer of up to 18 digits without a leading zero, not followed by a character that
    // could continue a number: always in range.
    let sign = usize::from(bytes.first() == Some(&b'-'));
    let digits = bytes[sign..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count();
    let len = sign + digits;
    let simple = (digits == 1 || (digits > 1 && digits <= 18 && bytes[sign] != b'0'))
        && !matches!(bytes.get(len), Some(b'-' | b'+' | b'.' | b'e' | b'E'));
    if simple {
        return Ok(len);
    }
    number_general(bytes)
}

/// [`number`] for anything but a short integer.
#[cold]
fn number_general(bytes: &[u8]) -> Result<usize> {
    let len = bytes
        .iter()
        .position(|b| !matches!(b, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
        .unwrap_or(bytes.len());
    let token = &bytes[..len];
    let digits = token.strip_prefix(b"-").unwrap_or(token);
    // An integer of up to 18 digits, without a leading zero: always in range.
    let simple = matches!(digits, [b'0'] | [b'1'..=b'9', ..])
        && digits.len() <= 18
        && digits.iter().all(u8::is_ascii_digit);
    if simple {
        return Ok(len);
    }
    // Anything else: serde_json's own number parser decides, range included. A document is
    // only valid when its number ends where this run of number characters does.
    serde_json::from_slice::<serde_json::Value>(token)
        .map(|_| len)
        .map_err(|_| Malformed)
}

/// Appends `bytes` to the `len` bytes in `buf`; `len` counts on past the end (and then
/// compares with no name).
fn push(buf: &mut [u8; MAX_NAME], len: &mut usize, bytes: &[u8]) {
    if let Some(to) = buf.get_mut(*len..*len + bytes.len()) {
        to.copy_from_slice(bytes);
    }
    *len += bytes.len();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_integers_read_here_match_the_general_number_path() {
        for n in [
            "0",
            "-0",
            "7",
            "-7",
            "10",
            "01",
            "-01",
            "00",
            "123456789012345678",
            "1234567890123456789",
            "-123456789012345678",
            "-",
            "--1",
            "1.5",
            "1e5",
            "1E5",
            "0.",
            "-0.0",
            "99999999999999999999",
        ] {
            for tail in ["", ",", "}", "]", " ", "x", "-", "+", ".", "e", "E", "5"] {
                let bytes = format!("{n}{tail}");
                assert_eq!(
                    number(bytes.as_bytes()).ok(),
                    number_general(bytes.as_bytes()).ok(),
                    "{bytes}"
                );
            }
        }
    }

    #[test]
    fn plain_flags_every_high_byte_before_the_special_one() {
        for len in 1..24 {
            for at in 0..len {
                for high_at in 0..len {
                    let mut bytes = vec![b'a'; len];
                    bytes[high_at] = 0xc3;
                    bytes[at] = b'"';
                    let mut high = 0;
                    assert_eq!(plain(&bytes, 0, &mut high), at);
                    if high_at < at {
                        assert_ne!(high & HIGH, 0, "{bytes:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn utf8_is_checked_wherever_a_high_byte_is() {
        // Invalid UTF-8 in a name or a value, in a short string (read byte by byte) or a long
        // one (eight bytes at a time): malformed. Valid UTF-8 in the same places: read.
        let docs = |s: &[u8]| {
            let mut out = Vec::new();
            for pad in [&b""[..], b"abcdefghijklmnop"] {
                out.push([br#"{""#, pad, s, br#"":1,"choices":[{"text":"a"}]}"#].concat());
                out.push([br#"{"choices":[{"text":""#, pad, s, br#""}]}"#].concat());
                out.push([br#"{"choices":[{"text":"a"}],"x":""#, s, pad, br#""}"#].concat());
            }
            out
        };
        for bad in [&b"\xff"[..], b"\xc3", b"\xe2\x82"] {
            for doc in docs(bad) {
                assert_eq!(chunk(&doc), Err(Malformed), "{doc:?}");
            }
        }
        for doc in docs("\u{e9}\u{1f600}".as_bytes()) {
            let read = chunk(&doc);
            assert_eq!(
                read,
                Ok(Some(Chunk {
                    error: false,
                    token: true
                })),
                "{doc:?}"
            );
        }
    }

    #[test]
    fn plain_finds_the_first_special_byte_at_every_position() {
        let naive = |bytes: &[u8], at: usize| {
            bytes[at..]
                .iter()
                .position(|&b| b == b'"' || b == b'\\' || b < b' ')
                .map_or(bytes.len(), |i| at + i)
        };
        // Fillers next to every special byte, including ones a borrow could disturb.
        for filler in [b'a', b' ', b'!', b'#', b'[', b']', 0x7f, 0x80, 0xa0, 0xff] {
            for special in [b'"', b'\\', 0, 0x1f, b'\n'] {
                for len in 0..24 {
                    for at in 0..len {
                        let mut bytes = vec![filler; len];
                        bytes[at] = special;
                        // A second special byte after the first must not be found first.
                        if at + 3 < len {
                            bytes[at + 3] = b'"';
                        }
                        for from in 0..=len {
                            assert_eq!(
                                plain(&bytes, from, &mut 0),
                                naive(&bytes, from),
                                "{bytes:?}"
                            );
                        }
                    }
                    assert_eq!(plain(&vec![filler; len], 0, &mut 0), len);
                }
            }
        }
    }
}
