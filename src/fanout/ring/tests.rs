use super::*;
use std::sync::atomic::AtomicUsize;
use std::thread;
use std::time::Instant;

#[derive(Debug, PartialEq, Eq)]
struct Item(u64);

fn ready(ring: &Ring<Item>, pos: u64) -> u64 {
    match ring.get(pos) {
        Slot::Ready(v) => v.0,
        other => panic!("expected Ready at {pos}, got {other:?}"),
    }
}

#[test]
fn handles_are_send_and_sync_as_documented() {
    fn send<X: Send>() {}
    fn sync<X: Sync>() {}
    send::<Writer<Item>>();
    send::<Arc<Ring<Item>>>();
    sync::<Ring<Item>>();
    sync::<Bell>();
    send::<Bell>();
}

#[test]
fn capacity_rounding() {
    for (asked, got) in [(0, 2), (1, 2), (2, 2), (3, 4), (4, 4), (5, 8), (1000, 1024), (1024, 1024)] {
        assert_eq!(Ring::<Item>::new(asked).capacity(), got, "asked {asked}");
    }
}

#[test]
fn push_get_sequence_and_not_yet() {
    let ring = Arc::new(Ring::new(4));
    let mut w = ring.writer().unwrap();
    assert_eq!(ring.head(), 0);
    assert_eq!(ring.get(0), Slot::NotYet);
    for i in 0..4 {
        assert_eq!(w.push(Item(i)), i);
        assert_eq!(ring.head(), i + 1);
    }
    for i in 0..4 {
        assert_eq!(ready(&ring, i), i);
    }
    assert_eq!(ring.get(4), Slot::NotYet);
    assert_eq!(ring.get(1000), Slot::NotYet);
}

#[test]
fn overwritten_exact_after_wrap() {
    let ring = Arc::new(Ring::new(4));
    let mut w = ring.writer().unwrap();
    let held = {
        w.push(Item(0));
        match ring.get(0) {
            Slot::Ready(v) => v,
            _ => unreachable!(),
        }
    };
    for i in 1..10 {
        w.push(Item(i));
    }
    // head = 10, cap = 4: readable 6..=9.
    assert_eq!(ring.get(0), Slot::Overwritten { missed: 6, oldest: 6 });
    assert_eq!(ring.get(5), Slot::Overwritten { missed: 1, oldest: 6 });
    for i in 6..10 {
        assert_eq!(ready(&ring, i), i);
    }
    assert_eq!(ring.get(10), Slot::NotYet);
    assert_eq!(ring.oldest(), 6);
    // An Arc handed out earlier stays valid after its slot was reused.
    assert_eq!(*held, Item(0));
}

#[test]
fn overwritten_when_slot_holds_newer_in_flight_entry() {
    // Simulate the writer between its slot store and its head store: head = 4 (positions
    // 0..=3 published), slot 0 already holds in-flight position 4.
    let ring = Arc::new(Ring::new(4));
    let mut w = ring.writer().unwrap();
    for i in 0..4 {
        w.push(Item(i));
    }
    ring.slots[0].replace(Some(Arc::new(Entry { pos: 4, value: Arc::new(Item(4)) })));
    assert_eq!(ring.head(), 4);
    assert_eq!(ring.get(0), Slot::Overwritten { missed: 1, oldest: 1 });
    assert_eq!(ready(&ring, 1), 1);
    assert_eq!(ring.get(4), Slot::NotYet);
}

#[test]
fn writer_claim_is_exclusive_and_released_on_drop() {
    let ring = Arc::new(Ring::new(8));
    let mut w1 = ring.writer().expect("first claim");
    assert!(ring.writer().is_none());
    w1.push(Item(0));
    w1.push(Item(1));
    drop(w1);
    let mut w2 = ring.writer().expect("claim after drop");
    assert!(ring.writer().is_none());
    assert_eq!(w2.next_pos(), 2);
    assert_eq!(w2.push(Item(2)), 2);
    assert_eq!(ready(&ring, 2), 2);
    // The writer can move to another thread.
    let h = thread::spawn(move || w2.push(Item(3)));
    assert_eq!(h.join().unwrap(), 3);
    assert!(ring.writer().is_some());
}

#[test]
fn bell_wait_returns_on_changed_epoch_and_times_out() {
    let bell = Bell::new();
    let e = bell.epoch();
    bell.ring();
    assert_ne!(bell.epoch(), e);
    let t = Instant::now();
    assert!(!bell.wait(e, Duration::from_secs(5)), "stale epoch must not sleep");
    assert!(t.elapsed() < Duration::from_secs(1));
    let t = Instant::now();
    assert!(bell.wait(bell.epoch(), Duration::from_millis(20)));
    assert!(t.elapsed() >= Duration::from_millis(15));
    assert_eq!(bell.waiters(), 0);
    assert_eq!(bell.ring_wakes(), 0, "nobody waited, so ring made no syscall");
}

#[test]
fn bell_ring_and_ring_all_wake_sleepers() {
    let bell = Arc::new(Bell::new());
    for use_all in [false, true] {
        let n = 6;
        let e = bell.epoch();
        let timeouts = Arc::new(AtomicUsize::new(0));
        let hs: Vec<_> = (0..n)
            .map(|_| {
                let (bell, timeouts) = (Arc::clone(&bell), Arc::clone(&timeouts));
                thread::spawn(move || {
                    while bell.epoch() == e {
                        if bell.wait(e, Duration::from_secs(2)) {
                            timeouts.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        while bell.waiters() < n {
            thread::yield_now();
        }
        thread::sleep(Duration::from_millis(20));
        if use_all {
            bell.ring_all()
        } else {
            bell.ring()
        }
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(timeouts.load(Ordering::Relaxed), 0, "use_all={use_all}: a sleeper was not woken");
    }
    assert!(bell.ring_wakes() <= 1);
}

/// One reader's result in the stress test.
#[derive(Debug, Default)]
struct ReaderStats {
    delivered: u64,
    missed: u64,
    waits: u64,
    timeouts_with_data: u64,
    /// Waits during which two or more rings happened: the reader slept through a ring.
    overslept: u64,
}

fn read_all(ring: &Ring<Item>, bell: &Bell, total: u64, slow: bool) -> ReaderStats {
    let mut s = ReaderStats::default();
    let mut pos = 0u64;
    let mut last: Option<u64> = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while pos < total {
        assert!(Instant::now() < deadline, "reader stuck at {pos}");
        let seen = bell.epoch();
        match ring.get(pos) {
            Slot::Ready(v) => {
                assert_eq!(v.0, pos, "wrong item");
                assert!(last.is_none_or(|l| pos > l), "positions must strictly increase");
                last = Some(pos);
                s.delivered += 1;
                pos += 1;
                if slow && pos == 1 {
                    // Overtaken for certain, whatever the machine's load: wait until the writer
                    // is two rings ahead (or done) before reading on.
                    while ring.head() < (pos + 2 * ring.capacity() as u64).min(total) {
                        thread::sleep(Duration::from_millis(1));
                    }
                }
                if slow && pos.is_multiple_of(64) {
                    thread::sleep(Duration::from_millis(1));
                }
            }
            Slot::Overwritten { missed, oldest } => {
                assert!(missed > 0);
                assert_eq!(oldest, pos + missed);
                assert!(oldest <= ring.head(), "oldest must be a published position");
                s.missed += missed;
                pos = oldest;
            }
            Slot::NotYet => {
                s.waits += 1;
                if bell.wait(seen, Duration::from_millis(50)) && ring.head() > pos {
                    s.timeouts_with_data += 1;
                }
                if bell.epoch().wrapping_sub(seen) >= 2 {
                    s.overslept += 1;
                }
            }
        }
    }
    assert_eq!(pos, total);
    s
}

#[test]
fn stress_one_writer_many_readers() {
    const TOTAL: u64 = 200_000;
    const FAST: usize = 4;
    const SLOW: usize = 2;
    let ring = Arc::new(Ring::<Item>::new(16_384));
    let bell = Arc::new(Bell::new());
    let readers: Vec<_> = (0..FAST + SLOW)
        .map(|i| {
            let (ring, bell) = (Arc::clone(&ring), Arc::clone(&bell));
            let slow = i >= FAST;
            thread::spawn(move || (slow, read_all(&ring, &bell, TOTAL, slow)))
        })
        .collect();
    let started = Instant::now();
    let writer = {
        let (ring, bell) = (Arc::clone(&ring), Arc::clone(&bell));
        thread::spawn(move || {
            let mut w = ring.writer().unwrap();
            for i in 0..TOTAL {
                assert_eq!(w.push(Item(i)), i);
                // Publish in bursts of 512 with one ring per burst, then pause so readers
                // catch up and fall asleep: one ring must wake every sleeper (wake chain).
                if i % 512 == 511 || i == TOTAL - 1 {
                    bell.ring();
                    thread::sleep(Duration::from_millis(1));
                }
            }
        })
    };
    writer.join().unwrap();
    let mut waits = 0;
    let mut timeouts_with_data = 0;
    let mut overslept = 0;
    for h in readers {
        let (slow, s) = h.join().unwrap();
        eprintln!("slow={slow} {s:?}");
        assert_eq!(s.delivered + s.missed, TOTAL, "{s:?}");
        if slow {
            assert!(s.missed > 0, "a slow reader should have been overtaken: {s:?}");
        } else {
            assert_eq!(s.missed, 0, "a fast reader was overtaken: {s:?}");
        }
        waits += s.waits;
        timeouts_with_data += s.timeouts_with_data;
        overslept += s.overslept;
    }
    eprintln!(
            "stress: {:?}, waits={waits}, overslept={overslept}, timeouts_with_data={timeouts_with_data}, ring_wakes={}, chain_wakes={}",
            started.elapsed(),
            bell.ring_wakes(),
            bell.chain_wakes()
        );
    assert!(waits > 0, "readers never slept: the bell was not exercised");
    // A broken wake chain would leave sleepers to their 50 ms timeout after almost every
    // pause (~390 pauses x several readers), so nearly every wait would time out with data; a
    // loaded machine's scheduling hiccups stay a small fraction of the waits.
    assert!(timeouts_with_data * 10 <= waits, "timeouts that found new data: {timeouts_with_data} of {waits} waits");
    // Rings come ~1 ms apart and a working chain wakes every sleeper within microseconds,
    // so sleeping through a ring is rare; without the chain (one wake per ring, FIFO) most
    // sleepers sleep through several rings.
    assert!(overslept * 10 <= waits, "readers slept through rings: {overslept} of {waits} waits");
    assert!(bell.ring_wakes() <= TOTAL / 512 + 1, "at most one wake syscall per ring");
}

/// Spawns `n` readers that follow `ring` to `total`, sleeping on `bell` whenever caught up.
/// Returns their join handles and per-reader progress counters.
#[allow(clippy::type_complexity)]
fn spawn_followers(
    n: usize,
    ring: &Arc<Ring<Item>>,
    bell: &Arc<Bell>,
    total: u64,
) -> (Vec<thread::JoinHandle<ReaderStats>>, Arc<Vec<AtomicU64>>) {
    let progress: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
    let hs = (0..n)
        .map(|i| {
            let (ring, bell, progress) = (Arc::clone(ring), Arc::clone(bell), Arc::clone(&progress));
            thread::spawn(move || {
                let mut s = ReaderStats::default();
                let mut pos = 0;
                while pos < total {
                    let seen = bell.epoch();
                    match ring.get(pos) {
                        Slot::Ready(v) => {
                            assert_eq!(v.0, pos);
                            s.delivered += 1;
                            pos += 1;
                            progress[i].store(pos, Ordering::SeqCst);
                        }
                        Slot::Overwritten { missed, oldest } => {
                            s.missed += missed;
                            pos = oldest;
                            progress[i].store(pos, Ordering::SeqCst);
                        }
                        Slot::NotYet => {
                            s.waits += 1;
                            if bell.wait(seen, Duration::from_millis(50)) && ring.head() > pos {
                                s.timeouts_with_data += 1;
                            }
                        }
                    }
                }
                s
            })
        })
        .collect();
    (hs, progress)
}

#[test]
fn push_wake_cost_does_not_grow_with_waiting_readers() {
    const READERS: usize = 32;
    const PUSHES: u64 = 100;
    let ring = Arc::new(Ring::<Item>::new(1024));
    let bell = Arc::new(Bell::new());
    let (hs, progress) = spawn_followers(READERS, &ring, &bell, PUSHES);
    let mut w = ring.writer().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    for i in 0..PUSHES {
        // Wait until every reader has consumed everything and is inside `wait`.
        while bell.waiters() < READERS as u32 || progress.iter().any(|p| p.load(Ordering::SeqCst) < i) {
            assert!(Instant::now() < deadline, "readers did not settle");
            thread::yield_now();
        }
        let before = bell.ring_wakes();
        w.push(Item(i));
        bell.ring();
        let wakes = bell.ring_wakes() - before;
        assert!(wakes <= 1, "push {i}: writer made {wakes} wake syscalls");
    }
    let mut timeouts_with_data = 0;
    for h in hs {
        let s = h.join().unwrap();
        assert_eq!(s.delivered, PUSHES);
        timeouts_with_data += s.timeouts_with_data;
    }
    let (ring_wakes, chain_wakes) = (bell.ring_wakes(), bell.chain_wakes());
    eprintln!(
            "32 waiters: pushes={PUSHES} ring_wakes={ring_wakes} chain_wakes={chain_wakes} timeouts_with_data={timeouts_with_data}"
        );
    assert!(ring_wakes <= PUSHES, "writer wake calls per push must be <= 1");
    assert_eq!(ring_wakes, PUSHES, "every push found sleeping readers");
    // The other 31 wake-ups per push came from the chain, not from the writer.
    assert!(chain_wakes >= PUSHES * (READERS as u64 - 1) / 2, "chain_wakes={chain_wakes}");
    assert!(timeouts_with_data <= 10, "broken wake chain: {timeouts_with_data} timeouts found data");
}

/// `cargo test --release -- --ignored --nocapture bench_publish_ns`
#[test]
#[ignore]
fn bench_publish_ns() {
    const PUSHES: u64 = 1_000_000;
    for readers in [1usize, 32, 1000] {
        // (a) Push alone, `readers` threads parked on a bell that is never rung (each did one
        // `get` first, so a per-thread reclamation scheme would know their threads).
        {
            let ring = Arc::new(Ring::<Item>::new(4096));
            let bell = Arc::new(Bell::new());
            let stop = Arc::new(AtomicBool::new(false));
            let hs: Vec<_> = (0..readers)
                .map(|_| {
                    let (ring, bell, stop) = (Arc::clone(&ring), Arc::clone(&bell), Arc::clone(&stop));
                    thread::spawn(move || {
                        let _ = ring.get(0);
                        while !stop.load(Ordering::SeqCst) {
                            bell.wait(bell.epoch(), Duration::from_secs(1));
                        }
                    })
                })
                .collect();
            while bell.waiters() < readers as u32 {
                thread::yield_now();
            }
            let mut w = ring.writer().unwrap();
            for i in 0..PUSHES / 4 {
                w.push(Item(i)); // warm-up: allocator and caches
            }
            let t = Instant::now();
            for i in 0..PUSHES {
                w.push(Item(i));
            }
            let ns = t.elapsed().as_nanos() as f64 / PUSHES as f64;
            stop.store(true, Ordering::SeqCst);
            bell.ring_all();
            for h in hs {
                h.join().unwrap();
            }
            println!("publish_ns push-only readers={readers} (parked, each read once): {ns:.1}");
        }
        // (b) Push + ring every `batch` pushes, `readers` threads following the ring and
        // sleeping on the bell. Wall time per push includes the writer being preempted by
        // the readers (2 cores), so the writer thread's CPU time is printed as well.
        for batch in [1u64, 64] {
            let total = PUSHES / 4;
            let ring = Arc::new(Ring::<Item>::new(4096));
            let bell = Arc::new(Bell::new());
            let (hs, _progress) = spawn_followers(readers, &ring, &bell, total);
            while bell.waiters() < readers as u32 {
                thread::yield_now();
            }
            let mut w = ring.writer().unwrap();
            let (t, cpu) = (Instant::now(), thread_cpu_ns());
            for i in 0..total {
                w.push(Item(i));
                if i % batch == batch - 1 {
                    bell.ring();
                }
            }
            let cpu_ns = (thread_cpu_ns() - cpu) as f64 / total as f64;
            let ns = t.elapsed().as_nanos() as f64 / total as f64;
            let wakes = bell.ring_wakes();
            bell.ring_all();
            for h in hs {
                h.join().unwrap();
            }
            println!(
                "publish_ns push+ring/{batch} readers={readers} (following): wall {ns:.1}, writer cpu {cpu_ns:.1}, \
                     writer wake syscalls/push={:.3}",
                wakes as f64 / total as f64
            );
        }
    }
}

/// CPU time consumed by the calling thread, in nanoseconds.
fn thread_cpu_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: `ts` is a valid, writable timespec; CLOCK_THREAD_CPUTIME_ID is always supported
    // on Linux and other POSIX systems this test runs on.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(r, 0);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
