//! How a [`ReplicaSet`](crate::ReplicaSet) places attempts: the routing of primaries and the
//! slots per replica ([`Ejection`](crate::Ejection), the outlier rules, is in `eject`).

/// How a [`ReplicaSet`](crate::ReplicaSet) chooses the replica of a primary attempt.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Routing {
    /// Power of two choices over each replica's expected wait for a first token (the
    /// default): the attempts on it still waiting for one, and a peak-EWMA of its recent
    /// times to first token, in which an attempt still waiting, or cancelled before its
    /// token, counts at least as long as it waited. Ejected replicas are left out.
    #[default]
    LeastWait,
    /// Round robin, blind to load and ejection (the behaviour before load-aware routing).
    RoundRobin,
}

/// The placement settings of a set.
#[derive(Clone, Debug)]
pub(crate) struct Config {
    pub(crate) routing: Routing,
    /// The most attempts per replica at once (`None`: no limit).
    pub(crate) slots: Option<u32>,
}
