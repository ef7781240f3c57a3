//! The prefilters of the stream tracker: which whole events are worth a JSON parse (for
//! usage) or a full classification (for a finish reason), found by searching their bytes for
//! a key and the first byte of its value.

use std::sync::LazyLock;

use memchr::memmem;

/// `"usage"`, optional whitespace, `:`, optional whitespace, `{` somewhere in `bytes` (every
/// occurrence of the key counts): the events worth parsing for usage.
///
/// The key is found with one `memchr` searcher built once: with usage extraction on (the
/// recorder's default) every event is searched, and a search position by position cost the
/// recorder about 4x `TraceLayer` per frame in `--bench overhead`.
pub(super) fn may_carry_usage(bytes: &[u8]) -> bool {
    static FINDER: LazyLock<memmem::Finder<'static>> =
        LazyLock::new(|| memmem::Finder::new(b"\"usage\""));
    has_member_starting(bytes, &FINDER, b'{')
}

/// The reasons an event's data may carry: `"finish_reason"` (OpenAI; servers that send it on
/// every chunk send `null` until the last) or `"stop_reason"` (an Anthropic `message_delta`
/// that ends the message; `message_start` carries `null`), each with a string value somewhere
/// in the bytes: the events worth classifying whole.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Reasons {
    pub(super) finish: bool,
    pub(super) stop: bool,
}

impl Reasons {
    /// Both keys end in `_reason"`, so one search finds either: every event of a stream is
    /// searched, and one search instead of two (the finish key was also searched twice) cut
    /// the reading's instructions per 50-token stream over the bare proxy's by 18% under callgrind
    /// (issue 31, `benches/instructions`).
    pub(super) fn in_event(bytes: &[u8]) -> Reasons {
        static FINDER: LazyLock<memmem::Finder<'static>> =
            LazyLock::new(|| memmem::Finder::new(b"_reason\""));
        let mut found = Reasons::default();
        for at in FINDER.find_iter(bytes) {
            let key = &bytes[..at];
            let slot = if key.ends_with(b"\"finish") {
                &mut found.finish
            } else if key.ends_with(b"\"stop") {
                &mut found.stop
            } else {
                continue;
            };
            *slot |= value_starts(&bytes[at + b"_reason\"".len()..], b'"');
        }
        found
    }

    pub(super) fn any(self) -> bool {
        self.finish || self.stop
    }
}

/// Whether some occurrence of the key `key` finds in `bytes` is followed (after optional
/// whitespace, `:` and optional whitespace) by `first`.
fn has_member_starting(bytes: &[u8], key: &memmem::Finder<'_>, first: u8) -> bool {
    let len = key.needle().len();
    key.find_iter(bytes)
        .any(|at| value_starts(&bytes[at + len..], first))
}

/// Whether `after`, the bytes after a JSON key, hold optional whitespace, `:`, optional
/// whitespace and then `first`.
fn value_starts(after: &[u8], first: u8) -> bool {
    match after.trim_ascii_start().split_first() {
        Some((b':', rest)) => rest.trim_ascii_start().first() == Some(&first),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_object_is_found_after_any_number_of_other_usage_keys() {
        assert!(may_carry_usage(br#"{"usage":{"prompt_tokens":1}}"#));
        assert!(may_carry_usage(br#"{"usage" :  {"a":1}}"#));
        assert!(may_carry_usage(
            br#"{"usage":null,"x":{"usage":"no"},"y":{"usage":{}}}"#
        ));
        assert!(!may_carry_usage(br#"{"usage":null,"x":{"usage":"no"}}"#));
        assert!(!may_carry_usage(br#"{"choices":[],"usage":null}"#));
        assert!(!may_carry_usage(br#"{"usage""#));
        assert!(!may_carry_usage(br#"{"usage":"#));
        assert!(!may_carry_usage(b""));
        // Adjacent candidates both count (this is only the prefilter: the JSON parse that
        // follows decides, and rejects this one). Overlapping ones (`"usage"usage"`) cannot
        // occur in JSON, where a quote that closes a string cannot open the next.
        assert!(may_carry_usage(br#""usage""usage":{}"#));
    }

    #[test]
    fn one_search_finds_either_reason_with_a_string_value() {
        let r = |bytes: &[u8]| {
            let r = Reasons::in_event(bytes);
            (r.finish, r.stop)
        };
        assert_eq!(
            r(br#"{"choices":[{"finish_reason":"stop"}]}"#),
            (true, false)
        );
        assert_eq!(
            r(br#"{"delta":{"stop_reason" :  "end_turn"}}"#),
            (false, true)
        );
        assert_eq!(
            r(br#"{"finish_reason":null,"stop_reason":"x"}"#),
            (false, true)
        );
        assert_eq!(
            r(br#"{"finish_reason":null,"x":{"finish_reason":"length"}}"#),
            (true, false)
        );
        assert_eq!(
            r(br#"{"finish_reason":null,"stop_reason":null}"#),
            (false, false)
        );
        // Another key ending the same way, an escaped key inside a string, a cut-off key.
        assert_eq!(
            r(br#"{"other_reason":"x","s":"\"finish_reason\":\"y"}"#),
            (false, false)
        );
        assert_eq!(r(br#"{"finish_reason""#), (false, false));
        assert_eq!(r(br#"_reason":"x""#), (false, false));
        assert_eq!(r(b""), (false, false));
    }
}
