//! [`PolicyTable`]: the ordered set of classes and the policy of each.

use tailguard_core::{ClassPolicy, Priority};

/// The ordered set of named classes a [`PriorityClassLayer`](crate::PriorityClassLayer)
/// classifies into, with the [`ClassPolicy`] of each.
///
/// The policy of the chosen class travels in the request extensions next to the
/// [`Priority`], so one classification drives the whole stack: admission reads
/// `reserved_share`, hedging reads `hedge`, timeouts read the per-class timeouts.
///
/// ```
/// use std::time::Duration;
/// use tailguard_core::{ClassPolicy, Priority};
/// use tailguard_priority::PolicyTable;
///
/// let table = PolicyTable::standard()
///     .with_class(Priority::interactive(), ClassPolicy::new().with_reserved_share(0.5))
///     .with_class(Priority::batch(), ClassPolicy::new().with_hedge(false)
///         .with_first_token_timeout(Duration::from_secs(60)));
/// assert_eq!(table.policy(&Priority::interactive()).unwrap().reserved_share, Some(0.5));
/// assert_eq!(table.by_name("BATCH"), Some(&Priority::batch()));
/// ```
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PolicyTable {
    /// Most important first.
    classes: Vec<(Priority, ClassPolicy)>,
}

impl PolicyTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The five standard classes (`critical`, `interactive`, `standard`, `batch`, `sheddable`),
    /// each with a policy that decides nothing ([`ClassPolicy::new`]): every layer keeps its own
    /// configuration until a policy is set.
    pub fn standard() -> Self {
        Priority::standard_set()
            .into_iter()
            .fold(PolicyTable::new(), |t, p| {
                t.with_class(p, ClassPolicy::new())
            })
    }

    /// Adds `priority` with `policy`, or replaces the class of the same level.
    pub fn with_class(mut self, priority: Priority, policy: ClassPolicy) -> Self {
        match self
            .classes
            .iter_mut()
            .find(|(p, _)| p.level() == priority.level())
        {
            Some(entry) => *entry = (priority, policy),
            None => {
                self.classes.push((priority, policy));
                self.classes.sort_by(|a, b| b.0.cmp(&a.0));
            }
        }
        self
    }

    /// The class of `priority`'s level as configured here, with its policy.
    pub fn get(&self, priority: &Priority) -> Option<(&Priority, &ClassPolicy)> {
        self.classes
            .iter()
            .find(|(p, _)| p.level() == priority.level())
            .map(|(p, c)| (p, c))
    }

    /// The policy of `priority`'s class.
    pub fn policy(&self, priority: &Priority) -> Option<&ClassPolicy> {
        self.get(priority).map(|(_, c)| c)
    }

    /// The class with this name (ASCII case-insensitive).
    pub fn by_name(&self, name: &str) -> Option<&Priority> {
        self.classes
            .iter()
            .map(|(p, _)| p)
            .find(|p| p.name().eq_ignore_ascii_case(name))
    }

    /// The classes, most important first.
    pub fn classes(&self) -> impl Iterator<Item = &Priority> {
        self.classes.iter().map(|(p, _)| p)
    }

    /// The number of classes.
    pub fn len(&self) -> usize {
        self.classes.len()
    }

    /// Whether the table has no class.
    pub fn is_empty(&self) -> bool {
        self.classes.is_empty()
    }
}
