//! T8: pcmail's files are its user's alone. Mail, tokens' hashes, caches and working copies
//! must not be readable by other local users, so a data dir (or a PC's home) is 0700 and every
//! file in it 0600 — also those created later, by SQLite (its WAL and SHM), by a working copy,
//! or by a newer build: the process's umask becomes 077, and what an older build left open is
//! closed when the dir is opened.

use std::path::Path;
#[cfg(unix)]
use std::sync::atomic::{AtomicU32, Ordering};

#[cfg(unix)]
static INHERITED: AtomicU32 = AtomicU32::new(u32::MAX);

/// Creates `dir` if missing and makes it and everything under it private, and sets this
/// process's umask to 077 (once; the umask it had is kept for the programs it starts).
pub fn make_private(dir: &Path) -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        if INHERITED.load(Ordering::Relaxed) == u32::MAX {
            // SAFETY: umask only swaps the process's file-creation mask; it cannot fail.
            let previous = unsafe { libc::umask(0o077) };
            #[allow(clippy::useless_conversion)] // mode_t is u32 on Linux, u16 on macOS
            INHERITED.store(u32::from(previous), Ordering::Relaxed);
        }
        std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
        let tighten = |path: &Path, want: u32| -> std::io::Result<()> {
            let meta = std::fs::symlink_metadata(path)?;
            if !meta.file_type().is_symlink() && meta.permissions().mode() & 0o777 != want {
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(want))?;
            }
            Ok(())
        };
        tighten(dir, 0o700)?;
        let mut pending = vec![dir.to_path_buf()];
        while let Some(d) = pending.pop() {
            for entry in std::fs::read_dir(&d)? {
                let entry = entry?;
                let kind = entry.file_type()?;
                if kind.is_dir() {
                    tighten(&entry.path(), 0o700)?;
                    pending.push(entry.path());
                } else if kind.is_file() {
                    tighten(&entry.path(), 0o600)?;
                }
            }
        }
        Ok(())
    }
    #[cfg(not(unix))]
    {
        std::fs::create_dir_all(dir)
    }
}

/// Opens `path` for writing, creating it readable by its owner only if it is missing (a store
/// file made outside a private data dir: a backup, a copy's target).
pub fn open_private(path: &Path) -> std::io::Result<std::fs::File> {
    let mut options = std::fs::OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)
}

/// The umask this process had before [`make_private`], for the programs it runs (a Function
/// writing a report keeps its user's usual permissions); None if it was never changed.
pub fn inherited_umask() -> Option<u32> {
    #[cfg(unix)]
    {
        let v = INHERITED.load(Ordering::Relaxed);
        (v != u32::MAX).then_some(v)
    }
    #[cfg(not(unix))]
    {
        None
    }
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn mode(p: &Path) -> u32 {
        std::fs::metadata(p).expect("meta").permissions().mode() & 0o777
    }

    #[test]
    fn t8_an_open_dir_left_by_an_older_build_is_closed_and_new_files_are_born_private() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("data");
        std::fs::create_dir_all(dir.join("sub")).expect("dirs");
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::write(dir.join("pcmail.db"), b"x").expect("file");
        std::fs::write(dir.join("sub/cache.db"), b"x").expect("file");
        std::fs::set_permissions(dir.join("pcmail.db"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
        make_private(&dir).expect("private");
        assert_eq!((mode(&dir), mode(&dir.join("sub"))), (0o700, 0o700));
        assert_eq!((mode(&dir.join("pcmail.db")), mode(&dir.join("sub/cache.db"))), (0o600, 0o600));
        std::fs::write(dir.join("later.db-wal"), b"x").expect("a file created later");
        assert_eq!(mode(&dir.join("later.db-wal")), 0o600, "the umask makes later files private");
        assert!(inherited_umask().is_some());
    }
}
