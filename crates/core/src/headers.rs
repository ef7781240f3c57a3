//! Header names and readers shared by the layers.

use http::header::CONTENT_TYPE;
use http::{HeaderMap, HeaderName};

/// `grpc-status`, the trailer (or trailers-only header) that carries a gRPC call's outcome.
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// The gRPC status code in `headers`: `None` when there is no `grpc-status`, `Some(0)` for OK.
///
/// This is the one reader of `grpc-status` in tailguard: the tracker, the hedge and the
/// recorder all decide through it. Surrounding whitespace is ignored. A value that is not a
/// decimal code is reported as `2` (UNKNOWN): a peer that sends a status it cannot spell has
/// failed, and gRPC clients map unparseable statuses the same way.
pub fn grpc_status(headers: &HeaderMap) -> Option<u16> {
    let value = headers.get(&GRPC_STATUS)?;
    let code = std::str::from_utf8(value.as_bytes().trim_ascii())
        .ok()
        .and_then(|s| s.parse().ok());
    Some(code.unwrap_or(2))
}

/// Whether `headers` are a gRPC call's: `content-type: application/grpc` or
/// `application/grpc+<codec>`.
pub fn is_grpc(headers: &HeaderMap) -> bool {
    headers
        .get(CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_codes_and_maps_garbage_to_unknown() {
        let mut map = HeaderMap::new();
        assert_eq!(grpc_status(&map), None);
        for (value, code) in [
            ("0", 0),
            (" 14 ", 14),
            ("8", 8),
            ("x", 2),
            ("", 2),
            ("-1", 2),
        ] {
            map.insert(GRPC_STATUS, value.parse().unwrap());
            assert_eq!(grpc_status(&map), Some(code), "{value:?}");
        }
    }
}
