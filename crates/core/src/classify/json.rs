//! The JSON the presets read before the first token, walked without allocating.
//!
//! A small recursive-descent reader that accepts exactly the documents
//! `serde_json::from_slice::<serde_json::Value>` accepts (UTF-8, control characters and escapes
//! in strings, paired surrogates, number syntax and range, nesting limit of 128, trailing
//! whitespace only) and reads only what a decision needs: whether a string, array or object is
//! empty, whether a value is `null` or `true`, which of a few names a member name or string is.
//! Nothing is built: no `Value`, no owned or unescaped strings (names are unescaped into a small
//! stack buffer). A member given twice counts by its last value, as in a `Value` map.
//!
//! Numbers other than short integers are handed to serde_json's own number parser, so that the
//! range (`1e400` is an error) is exactly serde_json's; that allocates nothing unless a crate in
//! the build enables serde_json's `float_roundtrip` or `arbitrary_precision` feature.

use super::{Class, anthropic_event};

/// The document is not JSON (or not the JSON `Value` would accept).
#[derive(Debug)]
pub(super) struct Malformed;

type Result<T> = std::result::Result<T, Malformed>;

/// What [`openai_json`](super::openai_json) needs from a chunk.
#[derive(Debug, Default)]
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
        r.object(&["error", "choices"], |r, key| {
            match key {
                Some(0) => chunk.error = r.not_null()?,
                Some(_) => chunk.token = r.any_element(Reader::choice)?,
                None => r.skip()?,
            }
            Ok(())
        })?;
        Ok(Some(chunk))
    })
}

/// The members of a delta that carry output (see `choice_has_output`).
const OUTPUT_KEYS: &[&str] = &[
    "content",
    "reasoning_content",
    "reasoning",
    "tool_calls",
    "refusal",
    "function_call",
];

/// Anthropic's event names, as `type` values.
const EVENT_NAMES: &[&str] = &[
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
        r.object(&["type"], |r, key| {
            match key {
                Some(_) if r.start()? == b'"' => {
                    class = r
                        .string(EVENT_NAMES)?
                        .name
                        .and_then(|i| anthropic_event(EVENT_NAMES[i].as_bytes()));
                }
                Some(_) => {
                    r.skip()?;
                    class = None;
                }
                None => r.skip()?,
            }
            Ok(())
        })?;
        Ok(class)
    })
    .ok()
    .flatten()
}

/// What [`ndjson`](super::ndjson) needs from a line.
#[derive(Debug, Default)]
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
        r.object(&["error", "done", "response", "message"], |r, key| {
            match key {
                Some(0) => line.error = r.not_null()?,
                Some(1) => line.done = r.scalar_or_skip()? == Some(Scalar::True),
                Some(2) => response = r.non_empty()?,
                Some(_) => message = r.message()?,
                None => r.skip()?,
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

/// A string read.
struct Str {
    /// It has no characters.
    empty: bool,
    /// Its index in the names it was compared with.
    name: Option<usize>,
}

/// serde_json's nesting limit: the 128th nested array or object is an error.
const MAX_DEPTH: u8 = 128;

/// Names compared with are at most this long (an escaped string that unescapes to more matches
/// no name).
const MAX_NAME: usize = 24;

// The longest names fit.
const _: () = {
    let mut i = 0;
    while i < EVENT_NAMES.len() {
        assert!(EVENT_NAMES[i].len() <= MAX_NAME);
        i += 1;
    }
    let mut i = 0;
    while i < OUTPUT_KEYS.len() {
        assert!(OUTPUT_KEYS[i].len() <= MAX_NAME);
        i += 1;
    }
};

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
    /// Levels of nesting left, as serde_json's `remaining_depth`.
    depth: u8,
}

impl<'a> Reader<'a> {
    /// Reads `bytes` as one JSON document with `read`, which must consume one value; then only
    /// whitespace may follow.
    fn document<T>(bytes: &'a [u8], read: impl FnOnce(&mut Self) -> Result<T>) -> Result<T> {
        // Outside strings valid JSON is ASCII, so this is the UTF-8 check of every string (a
        // run of raw bytes between escapes cannot end inside a character of valid UTF-8).
        if std::str::from_utf8(bytes).is_err() {
            return Err(Malformed);
        }
        let mut r = Reader {
            bytes,
            at: 0,
            depth: MAX_DEPTH,
        };
        let out = read(&mut r)?;
        r.whitespace();
        if r.at == r.bytes.len() {
            Ok(out)
        } else {
            Err(Malformed)
        }
    }

    fn whitespace(&mut self) {
        while let Some(b' ' | b'\n' | b'\t' | b'\r') = self.bytes.get(self.at) {
            self.at += 1;
        }
    }

    /// Skips whitespace and returns the first byte of the value that must follow.
    fn start(&mut self) -> Result<u8> {
        self.whitespace();
        self.bytes.get(self.at).copied().ok_or(Malformed)
    }

    /// Skips whitespace; true (and consumed) when `byte` follows.
    fn eat(&mut self, byte: u8) -> bool {
        self.whitespace();
        let found = self.bytes.get(self.at) == Some(&byte);
        self.at += usize::from(found);
        found
    }

    /// Consumes one value.
    fn skip(&mut self) -> Result<()> {
        match self.start()? {
            b'{' => self.object(&[], |r, _| r.skip()).map(drop),
            b'[' => self.array(Self::skip).map(drop),
            b'"' => self.string(&[]).map(drop),
            _ => self.scalar().map(drop),
        }
    }

    /// Consumes one value: a non-empty string, array or object?
    fn non_empty(&mut self) -> Result<bool> {
        Ok(match self.start()? {
            b'{' => self.object(&[], |r, _| r.skip())? > 0,
            b'[' => self.array(Self::skip)? > 0,
            b'"' => !self.string(&[])?.empty,
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
        self.object(&["text", "delta"], |r, key| {
            match key {
                Some(0) => text = r.non_empty()?,
                Some(_) => delta = r.delta()?,
                None => r.skip()?,
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
        self.object(OUTPUT_KEYS, |r, key| {
            match key {
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
        let mut found = [false; 2];
        self.object(&["content", "tool_calls"], |r, key| {
            match key {
                Some(i) => found[i] = r.non_empty()?,
                None => r.skip()?,
            }
            Ok(())
        })?;
        Ok(found.contains(&true))
    }

    /// One level of nesting deeper.
    fn enter(&mut self) -> Result<()> {
        self.depth -= 1;
        if self.depth == 0 {
            return Err(Malformed);
        }
        self.at += 1;
        Ok(())
    }

    /// Reads an object (at its `{`), calling `member` with each member name's index in `names`
    /// to consume its value. Returns the number of members.
    fn object(
        &mut self,
        names: &[&str],
        mut member: impl FnMut(&mut Self, Option<usize>) -> Result<()>,
    ) -> Result<usize> {
        self.enter()?;
        let mut members = 0;
        if !self.eat(b'}') {
            loop {
                if self.start()? != b'"' {
                    return Err(Malformed);
                }
                let name = self.string(names)?.name;
                if !self.eat(b':') {
                    return Err(Malformed);
                }
                member(self, name)?;
                members += 1;
                if self.eat(b'}') {
                    break;
                }
                if !self.eat(b',') {
                    return Err(Malformed);
                }
            }
        }
        self.depth += 1;
        Ok(members)
    }

    /// Reads an array (at its `[`), calling `element` to consume each element. Returns the
    /// number of elements.
    fn array(&mut self, mut element: impl FnMut(&mut Self) -> Result<()>) -> Result<usize> {
        self.enter()?;
        let mut elements = 0;
        if !self.eat(b']') {
            loop {
                element(self)?;
                elements += 1;
                if self.eat(b']') {
                    break;
                }
                if !self.eat(b',') {
                    return Err(Malformed);
                }
            }
        }
        self.depth += 1;
        Ok(elements)
    }

    /// Reads a string (at its `"`), comparing it with `names`.
    fn string(&mut self, names: &[&str]) -> Result<Str> {
        self.at += 1;
        let start = self.at;
        // The unescaped string, while it fits; only kept when there are names to compare with.
        let mut unescaped = [0u8; MAX_NAME];
        let mut len = 0;
        let mut run = start;
        let mut escaped = false;
        loop {
            self.at = plain(self.bytes, self.at);
            match *self.bytes.get(self.at).ok_or(Malformed)? {
                b'"' => break,
                b'\\' => {
                    let raw = &self.bytes[run..self.at];
                    self.at += 1;
                    let c = self.escape()?;
                    if !names.is_empty() {
                        push(&mut unescaped, &mut len, raw);
                        push(
                            &mut unescaped,
                            &mut len,
                            c.encode_utf8(&mut [0; 4]).as_bytes(),
                        );
                    }
                    run = self.at;
                    escaped = true;
                }
                // A control character.
                _ => return Err(Malformed),
            }
        }
        let raw = &self.bytes[start..self.at];
        let tail = &self.bytes[run..self.at];
        self.at += 1;
        let name = if names.is_empty() {
            None
        } else if !escaped {
            names.iter().position(|n| n.as_bytes() == raw)
        } else {
            push(&mut unescaped, &mut len, tail);
            unescaped
                .get(..len)
                .and_then(|s| names.iter().position(|n| n.as_bytes() == s))
        };
        // An escape is at least one character.
        Ok(Str {
            empty: raw.is_empty(),
            name,
        })
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
    fn scalar(&mut self) -> Result<Scalar> {
        let rest = &self.bytes[self.at..];
        let (scalar, len) = if rest.starts_with(b"null") {
            (Scalar::Null, 4)
        } else if rest.starts_with(b"true") {
            (Scalar::True, 4)
        } else if rest.starts_with(b"false") {
            (Scalar::False, 5)
        } else if let Some(b'-' | b'0'..=b'9') = rest.first() {
            (Scalar::Number, number(rest)?)
        } else {
            return Err(Malformed);
        };
        self.at += len;
        Ok(scalar)
    }
}

/// The index of the first `"`, `\` or control character in `bytes` from `at` on (or the length).
///
/// Eight bytes at a time, as serde_json skips strings: for each of the three tests the classic
/// "has a zero / a smaller byte" bit trick flags the lowest matching byte exactly.
fn plain(bytes: &[u8], mut at: usize) -> usize {
    const ONES: u64 = u64::from_ne_bytes([1; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    const QUOTES: u64 = u64::from_ne_bytes([b'"'; 8]);
    const BACKSLASHES: u64 = u64::from_ne_bytes([b'\\'; 8]);
    const SPACES: u64 = u64::from_ne_bytes([b' '; 8]);
    while let Some(word) = bytes.get(at..at + 8) {
        let mut eight = [0; 8];
        eight.copy_from_slice(word);
        let w = u64::from_le_bytes(eight);
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
        at += 1;
    }
    at
}

/// The length of the number `bytes` starts with.
fn number(bytes: &[u8]) -> Result<usize> {
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
                            assert_eq!(plain(&bytes, from), naive(&bytes, from), "{bytes:?}");
                        }
                    }
                    assert_eq!(plain(&vec![filler; len], 0), len);
                }
            }
        }
    }
}
