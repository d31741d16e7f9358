//! O2/O3: `backup`, `restore`, `store copy` and `store verify`. What moves and how stores
//! compare is `pcmail_store::transfer`'s; here are the files and the words.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use pcmail_store::transfer::{self, Moved};
use pcmail_store::{AnyStore, SqliteStore, Store, StoreError, redact_url};

use crate::args::{StoreArgs, StoreCommand, StorePair};

pub async fn backup(file: PathBuf, source: StoreArgs) -> anyhow::Result<i32> {
    // A name taken by anything, a dangling link included, is never written through.
    if file.symlink_metadata().is_ok() {
        bail!("{} already exists; a backup never overwrites a file (name a new one)", file.display());
    }
    let from = pcmail_store::open_to_read(&source.url(), &source.data_dir).await.context("opening the store")?;
    // Written beside its final name, held by a lock while it is, and linked to that name when
    // whole: a FILE that exists is a whole backup.
    let partial = with_suffix(&file, ".partial");
    let held =
        pcmail_store::private::open_private(&partial).with_context(|| format!("creating {}", partial.display()))?;
    // Unix locks are advisory; Windows would lock SQLite itself out of the file.
    #[cfg(unix)]
    if held.try_lock().is_err() {
        bail!("another backup into {} is running", file.display());
    }
    let outcome = write_backup(&from, &partial, &held).await;
    let linked = outcome.and_then(|moved| {
        // A hard link fails if the name was taken meanwhile, where a rename would replace it.
        std::fs::hard_link(&partial, &file).with_context(|| format!("naming the backup {}", file.display()))?;
        Ok(moved)
    });
    remove_partial(&partial)?;
    drop(held);
    let moved = linked.context("backup failed; no backup file was written")?;
    report("backed up", &moved, &file.display().to_string());
    Ok(0)
}

async fn write_backup(from: &AnyStore, partial: &Path, held: &std::fs::File) -> anyhow::Result<Moved> {
    // Whatever an earlier, stopped backup left under this name goes.
    for companion in ["-wal", "-shm", "-journal"] {
        remove_if_there(&with_suffix(partial, companion))?;
    }
    held.set_len(0).with_context(|| format!("emptying {}", partial.display()))?;
    let to = SqliteStore::open(partial).await.with_context(|| format!("creating {}", partial.display()))?;
    let moved = transfer::copy(from, &to).await?;
    to.seal().await.context("closing the backup")?;
    if with_suffix(partial, "-wal").exists() {
        bail!("the backup's write-ahead log was not folded into it");
    }
    Ok(moved)
}

pub async fn restore(file: PathBuf, target: StoreArgs) -> anyhow::Result<i32> {
    let from =
        SqliteStore::open_read_only(&file).await.with_context(|| format!("reading the backup {}", file.display()))?;
    if target.store.is_none() {
        pcmail_store::private::make_private(&target.data_dir)
            .with_context(|| format!("making the data dir {}", target.data_dir.display()))?;
    }
    let url = target.url();
    let to = pcmail_store::open(&url, &target.data_dir).await.context("opening the target store")?;
    let moved = copy(&from, &to, &url).await?;
    report("restored", &moved, &redact_url(&url));
    Ok(0)
}

pub async fn run(command: StoreCommand) -> anyhow::Result<i32> {
    match command {
        StoreCommand::Copy { ends } => {
            let from = pcmail_store::open_to_read(&ends.from, &ends.data_dir).await.context("opening --from")?;
            let to = pcmail_store::open(&ends.to, &ends.data_dir).await.context("opening --to")?;
            let moved = copy(&from, &to, &ends.to).await?;
            report("copied", &moved, &redact_url(&ends.to));
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
    let from = pcmail_store::open_to_read(&ends.from, &ends.data_dir).await.context("opening --from")?;
    let to = pcmail_store::open_to_read(&ends.to, &ends.data_dir).await.context("opening --to")?;
    let ours = transfer::digest(&from).await.context("reading --from")?;
    let theirs = transfer::digest(&to).await.context("reading --to")?;
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
    Ok(differ.is_empty())
}

async fn copy(from: &(impl Store + Clone), to: &impl Store, url: &str) -> anyhow::Result<Moved> {
    match transfer::copy(from, to).await {
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

fn report(what: &str, moved: &Moved, to: &str) {
    let rows: Vec<String> = moved.iter().filter(|(_, n)| *n > 0).map(|(t, n)| format!("{t} {n}")).collect();
    eprintln!("{what} into {to}: {}", if rows.is_empty() { "no rows".to_string() } else { rows.join(", ") });
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
