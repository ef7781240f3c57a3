//! [`BaseUri`]: one cloneable service aimed at one base URI, and
//! [`ReplicaSet::from_base_uris`], which makes a set of replicas from one service and a list
//! of base URIs (one pooled client, many upstreams).

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::uri::{Authority, PathAndQuery, Scheme, Uri};
use http::{Request, header};
use tower_service::Service;

use crate::set::ReplicaSet;

/// A base URI without a scheme or an authority: there is nowhere to send requests to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InvalidBaseUri {
    uri: String,
}

impl fmt::Display for InvalidBaseUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "base URI `{}` needs a scheme and an authority (http://host:port/prefix)",
            self.uri
        )
    }
}

impl std::error::Error for InvalidBaseUri {}

/// Sends every request to one base URI: the request's scheme and authority become the base's,
/// and its path is appended to the base's path (`http://10.0.0.7:8000/openai` turns
/// `/v1/chat/completions?x=1` into `http://10.0.0.7:8000/openai/v1/chat/completions?x=1`).
/// The `host` header is removed, so the client sets the base's. Everything else, readiness
/// included, is the inner service's.
#[derive(Clone, Debug)]
pub struct BaseUri<S> {
    inner: S,
    scheme: Scheme,
    authority: Authority,
    /// The base's path without its trailing `/` (empty for `/`).
    prefix: Arc<str>,
}

impl<S> BaseUri<S> {
    /// `inner` aimed at `base`, which needs a scheme and an authority; its path, if any, is a
    /// prefix (its query is ignored).
    pub fn new(inner: S, base: &Uri) -> Result<Self, InvalidBaseUri> {
        let invalid = || InvalidBaseUri {
            uri: base.to_string(),
        };
        Ok(BaseUri {
            inner,
            scheme: base.scheme().ok_or_else(invalid)?.clone(),
            authority: base.authority().ok_or_else(invalid)?.clone(),
            prefix: base.path().trim_end_matches('/').into(),
        })
    }

    /// The inner service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The request URI this service sends `uri` to.
    pub fn rewrite(&self, uri: &Uri) -> Uri {
        let tail = uri.path_and_query().map_or("/", PathAndQuery::as_str);
        let path = match self.prefix.is_empty() {
            true => uri.path_and_query().cloned(),
            // A valid path prefix followed by a valid path and query is a valid path and query.
            false => PathAndQuery::try_from(format!("{}{tail}", self.prefix)).ok(),
        };
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(self.scheme.clone());
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(path.unwrap_or_else(|| PathAndQuery::from_static("/")));
        // Scheme, authority and path and query are all set: the parts form a URI.
        Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
    }
}

impl<S, B> Service<Request<B>> for BaseUri<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> S::Future {
        *req.uri_mut() = self.rewrite(req.uri());
        req.headers_mut().remove(header::HOST);
        self.inner.call(req)
    }
}

impl<S: Clone> ReplicaSet<BaseUri<S>> {
    /// A set of one replica per base URI, each a clone of `service` (a pooled HTTP client, say)
    /// aimed at its base by [`BaseUri`], with [`ReplicaSet::new`]'s defaults; each replica is
    /// named by its base's authority (`10.0.0.7:8000`) for the `upstream` label.
    ///
    /// Fails on a base without a scheme or an authority. Panics when `bases` is empty, as
    /// [`ReplicaSet::new`] does.
    pub fn from_base_uris<'a>(
        service: S,
        bases: impl IntoIterator<Item = &'a Uri>,
    ) -> Result<Self, InvalidBaseUri> {
        let bases: Vec<&Uri> = bases.into_iter().collect();
        let replicas = bases
            .iter()
            .map(|base| BaseUri::new(service.clone(), base))
            .collect::<Result<Vec<_>, _>>()?;
        let names = bases
            .iter()
            .map(|b| b.authority().map_or("", |a| a.as_str()).to_owned());
        Ok(ReplicaSet::new(replicas).with_names(names))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(s: &str) -> BaseUri<()> {
        BaseUri::new((), &s.parse().unwrap()).unwrap()
    }

    #[test]
    fn scheme_authority_and_prefix_are_the_bases() {
        let uri: Uri = "/v1/chat/completions?x=1".parse().unwrap();
        assert_eq!(
            base("http://10.0.0.7:8000").rewrite(&uri),
            "http://10.0.0.7:8000/v1/chat/completions?x=1"
        );
        assert_eq!(
            base("https://api.example/openai/").rewrite(&uri),
            "https://api.example/openai/v1/chat/completions?x=1"
        );
        let absolute: Uri = "http://gateway:8080/v1/models".parse().unwrap();
        assert_eq!(
            base("http://up:1/p").rewrite(&absolute),
            "http://up:1/p/v1/models"
        );
    }

    #[test]
    fn a_base_needs_a_scheme_and_an_authority() {
        let e = BaseUri::new((), &"/v1".parse().unwrap()).unwrap_err();
        assert!(e.to_string().contains("`/v1`"), "{e}");
        let uris: Vec<Uri> = vec![
            "http://a:1".parse().unwrap(),
            "localhost:2".parse().unwrap(),
        ];
        assert!(ReplicaSet::from_base_uris((), &uris).is_err());
    }

    #[tokio::test]
    async fn one_service_serves_every_base_in_turn() {
        use tower::{ServiceExt, service_fn};
        let client = service_fn(|req: Request<()>| async move {
            let host = req.headers().contains_key(header::HOST);
            Ok::<_, std::convert::Infallible>(http::Response::new((req.uri().to_string(), host)))
        });
        let bases: Vec<Uri> = ["http://a:1/x", "http://b:2"]
            .map(|b| b.parse().unwrap())
            .into();
        let set = ReplicaSet::from_base_uris(client, &bases)
            .unwrap()
            .with_routing(crate::Routing::RoundRobin);
        let mut seen = Vec::new();
        for _ in 0..2 {
            let req = Request::get("/v1/models")
                .header("host", "gw")
                .body(())
                .unwrap();
            let res = set.clone().oneshot(req).await.unwrap();
            seen.push(res.body().get_ref().clone());
        }
        seen.sort();
        let want = [
            ("http://a:1/x/v1/models", false),
            ("http://b:2/v1/models", false),
        ];
        assert_eq!(seen, want.map(|(u, h)| (u.to_owned(), h)));
    }
}
