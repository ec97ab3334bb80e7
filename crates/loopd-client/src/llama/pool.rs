//! The [`Buffers`] of finished requests, kept for the next request of the same [`Client`].
//!
//! A set is 5 MiB ([`Buffers::BYTES`]). Made anew for every request, it cost a `memset` of
//! all of it (about 9% of the client path's instructions): glibc raises its mmap threshold
//! once the first set is freed, and from then on serves each zeroed allocation from the heap
//! and clears it. A set needs no clearing between requests (a stream ignores what its storage
//! holds, as between the generations of one runner request), so a finished request's set
//! goes back to the pool as it is and the next request takes it.
//!
//! [`Client`]: super::Client

use std::ops::{Deref, DerefMut};
use std::sync::{Mutex, MutexGuard};

use super::assemble::Buffers;

/// Spare sets a [`BufferPool`] keeps at most. Sets are made only when none is spare, so a
/// client keeps no more than it ever had in use at once; this bounds what a burst (requests
/// queued at the slot gate hold a set each) leaves behind, to the few slots a box serves.
pub const SPARE_BUFFERS: usize = 4;

/// Spare [`Buffers`], shared by every request (and thread) of one client; at most
/// [`SPARE_BUFFERS`] of them.
#[derive(Debug)]
pub struct BufferPool {
    spare: Mutex<Vec<Buffers>>,
}

impl Default for BufferPool {
    fn default() -> Self {
        Self::new()
    }
}

impl BufferPool {
    /// An empty pool (its list made to its bound now, so it never grows later).
    pub fn new() -> Self {
        BufferPool {
            spare: Mutex::new(Vec::with_capacity(SPARE_BUFFERS)),
        }
    }

    /// A spare set, or a new one when none is spare; it comes back when the guard drops.
    pub fn take(&self) -> PooledBuffers<'_> {
        let spare = self.lock().pop();
        PooledBuffers {
            pool: self,
            buffers: Some(spare.unwrap_or_default()),
        }
    }

    /// Sets kept now, at most [`SPARE_BUFFERS`].
    pub fn spare(&self) -> usize {
        self.lock().len()
    }

    // The list is consistent after every statement, so a poisoned lock is used as it is.
    fn lock(&self) -> MutexGuard<'_, Vec<Buffers>> {
        self.spare.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn give_back(&self, buffers: Buffers) {
        let mut spare = self.lock();
        if spare.len() < SPARE_BUFFERS {
            spare.push(buffers);
            return;
        }
        drop(spare);
        drop(buffers);
    }
}

/// A set of [`Buffers`] from a [`BufferPool`], given back to it on drop.
#[derive(Debug)]
pub struct PooledBuffers<'p> {
    pool: &'p BufferPool,
    // `None` only inside `drop`.
    buffers: Option<Buffers>,
}

impl Deref for PooledBuffers<'_> {
    type Target = Buffers;
    fn deref(&self) -> &Buffers {
        self.buffers.as_ref().expect("present until drop")
    }
}

impl DerefMut for PooledBuffers<'_> {
    fn deref_mut(&mut self) -> &mut Buffers {
        self.buffers.as_mut().expect("present until drop")
    }
}

impl Drop for PooledBuffers<'_> {
    fn drop(&mut self) {
        if let Some(b) = self.buffers.take() {
            self.pool.give_back(b);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_given_back_is_the_next_one_taken() {
        let pool = BufferPool::new();
        let first = pool.take();
        let at = first.head_ptr();
        drop(first);
        assert_eq!(pool.spare(), 1);
        let again = pool.take();
        assert_eq!(again.head_ptr(), at, "the same heap storage, not a new set");
        assert_eq!(pool.spare(), 0);
    }

    #[test]
    fn the_pool_keeps_at_most_spare_buffers_sets() {
        let pool = BufferPool::new();
        let held: Vec<_> = (0..=SPARE_BUFFERS).map(|_| pool.take()).collect();
        assert_eq!(pool.spare(), 0);
        let mut held = held.into_iter();
        for kept in 1..=SPARE_BUFFERS {
            drop(held.next());
            assert_eq!(pool.spare(), kept);
        }
        // One past the bound: freed, not kept.
        drop(held.next());
        assert_eq!(pool.spare(), SPARE_BUFFERS);
    }

    #[test]
    fn threads_share_one_pool() {
        let pool = BufferPool::new();
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| drop(pool.take()));
            }
        });
        assert!((1..=3).contains(&pool.spare()));
    }
}
