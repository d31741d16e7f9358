//! O2/O3: `backup`, `restore`, `store copy` and `store verify`. What moves and how stores
//! compare is `pcmail_store::transfer`'s; here are the files and the words.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use pcmail_core::restore::plan_restore;
use pcmail_store::transfer::{self, FileSum, Moved};
use pcmail_store::{AnyStore, SqliteStore, Store, StoreError, redact_url};

use crate::args::{StoreArgs, StoreCommand, StorePair};
use crate::progress::Meter;

pub async fn backup(file: PathBuf, source: StoreArgs) -> anyhow::Result<i32> {
    // A name taken by anything, a dangling link included, is never written through.
    if file.symlink_metadata().is_ok() {
        bail!("{} already exists; a backup never overwrites a file (name a new one)", file.display());
    }
    let from = pcmail_store::open_to_read(&source.url(), &source.data_dir).await.context("opening the store")?;
    // Written beside its final name, held by a lock while it is, and linked to that name when
    // whole: a FILE that exists is a whole backup.
    let partial = with_suffix(&file, ".partial");
    let held = open_partial(&partial)?;
    // Unix locks are advisory; Windows would lock SQLite itself out of the file.
    #[cfg(unix)]
    if held.try_lock().is_err() {
        bail!("another backup into {} is running", file.display());
    }
    let mut meter = Meter::new("backup", "rows");
    let outcome = write_backup(&from, &partial, &held, &mut meter).await;
    let linked = outcome.and_then(|moved| {
        // A hard link fails if the name was taken meanwhile, where a rename would replace it.
        std::fs::hard_link(&partial, &file).with_context(|| format!("naming the backup {}", file.display()))?;
        Ok(moved)
    });
    remove_partial(&partial)?;
    drop(held);
    let moved = linked.context("backup failed; no backup file was written")?;
    finish(meter, &moved, &file.display().to_string());
    Ok(0)
}

async fn write_backup(
    from: &AnyStore,
    partial: &Path,
    held: &std::fs::File,
    meter: &mut Meter,
) -> anyhow::Result<Moved> {
    // Whatever an earlier, stopped backup left under this name goes.
    for companion in ["-wal", "-shm", "-journal"] {
        remove_if_there(&with_suffix(partial, companion))?;
    }
    held.set_len(0).with_context(|| format!("emptying {}", partial.display()))?;
    let (to, copied) = match from.sqlite() {
        Some(sqlite) => {
            // P14: SQLite into SQLite copies pages; the checksums are of what the copy holds.
            sqlite.back_up_pages(partial.to_path_buf()).await.context("copying the store's pages")?;
            let copy = SqliteStore::open_read_only(partial).await.context("reading the copied pages")?;
            let copied = copy.digest_unwritten(&mut meter.rows()).await?;
            drop(copy);
            (SqliteStore::open(partial).await.with_context(|| format!("opening {}", partial.display()))?, copied)
        }
        None => {
            let to = SqliteStore::open(partial).await.with_context(|| format!("creating {}", partial.display()))?;
            let copied = transfer::copy_counted(from, &to, &mut meter.rows()).await?;
            (to, copied)
        }
    };
    // E14: the checksums of what it holds travel inside it; restore and verify check them.
    to.kv_set(transfer::BACKUP_DIGEST_KEY, &transfer::seal_digest(&copied)).await.context("sealing the backup")?;
    to.seal().await.context("closing the backup")?;
    if with_suffix(partial, "-wal").exists() {
        bail!("the backup's write-ahead log was not folded into it");
    }
    // E14: and the checksum of the whole file, written into it once nothing else will be.
    transfer::seal_file(held).with_context(|| format!("sealing {}", partial.display()))?;
    Ok(transfer::moved(&copied))
}

/// E14: the file a backup is written into, created `O_EXCL|O_NOFOLLOW` (0600), or one a
/// stopped backup left, opened without following a link: a planted link is refused, never
/// written through.
fn open_partial(partial: &Path) -> anyhow::Result<std::fs::File> {
    let mut create = std::fs::OpenOptions::new();
    create.read(true).write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        create.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    }
    match create.open(partial) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        other => return other.with_context(|| format!("creating {}", partial.display())),
    }
    if partial.symlink_metadata().is_ok_and(|m| !m.file_type().is_file()) {
        bail!("{} is a link or not a file; a backup is never written through one (remove it)", partial.display());
    }
    let mut reuse = std::fs::OpenOptions::new();
    reuse.read(true).write(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut reuse, libc::O_NOFOLLOW);
    reuse.open(partial).with_context(|| format!("opening the unfinished {}", partial.display()))
}

/// E14: opens a backup to read it, refused when its rows, its pages or its bytes changed since
/// it was written: the tabs whose checksums differ are named, or "the file" when only the
/// whole file's does.
async fn open_backup(
    file: &Path,
    scratch: &Path,
    meter: &mut Meter,
) -> anyhow::Result<(SqliteStore, Option<Migrated>)> {
    let whole = whole_file(file)?;
    if let Ok((found, known)) = pcmail_store::sqlite::schema::versions_at(file)
        && found > 0
        && found < known
    {
        return migrated_copy(file, scratch, whole, (found, known)).await;
    }
    let from = match SqliteStore::open_read_only(file).await {
        Ok(from) => from,
        Err(_) if whole == FileSum::Differs => bail!(
            "the backup {} does not match its checksums in: the file (it was changed after it was written; \
             nothing was restored)",
            file.display()
        ),
        Err(e) => return Err(e).with_context(|| format!("reading the backup {}", file.display())),
    };
    let sealed = transfer::verify_sealed_counted(&from, whole, &mut meter.rows())
        .await
        .with_context(|| format!("checking {}", file.display()))?;
    meter.pause();
    from.integrity().await.with_context(|| format!("checking the backup {}", file.display()))?;
    if !sealed {
        eprintln!("{} carries no checksums (written before they were kept); its pages check out", file.display());
    }
    Ok((from, None))
}

/// V5: the copy of a backup of an earlier schema that a restore reads, migrated to this build's;
/// removed when the restore ends. The backup itself is never written.
struct Migrated(PathBuf);

impl Drop for Migrated {
    fn drop(&mut self) {
        for companion in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(with_suffix(&self.0, companion));
        }
    }
}

/// V5: a backup of an earlier schema restores directly: its whole-file checksum is checked on
/// the backup, then a copy of it beside the target is migrated and read (its tabs' checksums
/// were counted over the columns of its own release, so the file's is the one that holds).
async fn migrated_copy(
    file: &Path,
    scratch: &Path,
    whole: FileSum,
    (found, known): (usize, usize),
) -> anyhow::Result<(SqliteStore, Option<Migrated>)> {
    if whole == FileSum::Differs {
        bail!(
            "the backup {} does not match its checksums in: the file (it was changed after it was written; \
             nothing was restored)",
            file.display()
        );
    }
    let copy = Migrated(scratch.join(format!(".restore-schema-{found}-{}.db", std::process::id())));
    std::fs::copy(file, &copy.0).with_context(|| format!("copying {} to migrate it", file.display()))?;
    let from = SqliteStore::open(&copy.0).await.with_context(|| format!("migrating a copy of {}", file.display()))?;
    from.integrity().await.with_context(|| format!("checking the backup {}", file.display()))?;
    eprintln!(
        "{} is of schema {found} (this build's is {known}): restoring from a copy migrated to it",
        file.display()
    );
    Ok((from, Some(copy)))
}

/// The verdict of a file's whole-file checksum (E14); nothing there is for the opening to say.
fn whole_file(file: &Path) -> anyhow::Result<FileSum> {
    if !file.is_file() {
        return Ok(FileSum::Absent);
    }
    transfer::check_file(file).with_context(|| format!("reading {}", file.display()))
}

pub async fn restore(file: PathBuf, target: StoreArgs, force: bool) -> anyhow::Result<i32> {
    // A backup of an earlier schema is migrated on a copy in the data dir (private), else in
    // the system's temporary directory.
    let scratch = if target.data_dir.is_dir() { target.data_dir.clone() } else { std::env::temp_dir() };
    let mut meter = Meter::new("restore", "rows");
    meter.phase("checking");
    let (from, _migrated) = open_backup(&file, &scratch, &mut meter).await?;
    if target.store.is_none() {
        pcmail_store::private::make_private(&target.data_dir)
            .with_context(|| format!("making the data dir {}", target.data_dir.display()))?;
    }
    let url = target.url();
    let to = pcmail_store::open(&url, &target.data_dir).await.context("opening the target store")?;
    // E14: what comes back, what goes, and whether that needs --force.
    let brings = meter.wait("reading the backup", transfer::survey(&from)).await.context("reading the backup")?;
    let held = meter.wait("reading the target", transfer::survey(&to)).await.context("reading the target store")?;
    let plan = plan_restore(&brings, &held);
    let shown = redact_url(&url);
    eprintln!("the backup brings back: {}", brings.describe());
    eprintln!("{shown} holds, and the restore drops: {}", held.describe());
    if !plan.needs_force.is_empty() && !force {
        for why in &plan.needs_force {
            eprintln!("refused: {why}");
        }
        bail!("restore refused; nothing was changed (--force replaces what {shown} holds)");
    }
    meter.phase("restoring");
    let moved = if plan.replaces {
        replace(&from, to, &url, &mut meter).await?
    } else {
        copy(&from, &to, &url, &mut meter).await?
    };
    finish(meter, &moved, &shown);
    Ok(0)
}

/// E14: a restore over a store that holds rows, so that the store is either all it was or all
/// the backup. SQLite: the backup is copied into a new file beside it, which then takes the
/// store's name (its write-ahead log going with the old one). PostgreSQL: emptied and filled in
/// one transaction. Sheets: the working copy likewise, then the spreadsheet in one cycle.
async fn replace(from: &SqliteStore, to: AnyStore, url: &str, meter: &mut Meter) -> anyhow::Result<Moved> {
    let Some(path) = url.strip_prefix("sqlite:").filter(|p| !p.is_empty()).map(PathBuf::from) else {
        return transfer::replace(from, &to)
            .await
            .with_context(|| format!("the restore into {} did not finish", redact_url(url)));
    };
    drop(to);
    let fresh = with_suffix(&path, ".restoring");
    remove_partial(&fresh)?;
    let into = SqliteStore::open(&fresh).await.with_context(|| format!("creating {}", fresh.display()))?;
    let moved = copy(from, &into, &format!("sqlite:{}", fresh.display()), meter).await?;
    into.seal().await.with_context(|| format!("closing {}", fresh.display()))?;
    for companion in ["-wal", "-shm", "-journal"] {
        remove_if_there(&with_suffix(&path, companion))?;
    }
    std::fs::rename(&fresh, &path).with_context(|| format!("putting the restored store at {}", path.display()))?;
    Ok(moved)
}

pub async fn run(command: StoreCommand) -> anyhow::Result<i32> {
    match command {
        StoreCommand::Copy { ends } => {
            let from = pcmail_store::open_to_read(&ends.from, &ends.data_dir).await.context("opening --from")?;
            let to = pcmail_store::open(&ends.to, &ends.data_dir).await.context("opening --to")?;
            let mut meter = Meter::new("store copy", "rows");
            let moved = copy(&from, &to, &ends.to, &mut meter).await?;
            finish(meter, &moved, &redact_url(&ends.to));
            Ok(0)
        }
        // Like `diff`: 0 the same, 1 different, more than 1 when they could not be compared.
        StoreCommand::Verify { ends } => match verify(&ends).await {
            Ok(equal) => Ok(if equal { 0 } else { 1 }),
            Err(e) => {
                crate::exit::print(&e);
                Ok(crate::exit::exit_code(&e).max(2))
            }
        },
    }
}

async fn verify(ends: &StorePair) -> anyhow::Result<bool> {
    let mut meter = Meter::new("store verify", "rows");
    let from = open_end(&ends.from, &ends.data_dir).await.context("opening --from")?;
    let to = open_end(&ends.to, &ends.data_dir).await.context("opening --to")?;
    // E14: an end that is a backup must first match the checksums it was written with.
    for (end, url, store) in [("--from", &ends.from, &from), ("--to", &ends.to, &to)] {
        let whole = match url.strip_prefix("sqlite:").filter(|p| !p.is_empty()) {
            Some(path) => whole_file(Path::new(path))?,
            None => FileSum::Absent,
        };
        meter.phase(if end == "--from" { "checking --from" } else { "checking --to" });
        let sealed = transfer::verify_sealed_counted(store, whole, &mut meter.rows()).await;
        meter.pause();
        if sealed.with_context(|| format!("checking {end}"))? {
            eprintln!("{end} is a backup and matches the checksums it was written with");
        }
    }
    meter.phase("reading --from");
    let ours = from.digest(&mut meter.rows()).await.context("reading --from")?;
    meter.phase("reading --to");
    let theirs = to.digest(&mut meter.rows()).await.context("reading --to")?;
    meter.pause();
    println!("{:<16} {:>10} {:>10}  CHECKSUMS", "TAB", "FROM", "TO");
    for (a, b) in ours.iter().zip(&theirs) {
        let same = if a == b { "equal" } else { "DIFFER" };
        println!("{:<16} {:>10} {:>10}  {same}", a.tab, a.rows, b.rows);
    }
    let differ = transfer::differences(&ours, &theirs);
    if differ.is_empty() {
        eprintln!("the stores hold the same rows in every tab");
    } else {
        eprintln!("the stores differ in: {}", differ.join(", "));
    }
    let rows = |d: &[transfer::TabDigest]| d.iter().map(|t| t.rows).sum::<u64>();
    let (a, b) = (rows(&ours), rows(&theirs));
    let read = format!("--from {}, --to {}", pcmail_core::progress::grouped(a), pcmail_core::progress::grouped(b));
    meter.finish(&read, a + b, None);
    Ok(differ.is_empty())
}

/// One end of `store verify`, read only; a SQLite file that cannot be opened and whose own
/// checksum differs is named as a changed backup (E14).
async fn open_end(url: &str, data_dir: &Path) -> anyhow::Result<AnyStore> {
    match pcmail_store::open_to_read(url, data_dir).await {
        Ok(store) => Ok(store),
        Err(e) => match url.strip_prefix("sqlite:").filter(|p| !p.is_empty()) {
            Some(path) if whole_file(Path::new(path))? == FileSum::Differs => bail!(
                "the backup {path} does not match its checksums in: the file (it was changed after it was written)"
            ),
            _ => Err(e.into()),
        },
    }
}

async fn copy(from: &(impl Store + Clone), to: &impl Store, url: &str, meter: &mut Meter) -> anyhow::Result<Moved> {
    match transfer::copy_moved(from, to, &mut meter.rows()).await {
        Ok(moved) => Ok(moved),
        Err(e @ StoreError::NotEmpty(_)) => Err(e.into()),
        Err(e) => Err(e).with_context(|| {
            format!(
                "the copy stopped; {} holds part of the rows and is marked unfinished (serve refuses it): \
                 empty it and copy again",
                redact_url(url)
            )
        }),
    }
}

/// X4: the summary line of a backup, restore or copy: the rows of each tab, in all, how fast,
/// and where to.
fn finish(meter: Meter, moved: &Moved, to: &str) {
    let rows = moved.iter().map(|(_, n)| n).sum();
    meter.finish(&pcmail_core::progress::counts(moved), rows, Some(to));
}

fn with_suffix(file: &Path, suffix: &str) -> PathBuf {
    let mut name = file.as_os_str().to_owned();
    name.push(suffix);
    PathBuf::from(name)
}

fn remove_partial(partial: &Path) -> anyhow::Result<()> {
    for companion in ["", "-wal", "-shm", "-journal"] {
        remove_if_there(&with_suffix(partial, companion))?;
    }
    Ok(())
}

fn remove_if_there(path: &Path) -> anyhow::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(e).with_context(|| format!("removing the unfinished {}", path.display()))
        }
        _ => Ok(()),
    }
}
