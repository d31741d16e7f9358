//! O2/O3: `backup`, `restore`, `store copy` and `store verify`. What moves and how stores
//! compare is `pcmail_store::transfer`'s; here are the files and the words.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use pcmail_store::transfer::{self, Moved};
use pcmail_store::{AnyStore, SqliteStore, StoreError};

use crate::args::{StoreArgs, StoreCommand, StorePair};

pub async fn backup(file: PathBuf, source: StoreArgs) -> anyhow::Result<i32> {
    if file.exists() {
        bail!("{} already exists; a backup never overwrites a file (name a new one)", file.display());
    }
    let from = pcmail_store::open_to_read(&source.url(), &source.data_dir).await.context("opening the store")?;
    // Written beside its final name and renamed when whole: a FILE that exists is a whole backup.
    let partial = with_suffix(&file, ".partial");
    remove_leftover(&partial)?;
    create_private(&partial)?;
    let to = SqliteStore::open(&partial).await.with_context(|| format!("creating {}", partial.display()))?;
    let moved = transfer::copy(&from, &to).await;
    // Every connection closed: the file holds everything, with no write-ahead log beside it.
    drop(to);
    let whole = moved.and_then(|m| match with_suffix(&partial, "-wal").exists() {
        false => Ok(m),
        true => Err(StoreError::Backend("the copy's write-ahead log was not folded into it".into())),
    });
    let moved = match whole {
        Ok(m) => m,
        Err(e) => {
            remove_leftover(&partial)?;
            return Err(e).context("backup failed; no file was written");
        }
    };
    std::fs::rename(&partial, &file).with_context(|| format!("naming the backup {}", file.display()))?;
    report("backed up", &moved, &file.display().to_string());
    Ok(0)
}

pub async fn restore(file: PathBuf, target: StoreArgs) -> anyhow::Result<i32> {
    if !file.is_file() {
        bail!("no backup at {}", file.display());
    }
    if target.store.is_none() {
        pcmail_store::private::make_private(&target.data_dir)
            .with_context(|| format!("making the data dir {}", target.data_dir.display()))?;
    }
    let from = SqliteStore::open(&file).await.with_context(|| format!("opening the backup {}", file.display()))?;
    let to = pcmail_store::open(&target.url(), &target.data_dir).await.context("opening the target store")?;
    let moved = copy(&from, &to).await?;
    report("restored", &moved, &pcmail_store::redact_url(&target.url()));
    Ok(0)
}

pub async fn run(command: StoreCommand) -> anyhow::Result<i32> {
    match command {
        StoreCommand::Copy { ends } => {
            let (from, to) = open_pair(&ends, false).await?;
            let moved = copy(&from, &to).await?;
            report("copied", &moved, &pcmail_store::redact_url(&ends.to));
            Ok(0)
        }
        StoreCommand::Verify { ends } => {
            let (from, to) = open_pair(&ends, true).await?;
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
                Ok(0)
            } else {
                eprintln!("the stores differ in: {}", differ.join(", "));
                Ok(1)
            }
        }
    }
}

async fn open_pair(ends: &StorePair, both_read: bool) -> anyhow::Result<(AnyStore, AnyStore)> {
    let from = pcmail_store::open_to_read(&ends.from, &ends.data_dir).await.context("opening --from")?;
    let to = if both_read {
        pcmail_store::open_to_read(&ends.to, &ends.data_dir).await
    } else {
        pcmail_store::open(&ends.to, &ends.data_dir).await
    };
    Ok((from, to.context("opening --to")?))
}

async fn copy(from: &(impl pcmail_store::Store + Clone), to: &impl pcmail_store::Store) -> anyhow::Result<Moved> {
    match transfer::copy(from, to).await {
        Err(StoreError::NotEmpty) => bail!("{}", StoreError::NotEmpty),
        other => other.context("the copy stopped; the target holds part of the rows: empty it before trying again"),
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

/// A `.partial` file (and its SQLite companions) left by a backup that did not finish.
fn remove_leftover(partial: &Path) -> anyhow::Result<()> {
    for companion in ["", "-wal", "-shm", "-journal"] {
        let path = with_suffix(partial, companion);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(e).with_context(|| format!("removing the unfinished {}", path.display()));
            }
            _ => {}
        }
    }
    Ok(())
}

/// The backup holds every token hash and all mail: only its owner may read it (T8).
fn create_private(path: &Path) -> anyhow::Result<()> {
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path).map(drop).with_context(|| format!("creating {}", path.display()))
}
