//! Request paths normalised before routing, as Envoy's `normalize_path` and `merge_slashes`
//! do: dot segments (`.`, `..`, and their percent-encoded forms `%2e`, `%2E`) are resolved
//! (RFC 3986 §5.2.4) and runs of slashes merged. So `POST /v1/models/../../admin` is routed,
//! and forwarded, as `/admin` (a 404 here), never handed to an upstream that would resolve it
//! itself to a path outside `/v1/*`. Encoded slashes (`%2F`) are left as they are: they do not
//! separate segments here, nor in the upstream's router.

use http::Request;
use http::uri::{PathAndQuery, Uri};

/// `req` with its path normalised (unchanged when it already was).
pub(crate) fn normalized<B>(mut req: Request<B>) -> Request<B> {
    if let Some(uri) = normalize(req.uri()) {
        *req.uri_mut() = uri;
    }
    req
}

/// The normalised form of `uri`, or `None` when it is already normal.
fn normalize(uri: &Uri) -> Option<Uri> {
    let path = uri.path();
    if !needs_work(path) {
        return None;
    }
    let mut segments: Vec<&str> = Vec::new();
    for segment in path.split('/').filter(|s| !s.is_empty()) {
        match decoded_dots(segment) {
            Some(1) => {}
            Some(2) => {
                segments.pop();
            }
            _ => segments.push(segment),
        }
    }
    // A final `/`, `.` or `..` leaves the path ending in a slash (RFC 3986 §5.2.4).
    let last_is_dots = path
        .rsplit('/')
        .next()
        .is_some_and(|s| decoded_dots(s).is_some());
    let trailing = (path.ends_with('/') || last_is_dots) && !segments.is_empty();
    let mut out = String::with_capacity(path.len());
    for s in &segments {
        out.push('/');
        out.push_str(s);
    }
    if out.is_empty() || trailing {
        out.push('/');
    }
    if let Some(q) = uri.query() {
        out.push('?');
        out.push_str(q);
    }
    let mut parts = uri.clone().into_parts();
    // Built from the characters of a valid path and query: always valid.
    parts.path_and_query = Some(PathAndQuery::try_from(out).ok()?);
    Uri::from_parts(parts).ok()
}

/// Whether `path` has a dot segment or an empty one (two slashes in a row).
fn needs_work(path: &str) -> bool {
    path.contains("//") || path.split('/').any(|s| decoded_dots(s).is_some())
}

/// `Some(n)` when `segment` is a dot segment of `n` dots (`.` or `..`, each dot possibly
/// written `%2e` / `%2E`), `None` for any other segment.
fn decoded_dots(segment: &str) -> Option<usize> {
    let mut rest = segment.as_bytes();
    let mut dots = 0;
    while !rest.is_empty() {
        if rest[0] == b'.' {
            rest = &rest[1..];
        } else if rest.len() >= 3 && rest[..3].eq_ignore_ascii_case(b"%2e") {
            rest = &rest[3..];
        } else {
            return None;
        }
        dots += 1;
    }
    (1..=2).contains(&dots).then_some(dots)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn norm(s: &str) -> String {
        let uri: Uri = s.parse().unwrap();
        normalize(&uri).map_or_else(|| uri.to_string(), |u| u.to_string())
    }

    #[test]
    fn dot_segments_are_resolved_and_slashes_merged() {
        assert_eq!(norm("/v1/models/../../admin"), "/admin");
        assert_eq!(norm("/v1/models/%2e%2e/%2E%2E/admin"), "/admin");
        assert_eq!(norm("/v1/models/.%2e/x"), "/v1/x");
        assert_eq!(norm("/v1/./chat//completions"), "/v1/chat/completions");
        assert_eq!(norm("/../../.."), "/");
        assert_eq!(norm("//v1/models/"), "/v1/models/");
        assert_eq!(norm("/v1/a/..?x=1/../y"), "/v1/?x=1/../y");
        assert_eq!(
            norm("http://h:1/v1/x/../models?q"),
            "http://h:1/v1/models?q"
        );
    }

    #[test]
    fn normal_paths_are_left_alone() {
        for p in [
            "/v1/chat/completions",
            "/v1/models/a.b",
            "/v1/models/...",
            "/v1/x%2Fy",
            "/v1/.hidden",
            "/",
        ] {
            let uri: Uri = p.parse().unwrap();
            assert!(normalize(&uri).is_none(), "{p}");
        }
    }
}
