//! Request ids: taken from the request, or generated, and carried both ways.

use std::fmt;
use std::hash::{BuildHasher, RandomState};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
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

    /// A fresh id: 32 lower-case hex digits from a process-wide counter mixed with a random
    /// per-process seed (unique within the process, collision-resistant across processes; no
    /// locks, one atomic increment).
    pub fn generate() -> Self {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        static SEED: OnceLock<(u64, u64)> = OnceLock::new();
        let (a, b) = *SEED.get_or_init(|| {
            let s = RandomState::new();
            (s.hash_one(0x7461_696c_u64), s.hash_one(0x6775_6172_u64))
        });
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        // splitmix64 is a bijection, so both halves are unique per counter value.
        let hi = splitmix64(a.wrapping_add(n));
        let lo = splitmix64(b ^ n);
        let mut buf = [0u8; 32];
        buf[..16].copy_from_slice(&hex(hi));
        buf[16..].copy_from_slice(&hex(lo));
        // One allocation, shared by every clone (the id travels upstream and back).
        RequestId(
            HeaderValue::from_maybe_shared(Bytes::from_owner(buf))
                .expect("hex digits are a valid header value"),
        )
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

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `v` as 16 lower-case hex digits, most significant first, eight at a time (SWAR): each
/// nibble is spread into a byte of its own, then turned into its digit with no branch.
fn hex(v: u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&hex8((v >> 32) as u32));
    out[8..].copy_from_slice(&hex8(v as u32));
    out
}

fn hex8(v: u32) -> [u8; 8] {
    const ONES: u64 = 0x0101_0101_0101_0101;
    let x = u64::from(v);
    let x = (x | (x << 16)) & 0x0000_ffff_0000_ffff;
    let x = (x | (x << 8)) & 0x00ff_00ff_00ff_00ff;
    let x = (x | (x << 4)) & 0x0f0f_0f0f_0f0f_0f0f;
    // 1 in each byte whose nibble is 10 or more (n + 6 carries into bit 4; no byte overflows).
    let letters = ((x + 6 * ONES) >> 4) & ONES;
    // '0' + n, and 'a' - '0' - 10 = 39 more for letters.
    (x + 0x30 * ONES + 39 * letters).to_be_bytes()
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
    fn swar_hex_matches_the_digit_loop() {
        fn slow(v: u64) -> [u8; 16] {
            const DIGITS: &[u8; 16] = b"0123456789abcdef";
            let mut out = [0u8; 16];
            for (i, o) in out.iter_mut().enumerate() {
                *o = DIGITS[((v >> (60 - 4 * i)) & 0xf) as usize];
            }
            out
        }
        let mut v = 0x0123_4567_89ab_cdef_u64;
        for _ in 0..10_000 {
            assert_eq!(hex(v), slow(v), "{v:#x}");
            v = splitmix64(v);
        }
        for v in [0, u64::MAX, 0xa0a0_a0a0_a0a0_a0a0, 0x9f9f_9f9f_9f9f_9f9f] {
            assert_eq!(hex(v), slow(v), "{v:#x}");
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
