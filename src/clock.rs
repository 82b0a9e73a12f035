//! Wall-clock time, as one seam: every durable time broca writes (run, step, tool and terminal
//! records, run-index rows, LKG envelopes) and every decision made from one (retention expiry
//! and deletion, the catalog's age) reads a [`Clock`]. Production runs on [`SystemClock`]; a
//! test moves a [`ManualClock`]; the conformance adapter moves a running broca's clock from
//! outside through an [`OffsetFileClock`] (debug builds only, `BROCA_TEST_CLOCK_FILE`).
//!
//! Intervals (timeouts, backoff, watchdogs, pacing) are measured on `Instant`, which a moved
//! wall clock must not disturb; a wait that ends at a wall-clock time (an idle actor closing at
//! its session's expiry) re-reads a moved clock at least every [`Clock::recheck`].

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

/// The environment variable naming an [`OffsetFileClock`]'s file (debug builds only).
pub const TEST_CLOCK_ENV: &str = "BROCA_TEST_CLOCK_FILE";

/// Unix time in milliseconds.
pub trait Clock: Send + Sync {
    fn now_ms(&self) -> u64;

    /// How long a wait for a wall-clock moment may sleep before reading this clock again:
    /// `None` for a clock that only moves with real time.
    fn recheck(&self) -> Option<Duration> {
        None
    }
}

/// A shared clock.
pub type SharedClock = Arc<dyn Clock>;

/// The system's wall clock, in unix milliseconds (0 before the epoch).
pub fn unix_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The system's wall clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        unix_ms()
    }
}

/// How often a wait re-reads a clock a test moves.
const MOVED_RECHECK: Duration = Duration::from_millis(crate::limits::RETENTION_SWEEP_MS);

/// A clock that moves only when told (tests).
#[derive(Debug)]
pub struct ManualClock {
    ms: AtomicU64,
}

impl ManualClock {
    pub fn at(ms: u64) -> ManualClock {
        ManualClock { ms: AtomicU64::new(ms) }
    }

    /// Starts at the system's now.
    pub fn now() -> ManualClock {
        ManualClock::at(unix_ms())
    }

    pub fn advance(&self, by: Duration) {
        let by = u64::try_from(by.as_millis()).unwrap_or(u64::MAX);
        self.ms.fetch_add(by, Ordering::AcqRel);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.ms.load(Ordering::Acquire)
    }

    fn recheck(&self) -> Option<Duration> {
        Some(MOVED_RECHECK)
    }
}

/// The system clock plus an offset read from a file another process writes (a decimal count
/// of milliseconds; a missing or unreadable file is offset 0). The file is read again when
/// its modification time, length or inode changes (a writer renames a new file in), so an advance is seen by the next reading.
/// Built only from [`from_env`] in debug builds: the conformance adapter's
/// `advance_retention_clock`.
#[derive(Debug)]
pub struct OffsetFileClock {
    path: PathBuf,
    /// The file as last read, and the offset it held.
    seen: Mutex<(Option<FileStamp>, u64)>,
}

/// A file's modification time, length and inode: when any changes, it is read again.
type FileStamp = (SystemTime, u64, u64);

impl OffsetFileClock {
    pub fn new(path: PathBuf) -> OffsetFileClock {
        OffsetFileClock { path, seen: Mutex::new((None, 0)) }
    }

    /// The offset the file holds now.
    pub fn offset_ms(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let stamp = std::fs::metadata(&self.path).ok().and_then(|m| Some((m.modified().ok()?, m.len(), m.ino())));
        let mut seen = self.seen.lock();
        if stamp != seen.0 {
            let text = std::fs::read_to_string(&self.path).unwrap_or_default();
            *seen = (stamp, text.trim().parse().unwrap_or(0));
        }
        seen.1
    }
}

impl Clock for OffsetFileClock {
    fn now_ms(&self) -> u64 {
        unix_ms().saturating_add(self.offset_ms())
    }

    fn recheck(&self) -> Option<Duration> {
        Some(MOVED_RECHECK)
    }
}

/// The process's clock: the system clock, or in a debug build with [`TEST_CLOCK_ENV`] set an
/// [`OffsetFileClock`] on that file.
pub fn from_env() -> SharedClock {
    #[cfg(debug_assertions)]
    if let Some(path) = std::env::var_os(TEST_CLOCK_ENV).filter(|p| !p.is_empty()) {
        log::warn!("the wall clock is moved by {} (a test switch)", PathBuf::from(&path).display());
        return Arc::new(OffsetFileClock::new(PathBuf::from(path)));
    }
    Arc::new(SystemClock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_manual_clock_moves_only_when_told() {
        let clock = ManualClock::at(1_000);
        assert_eq!(clock.now_ms(), 1_000);
        clock.advance(Duration::from_secs(2));
        assert_eq!(clock.now_ms(), 3_000);
        assert!(SystemClock.recheck().is_none() && clock.recheck().is_some());
    }

    #[test]
    fn an_offset_file_clock_reads_each_new_offset() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("offset");
        let clock = OffsetFileClock::new(path.clone());
        assert_eq!(clock.offset_ms(), 0, "no file: no offset");
        std::fs::write(&path, "86400000\n").unwrap();
        assert_eq!(clock.offset_ms(), 86_400_000);
        std::fs::write(&path, "172800001").unwrap();
        assert_eq!(clock.offset_ms(), 172_800_001, "a longer file is read again");
        assert!(clock.now_ms() >= unix_ms() + 172_800_000);
    }
}
