//! [`Store`]: where the buckets live — in this process ([`LocalStore`](crate::LocalStore)),
//! or, later, shared by several gateways (Redis).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tailguard_core::Tenant;

use crate::limit::{Limit, Tokens};

/// Where a tenant's buckets live: takes reservations and settles them.
///
/// The layer asks [`reserve`](Store::reserve) once per budgeted request, before the request
/// goes on, and waits for the answer in its response future (an in-process store answers at
/// once, [`Reply::Ready`]; a remote one may answer [`Reply::Later`]). Every
/// [`Decision::Reserved`] is settled exactly once with [`reconcile`](Store::reconcile) when
/// the response ends, however it ends; a reservation whose gateway dies before that is the
/// store's to expire. A [`Reply::Later`] dropped before it completes (the client went away
/// while the store decided) is never settled: a store that takes tokens in that future gives
/// them back itself, or expires them.
///
/// A reservation is all or nothing: either every bucket of the tenant's limits gave its share
/// of `want` (the [`Kind`](crate::Kind) of each limit says which tokens count), or none did.
pub trait Store: fmt::Debug + Send + Sync + 'static {
    /// Takes `want` from every bucket of `tenant` that `limits` describe, or nothing.
    fn reserve(&self, tenant: &Tenant, limits: &[Limit], want: Tokens) -> Reply;

    /// Settles the reservation `ticket` of `reserved` tokens, taken by
    /// [`reserve`](Store::reserve) with the same `tenant` and `limits`, once `used` tokens are
    /// known: gives back what was reserved and not used, takes what was used beyond it.
    /// Called from `Drop`: it must not block (a remote store sends it on in the background).
    fn reconcile(
        &self,
        tenant: &Tenant,
        limits: &[Limit],
        ticket: Ticket,
        reserved: Tokens,
        used: Tokens,
    );
}

/// A reservation's identity in its store, handed back to [`Store::reconcile`] (an in-process
/// store needs none; a shared one can name the reservation it expires if nobody settles it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Ticket(pub u64);

/// A store's answer to [`Store::reserve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Every bucket gave its share; settle with this ticket.
    Reserved(Ticket),
    /// Some bucket is short: nothing was taken.
    Refused(Shortfall),
    /// The store cannot decide — a shared store that is unreachable and configured to fail
    /// closed — and nothing was taken: the request is refused with 503 `cluster_unavailable`
    /// (as admission's cluster mode refuses) and this `Retry-After`.
    Unavailable(Duration),
}

/// The bucket that refused a reservation: the one that frees its share last, or one that
/// never can (the reservation is more than its limit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shortfall {
    /// The limit of that bucket.
    pub limit: Limit,
    /// The tokens the reservation asked of it.
    pub wanted: u64,
    /// Whole tokens it holds now.
    pub available: u64,
    /// When it will hold `wanted` if nothing else is taken from it meanwhile (a refund of a
    /// reservation in flight can only make it sooner); `None` when it never will, because
    /// `wanted` is more than the limit.
    pub retry_after: Option<Duration>,
}

/// The answer to [`Store::reserve`]: at once, or from a future (a remote store).
pub enum Reply {
    /// The decision, known at once.
    Ready(Decision),
    /// The decision, once this future completes.
    Later(Pin<Box<dyn Future<Output = Decision> + Send>>),
}

impl Future for Reply {
    type Output = Decision;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Decision> {
        match self.get_mut() {
            Reply::Ready(d) => Poll::Ready(*d),
            Reply::Later(fut) => fut.as_mut().poll(cx),
        }
    }
}

impl fmt::Debug for Reply {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reply::Ready(d) => f.debug_tuple("Ready").field(d).finish(),
            Reply::Later(_) => f.write_str("Later(..)"),
        }
    }
}
