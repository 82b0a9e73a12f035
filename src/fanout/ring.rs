//! Per-lineage bounded broadcast rings with a futex bell.
//!
//! One *lineage thread* (the single writer) publishes items into a [`Ring`]; any number of
//! fan-out threads (one per subscriber) each read every item at their own position. A reader
//! that falls more than `capacity` positions behind the writer is told exactly how many items it
//! lost ([`Slot::Overwritten`]) and where to resume; it never sees a torn or wrong item.
//! A [`Bell`] (an eventcount over a Linux futex) lets idle readers sleep without the writer
//! paying per reader.
//!
//! # Invariants
//!
//! * **Single writer.** Only the holder of the unique [`Writer`] (claimed with [`Ring::writer`],
//!   released on drop) stores into slots and advances `head`. Readers never write to the ring.
//! * **Positions.** Positions are `u64`, start at 0 and are never reused (at one push per
//!   nanosecond they would wrap after ~584 years). The item at position `p` lives in slot
//!   `p & (capacity - 1)`; capacity is a power of two `>= 2`. `head` is the next position the
//!   writer will fill, so positions `< head` are published, positions `>= head` are not.
//!   At any instant slot `p & mask` holds the newest published position congruent to `p`, or
//!   the in-flight one (`== head`) that the writer has stored but not yet published.
//! * **Self-describing entries.** A slot ([`cell::Cell`]) holds `Arc<Entry { pos, value }>` in
//!   one word whose low bit is a lock, held only to clone or replace the pointer. Reclamation
//!   is the `Arc`'s: a reader holding a `Slot::Ready(Arc<T>)` keeps the item alive after it is
//!   overwritten.
//!
//! # Push (writer)
//!
//! 1. replace `slots[pos & mask]` with `Some(Arc::new(Entry { pos, value }))` under its lock bit;
//! 2. `head.store(pos + 1, SeqCst)`;
//! 3. drop the displaced entry (after publishing, so it is off the critical path of readers).
//!
//! One uncontended slot lock, no loop, no allocation beyond the item's own: O(1) whatever the
//! number of readers, reader threads or rings in the process (see *Why not arc-swap* below).
//!
//! # Get (reader): why a reader can never return a wrong item
//!
//! `get(pos)` loads `h = head` (SeqCst), then the slot, then compares the slot's `entry.pos`:
//!
//! * `pos >= h` → `NotYet`.
//! * `pos < h - capacity` → `Overwritten { oldest: h - capacity, missed: oldest - pos }`
//!   (the writer has published at least `h - capacity + ...` newer items into that slot).
//! * otherwise load the slot:
//!   * `entry.pos == pos` → `Ready(entry.value)`. The value is returned only when the entry
//!     *itself* says it was published at `pos`; the entry is immutable once built and the
//!     `Arc` we clone keeps it alive, so the item is exactly the one pushed at `pos`, whatever
//!     the writer does concurrently. There is no "read the data, then re-check a sequence
//!     number" window at all: the position and the value travel in one atomically swapped
//!     pointer.
//!   * `entry.pos > pos` → the writer lapped us between our two loads (or is storing the
//!     in-flight position `h' == entry.pos`). Then every position `<= entry.pos - capacity` is
//!     gone, so `oldest = max(head_now - capacity, entry.pos + 1 - capacity)` and
//!     `missed = oldest - pos >= 1`.
//!   * `entry.pos < pos` or an empty slot cannot happen: the writer's slot store for `pos` is
//!     sequenced before its SeqCst (hence release) store of `head = pos + 1`; our SeqCst
//!     (hence acquire) load of `head` read `h > pos`, i.e. that store or a later one, so the
//!     slot store happens-before our slot load, and by write-read coherence the slot load
//!     returns that entry or a later one in the slot's modification order (later entries have
//!     larger positions). Defensively, that branch returns `NotYet` (retry) rather than
//!     anything wrong.
//!
//! A reader that acts on `Overwritten` by jumping to `oldest` and adding `missed` to its loss
//! count keeps the invariant `delivered + missed == positions passed` exactly; if `oldest` itself
//! is overwritten in the meantime, the next `get` reports the further loss.
//!
//! # Memory orderings
//!
//! * `head`: SeqCst store by the writer, SeqCst load by readers. Release/acquire would suffice
//!   for the slot publication argument above; SeqCst is used so that `head` also takes part in
//!   the single total order that the [`Bell`] protocol reasons in, at negligible cost on x86
//!   (a store is an `xchg`; loads are plain).
//! * Slots: the lock bit's release (unlock store) and acquire (lock CAS). The writer's unlock
//!   is sequenced before its `head` store; a reader whose `head` load read that store (or a
//!   later one) takes the slot's lock after that unlock in the word's modification order, so it
//!   sees that entry or a later one.
//! * The writer claim flag: acquire CAS on claim, release store on drop, so a new `Writer`
//!   sees the previous writer's last `head`.
//! * [`Bell`]: see its docs: a Dekker-style pair (writer: bump `epoch`, then read `waiters`;
//!   reader: bump `waiters`, then read `epoch`), both SeqCst, so at least one side sees the other.
//!
//! # Why not arc-swap
//!
//! The slots were `ArcSwapOption`s. arc-swap's store runs `Debt::pay_all`, which walks a global
//! list with one node per thread that ever used any arc-swap, so with one fan-out thread per
//! subscriber every push cost O(threads in the process). At 1,000 observed active runs (about
//! 3,000 threads) that walk was 55% of broca's CPU (`make bench-capacity` under `perf`). A
//! slot's lock bit is taken for one pointer clone or replace, by one writer and that ring's few
//! readers.
//!
//! # Bell (eventcount)
//!
//! A reader reads `epoch` *before* checking the rings; if it finds nothing it calls
//! [`Bell::wait`] with that epoch, which sleeps only if the epoch is unchanged (checked
//! atomically by the kernel in `FUTEX_WAIT`). The writer pushes, then calls [`Bell::ring`]:
//! bump the epoch, and only if `waiters > 0` issue one `FUTEX_WAKE(1)`. A woken waiter, before
//! returning, passes the wake on to one more sleeper (the *wake chain*) if it was woken by a
//! real change (`epoch != seen`) and others are waiting; so one `ring` wakes every sleeper
//! while the writer pays for one syscall. The chain stops at the first waiter that was asleep on
//! the *current* epoch: futex waiters of equal (non-realtime) priority are woken in FIFO
//! order, and a waiter on the current epoch queued after every waiter on an older epoch, so all
//! of those have been woken by then. Waiters always pass a timeout, so a lost wake (e.g. with
//! realtime priorities, where the FIFO argument does not hold, or an epoch wrap after exactly
//! 2^32 rings) costs latency, never liveness.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_utils::CachePadded;

mod cell;
use cell::Cell;

/// What a slot holds: the position it was published at and the item.
struct Entry<T> {
    pos: u64,
    value: Arc<T>,
}

/// A bounded broadcast ring: one writer, any number of readers each at its own position.
pub struct Ring<T> {
    /// The next position the writer will fill.
    head: CachePadded<AtomicU64>,
    /// True while a [`Writer`] is alive.
    writer_claimed: AtomicBool,
    mask: u64,
    slots: Box<[Cell<Entry<T>>]>,
}

/// The result of [`Ring::get`].
#[derive(Debug, PartialEq, Eq)]
pub enum Slot<T> {
    /// Exactly the item published at the requested position.
    Ready(Arc<T>),
    /// The position has not been published yet (`pos >= head`).
    NotYet,
    /// The position was overwritten: `missed` positions starting at the requested one are gone,
    /// `oldest` (= requested + missed) is the oldest position that may still be read.
    Overwritten { missed: u64, oldest: u64 },
}

impl<T: Send + Sync + 'static> Ring<T> {
    /// A ring with `capacity` rounded up to a power of two, at least 2.
    ///
    /// # Panics
    /// If the rounded capacity does not fit in `usize`.
    pub fn new(capacity: usize) -> Ring<T> {
        let cap = capacity.max(2).checked_next_power_of_two().expect("ring capacity overflows usize");
        let slots = (0..cap).map(|_| Cell::empty()).collect::<Vec<_>>().into_boxed_slice();
        Ring {
            head: CachePadded::new(AtomicU64::new(0)),
            writer_claimed: AtomicBool::new(false),
            mask: cap as u64 - 1,
            slots,
        }
    }

    /// The number of slots (a power of two, at least 2).
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// The next position the writer will fill (positions start at 0). SeqCst load.
    pub fn head(&self) -> u64 {
        self.head.load(Ordering::SeqCst)
    }

    /// The oldest position that is still nominally readable (`head - capacity`, or 0).
    pub fn oldest(&self) -> u64 {
        self.head().saturating_sub(self.slots.len() as u64)
    }

    /// Claims the single writer handle; `None` if a [`Writer`] is alive (released on drop).
    pub fn writer(self: &Arc<Self>) -> Option<Writer<T>> {
        self.writer_claimed.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).ok()?;
        // The previous writer (if any) released `writer_claimed` after its last head store.
        let next = self.head.load(Ordering::SeqCst);
        Some(Writer { ring: Arc::clone(self), next })
    }

    /// What is at `pos`: `Ready` (exactly the item published at `pos`), `NotYet` (`pos >= head`),
    /// or `Overwritten` (`pos < head - capacity`, or the slot now holds a newer item):
    /// `missed` = how many positions from `pos` are gone, `oldest` = oldest still readable position.
    pub fn get(&self, pos: u64) -> Slot<T> {
        let cap = self.slots.len() as u64;
        let head = self.head.load(Ordering::SeqCst);
        if pos >= head {
            return Slot::NotYet;
        }
        let floor = head.saturating_sub(cap);
        if pos < floor {
            return Slot::Overwritten { missed: floor - pos, oldest: floor };
        }
        let entry = self.slots[(pos & self.mask) as usize].load();
        match entry.as_deref() {
            Some(entry) if entry.pos == pos => Slot::Ready(Arc::clone(&entry.value)),
            Some(entry) if entry.pos > pos => {
                // Lapped between the head load and the slot load (or the writer is storing the
                // in-flight position `entry.pos`): everything <= entry.pos - cap is gone.
                let head_now = self.head.load(Ordering::SeqCst);
                let oldest = head_now.saturating_sub(cap).max(entry.pos + 1 - cap);
                Slot::Overwritten { missed: oldest - pos, oldest }
            }
            // Impossible by the happens-before argument in the module docs; retrying is safe.
            _ => {
                debug_assert!(false, "slot for published position {pos} holds an older entry");
                Slot::NotYet
            }
        }
    }
}

/// The unique writer of a [`Ring`]. Not `Clone`; `Send`. Dropping it releases the claim.
pub struct Writer<T> {
    ring: Arc<Ring<T>>,
    next: u64,
}

impl<T> Writer<T> {
    /// O(1): store the item in slot `pos % cap` (as `Arc<Entry { pos, value }>`, under the
    /// slot's lock bit, held for the pointer replace only), then advance head (SeqCst store).
    /// Returns its position.
    pub fn push(&mut self, value: T) -> u64 {
        self.push_arc(Arc::new(value))
    }

    /// Like [`Writer::push`] for an item that is already in an `Arc` (saves one allocation).
    pub fn push_arc(&mut self, value: Arc<T>) -> u64 {
        let pos = self.next;
        let entry = Arc::new(Entry { pos, value });
        let displaced = self.ring.slots[(pos & self.ring.mask) as usize].replace(Some(entry));
        self.ring.head.store(pos + 1, Ordering::SeqCst);
        self.next = pos + 1;
        // Dropped after publishing; readers still holding it keep it alive.
        drop(displaced);
        pos
    }

    /// The position the next push will get (== the ring's head).
    pub fn next_pos(&self) -> u64 {
        self.next
    }

    /// The ring this writer writes.
    pub fn ring(&self) -> &Arc<Ring<T>> {
        &self.ring
    }
}

impl<T> Drop for Writer<T> {
    fn drop(&mut self) {
        self.ring.writer_claimed.store(false, Ordering::Release);
    }
}

/// A wake-up word shared by one lineage's rings and its readers (an eventcount over a futex).
///
/// Protocol (reader): `let e = bell.epoch(); if nothing in the rings { bell.wait(e, timeout) }`.
/// Protocol (writer): push to a ring, then `bell.ring()`.
pub struct Bell {
    /// The futex word: bumped by every `ring`/`ring_all`.
    epoch: AtomicU32,
    /// Readers between entering and leaving `wait` (asleep or about to be).
    waiters: AtomicU32,
    /// A wake the writer issued has not yet been taken by the reader it woke: later rings only
    /// bump the epoch (that reader, awake, drains them and passes the wake on), so a burst of
    /// publishes costs one syscall, not one each.
    waking: AtomicBool,
    /// Futex wake syscalls made by `ring` (the writer's cost).
    ring_wakes: CachePadded<AtomicU64>,
    /// Futex wake syscalls made by woken waiters passing the wake on.
    chain_wakes: AtomicU64,
}

impl Default for Bell {
    fn default() -> Self {
        Bell::new()
    }
}

impl Bell {
    pub fn new() -> Bell {
        Bell {
            epoch: AtomicU32::new(0),
            waiters: AtomicU32::new(0),
            waking: AtomicBool::new(false),
            ring_wakes: CachePadded::new(AtomicU64::new(0)),
            chain_wakes: AtomicU64::new(0),
        }
    }

    /// The current epoch; a reader reads it BEFORE checking the rings, then waits on it.
    pub fn epoch(&self) -> u32 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// Writer side: bump the epoch and, only if some reader is waiting, wake ONE waiter
    /// (`FUTEX_WAKE_PRIVATE`, 1). Cost O(1) regardless of how many readers wait.
    pub fn ring(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        // Dekker pair with `wait`: (epoch += 1; load waiters) vs (waiters += 1; load epoch).
        // In the SeqCst total order one of the two loads sees the other side's RMW: either we
        // see the waiter and wake it (the kernel re-checks the epoch, so a waiter that has not
        // yet slept returns at once), or the waiter sees the new epoch and does not sleep.
        if self.waiters.load(Ordering::SeqCst) > 0 && !self.waking.swap(true, Ordering::SeqCst) {
            self.ring_wakes.fetch_add(1, Ordering::Relaxed);
            if futex::wake(&self.epoch, 1) == 0 {
                // Nobody was asleep yet (a waiter about to sleep sees the new epoch): no wake
                // is in flight.
                self.waking.store(false, Ordering::SeqCst);
            }
        }
    }

    /// Reader side: if the epoch still equals `seen`, sleep until it changes or `timeout`
    /// passes (`FUTEX_WAIT_PRIVATE` with a timespec). On waking, it passes the wake on to one
    /// more waiter (a wake chain), so one `ring` eventually wakes every waiter while the writer
    /// pays for one. Returns true if it returned because the timeout elapsed (the caller should
    /// re-check the rings either way; spurious returns are possible).
    pub fn wait(&self, seen: u32, timeout: Duration) -> bool {
        self.waiters.fetch_add(1, Ordering::SeqCst);
        let mut woken = false;
        let mut timed_out = false;
        if self.epoch.load(Ordering::SeqCst) == seen {
            match futex::wait(&self.epoch, seen, timeout) {
                futex::Wait::Woken => woken = true,
                futex::Wait::TimedOut => timed_out = true,
                futex::Wait::Other => {}
            }
        }
        if woken || timed_out {
            // The writer's wake (if it was ours) is taken; a timeout also clears a wake that
            // was never delivered, so a lost one costs at most one `timeout`.
            self.waking.store(false, Ordering::SeqCst);
        }
        let others = self.waiters.fetch_sub(1, Ordering::SeqCst) - 1;
        // Pass a real wake on (epoch moved past what we slept on); a waiter woken while asleep
        // on the current epoch ends the chain (see module docs), which prevents ping-pong.
        if woken && others > 0 && self.epoch.load(Ordering::SeqCst) != seen {
            self.chain_wakes.fetch_add(1, Ordering::Relaxed);
            futex::wake(&self.epoch, 1);
        }
        timed_out
    }

    /// Wake every waiter (used when a stream is cancelled/stopped); may be O(waiters).
    pub fn ring_all(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
        if self.waiters.load(Ordering::SeqCst) > 0 {
            futex::wake(&self.epoch, i32::MAX);
        }
    }

    /// How many readers are currently inside `wait` (diagnostics).
    pub fn waiters(&self) -> u32 {
        self.waiters.load(Ordering::SeqCst)
    }

    /// Futex wake syscalls made by [`Bell::ring`] so far (the writer's wake cost).
    pub fn ring_wakes(&self) -> u64 {
        self.ring_wakes.load(Ordering::Relaxed)
    }

    /// Futex wake syscalls made by waiters passing a wake on (the wake chain) so far.
    pub fn chain_wakes(&self) -> u64 {
        self.chain_wakes.load(Ordering::Relaxed)
    }
}

#[cfg(target_os = "linux")]
mod futex {
    use std::sync::atomic::AtomicU32;
    use std::time::Duration;

    pub(super) enum Wait {
        /// Woken by a FUTEX_WAKE (or spuriously).
        Woken,
        TimedOut,
        /// The word no longer held the expected value (EAGAIN), or a signal (EINTR).
        Other,
    }

    pub(super) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) -> Wait {
        let ts = libc::timespec {
            tv_sec: timeout.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as _,
        };
        // SAFETY: `word` is a live, 4-byte aligned u32 (AtomicU32 has u32's layout) borrowed for
        // the whole call; FUTEX_WAIT only reads it atomically in the kernel. `ts` is a valid
        // timespec on our stack for the call (a relative timeout). uaddr2/val3 are unused.
        let r = unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAIT | libc::FUTEX_PRIVATE_FLAG,
                expected,
                &ts as *const libc::timespec,
                std::ptr::null::<u32>(),
                0u32,
            )
        };
        if r == 0 {
            return Wait::Woken;
        }
        match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::ETIMEDOUT) => Wait::TimedOut,
            _ => Wait::Other,
        }
    }

    /// Wakes up to `n` waiters on `word`; returns how many were woken.
    pub(super) fn wake(word: &AtomicU32, n: i32) -> usize {
        // SAFETY: `word` is a live, aligned u32 for the call; FUTEX_WAKE does not access the
        // memory, it only uses the address as a key. The timeout/uaddr2/val3 slots are unused.
        let r = unsafe {
            libc::syscall(
                libc::SYS_futex,
                word.as_ptr(),
                libc::FUTEX_WAKE | libc::FUTEX_PRIVATE_FLAG,
                n,
                std::ptr::null::<libc::timespec>(),
                std::ptr::null::<u32>(),
                0u32,
            )
        };
        r.max(0) as usize
    }
}

#[cfg(not(target_os = "linux"))]
mod futex {
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    pub(super) enum Wait {
        #[allow(dead_code)]
        Woken,
        TimedOut,
        Other,
    }

    /// Fallback: a short sleep (at most 1 ms, at most `timeout`) while the word is unchanged.
    pub(super) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) -> Wait {
        if word.load(Ordering::SeqCst) == expected {
            std::thread::sleep(timeout.min(Duration::from_millis(1)));
        }
        if word.load(Ordering::SeqCst) == expected {
            Wait::TimedOut
        } else {
            Wait::Other
        }
    }

    pub(super) fn wake(_word: &AtomicU32, _n: i32) -> usize {
        0
    }
}

#[cfg(test)]
mod tests;
