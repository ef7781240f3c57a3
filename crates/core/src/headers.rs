//! Header lookups on the per-request path, shared by the layers (and by
//! [`Dialect::resolve`](crate::Dialect::resolve)).

use http::{HeaderMap, HeaderName, HeaderValue};

/// `grpc-status`, as a parsed name (a `&str` key is parsed on every lookup).
pub const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// Up to this many distinct names, a lookup compares names one by one instead of hashing the
/// name and probing the map: a request or response head with a handful of headers is the
/// common case, and a name comparison is a tag or length check before any byte is compared.
pub const LINEAR_LOOKUP: usize = 8;

/// The first value of `name` in `headers`: the same answer as `HeaderMap::get`.
#[inline]
pub fn get<'a>(headers: &'a HeaderMap, name: &HeaderName) -> Option<&'a HeaderValue> {
    if headers.keys_len() <= LINEAR_LOOKUP {
        // `iter` yields each name's first value before its others.
        headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v)
    } else {
        headers.get(name)
    }
}

/// Whether `headers` holds `name`: the same answer as `HeaderMap::contains_key`.
#[inline]
pub fn contains(headers: &HeaderMap, name: &HeaderName) -> bool {
    if headers.keys_len() <= LINEAR_LOOKUP {
        headers.keys().any(|k| k == name)
    } else {
        headers.contains_key(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The linear lookup answers as the map's own, below and above the threshold, for standard
    /// and custom names, for names with several values, and for absent names.
    #[test]
    fn lookups_match_the_map() {
        let names = [
            HeaderName::from_static("content-type"),
            HeaderName::from_static("grpc-status"),
            HeaderName::from_static("x-tailguard-no-hedge"),
            HeaderName::from_static("accept"),
            HeaderName::from_static("x-a"),
            HeaderName::from_static("x-b"),
        ];
        let mut map = HeaderMap::new();
        for n in 0..40 {
            for name in &names {
                assert_eq!(get(&map, name), map.get(name));
                assert_eq!(contains(&map, name), map.contains_key(name));
            }
            let name = HeaderName::from_bytes(format!("x-h{}", n % 13).as_bytes()).unwrap();
            map.append(name, HeaderValue::from_str(&n.to_string()).unwrap());
            if n % 5 == 0 {
                let name = &names[n % names.len()];
                map.append(name.clone(), HeaderValue::from_str(&n.to_string()).unwrap());
            }
        }
        assert!(map.keys_len() > LINEAR_LOOKUP);
    }
}
