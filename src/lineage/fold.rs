//! Archive folding (spec §20, DESIGN §8): a closed, cold WAL is sealed into a container in
//! `wal-archive/` (or `wal-archive-durable/` for a backed-up session), and unfolded back into
//! its live tree, byte for byte and with its modification time, the first time anything needs
//! it: a read, a status, a send. Reads are therefore served as if it had never been folded.
//!
//! Invariants:
//! - a fold and an unfold each hold the session's lease, so neither meets a writer or the other;
//! - a live WAL is authoritative: a container beside a live WAL of the same session is stale (a
//!   fold cut after its rename) and is removed, under the lease, by [`tidy`] at start;
//! - every step is atomic (write a temp file, fsync, rename, fsync the directory, then remove
//!   the source), with a fail point after each, so a crash leaves one authoritative copy and at
//!   most temp files [`tidy`] removes;
//! - `wal-ephemeral/` is never folded, nor a session with a run or a send pending, nor one that
//!   holds a provider-held record (held-record ranges stay live, spec §19 H-32), nor one whose
//!   WAL does not end on a whole frame.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use super::{LineageError, Shared};
use crate::record::{self, Record};
use crate::replay::{EpisodeStatus, Replay};
use crate::state_root::Placement;
use crate::wal::container::{self, Header};
use crate::wal::{self, Lease, LeaseError, ScannedFrame};

pub use crate::config::FoldPolicy;

/// The live trees a fold reads and the archive tree each folds into.
pub const FOLDED: [(Placement, &str); 2] =
    [(Placement::Standard, "wal-archive"), (Placement::Durable, "wal-archive-durable")];

/// What one fold attempt came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Folded {
    Sealed {
        wal_bytes: u64,
        container_bytes: u64,
    },
    /// Not folded now (the reason, for logs and tests).
    Skipped(&'static str),
}

/// Why a fold or unfold failed (nothing is lost: the live copy, or the container, stays).
#[derive(Debug)]
pub enum FoldError {
    Io { op: &'static str, path: PathBuf, source: std::io::Error },
    Lineage(LineageError),
    Container(container::Unsealed),
}

impl std::fmt::Display for FoldError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FoldError::Io { op, path, source } => write!(f, "fold: cannot {op} {}: {source}", path.display()),
            FoldError::Lineage(e) => write!(f, "fold: {e}"),
            FoldError::Container(e) => e.fmt(f),
        }
    }
}

impl std::error::Error for FoldError {}

fn io(op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> FoldError {
    let path = path.to_path_buf();
    move |source| FoldError::Io { op, path, source }
}

fn archive_dir(shared: &Shared, tree: Placement) -> Option<PathBuf> {
    FOLDED.iter().find(|(p, _)| *p == tree).map(|(_, dir)| shared.root.path().join(dir))
}

/// The container of the session at `addr`, if one exists, and the live tree it unfolds into.
pub fn container_of(shared: &Shared, addr: &str) -> Option<(PathBuf, Placement)> {
    FOLDED.iter().find_map(|(tree, dir)| {
        let path = shared.root.path().join(dir).join(format!("{addr}.{}", container::SUFFIX));
        path.exists().then_some((path, *tree))
    })
}

/// The folded WAL's modification time, from its container's header (checked, not inflated).
pub fn folded_mtime_ms(shared: &Shared, addr: &str) -> Option<u64> {
    let (path, _) = container_of(shared, addr)?;
    container::header(&fs::read(path).ok()?).ok().map(|h| h.wal_mtime_ms)
}

/// Folds the WAL of `addr` in `tree` if it is cold at `now_ms` and foldable.
pub fn fold_one(
    shared: &Shared,
    addr: &str,
    tree: Placement,
    policy: &FoldPolicy,
    now_ms: u64,
) -> Result<Folded, FoldError> {
    let Some(archive) = archive_dir(shared, tree) else { return Ok(Folded::Skipped("ephemeral")) };
    let lease_path = shared.root.lease_path_of(addr);
    let _lease = match Lease::acquire(&lease_path) {
        Ok(lease) => lease,
        Err(LeaseError::Busy { .. } | LeaseError::Stale { .. }) => return Ok(Folded::Skipped("open")),
        Err(e) => return Err(FoldError::Lineage(e.into())),
    };
    let live = shared.root.path().join(tree.dir_name()).join(format!("{addr}.wal"));
    let Ok(meta) = fs::metadata(&live) else { return Ok(Folded::Skipped("gone")) };
    let mtime_ms =
        meta.modified().ok().and_then(|t| t.duration_since(UNIX_EPOCH).ok()).map_or(0, |d| d.as_millis() as u64);
    if mtime_ms.saturating_add(policy.after_idle_ms) > now_ms {
        return Ok(Folded::Skipped("warm"));
    }
    if meta.len() < policy.min_bytes.max(1) || meta.len() > container::MAX_WAL_BYTES {
        return Ok(Folded::Skipped("size"));
    }
    let bytes = fs::read(&live).map_err(io("read", &live))?;
    if let Some(why) = unfoldable(&live, bytes.len() as u64)? {
        return Ok(Folded::Skipped(why));
    }
    let header = Header {
        addr: addr.to_owned(),
        tree: tree.dir_name().to_owned(),
        wal_bytes: bytes.len() as u64,
        wal_sha256: container::sha256_hex(&bytes),
        wal_mtime_ms: mtime_ms,
        folded_at_ms: now_ms,
    };
    let sealed = container::seal(&header, &bytes);
    crate::wal::ensure_private_dir(&archive).map_err(io("create", &archive))?;
    let target = archive.join(format!("{addr}.{}", container::SUFFIX));
    let partial = archive.join(format!("{addr}.{}.partial", container::SUFFIX));
    write_synced(&partial, &sealed, None)?;
    crate::failpoint!("fold.after_write");
    fs::rename(&partial, &target).map_err(io("rename", &partial))?;
    wal::sync_dir(&archive).map_err(|e| FoldError::Lineage(e.into()))?;
    crate::failpoint!("fold.after_rename");
    fs::remove_file(&live).map_err(io("remove", &live))?;
    let live_dir = live.parent().unwrap_or(Path::new("."));
    wal::sync_dir(live_dir).map_err(|e| FoldError::Lineage(e.into()))?;
    crate::failpoint!("fold.after_remove");
    Ok(Folded::Sealed { wal_bytes: header.wal_bytes, container_bytes: sealed.len() as u64 })
}

/// Why the WAL at `path` (`len` bytes) must stay live, if it must.
fn unfoldable(path: &Path, len: u64) -> Result<Option<&'static str>, FoldError> {
    let mut replay = Replay::default();
    let (mut end, mut held) = (0u64, false);
    let read = wal::read(path, record::KNOWN_FEATURES, None, &mut |f: ScannedFrame<'_>| -> Result<(), LineageError> {
        let rec = Record::decode(f.payload).map_err(|e| LineageError::Refused(e.0))?;
        held |= matches!(rec, Record::ToolCallProviderHeld(_));
        replay.apply(f.seq, &rec, &mut |_| {})?;
        end = f.offset + f.len;
        Ok(())
    });
    if read.is_err() {
        return Ok(Some("unreadable"));
    }
    let running = replay.last.as_ref().is_some_and(|e| !matches!(e.status, EpisodeStatus::Finished { .. }));
    Ok(match () {
        _ if end != len => Some("torn tail"),
        _ if running || !replay.queue.is_empty() => Some("busy"),
        _ if held => Some("held record"),
        _ => None,
    })
}

/// Unfolds the session at `addr` back into its live tree, if it is folded, and returns the live
/// WAL's path. `lease_held`: the caller already holds the session's lease (an opening writer).
pub fn unfold(shared: &Shared, addr: &str, lease_held: bool) -> Result<Option<PathBuf>, FoldError> {
    let Some((path, tree)) = container_of(shared, addr) else { return Ok(None) };
    let _lease = if lease_held {
        None
    } else {
        let wait = Duration::from_millis(crate::limits::OWN_LEASE_WAIT_MS);
        Some(
            Lease::acquire_waiting_for_own(&shared.root.lease_path_of(addr), wait)
                .map_err(|e| FoldError::Lineage(e.into()))?,
        )
    };
    let live_dir = shared.root.path().join(tree.dir_name());
    let live = live_dir.join(format!("{addr}.wal"));
    if live.exists() {
        // Unfolded meanwhile (or a fold cut after its rename): the live copy is authoritative.
        return Ok(Some(live));
    }
    if !path.exists() {
        return Ok(None);
    }
    let sealed = fs::read(&path).map_err(io("read", &path))?;
    let (header, wal) = container::open(&sealed).map_err(FoldError::Container)?;
    if header.addr != addr {
        return Err(FoldError::Container(container::Unsealed("address")));
    }
    let staged = live_dir.join(format!("{addr}.wal.unfolding"));
    write_synced(&staged, &wal, Some(header.wal_mtime_ms))?;
    fs::rename(&staged, &live).map_err(io("rename", &staged))?;
    wal::sync_dir(&live_dir).map_err(|e| FoldError::Lineage(e.into()))?;
    crate::failpoint!("fold.unfold_after_rename");
    fs::remove_file(&path).map_err(io("remove", &path))?;
    if let Some(dir) = path.parent() {
        wal::sync_dir(dir).map_err(|e| FoldError::Lineage(e.into()))?;
    }
    Ok(Some(live))
}

/// At start: removes what cut folds and unfolds left (temp files, and containers whose session
/// is live), each under the session's lease, so one copy of every session remains.
pub fn tidy(shared: &Shared) -> usize {
    let mut removed = 0;
    let mut stale: Vec<(String, PathBuf)> = Vec::new();
    for (tree, dir) in FOLDED {
        // One listing of each tree (a boot over many folded sessions stats nothing per session).
        let mut live = std::collections::HashSet::new();
        for entry in fs::read_dir(shared.root.path().join(tree.dir_name())).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let addr = name.split('.').next().unwrap_or_default().to_owned();
            if name.ends_with(".wal.unfolding") {
                stale.push((addr, entry.path()));
            } else if name.ends_with(".wal") {
                live.insert(addr);
            }
        }
        for entry in fs::read_dir(shared.root.path().join(dir)).into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let addr = name.split('.').next().unwrap_or_default().to_owned();
            if name.ends_with(".partial") || (name.ends_with(container::SUFFIX) && live.contains(&addr)) {
                stale.push((addr, entry.path()));
            }
        }
    }
    for (addr, path) in stale {
        if let Ok(_lease) = Lease::acquire(&shared.root.lease_path_of(&addr)) {
            if fs::remove_file(&path).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// One sweep: folds what is cold in the live trees, at most `policy.max_per_pass`.
pub fn sweep(shared: &Shared, policy: &FoldPolicy) -> Vec<Result<Folded, FoldError>> {
    let now = shared.clock.now_ms();
    let mut out = Vec::new();
    for (tree, _) in FOLDED {
        for entry in fs::read_dir(shared.root.path().join(tree.dir_name())).into_iter().flatten().flatten() {
            if out.iter().filter(|r| matches!(r, Ok(Folded::Sealed { .. }))).count() >= policy.max_per_pass {
                return out;
            }
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(addr) = name.strip_suffix(".wal") else { continue };
            out.push(fold_one(shared, addr, tree, policy, now));
        }
    }
    out
}

fn write_synced(path: &Path, bytes: &[u8], mtime_ms: Option<u64>) -> Result<(), FoldError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = fs::remove_file(path);
    let mut file =
        fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(path).map_err(io("create", path))?;
    file.write_all(bytes).map_err(io("write", path))?;
    if let Some(ms) = mtime_ms {
        file.set_modified(UNIX_EPOCH + Duration::from_millis(ms)).map_err(io("set the time of", path))?;
    }
    file.sync_all().map_err(io("sync", path))
}
