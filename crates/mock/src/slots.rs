//! A replica's generation slots: a FIFO semaphore whose size can change while it runs.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How much slower a decode step is with every slot busy than with one: 25%. Real batching
/// servers share compute across the batch, so the gap grows with it, but mildly (the batch is
/// what makes them fast).
pub(crate) const FULL_BATCH_GAP_GROWTH: f64 = 0.25;

/// K generation slots, taken first come first served. Shrinking takes free slots away at
/// once and busy ones as they free (running streams are not cut), as a replica that loses
/// GPUs finishes what it runs.
#[derive(Debug)]
pub(crate) struct Slots {
    sem: Arc<Semaphore>,
    /// Slots in use.
    busy: AtomicU32,
    size: Mutex<Size>,
}

#[derive(Debug)]
struct Size {
    /// The number of slots.
    slots: u32,
    /// Busy slots to take away when they free (after a shrink).
    debt: u32,
}

/// One slot, held by a generating request; frees it when dropped.
#[derive(Debug)]
pub(crate) struct Slot {
    slots: Arc<Slots>,
    permit: Option<OwnedSemaphorePermit>,
}

impl Slots {
    pub(crate) fn new(slots: u32) -> Arc<Self> {
        Arc::new(Slots {
            sem: Arc::new(Semaphore::new(slots as usize)),
            busy: AtomicU32::new(0),
            size: Mutex::new(Size { slots, debt: 0 }),
        })
    }

    /// Waits for a free slot (first come, first served).
    pub(crate) async fn acquire(self: Arc<Self>) -> Option<Slot> {
        let permit = self.sem.clone().acquire_owned().await.ok()?;
        self.busy.fetch_add(1, Ordering::Relaxed);
        Some(Slot {
            slots: self,
            permit: Some(permit),
        })
    }

    /// The number of slots.
    pub(crate) fn size(&self) -> u32 {
        self.lock().slots
    }

    /// Busy slots over slots (0 with no slots).
    pub(crate) fn load(&self) -> f64 {
        let slots = self.size();
        match slots {
            0 => 0.0,
            n => f64::from(self.busy.load(Ordering::Relaxed)) / f64::from(n),
        }
    }

    /// Sets the number of slots to `slots`.
    pub(crate) fn resize(&self, slots: u32) {
        let mut size = self.lock();
        if slots >= size.slots {
            let mut more = slots - size.slots;
            let repaid = more.min(size.debt);
            size.debt -= repaid;
            more -= repaid;
            self.sem.add_permits(more as usize);
        } else {
            let fewer = size.slots - slots;
            let taken = self.sem.forget_permits(fewer as usize) as u32;
            size.debt += fewer - taken;
        }
        size.slots = slots;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Size> {
        self.size.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.busy.fetch_sub(1, Ordering::Relaxed);
        let mut size = self.slots.lock();
        if let Some(permit) = self.permit.take()
            && size.debt > 0
        {
            size.debt -= 1;
            permit.forget();
        }
        // Otherwise the permit goes back to the semaphore here, under the lock, so a resize
        // never sees it half returned.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn shrinking_takes_free_slots_at_once_and_busy_ones_as_they_free() {
        let slots = Slots::new(4);
        let a = slots.clone().acquire().await.unwrap();
        let b = slots.clone().acquire().await.unwrap();
        slots.resize(1);
        assert_eq!(slots.sem.available_permits(), 0);
        drop(a);
        assert_eq!(slots.sem.available_permits(), 0, "one busy slot was owed");
        drop(b);
        assert_eq!(slots.sem.available_permits(), 1);
        slots.resize(3);
        assert_eq!(slots.sem.available_permits(), 3);
        assert_eq!(slots.size(), 3);
    }

    #[tokio::test]
    async fn growing_repays_the_debt_first() {
        let slots = Slots::new(2);
        let a = slots.clone().acquire().await.unwrap();
        let b = slots.clone().acquire().await.unwrap();
        slots.resize(0);
        slots.resize(1);
        assert_eq!(slots.sem.available_permits(), 0);
        drop(a);
        drop(b);
        assert_eq!(slots.sem.available_permits(), 1);
        assert!(slots.load() == 0.0);
    }
}
