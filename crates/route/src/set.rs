//! `ReplicaSet`: an explicit set of replicas the hedge spreads its attempts over.

use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response};
use tailguard_core::Upstream;
use tower_service::Service;

use crate::body::ReplicaBody;
use crate::config::{Config, Routing};
use crate::eject::Ejection;
use crate::future::ResponseFuture;
use crate::health::Health;
use crate::place::Placer;

/// A set of replica services; each attempt of a hedged request goes to a replica no earlier
/// attempt of the same request went to.
///
/// Put it under `tailguard-hedge`'s `FirstTokenHedge` (`layer.layer(ReplicaSet::new(..))`), or
/// under any layer that speaks core's [attempt protocol](tailguard_core::attempt).
///
/// * **Primary**: by default ([`Routing::LeastWait`]) the better of two replicas by expected
///   wait for a first token, which the hedge reports to the set through the request's
///   [`Attempt`] (core's [attempt protocol](tailguard_core::attempt)); replicas ejected for
///   repeated failures or slowness (see [`Ejection`]) are left out. With
///   [`Routing::RoundRobin`], the next replica in turn. A replica the set has no news of yet
///   (no first token, no wait cut short) takes one attempt, a probe, and no more until that
///   one is answered; meanwhile it is taken to be like the others (their median estimate).
/// * **Backup**: the best-scored replica the request's [`Attempt`] has not recorded (an
///   ejected one only when no other is left); when all were tried, the primary's rule again.
///   An attempt the replica interrupted for a newer one is no try of it (see
///   [`with_interruption_hold`](Self::with_interruption_hold)): the request may go back there.
/// * **Slots** ([`with_slots`](Self::with_slots), or one while a replica is learned to serve
///   one at a time, see [`with_interruption_hold`](Self::with_interruption_hold)): an attempt
///   is placed only on a replica with a free slot, and holds it until its response body ends
///   or is dropped. While no suitable replica has one, the attempt waits in the set (in the
///   gateway, not in an upstream's own queue) and is placed when a slot frees, **oldest request
///   first** (a backup keeps its request's age); a backup waits for a slot on a replica not
///   yet tried, and is dropped unsent if the race is decided first.
/// * **Waiting for a faster replica**: an attempt (a backup among the replicas it may go to)
///   waits for a full replica rather than take a free one when the full one's expected first
///   token (the attempts ahead of it times its average slot hold, plus its first-token
///   estimate) comes sooner than the free one's last known wait; for at most that last known
///   wait (the hedge may back it up meanwhile), then it takes a replica with room. Slowness steers placement this way; it never leaves a
///   request waiting longer than the set expects a replica with room to take.
///
/// The chosen replica's index is recorded as its [`ReplicaId`]. A request without an
/// `Attempt` (sent around the hedge) is routed the same way and holds a slot, but feeds no
/// score: nothing reports its first token.
///
/// Why not tower's `balance::p2c`: it needs every endpoint ready before a pick and knows
/// nothing of which replicas a request already tried, and its `load` measures responses to
/// their head, which streaming servers send at once.
///
/// Readiness: `poll_ready` is always ready; each call readies a clone of the chosen replica
/// inside the response future (tower's `Oneshot`). A slow or saturated replica must not
/// block the set, since getting away from such a replica is the point of a hedge. Replica
/// services are therefore `Clone` (a hyper client, a tonic `Channel` and a tower `Buffer` all
/// are, cheaply).
///
/// [`Attempt`]: tailguard_core::attempt::Attempt
/// [`ReplicaId`]: tailguard_core::attempt::ReplicaId
pub struct ReplicaSet<S> {
    placer: Placer<S>,
}

/// The default of [`ReplicaSet::with_interruption_hold`].
const INTERRUPTION_HOLD: Duration = Duration::from_secs(60);

impl<S> ReplicaSet<S> {
    /// A set of `replicas` (at least one), with the defaults: [`Routing::LeastWait`], a
    /// decay of **10 s** for the first-token estimate (tower's and linkerd's peak-EWMA
    /// default: a replica that recovered gets traffic back within seconds), [`Ejection::new`],
    /// no slot limit.
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
        crate::metrics::describe();
        let health = Health::new(
            replicas.len(),
            Duration::from_secs(10),
            Ejection::new(),
            INTERRUPTION_HOLD,
        );
        let config = Config {
            routing: Routing::LeastWait,
            slots: None,
        };
        ReplicaSet {
            placer: Placer::new(replicas, config, health),
        }
    }

    /// A set routed [`Routing::RoundRobin`], with no ejection.
    pub fn round_robin(replicas: impl IntoIterator<Item = S>) -> Self {
        Self::new(replicas)
            .with_routing(Routing::RoundRobin)
            .with_ejection(Ejection::disabled())
    }

    /// Names the replicas, in order, for the `upstream` label: the set inserts a
    /// [`Upstream`] with its replica's name into every response that carries none (a replica
    /// service may set its own). Replicas without a name given keep theirs: `replica-{index}`
    /// from [`new`](Self::new), the base's authority (`10.0.0.7:8000`) from
    /// [`from_base_uris`](Self::from_base_uris). Keep the names few and fixed: they are
    /// metric label values.
    pub fn with_names<N: Into<Arc<str>>>(mut self, names: impl IntoIterator<Item = N>) -> Self {
        let mut all: Vec<Upstream> = self.placer.names.to_vec();
        for (slot, name) in all.iter_mut().zip(names) {
            *slot = Upstream::new(name);
        }
        self.placer.names = all.into();
        self
    }

    /// Sets how primaries are routed.
    pub fn with_routing(mut self, routing: Routing) -> Self {
        self.placer.config.routing = routing;
        self
    }

    /// Sets the most concurrent attempts per replica (`None`: no limit; `Some(0)` counts as
    /// `1`). For example `Some(1)` for a single-slot llama.cpp server.
    pub fn with_slots(mut self, slots: Option<u32>) -> Self {
        self.placer.config.slots = slots.map(|n| n.max(1));
        self
    }

    /// Sets the outlier ejection rules (state gathered so far is reset).
    pub fn with_ejection(self, ejection: Ejection) -> Self {
        let decay = self.placer.health.decay;
        self.with_health(decay, ejection)
    }

    /// Sets the decay time constant of the first-token estimate (state gathered so far is
    /// reset).
    pub fn with_decay(self, decay: Duration) -> Self {
        let ejection = self.placer.health.ejection.clone();
        self.with_health(decay, ejection)
    }

    /// Sets how long a replica that interrupted a stream for a newer attempt gets one attempt
    /// at a time (default **60 s**, doubled by each interruption since the replica last streamed two
    /// attempts at once, up to 64 times; `Duration::ZERO`: never, and
    /// such a stream without a token counts as a failure). A single-slot llama-cpp-python
    /// server ends its running stream (a bare `[DONE]`, or a close mid-stream) when a newer
    /// request arrives; the set reads a stream that ends that way (after its first token, as
    /// its sender reports it cut short) within 2 s of placing a newer attempt on the same
    /// replica as "one slot", and holds further attempts in the gateway
    /// until the slot frees, instead of trading one stream for another. After the hold the
    /// replica takes attempts side by side again; the next interruption teaches it again, for
    /// twice as long each time (up to 64 holds) until it is seen streaming two at once. The
    /// first interruption of a stream after its first token breaks that stream (the client
    /// sees an in-band error); before its first token, the hedge's empty-stream retry hides it,
    /// and that retry may wait for the same replica's slot (the interrupted attempt is no try
    /// of it).
    /// State gathered so far is reset.
    pub fn with_interruption_hold(self, hold: Duration) -> Self {
        let (decay, ejection) = (
            self.placer.health.decay,
            self.placer.health.ejection.clone(),
        );
        self.rebuild(decay, ejection, hold)
    }

    fn with_health(self, decay: Duration, ejection: Ejection) -> Self {
        let hold = self.placer.health.interruption_hold;
        self.rebuild(decay, ejection, hold)
    }

    fn rebuild(mut self, decay: Duration, ejection: Ejection, hold: Duration) -> Self {
        let n = self.placer.replicas.len();
        self.placer.health = Arc::new(Health::new(n, decay, ejection, hold));
        self
    }

    /// The number of replicas.
    pub fn len(&self) -> usize {
        self.placer.replicas.len()
    }

    /// Always `false`: a set holds at least one replica.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// The sum of the slots, when they are limited: the most attempts in flight at once, and
    /// a natural admission capacity in front of the hedge.
    pub fn total_slots(&self) -> Option<u64> {
        self.placer
            .config
            .slots
            .map(|n| u64::from(n) * self.len() as u64)
    }
}

impl<S> Clone for ReplicaSet<S> {
    fn clone(&self) -> Self {
        ReplicaSet {
            placer: self.placer.clone(),
        }
    }
}

impl<S> fmt::Debug for ReplicaSet<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = &self.placer;
        f.debug_struct("ReplicaSet")
            .field("replicas", &p.replicas.len())
            .field("routing", &p.config.routing)
            .field("slots", &p.config.slots)
            .field("decay", &p.health.decay)
            .field("ejection", &p.health.ejection)
            .finish()
    }
}

impl<S, B, RB> Service<Request<B>> for ReplicaSet<S>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone,
{
    type Response = Response<ReplicaBody<RB>>;
    type Error = S::Error;
    type Future = ResponseFuture<S, B>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        ResponseFuture::new(self.placer.clone(), req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::line::Spot;
    use tailguard_core::attempt::Attempt;

    fn place(set: &ReplicaSet<()>, attempt: &Attempt) -> Option<usize> {
        let mut req = Request::new(());
        req.extensions_mut().insert(attempt.clone());
        let mut spot = Spot::new(set.placer.health.clone(), attempt.since());
        set.placer.place(&req, &mut spot, None).map(|(i, _)| i)
    }

    #[tokio::test(start_paused = true)]
    async fn backups_avoid_tried_replicas() {
        for set in [
            ReplicaSet::new([(), (), ()]),
            ReplicaSet::round_robin([(), (), ()]),
        ] {
            let primary = Attempt::primary();
            let mut all: Vec<usize> = (0..3)
                .filter_map(|k| place(&set, &primary.next(k)))
                .collect();
            all.sort_unstable();
            assert_eq!(all, vec![0, 1, 2]);
            // Everything tried: the primary's rule again, still in range.
            assert!(place(&set, &primary.next(3)).is_some_and(|i| i < 3));
        }
    }

    #[tokio::test(start_paused = true)]
    async fn slots_bound_placements() {
        let set = ReplicaSet::new([(), ()]).with_slots(Some(1));
        assert_eq!(set.total_slots(), Some(2));
        let a = Attempt::primary();
        let first = place(&set, &a).map(|i| (i, ()));
        assert!(first.is_some());
        // The backup takes the other replica's slot; a third attempt of anyone waits.
        assert!(place(&set, &a.next(1)).is_some());
        assert_eq!(place(&set, &Attempt::primary()), None);
    }
}
