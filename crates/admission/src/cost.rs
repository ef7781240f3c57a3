//! Cost functions: how many capacity units a request holds.

use std::fmt;
use std::sync::Arc;

use http::header::CONTENT_LENGTH;
use http::request::Parts;
use tailguard_core::RequestFacts;

type CostFn = dyn Fn(&Parts) -> u32 + Send + Sync;

/// Maps a request to the capacity units it holds while in flight.
///
/// A cost function sees the request head ([`http::request::Parts`]: method, URI, headers and
/// extensions such as [`RequestFacts`]), never the body. Whatever it returns, a request holds at
/// least 1 unit and at most the per-request cap of the layer
/// ([`with_max_request_share`](crate::BoundedAdmissionLayer::with_max_request_share)).
///
/// ```
/// use tailguard_admission::Cost;
///
/// // 1 unit per started 4 KiB of prompt plus 1 unit per started 256 requested tokens.
/// let cost = Cost::prompt_bytes(4096).plus(Cost::max_tokens(256));
/// let req = http::Request::builder()
///     .header("content-length", "10000")
///     .body(())
///     .unwrap();
/// let (parts, _) = req.into_parts();
/// assert_eq!(cost.units(&parts), 3 + 1);
/// ```
#[derive(Clone)]
pub struct Cost(Kind);

#[derive(Clone)]
enum Kind {
    Unit,
    Fn(Arc<CostFn>),
}

impl Cost {
    /// Every request costs 1 unit (the default): capacity counts concurrent requests.
    pub fn unit() -> Self {
        Cost(Kind::Unit)
    }

    /// A cost computed by `f` from the request head.
    pub fn from_fn<F>(f: F) -> Self
    where
        F: Fn(&Parts) -> u32 + Send + Sync + 'static,
    {
        Cost(Kind::Fn(Arc::new(f)))
    }

    /// One unit per started `bytes_per_unit` bytes of prompt: [`RequestFacts::prompt_bytes`] when
    /// a gateway recorded it, else the `Content-Length` header; 1 unit when neither is known.
    pub fn prompt_bytes(bytes_per_unit: u64) -> Self {
        let per = bytes_per_unit.max(1);
        Cost::from_fn(move |parts| saturate(prompt_bytes(parts).unwrap_or(0).div_ceil(per)))
    }

    /// One unit per started `tokens_per_unit` tokens of [`RequestFacts::max_tokens`]; 1 unit
    /// when the request carries no `max_tokens` hint.
    pub fn max_tokens(tokens_per_unit: u32) -> Self {
        let per = tokens_per_unit.max(1);
        Cost::from_fn(move |parts| {
            let tokens = parts
                .extensions
                .get::<RequestFacts>()
                .and_then(|f| f.max_tokens)
                .unwrap_or(0);
            tokens.div_ceil(per).max(1)
        })
    }

    /// The sum of two costs.
    pub fn plus(self, other: Cost) -> Self {
        Cost::from_fn(move |parts| self.units(parts).saturating_add(other.units(parts)))
    }

    /// The units `parts` costs by this function (at least 1; the layer's cap applies later).
    pub fn units(&self, parts: &Parts) -> u32 {
        match &self.0 {
            Kind::Unit => 1,
            Kind::Fn(f) => f(parts).max(1),
        }
    }
}

/// Bytes per prompt token in the estimate of a prompt's tokens from its size: about 4 for
/// English text under the usual BPE tokenizers (JSON framing counts as prompt).
pub(crate) const BYTES_PER_TOKEN: u64 = 4;

/// The prompt's size in bytes: [`RequestFacts::prompt_bytes`] when a gateway recorded it, else
/// the `Content-Length` header.
fn prompt_bytes(parts: &Parts) -> Option<u64> {
    parts
        .extensions
        .get::<RequestFacts>()
        .and_then(|f| f.prompt_bytes)
        .or_else(|| {
            parts
                .headers
                .get(CONTENT_LENGTH)
                .and_then(|v| v.to_str().ok())
                .and_then(|s| s.trim().parse::<u64>().ok())
        })
}

/// The prompt's tokens: [`RequestFacts::prompt_tokens`] when counted, else its size in bytes
/// (as [`Cost::prompt_bytes`] reads it) over [`BYTES_PER_TOKEN`], rounded up; 0 when neither is
/// known.
pub(crate) fn prompt_tokens(parts: &Parts) -> u64 {
    parts
        .extensions
        .get::<RequestFacts>()
        .and_then(|f| f.prompt_tokens)
        .unwrap_or_else(|| prompt_bytes(parts).unwrap_or(0).div_ceil(BYTES_PER_TOKEN))
}

fn saturate(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX).max(1)
}

impl Default for Cost {
    fn default() -> Self {
        Cost::unit()
    }
}

impl fmt::Debug for Cost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Kind::Unit => f.write_str("Cost::unit"),
            Kind::Fn(_) => f.write_str("Cost::from_fn(..)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(req: http::Request<()>) -> Parts {
        req.into_parts().0
    }

    #[test]
    fn prompt_bytes_prefers_facts_then_content_length() {
        let c = Cost::prompt_bytes(1000);
        let p = parts(http::Request::new(()));
        assert_eq!(c.units(&p), 1, "unknown size costs 1");
        let p = parts(
            http::Request::builder()
                .header("content-length", "2500")
                .body(())
                .unwrap(),
        );
        assert_eq!(c.units(&p), 3);
        let mut p = p;
        p.extensions
            .insert(RequestFacts::new().with_prompt_bytes(10_001));
        assert_eq!(c.units(&p), 11);
        let p = parts(
            http::Request::builder()
                .header("content-length", "garbage")
                .body(())
                .unwrap(),
        );
        assert_eq!(c.units(&p), 1);
    }

    #[test]
    fn prompt_tokens_are_counted_or_estimated_from_bytes() {
        let mut p = parts(
            http::Request::builder()
                .header("content-length", "401")
                .body(())
                .unwrap(),
        );
        assert_eq!(prompt_tokens(&p), 101);
        p.extensions
            .insert(RequestFacts::new().with_prompt_bytes(40));
        assert_eq!(prompt_tokens(&p), 10);
        p.extensions.insert(
            RequestFacts::new()
                .with_prompt_bytes(40)
                .with_prompt_tokens(7),
        );
        assert_eq!(prompt_tokens(&p), 7);
        assert_eq!(prompt_tokens(&parts(http::Request::new(()))), 0);
    }

    #[test]
    fn max_tokens_and_sum() {
        let c = Cost::max_tokens(100);
        let mut p = parts(http::Request::new(()));
        assert_eq!(c.units(&p), 1);
        p.extensions
            .insert(RequestFacts::new().with_max_tokens(250));
        assert_eq!(c.units(&p), 3);
        assert_eq!(c.clone().plus(Cost::unit()).units(&p), 4);
        assert_eq!(Cost::from_fn(|_| 0).units(&p), 1, "never below 1");
    }
}
