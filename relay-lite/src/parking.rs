//! Where long-polls park: one bounded pool per API family (Stringcup, letmeknow), and inside each
//! a share per caller, so that no one caller (an identity, or a client address for
//! unauthenticated reads) can take the slots everyone else needs.
//!
//! A parked request holds memory (its connection, its request and a hub subscription), so the
//! pools are what bounds it; the per-caller share is what keeps one attacker's thousands of
//! waits from turning every other client's wait into an immediate answer.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One family's pool of parking slots.
#[derive(Debug)]
pub struct ParkingPool {
    slots: Arc<Semaphore>,
    per_caller: usize,
    callers: Arc<Mutex<HashMap<String, usize>>>,
}

/// A parked request's slot; dropping it frees the slot and the caller's share.
#[derive(Debug)]
pub struct Parked {
    _permit: OwnedSemaphorePermit,
    callers: Arc<Mutex<HashMap<String, usize>>>,
    caller: String,
}

/// Why a request could not park.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// The caller already holds its share of this family's slots.
    Caller,
    /// Every slot of this family is taken.
    Pool,
}

fn lock(map: &Mutex<HashMap<String, usize>>) -> MutexGuard<'_, HashMap<String, usize>> {
    map.lock().unwrap_or_else(PoisonError::into_inner)
}

impl ParkingPool {
    /// A pool of `slots`, of which one caller may hold `per_caller` (0: no per-caller share).
    pub fn new(slots: usize, per_caller: usize) -> Self {
        Self { slots: Arc::new(Semaphore::new(slots)), per_caller, callers: Arc::new(Mutex::new(HashMap::new())) }
    }

    /// Takes a slot for `caller`.
    pub fn park(&self, caller: &str) -> Result<Parked, Full> {
        let mut callers = lock(&self.callers);
        let held = callers.get(caller).copied().unwrap_or(0);
        if self.per_caller > 0 && held >= self.per_caller {
            return Err(Full::Caller);
        }
        let permit = self.slots.clone().try_acquire_owned().map_err(|_| Full::Pool)?;
        callers.insert(caller.to_owned(), held + 1);
        Ok(Parked { _permit: permit, callers: self.callers.clone(), caller: caller.to_owned() })
    }

    /// Slots free now.
    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }
}

impl Drop for Parked {
    fn drop(&mut self) {
        let mut callers = lock(&self.callers);
        if let Some(held) = callers.get_mut(&self.caller) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                callers.remove(&self.caller);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_caller_cannot_take_more_than_its_share() {
        let pool = ParkingPool::new(10, 3);
        let mallory: Vec<_> = (0..3).map(|_| pool.park("mallory").unwrap()).collect();
        assert_eq!(pool.park("mallory").unwrap_err(), Full::Caller);
        let alice = pool.park("alice").unwrap();
        assert_eq!(pool.available(), 6);
        drop(mallory);
        assert_eq!(pool.available(), 9);
        assert!(pool.park("mallory").is_ok());
        drop(alice);
    }

    #[test]
    fn the_pool_bounds_everyone_together() {
        let pool = ParkingPool::new(2, 0);
        let _a = pool.park("a").unwrap();
        let _b = pool.park("b").unwrap();
        assert_eq!(pool.park("c").unwrap_err(), Full::Pool);
    }
}
