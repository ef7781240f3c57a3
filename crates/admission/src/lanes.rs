//! The waiters of one priority class, in one lane per tenant.
//!
//! Under fair queueing each tenant with waiters in the class has a lane, its waiters oldest
//! first; without it every waiter is in one lane (tenant [`NO_TENANT`]), so the class is the
//! single FIFO it always was. Lanes are few (the tenants waiting in a class), so they are a
//! plain vector searched in order; an emptied lane is removed at once.

use std::collections::VecDeque;

use crate::queue::Waiter;

/// The tenant of waiters when fair queueing is off.
pub(crate) const NO_TENANT: usize = usize::MAX;

/// One tenant's waiters in a class, oldest first (`seq` increasing front to back).
pub(crate) struct Lane {
    pub(crate) tenant: usize,
    waiters: VecDeque<Waiter>,
}

impl Lane {
    /// Its oldest waiter.
    pub(crate) fn oldest(&self) -> &Waiter {
        self.waiters.front().expect("lanes are never empty")
    }

    /// Its newest waiter.
    pub(crate) fn newest(&self) -> &Waiter {
        self.waiters.back().expect("lanes are never empty")
    }
}

/// The waiters of one class, by tenant.
#[derive(Default)]
pub(crate) struct Lanes {
    lanes: Vec<Lane>,
    len: usize,
}

impl Lanes {
    /// Waiters in the class.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The lanes, in no particular order.
    pub(crate) fn lanes(&self) -> &[Lane] {
        &self.lanes
    }

    /// Appends `w`, the newest waiter of the class, to the lane of its tenant.
    pub(crate) fn push(&mut self, w: Waiter) {
        self.len += 1;
        let tenant = w.tenant();
        match self.lanes.iter_mut().find(|l| l.tenant == tenant) {
            Some(l) => l.waiters.push_back(w),
            None => self.lanes.push(Lane {
                tenant,
                waiters: VecDeque::from([w]),
            }),
        }
    }

    /// The oldest waiter of the class.
    pub(crate) fn oldest(&self) -> Option<&Waiter> {
        self.lanes.iter().map(Lane::oldest).min_by_key(|w| w.seq)
    }

    /// The newest waiter of the class.
    pub(crate) fn newest(&self) -> Option<&Waiter> {
        self.lanes.iter().map(Lane::newest).max_by_key(|w| w.seq)
    }

    /// Takes the newest (else the oldest) waiter of lane `lane` out.
    pub(crate) fn pop(&mut self, lane: usize, newest: bool) -> Waiter {
        let l = &mut self.lanes[lane];
        let w = if newest {
            l.waiters.pop_back()
        } else {
            l.waiters.pop_front()
        };
        self.took(lane);
        w.expect("lanes are never empty")
    }

    /// Takes the newest waiter of the class out.
    pub(crate) fn pop_newest(&mut self) -> Option<Waiter> {
        let lane = (0..self.lanes.len()).max_by_key(|&i| self.lanes[i].newest().seq)?;
        Some(self.pop(lane, true))
    }

    /// Takes the waiter `seq` of `tenant` out; `None` if it is not queued.
    pub(crate) fn remove(&mut self, tenant: usize, seq: u64) -> Option<Waiter> {
        let lane = self.lanes.iter().position(|l| l.tenant == tenant)?;
        let waiters = &mut self.lanes[lane].waiters;
        let pos = waiters.binary_search_by_key(&seq, |w| w.seq).ok()?;
        let w = waiters.remove(pos);
        self.took(lane);
        w
    }

    /// Bookkeeping after a waiter left lane `lane`.
    fn took(&mut self, lane: usize) {
        self.len -= 1;
        if self.lanes[lane].waiters.is_empty() {
            self.lanes.swap_remove(lane);
        }
    }
}
