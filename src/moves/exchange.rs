//! The exchange directory (`<state root>/exchange/`, 0700): the only place a move reads or
//! writes an archive. Moves never take a caller's path (#44): `move.export` writes the
//! archive under a name broca chooses, `move.adopt` names a file in this directory, and the
//! operator's CLI copies archives in and out with the operator's own rights.
//!
//! Invariants:
//! - a name is 1..=[`MAX_NAME`] bytes of `[A-Za-z0-9._-]`, not starting with `.`, ending in
//!   [`SUFFIX`]: it names a file directly in the directory, never a path;
//! - a file is created with `O_CREAT|O_EXCL|O_NOFOLLOW`, mode 0600, written to a `.partial`
//!   beside it, synced, and linked to its name (a link never replaces an existing file);
//! - a file is read with `O_NOFOLLOW|O_NONBLOCK`, only when the opened descriptor is a regular
//!   file, and through a bound: a FIFO, a device or a symlink is refused at once.

use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use crate::state_root::StateRoot;

/// The directory under the state root.
pub const DIR: &str = "exchange";
/// How an archive's name ends.
pub const SUFFIX: &str = ".archive";
/// The longest name taken.
pub const MAX_NAME: usize = 128;

/// The exchange directory of `root`, created (0700) if missing. Refused when it is not a
/// directory of its own (a symlink, say).
pub fn dir(root: &Path) -> io::Result<PathBuf> {
    let dir = root.join(DIR);
    crate::wal::ensure_private_dir(&dir)?;
    let meta = std::fs::symlink_metadata(&dir)?;
    if !meta.is_dir() {
        return Err(io::Error::other(format!("{} is not a directory", dir.display())));
    }
    Ok(dir)
}

/// [`dir`] of a state root.
pub fn of(root: &StateRoot) -> io::Result<PathBuf> {
    dir(root.path())
}

/// Why a name is not an archive's name in the exchange directory.
pub fn check_name(name: &str) -> Result<(), &'static str> {
    let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
    if name.is_empty() || name.len() > MAX_NAME {
        return Err("a file name of 1 to 128 bytes");
    }
    if !name.bytes().all(allowed) || name.starts_with('.') || !name.ends_with(SUFFIX) {
        return Err("a file name in broca's exchange directory: letters, digits, '.', '_' and '-', not starting with '.', ending in .archive (moves take no paths)");
    }
    Ok(())
}

/// The name `move.export` gives the archive of the session at `addr` tombstoned at `epoch`:
/// the same for every repeat of that export.
pub fn export_name(addr: &str, epoch: u64) -> String {
    format!("{addr}.e{epoch}{SUFFIX}")
}

/// A fresh name for an archive the operator brings in (`broca session import`).
pub fn import_name(addr: &str) -> String {
    format!("{addr}.in-{}{SUFFIX}", uuid::Uuid::new_v4().simple())
}

/// Creates `dir/name` holding `bytes`: never over an existing file (`AlreadyExists`), never
/// through a symlink. `before_link` runs after the data is synced, before it gets its name.
pub fn create_new(dir: &Path, name: &str, bytes: &[u8], before_link: impl FnOnce()) -> io::Result<()> {
    check_name(name).map_err(|why| io::Error::new(io::ErrorKind::InvalidInput, why))?;
    let partial = dir.join(format!(".{name}.{}.partial", uuid::Uuid::new_v4().simple()));
    let written = (|| {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&partial)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        before_link();
        std::fs::hard_link(&partial, dir.join(name))
    })();
    let _ = std::fs::remove_file(&partial);
    written?;
    std::fs::File::open(dir)?.sync_all()
}

/// Why a file of the exchange directory was not read.
#[derive(Debug)]
pub enum ReadError {
    /// It cannot be opened or read (absent, a symlink, …).
    Unreadable(io::Error),
    /// It is not a regular file (a FIFO, a device, a directory).
    NotRegular,
    /// It holds more than the bound.
    TooLarge { limit: u64 },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Unreadable(e) if e.raw_os_error() == Some(libc::ELOOP) => f.write_str("it is a symlink"),
            ReadError::Unreadable(e) if e.kind() == io::ErrorKind::NotFound => f.write_str("no such archive"),
            ReadError::Unreadable(_) => f.write_str("it cannot be read"),
            ReadError::NotRegular => f.write_str("it is not a regular file"),
            ReadError::TooLarge { limit } => write!(f, "it is larger than {limit} bytes"),
        }
    }
}

/// Reads `path` (never through a symlink, never blocking on a FIFO) if it is a regular file of
/// at most `limit` bytes.
pub fn read_bounded(path: &Path, limit: u64) -> Result<Vec<u8>, ReadError> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(ReadError::Unreadable)?;
    let meta = file.metadata().map_err(ReadError::Unreadable)?;
    if !meta.is_file() {
        return Err(ReadError::NotRegular);
    }
    if meta.size() > limit {
        return Err(ReadError::TooLarge { limit });
    }
    let mut out = Vec::with_capacity(usize::try_from(meta.size()).unwrap_or(0));
    // The bound holds even if the file grows while it is read.
    file.take(limit + 1).read_to_end(&mut out).map_err(ReadError::Unreadable)?;
    if out.len() as u64 > limit {
        return Err(ReadError::TooLarge { limit });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_file_names_of_this_directory_only() {
        for good in ["a.archive", "0123abcd.e4.archive", "x_y-z.archive"] {
            assert_eq!(check_name(good), Ok(()), "{good}");
        }
        let long = format!("{}.archive", "a".repeat(MAX_NAME));
        for bad in [
            "",
            ".archive",
            ".x.archive",
            "../x.archive",
            "/etc/x.archive",
            "a/b.archive",
            "x.wal",
            "x y.archive",
            "x\0.archive",
            long.as_str(),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert_eq!(check_name(&export_name("ab12", 7)), Ok(()));
        assert_eq!(check_name(&import_name("ab12")), Ok(()));
    }

    #[test]
    fn a_created_file_never_replaces_one_and_never_follows_a_link() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = dir(tmp.path()).unwrap();
        create_new(&dir, "a.archive", b"one", || {}).unwrap();
        let again = create_new(&dir, "a.archive", b"two", || {}).unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(dir.join("a.archive")).unwrap(), b"one");
        let mode = std::fs::metadata(dir.join("a.archive")).unwrap().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let target = tmp.path().join("victim");
        std::fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, dir.join("l.archive")).unwrap();
        assert!(create_new(&dir, "l.archive", b"evil", || {}).is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        let leftovers: Vec<_> =
            std::fs::read_dir(&dir).unwrap().filter_map(|e| e.ok()?.file_name().into_string().ok()).collect();
        assert!(leftovers.iter().all(|n| !n.ends_with(".partial")), "{leftovers:?}");
    }

    #[test]
    fn reads_refuse_links_fifos_devices_and_the_oversized_at_once() {
        let tmp = tempfile::tempdir().unwrap();
        let file = tmp.path().join("f");
        std::fs::write(&file, b"12345").unwrap();
        assert_eq!(read_bounded(&file, 5).unwrap(), b"12345");
        assert!(matches!(read_bounded(&file, 4), Err(ReadError::TooLarge { limit: 4 })));
        let link = tmp.path().join("l");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert!(matches!(read_bounded(&link, 100), Err(ReadError::Unreadable(_))));
        assert!(matches!(read_bounded(Path::new("/dev/zero"), 100), Err(ReadError::NotRegular)));
        let fifo = tmp.path().join("p");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a NUL-terminated path of this test's own directory.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        assert!(matches!(read_bounded(&fifo, 100), Err(ReadError::NotRegular)), "a FIFO is refused without blocking");
    }
}
