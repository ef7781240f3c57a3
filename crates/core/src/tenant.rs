//! [`Tenant`]: who a request is for, in core's vocabulary, as [`Priority`](crate::Priority)
//! says how much it matters.
//!
//! A layer that identifies tenants (`tailguard-priority`'s `TenantLayer`: a configured header,
//! or a hash of the API key) inserts one into the request extensions; admission's fair queueing
//! and token budgets read it, and the recorder labels metrics with its bounded
//! [`label`](Tenant::label). A request without one belongs to no tenant: fair queueing treats
//! all such requests as one tenant, budgets do not apply.
//!
//! ```
//! use tailguard_core::Tenant;
//!
//! let t = Tenant::new("acme").with_weight(2.0);
//! assert_eq!((t.id(), t.label(), t.weight()), ("acme", "acme", 2.0));
//! // An unnamed tenant keeps its id but shares a pooled label.
//! let pooled = Tenant::new("key-3f2a9c0d11b4e7a5").with_label(Tenant::OTHER);
//! assert_eq!(pooled.label(), "other");
//! ```

use std::fmt;
use std::sync::Arc;

/// Who a request is for: an id (unbounded: every tenant its own), a bounded metric label, and
/// a weight (its share of contended capacity relative to other tenants, 1 by default).
///
/// Two tenants are equal when their ids are.
#[derive(Clone)]
pub struct Tenant {
    id: Arc<str>,
    label: Arc<str>,
    weight: f64,
}

impl Tenant {
    /// The label of tenants pooled together for metrics.
    pub const OTHER: &'static str = "other";

    /// A tenant with this id, labelled by it, of weight 1.
    pub fn new(id: impl Into<Arc<str>>) -> Self {
        let id = id.into();
        Tenant {
            label: id.clone(),
            id,
            weight: 1.0,
        }
    }

    /// Sets the metric label (bounded: a configured name, or [`Tenant::OTHER`]).
    pub fn with_label(mut self, label: impl Into<Arc<str>>) -> Self {
        self.label = label.into();
        self
    }

    /// Sets the weight: a tenant of weight 2 gets twice the service of a tenant of weight 1
    /// when both wait. Not finite or not positive: 1.
    pub fn with_weight(mut self, weight: f64) -> Self {
        self.weight = if weight.is_finite() && weight > 0.0 {
            weight
        } else {
            1.0
        };
        self
    }

    /// The tenant's id.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The id, shared (a reference count, no copy).
    pub fn shared_id(&self) -> Arc<str> {
        self.id.clone()
    }

    /// The bounded metric label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The label, shared.
    pub fn shared_label(&self) -> Arc<str> {
        self.label.clone()
    }

    /// The weight (positive, finite).
    pub fn weight(&self) -> f64 {
        self.weight
    }
}

impl PartialEq for Tenant {
    fn eq(&self, other: &Self) -> bool {
        self.id == other.id
    }
}

impl Eq for Tenant {}

impl std::hash::Hash for Tenant {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.id.hash(state);
    }
}

impl fmt::Debug for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Tenant({}", &*self.id)?;
        if self.label != self.id {
            write!(f, ", label {}", &*self.label)?;
        }
        if self.weight != 1.0 {
            write!(f, ", weight {}", self.weight)?;
        }
        f.write_str(")")
    }
}

impl fmt::Display for Tenant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_are_positive_and_finite_and_equality_is_by_id() {
        for w in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert_eq!(Tenant::new("a").with_weight(w).weight(), 1.0);
        }
        assert_eq!(
            Tenant::new("a").with_weight(3.0),
            Tenant::new("a").with_label("x")
        );
        assert_eq!(
            format!(
                "{:?}",
                Tenant::new("a").with_label("other").with_weight(2.0)
            ),
            "Tenant(a, label other, weight 2)"
        );
    }
}
