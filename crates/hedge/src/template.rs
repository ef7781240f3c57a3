//! The request head every attempt of a race is built from.

use http::request::Parts;
use http::{HeaderName, HeaderValue, Request};
use tailguard_core::attempt::Attempt;
use tailguard_core::progress::StreamProgress;
use tailguard_core::{EndReport, RequestFacts};

/// The client's request head, copied for each attempt (`http::request::Parts` cannot be
/// cloned).
pub(crate) struct Template(Parts);

impl Template {
    pub(crate) fn new(parts: Parts) -> Self {
        Template(parts)
    }

    /// A copy of the head (method, URI, version, every header value in its order, extensions),
    /// as a request with `body`.
    pub(crate) fn request<T>(&self, body: T) -> Request<T> {
        let mut req = Request::new(body);
        *req.method_mut() = self.0.method.clone();
        *req.uri_mut() = self.0.uri.clone();
        *req.version_mut() = self.0.version;
        *req.headers_mut() = self.0.headers.clone();
        *req.extensions_mut() = self.0.extensions.clone();
        req
    }

    /// The request of one attempt: a copy of the head with `body`, the attempt's number in
    /// `header` (when set), the [`Attempt`], a progress record of its own and the attempt's
    /// end report.
    pub(crate) fn attempt_request<T>(
        &self,
        body: T,
        attempt: Attempt,
        header: Option<&HeaderName>,
        report: Option<&EndReport>,
    ) -> Request<T> {
        let mut req = self.request(body);
        if let Some(h) = header {
            let number = HeaderValue::from(u16::from(attempt.number()));
            req.headers_mut().insert(h.clone(), number);
        }
        req.extensions_mut().insert(attempt);
        // Attempts race, and a loser's stream is not the request's: each gets a progress
        // record of its own (core's `progress`), read by any layer below that reads it.
        req.extensions_mut().insert(StreamProgress::detached());
        if let Some(r) = report {
            req.extensions_mut().insert(r.clone());
        }
        req
    }

    /// Whether the request is a gRPC call (`content-type: application/grpc*`).
    pub(crate) fn is_grpc(&self) -> bool {
        tailguard_core::headers::is_grpc(&self.0.headers)
    }

    /// Whether the request asked to stream: its [`RequestFacts`] say `stream: true` (an answer
    /// that is not a stream then fails an attempt).
    pub(crate) fn asks_to_stream(&self) -> bool {
        self.0
            .extensions
            .get::<RequestFacts>()
            .is_some_and(|f| f.stream == Some(true))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{HeaderMap, HeaderValue, Method, Version};

    /// A backup's head is the original one: method, URI, version, every header value in the
    /// original's order (several values of a name, sensitive values), extensions.
    #[test]
    fn a_template_request_has_the_original_head() {
        #[derive(Clone, Debug, PartialEq)]
        struct Tag(u32);
        let mut req = Request::builder()
            .method(Method::PUT)
            .uri("https://example.com:8443/v1/chat?x=1")
            .version(Version::HTTP_2)
            .header("x-b", "1")
            .header("content-type", "application/json")
            .header("x-b", "2")
            .header("accept", "text/event-stream")
            .header("x-b", "3")
            .body(())
            .unwrap();
        let mut secret = HeaderValue::from_static("Bearer k");
        secret.set_sensitive(true);
        req.headers_mut()
            .insert(http::header::AUTHORIZATION, secret);
        req.extensions_mut().insert(Tag(7));
        let (parts, ()) = req.into_parts();
        let template = Template::new(parts);
        let copy = template.request(5u8);
        let parts = &template.0;
        assert_eq!(copy.method(), parts.method);
        assert_eq!(copy.uri(), &parts.uri);
        assert_eq!(copy.version(), parts.version);
        let pairs = |h: &HeaderMap| {
            h.iter()
                .map(|(n, v)| (n.clone(), v.clone(), v.is_sensitive()))
                .collect::<Vec<_>>()
        };
        assert_eq!(pairs(copy.headers()), pairs(&parts.headers));
        assert_eq!(copy.headers().len(), 6);
        assert_eq!(copy.extensions().get::<Tag>(), Some(&Tag(7)));
        assert_eq!(*copy.body(), 5);
    }
}
