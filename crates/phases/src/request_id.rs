//! Request ids: taken from the request, or generated, and carried both ways.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use http::HeaderValue;

/// The header a request id travels in by default.
pub const X_REQUEST_ID: &str = "x-request-id";

/// The longest request id accepted from a client, in bytes; a longer (or non-printable) value is
/// replaced by a generated one so a client cannot inflate logs through this header.
pub const MAX_REQUEST_ID_LEN: usize = 128;

/// The id of one request: the client's `x-request-id` when it sent a usable one, else generated.
///
/// The recorder inserts it into the request extensions (so inner layers and handlers can log
/// it), into the request headers sent upstream, and onto the response. It is a tracing field and
/// part of every [`PhaseReport`](crate::PhaseReport); it is never a metric label.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct RequestId(HeaderValue);

impl RequestId {
    /// Uses `value` when it is 1 to [`MAX_REQUEST_ID_LEN`] bytes of visible ASCII.
    pub fn from_header(value: &HeaderValue) -> Option<Self> {
        let bytes = value.as_bytes();
        let ok = !bytes.is_empty()
            && bytes.len() <= MAX_REQUEST_ID_LEN
            && bytes.iter().all(|b| b.is_ascii_graphic());
        ok.then(|| RequestId(value.clone()))
    }

    /// A fresh id: 32 lower-case hex digits, 128 bits hashed (SipHash, under a random
    /// per-process key) from a process-wide counter. Like a UUID v4 they are unique in practice,
    /// within and across processes, and they do not reveal how many requests came before.
    pub fn generate() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        static KEY: OnceLock<RandomState> = OnceLock::new();
        let key = KEY.get_or_init(RandomState::new);
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let id = format!(
            "{:016x}{:016x}",
            key.hash_one((n, 0u8)),
            key.hash_one((n, 1u8))
        );
        RequestId(HeaderValue::try_from(id).expect("hex digits are a valid header value"))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        // Both constructors guarantee visible ASCII.
        self.0.to_str().unwrap_or_default()
    }

    /// The id as a header value.
    pub fn header_value(&self) -> &HeaderValue {
        &self.0
    }
}

impl fmt::Debug for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RequestId({})", self.as_str())
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ids_are_unique_hex() {
        let ids: std::collections::HashSet<_> = (0..10_000)
            .map(|_| RequestId::generate().as_str().to_owned())
            .collect();
        assert_eq!(ids.len(), 10_000);
        for id in ids.iter().take(10) {
            assert_eq!(id.len(), 32);
            assert!(id.bytes().all(|b| b.is_ascii_hexdigit()));
        }
    }

    #[test]
    fn client_ids_are_validated() {
        let ok = HeaderValue::from_static("abc-123");
        assert_eq!(RequestId::from_header(&ok).unwrap().as_str(), "abc-123");
        assert!(RequestId::from_header(&HeaderValue::from_static("")).is_none());
        assert!(RequestId::from_header(&HeaderValue::from_static("a b")).is_none());
        let long = HeaderValue::from_str(&"x".repeat(MAX_REQUEST_ID_LEN + 1)).unwrap();
        assert!(RequestId::from_header(&long).is_none());
        let bin = HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap();
        assert!(RequestId::from_header(&bin).is_none());
    }
}
