//! One ring slot: an `Option<Arc<T>>` in a single word, with its low bit as a lock held only
//! while the pointer is cloned or replaced.
//!
//! Invariants: the word is null or a pointer from `Arc::into_raw` (an `Arc<T>` with `T`
//! aligned to at least 2, so bit 0 is free); bit 0 is set only between a successful `lock` and
//! its `unlock`, and nothing but a strong-count increment or a pointer replace happens in
//! between; the cell owns one strong count of the pointer it holds.
//!
//! Why not a `Mutex<Option<Arc<T>>>`: that is 16 bytes, and a lineage's two rings have 5,120
//! slots, so it cost 40 KiB more per open lineage than the pointer alone. Why not arc-swap: see
//! the ring's docs (its writer cost grows with the threads in the process).

use std::ptr;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::Arc;

const LOCKED: usize = 1;
/// Spins before a contended lock yields its core. The holder is at most a few instructions
/// from unlocking (unless it was preempted there), but 32 readers of one slot queue behind each
/// other: with 64 spins they yielded, and a yield on two busy cores costs milliseconds
/// (`fanout.delta_latency_p99_us.subs32` rose from ~2,400 to ~5,000–8,000 µs).
const SPINS: u32 = 2048;

pub(super) struct Cell<T> {
    word: AtomicPtr<T>,
}

impl<T> Cell<T> {
    const ALIGNED: () = assert!(std::mem::align_of::<T>() >= 2, "bit 0 of the pointer must be free");

    pub fn empty() -> Cell<T> {
        let () = Self::ALIGNED;
        Cell { word: AtomicPtr::new(ptr::null_mut()) }
    }

    /// Sets the lock bit; returns the pointer it guards (bit clear).
    fn lock(&self) -> *mut T {
        let mut spins = 0;
        loop {
            let current = self.word.load(Ordering::Relaxed);
            if current.addr() & LOCKED == 0 {
                let locked = current.map_addr(|a| a | LOCKED);
                if self.word.compare_exchange_weak(current, locked, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    return current;
                }
            }
            spins += 1;
            if spins < SPINS {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }

    /// Clears the lock bit, leaving `pointer` in the cell.
    fn unlock(&self, pointer: *mut T) {
        self.word.store(pointer, Ordering::Release);
    }

    /// A clone of the held `Arc`, if any.
    pub fn load(&self) -> Option<Arc<T>> {
        let held = self.lock();
        let out = (!held.is_null()).then(|| {
            // SAFETY: `held` came from `Arc::into_raw` and the cell's own strong count keeps it
            // alive while the lock bit is set (a replace must take the lock first).
            unsafe {
                Arc::increment_strong_count(held);
                Arc::from_raw(held)
            }
        });
        self.unlock(held);
        out
    }

    /// Puts `value` in the cell and returns what it held.
    pub fn replace(&self, value: Option<Arc<T>>) -> Option<Arc<T>> {
        let next = value.map_or(ptr::null_mut(), |v| Arc::into_raw(v).cast_mut());
        let held = self.lock();
        self.unlock(next);
        // SAFETY: `held` came from `Arc::into_raw`; the cell's strong count moves to the caller.
        (!held.is_null()).then(|| unsafe { Arc::from_raw(held) })
    }
}

impl<T> Drop for Cell<T> {
    fn drop(&mut self) {
        let held = *self.word.get_mut();
        if !held.is_null() {
            // SAFETY: unlocked (we have `&mut self`), and the cell owns this strong count.
            drop(unsafe { Arc::from_raw(held.map_addr(|a| a & !LOCKED)) });
        }
    }
}

// SAFETY: the cell is a shared `Option<Arc<T>>`: sending or sharing it is sound exactly when
// sending or sharing an `Arc<T>` is.
unsafe impl<T: Send + Sync> Send for Cell<T> {}
unsafe impl<T: Send + Sync> Sync for Cell<T> {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_holds_counts_and_releases_its_arc() {
        let cell = Cell::empty();
        assert!(cell.load().is_none());
        let first = Arc::new(7u64);
        assert!(cell.replace(Some(Arc::clone(&first))).is_none());
        assert_eq!(Arc::strong_count(&first), 2);
        let loaded = cell.load().unwrap();
        assert_eq!((*loaded, Arc::strong_count(&first)), (7, 3));
        let back = cell.replace(Some(Arc::new(8))).unwrap();
        assert!(Arc::ptr_eq(&back, &first));
        drop((back, loaded));
        assert_eq!(Arc::strong_count(&first), 1);
        let second = cell.load().unwrap();
        drop(cell);
        assert_eq!((*second, Arc::strong_count(&second)), (8, 1));
    }

    #[test]
    fn readers_and_a_writer_never_see_a_freed_or_torn_value() {
        let cell = Arc::new(Cell::empty());
        cell.replace(Some(Arc::new((0u64, 0u64))));
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let cell = Arc::clone(&cell);
                std::thread::spawn(move || {
                    for _ in 0..100_000 {
                        let v = cell.load().unwrap();
                        assert_eq!(v.0, v.1);
                    }
                })
            })
            .collect();
        for i in 1..100_000u64 {
            cell.replace(Some(Arc::new((i, i))));
        }
        for r in readers {
            r.join().unwrap();
        }
    }
}
