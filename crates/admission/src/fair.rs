//! Fair queueing across tenants by tokens: the virtual token counters of one gate.
//!
//! Each tenant ([`Tenant`] in the request extensions; requests without one are one anonymous
//! tenant) has a counter of the weighted service it received. The queue serves, within a
//! class, the waiter whose tenant has the least counter ([`crate::queue`]); this module keeps
//! the counters, after the virtual token counter (VTC) of Sheng et al., "Fairness in Serving
//! Large Language Models" (OSDI 2024):
//!
//! * **Charge.** At admission a tenant's counter grows by
//!   `(input tokens × w_in + expected output × w_out) / weight`; when the response body ends it
//!   is corrected by `(real output − expected output) × w_out / weight`.
//! * **Lift.** When a tenant that had no waiter gets one, its counter becomes at least the least
//!   counter among the tenants that have waiters, or, when none has, the gate's *floor*: so an
//!   idle tenant cannot bank credit.
//! * **Floor.** The gate's virtual time when nobody waits: raised (never lowered) to the counter
//!   of a tenant admitted while nobody waits, to the least counter among waiting tenants
//!   whenever a tenant joins them, and to the counter of the last waiter to leave the queue.
//!   Service taken while nobody else wanted it earns neither credit nor debt against tenants
//!   that come later.
//! * **Forgetting.** A tenant with nothing waiting and nothing in flight is forgotten, so memory
//!   is bounded by the waiters and the requests in flight. When it comes back it starts at the
//!   floor and is lifted as any tenant: a debt it had (service beyond the others') is forgiven.
//!
//! Ties between tenants (equal counters, as a lift makes) go to the tenant holding fewer units
//! in flight per weight, then to the oldest waiter.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use http::request::Parts;
use tailguard_core::{RequestFacts, Tenant};

use crate::cost;
use crate::metrics::TenantMetrics;

/// Default weight of one prompt (input) token in a tenant's counter: 1, as in the VTC paper.
pub const DEFAULT_INPUT_TOKEN_WEIGHT: f64 = 1.0;
/// Default weight of one output token in a tenant's counter: 2, as in the VTC paper (a decoded
/// token costs the server more than a prefilled one).
pub const DEFAULT_OUTPUT_TOKEN_WEIGHT: f64 = 2.0;
/// Default output a request is charged for at admission: its `max_tokens` capped at 256, or 256
/// when it carries none. The charge is corrected with the real output when its body ends.
pub const DEFAULT_EXPECTED_OUTPUT_TOKENS: u32 = 256;

/// The fair-queueing configuration of a gate.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fairness {
    pub(crate) input_weight: f64,
    pub(crate) output_weight: f64,
    pub(crate) expected_output: u32,
}

impl Default for Fairness {
    fn default() -> Self {
        Fairness {
            input_weight: DEFAULT_INPUT_TOKEN_WEIGHT,
            output_weight: DEFAULT_OUTPUT_TOKEN_WEIGHT,
            expected_output: DEFAULT_EXPECTED_OUTPUT_TOKENS,
        }
    }
}

impl Fairness {
    /// What a request asks of its tenant: who it is for, and its charge at admission.
    pub(crate) fn demand(&self, parts: &Parts) -> Demand {
        let tenant = parts.extensions.get::<Tenant>().cloned();
        let weight = tenant.as_ref().map_or(1.0, Tenant::weight);
        let expected = parts
            .extensions
            .get::<RequestFacts>()
            .and_then(|f| f.max_tokens)
            .map_or(self.expected_output, |m| m.min(self.expected_output));
        let input = cost::prompt_tokens(parts) as f64;
        Demand {
            tenant,
            charge: Charge {
                input: input * self.input_weight / weight,
                expected: u64::from(expected),
                per_output: self.output_weight / weight,
            },
        }
    }
}

/// A request's tenant (`None`: the anonymous tenant) and its charge.
#[derive(Clone, Debug)]
pub(crate) struct Demand {
    pub(crate) tenant: Option<Tenant>,
    pub(crate) charge: Charge,
}

/// A request's tenant slot and charge, carried by its waiter and its permit.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Fair {
    pub(crate) tenant: usize,
    pub(crate) charge: Charge,
}

/// What a request adds to its tenant's counter, already divided by the tenant's weight.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Charge {
    /// The weighted input tokens.
    input: f64,
    /// The output tokens charged at admission.
    expected: u64,
    /// The weighted cost of one output token.
    per_output: f64,
}

impl Charge {
    /// The charge at admission.
    fn upfront(&self) -> f64 {
        self.input + self.expected as f64 * self.per_output
    }

    /// The correction at the end of the request, once what it was served is known.
    pub(crate) fn correction(&self, served: Served) -> f64 {
        match served {
            Served::Expected => 0.0,
            Served::Output(n) => (n as f64 - self.expected as f64) * self.per_output,
            Served::Nothing => -self.upfront(),
        }
    }
}

/// What an admitted request was served, as far as the gate learns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Served {
    /// Unknown (a response that is not a stream): the charge at admission stands.
    Expected,
    /// This many output tokens (a stream's count, 0 for an error status or a failed call).
    Output(u64),
    /// Nothing: the request never reached the upstream (its cluster lease failed).
    Nothing,
}

/// The counter of a tenant known to the gate.
struct Slot {
    /// The tenant's id (`None`: the anonymous tenant).
    id: Option<Arc<str>>,
    /// Weighted service received, in tokens over the weight.
    counter: f64,
    /// The tenant's weight, as its latest request said.
    weight: f64,
    waiting: usize,
    in_flight: usize,
    /// Units held by its requests in flight.
    units: u64,
    metrics: Option<TenantMetrics>,
    /// Shared counters: the tenant's cluster-wide service at the last exchange, if any.
    seen: Option<f64>,
}

/// The virtual token counters of one gate's tenants. See the [module docs](self).
#[derive(Default)]
pub(crate) struct Tenants {
    named: HashMap<Arc<str>, usize>,
    anonymous: Option<usize>,
    slots: Vec<Option<Slot>>,
    free: Vec<usize>,
    /// Tenants with waiters.
    waiting: usize,
    floor: f64,
    /// Metric handles by label (bounded by whoever labels tenants).
    labels: HashMap<Arc<str>, TenantMetrics>,
    /// Shared counters ([`crate::fair_share`]): the service charged here since the last
    /// exchange, by tenant (`None` while the counters are not shared).
    pending: Option<HashMap<TenantKey, f64>>,
}

/// A tenant's id in the shared counters (`None`: the anonymous tenant).
pub(crate) type TenantKey = Option<Arc<str>>;

impl Tenants {
    /// Counters kept for sharing with other gates ([`crate::fair_share`]).
    pub(crate) fn shared() -> Self {
        Tenants {
            pending: Some(HashMap::new()),
            ..Tenants::default()
        }
    }

    /// Adds `service` to tenant `i`'s counter, and to what the next exchange reports.
    fn charge(&mut self, i: usize, service: f64) {
        let s = self.slots[i].as_mut().expect("a live tenant slot");
        s.counter += service;
        if let Some(p) = &mut self.pending {
            *p.entry(s.id.clone()).or_default() += service;
        }
    }

    /// For an exchange of shared counters: takes the service charged since the last one, and
    /// lists the tenants whose cluster-wide service is wanted (those the gate knows).
    pub(crate) fn take_report(&mut self) -> (HashMap<TenantKey, f64>, Vec<TenantKey>) {
        let pushed = self
            .pending
            .as_mut()
            .map(std::mem::take)
            .unwrap_or_default();
        let wanted = self.slots.iter().flatten().map(|s| s.id.clone()).collect();
        (pushed, wanted)
    }

    /// Applies an exchange's answer, `totals[k]` the cluster-wide service of `wanted[k]` after
    /// `pushed` was added: a tenant's counter grows by the service other gates gave it since
    /// the previous exchange. A tenant seen for the first time (or again after being
    /// forgotten) only records its total: service before the gate knew it is not charged, as
    /// a newcomer starts at the floor. `None`: the exchange failed; every tenant starts over.
    pub(crate) fn apply_totals(
        &mut self,
        pushed: &HashMap<TenantKey, f64>,
        answer: Option<(&[TenantKey], &[f64])>,
    ) {
        let Some((wanted, totals)) = answer else {
            self.slots.iter_mut().flatten().for_each(|s| s.seen = None);
            return;
        };
        for (key, &total) in wanted.iter().zip(totals) {
            let found = match key {
                Some(id) => self.named.get(id).copied(),
                None => self.anonymous,
            };
            let Some(s) = found.and_then(|i| self.slots[i].as_mut()) else {
                continue;
            };
            if let Some(before) = s.seen {
                let mine = pushed.get(key).copied().unwrap_or(0.0);
                let elsewhere = total - before - mine;
                if elsewhere.is_finite() {
                    s.counter += elsewhere;
                }
            }
            s.seen = Some(total);
        }
    }

    fn get(&self, i: usize) -> &Slot {
        self.slots[i].as_ref().expect("a live tenant slot")
    }

    fn get_mut(&mut self, i: usize) -> &mut Slot {
        self.slots[i].as_mut().expect("a live tenant slot")
    }

    /// The slot of `tenant` (`None`: the anonymous one), created at the floor when the gate does
    /// not know it. A slot lives while its tenant has waiters or requests in flight: the caller
    /// queues or admits the request, or calls [`forget_if_idle`](Self::forget_if_idle).
    pub(crate) fn slot(&mut self, tenant: Option<&Tenant>) -> usize {
        let found = match tenant {
            Some(t) => self.named.get(t.id()).copied(),
            None => self.anonymous,
        };
        let i = found.unwrap_or_else(|| self.create(tenant));
        if let Some(t) = tenant {
            self.get_mut(i).weight = t.weight();
        }
        i
    }

    fn create(&mut self, tenant: Option<&Tenant>) -> usize {
        let metrics = tenant.map(|t| {
            self.labels
                .entry(t.shared_label())
                .or_insert_with(|| TenantMetrics::new(t.label()))
                .clone()
        });
        let slot = Slot {
            id: tenant.map(Tenant::shared_id),
            counter: self.floor,
            weight: tenant.map_or(1.0, Tenant::weight),
            waiting: 0,
            in_flight: 0,
            units: 0,
            metrics,
            seen: None,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i] = Some(slot);
                i
            }
            None => {
                self.slots.push(Some(slot));
                self.slots.len() - 1
            }
        };
        match tenant {
            Some(t) => {
                self.named.insert(t.shared_id(), i);
            }
            None => self.anonymous = Some(i),
        }
        i
    }

    /// Forgets tenant `i` if it has nothing waiting and nothing in flight.
    pub(crate) fn forget_if_idle(&mut self, i: usize) {
        let s = self.get(i);
        if s.waiting > 0 || s.in_flight > 0 {
            return;
        }
        match self.slots[i].take().and_then(|s| s.id) {
            Some(id) => {
                self.named.remove(&id);
            }
            None => self.anonymous = None,
        }
        self.free.push(i);
    }

    /// The order of tenant `i` among waiting tenants, least first: its counter, then the units
    /// it holds in flight per weight.
    pub(crate) fn rank(&self, i: usize) -> (f64, f64) {
        let s = self.get(i);
        (s.counter, s.units as f64 / s.weight)
    }

    /// Tenant `i` queues a request; if it had no waiter, it is lifted.
    pub(crate) fn enqueue(&mut self, i: usize) {
        let s = self.get_mut(i);
        s.waiting += 1;
        if s.waiting > 1 {
            return;
        }
        // The least counter among the others (`i` had no waiter; `self.waiting` does not count
        // it yet).
        let least = (self.waiting > 0)
            .then(|| {
                self.slots
                    .iter()
                    .enumerate()
                    .filter_map(|(j, s)| s.as_ref().filter(|s| j != i && s.waiting > 0))
                    .map(|s| s.counter)
                    .min_by(f64::total_cmp)
            })
            .flatten();
        let target = match least {
            Some(m) => {
                self.floor = self.floor.max(m);
                m
            }
            None => self.floor,
        };
        self.waiting += 1;
        let s = self.get_mut(i);
        s.counter = s.counter.max(target);
    }

    /// A waiter of tenant `i` left the queue; `last` when it was the queue's last waiter. An
    /// admission or [`forget_if_idle`](Self::forget_if_idle) follows.
    pub(crate) fn dequeue(&mut self, i: usize, last: bool) {
        let s = self.get_mut(i);
        s.waiting -= 1;
        let (idle, counter) = (s.waiting == 0, s.counter);
        if idle {
            self.waiting -= 1;
        }
        if last {
            self.floor = self.floor.max(counter);
        }
    }

    /// Tenant `i` is admitted a request of `units` with `charge`, after waiting `waited`
    /// (`None`: admitted at once, nobody waiting).
    pub(crate) fn admit(
        &mut self,
        i: usize,
        charge: &Charge,
        units: u32,
        waited: Option<Duration>,
    ) {
        let s = self.get(i);
        if waited.is_none() {
            self.floor = self.floor.max(s.counter);
        }
        self.charge(i, charge.upfront());
        let s = self.get_mut(i);
        s.in_flight += 1;
        s.units += u64::from(units);
        if let Some(m) = &s.metrics {
            m.admitted(waited.unwrap_or_default());
        }
    }

    /// A request of tenant `i` holding `units` ended; its charge is corrected by `correction`.
    pub(crate) fn release(&mut self, i: usize, correction: f64, units: u32) {
        self.charge(i, correction);
        let s = self.get_mut(i);
        s.in_flight -= 1;
        s.units -= u64::from(units);
        self.forget_if_idle(i);
    }

    /// The counter of the tenant `id` (`None`: the anonymous one), if the gate knows it.
    pub(crate) fn counter_of(&self, id: Option<&str>) -> Option<f64> {
        let i = match id {
            Some(id) => self.named.get(id).copied(),
            None => self.anonymous,
        }?;
        Some(self.get(i).counter)
    }

    /// Tenants the gate knows (with waiters or requests in flight).
    pub(crate) fn known(&self) -> usize {
        self.named.len() + usize::from(self.anonymous.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn charge(tokens: f64) -> Charge {
        Charge {
            input: tokens,
            expected: 0,
            per_output: 2.0,
        }
    }

    #[test]
    fn demand_charges_prompt_and_capped_output_over_the_weight() {
        let f = Fairness::default();
        let mut parts = http::Request::new(()).into_parts().0;
        parts.extensions.insert(
            RequestFacts::new()
                .with_prompt_tokens(100)
                .with_max_tokens(1000),
        );
        parts.extensions.insert(Tenant::new("a").with_weight(2.0));
        let d = f.demand(&parts);
        assert_eq!(d.tenant.as_ref().map(Tenant::id), Some("a"));
        // (100 × 1 + min(1000, 256) × 2) / 2
        assert_eq!(d.charge.upfront(), (100.0 + 512.0) / 2.0);
        assert_eq!(d.charge.correction(Served::Output(6)), -250.0);
        assert_eq!(d.charge.correction(Served::Expected), 0.0);
        assert_eq!(d.charge.correction(Served::Nothing), -306.0);
        // Without facts: 256 expected, the prompt estimated from Content-Length (4 bytes a token).
        let mut parts = http::Request::builder()
            .header("content-length", "400")
            .body(())
            .unwrap()
            .into_parts()
            .0;
        assert_eq!(f.demand(&parts).charge.upfront(), 100.0 + 512.0);
        parts
            .extensions
            .insert(RequestFacts::new().with_max_tokens(10));
        assert_eq!(f.demand(&parts).charge.upfront(), 100.0 + 20.0);
    }

    #[test]
    fn lift_floor_and_forgetting() {
        let mut t = Tenants::default();
        let (a, b) = (Tenant::new("a"), Tenant::new("b"));
        let ia = t.slot(Some(&a));
        // Admitted at once with nobody waiting: the floor is its counter before the charge.
        t.admit(ia, &charge(100.0), 1, None);
        assert_eq!((t.rank(ia), t.floor), ((100.0, 1.0), 0.0));
        t.enqueue(ia);
        let ib = t.slot(Some(&b));
        assert_eq!(t.rank(ib).0, 0.0);
        // b joins a waiting a: lifted to a's counter.
        t.enqueue(ib);
        assert_eq!((t.rank(ib).0, t.floor), (100.0, 100.0));
        t.dequeue(ia, false);
        t.admit(ia, &charge(50.0), 1, Some(Duration::ZERO));
        t.dequeue(ib, true);
        assert_eq!(t.floor, 100.0);
        t.forget_if_idle(ib);
        assert_eq!((t.known(), t.counter_of(Some("b"))), (1, None));
        // a's requests end: a is forgotten too; a newcomer starts at the floor.
        t.release(ia, -10.0, 1);
        assert_eq!(t.counter_of(Some("a")), Some(140.0));
        t.release(ia, 0.0, 1);
        assert_eq!(t.known(), 0);
        let i = t.slot(None);
        assert_eq!((t.rank(i).0, t.counter_of(None)), (100.0, Some(100.0)));
        t.forget_if_idle(i);
        assert_eq!((t.known(), t.slots.len(), t.free.len()), (0, 2, 2));
    }
}
