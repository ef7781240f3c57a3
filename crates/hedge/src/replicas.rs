//! `ReplicaSet`: an explicit set of replicas the hedge spreads its attempts over.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use http::Request;
use tower::ServiceExt;
use tower::util::Oneshot;
use tower_service::Service;

use crate::attempt::{Attempt, ReplicaId};

/// A set of replica services; each attempt of a hedged request goes to a replica no earlier
/// attempt of the same request went to.
///
/// Put it under [`FirstTokenHedge`](crate::FirstTokenHedge) (or use
/// [`FirstTokenHedgeLayer::layer_replicas`](crate::FirstTokenHedgeLayer::layer_replicas)). The
/// primary goes to the next replica in round-robin order; each backup goes to the first replica
/// after it (in ring order) that the request's [`Attempt`] has not recorded; when all were
/// tried, the round-robin choice is reused. The chosen replica's index is recorded as its
/// [`ReplicaId`]. A request without an `Attempt` (sent around the hedge) is routed
/// round-robin.
///
/// Readiness: `poll_ready` is always ready; each call readies a clone of the chosen replica
/// inside the response future (tower's `Oneshot`). A slow or saturated replica must not
/// block the set, since getting away from such a replica is the point of a hedge. Replica
/// services are therefore `Clone` (a hyper client, a tonic `Channel` and a tower `Buffer` all
/// are, cheaply).
pub struct ReplicaSet<S> {
    replicas: Arc<[S]>,
    next: Arc<AtomicUsize>,
}

impl<S> ReplicaSet<S> {
    /// A set of `replicas` (at least one).
    ///
    /// # Panics
    ///
    /// When `replicas` is empty: a set with nothing to route to is a configuration error.
    pub fn new(replicas: impl IntoIterator<Item = S>) -> Self {
        let replicas: Arc<[S]> = replicas.into_iter().collect();
        assert!(
            !replicas.is_empty(),
            "ReplicaSet needs at least one replica"
        );
        ReplicaSet {
            replicas,
            next: Arc::default(),
        }
    }

    /// The number of replicas.
    pub fn len(&self) -> usize {
        self.replicas.len()
    }

    /// Always `false`: a set holds at least one replica.
    pub fn is_empty(&self) -> bool {
        false
    }

    fn pick(&self, attempt: Option<&Attempt>) -> usize {
        let n = self.replicas.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        let Some(attempt) = attempt else {
            return start;
        };
        let tried = attempt.tried();
        let choice = (0..n)
            .map(|k| (start + k) % n)
            .find(|i| !tried.contains(&ReplicaId(*i as u64)))
            .unwrap_or(start);
        attempt.record(ReplicaId(choice as u64));
        choice
    }
}

impl<S> Clone for ReplicaSet<S> {
    fn clone(&self) -> Self {
        ReplicaSet {
            replicas: self.replicas.clone(),
            next: self.next.clone(),
        }
    }
}

impl<S> fmt::Debug for ReplicaSet<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicaSet")
            .field("replicas", &self.replicas.len())
            .finish()
    }
}

impl<S, B> Service<Request<B>> for ReplicaSet<S>
where
    S: Service<Request<B>> + Clone,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Oneshot<S, Request<B>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let i = self.pick(req.extensions().get::<Attempt>());
        self.replicas[i].clone().oneshot(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backups_avoid_tried_replicas() {
        let set = ReplicaSet::new([(), (), ()]);
        let primary = Attempt::primary();
        let a = set.pick(Some(&primary));
        let b = set.pick(Some(&primary.with_number(1)));
        let c = set.pick(Some(&primary.with_number(2)));
        let mut all = vec![a, b, c];
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2]);
        // Everything tried: falls back to round robin, still in range.
        assert!(set.pick(Some(&primary.with_number(3))) < 3);
        // Primaries of different requests spread round robin.
        let p1 = set.pick(Some(&Attempt::primary()));
        let p2 = set.pick(Some(&Attempt::primary()));
        assert_ne!(p1, p2);
    }
}
