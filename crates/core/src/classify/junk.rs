//! Junk: event data the OpenAI and Anthropic dialects cannot carry (not a JSON object, not
//! `[DONE]`), found exactly before the first token and cheaply after it.

use super::is_done;
use crate::scan::Captured;

/// Whether an event's data is junk for the OpenAI and Anthropic dialects: not a JSON object,
/// and not `[DONE]`.
///
/// Before the first token a whole event is parsed (serde_json, syntax only): exact. After it
/// (and for data captured in part) only what costs nothing is looked at, see
/// [`junk_by_syntax`]: per event, a few bytes at the start of the captured prefix and the last
/// byte the scanner noted ([`Captured::last`]); no copy, no parse. That catches text
/// (`data: this is not json`), braces that open no member (`data: {{{{`), other JSON values,
/// empty data and an object cut short (the usual malformed event: a chunk whose tail is
/// missing), and lets through an object that is broken only in its middle. A full parse of
/// every event would need the scanner to copy every event whole, which it avoids on purpose.
pub(super) fn junk(data: &Captured<'_>, first_token_seen: bool) -> bool {
    if is_done(data.bytes) {
        false
    } else if first_token_seen || !data.is_complete() {
        junk_by_syntax(data)
    } else {
        !super::json::is_object(data.bytes)
    }
}

/// The cheap check of [`junk`]: the data does not begin as an object does (`{`, optional
/// whitespace, then `"` or `}`) or does not end with `}`. Data whose captured prefix is all
/// whitespace, or ends right after its `{`, is judged by what was seen (no junk when the rest
/// was not captured).
pub(super) fn junk_by_syntax(data: &Captured<'_>) -> bool {
    let ends_as_object = data.last == Some(b'}');
    match data.bytes.trim_ascii_start().split_first() {
        Some((b'{', rest)) => match rest.trim_ascii_start().first() {
            Some(b'"' | b'}') => !ends_as_object,
            Some(_) => true,
            None => data.is_complete() || !ends_as_object,
        },
        Some(_) => true,
        None => data.is_complete(),
    }
}
