//! P14: `backup`, `store copy` and `store verify` of P1's data set through the real
//! `pcmail-ctl`, at a tenth of it and whole. Linear in rows (10× the rows ≤ 12× the time);
//! ≥ 0.3× the rate of `sqlite3 .backup` / `pg_dump` of the same database, same run; each
//! process's peak RSS ≤ 200 MB.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use pcmail_server::ServeConfig;
use pcmail_store::Store;

use crate::flush_writes;
use crate::jobs::scratch_postgres;
use crate::pcside::bin;
use crate::reconcile::{catch_up, fill, mails};
use crate::rss::memory;
use crate::table::Row;

/// One process's wall time and peak resident memory.
#[derive(Clone, Copy)]
struct Ran {
    time: Duration,
    peak_mib: f64,
}

/// Runs `cmd` to its end; panics with its stderr when it fails (a benchmark of a failing
/// command measures nothing). The peak is the process's `VmHWM`, read while it runs: its
/// `ru_maxrss` would count this benchmark's own memory, which the kernel carries over the exec
/// of a child spawned with a shared address space. What earlier steps wrote is flushed first
/// (a copy into PostgreSQL writes a gigabyte of WAL, a backup 700 MB of file).
fn ran(cmd: &mut Command) -> Ran {
    assert!(flush_writes(), "psql -c CHECKPOINT on PCMAIL_TEST_POSTGRES's server");
    let errors = tempfile::NamedTempFile::new().expect("stderr file");
    let started = Instant::now();
    let mut child =
        cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(errors.reopen().expect("stderr")).spawn().expect("spawn");
    let mut peak_mib = 0f64;
    let status = loop {
        if let Some((_, hwm)) = memory(child.id()) {
            peak_mib = peak_mib.max(hwm);
        }
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let time = started.elapsed();
    assert!(status.success(), "{cmd:?} failed: {}", std::fs::read_to_string(errors.path()).unwrap_or_default());
    Ran { time, peak_mib }
}

fn ctl(args: &[&str]) -> Ran {
    ran(Command::new(bin()).args(args).env("PCMAIL_LOG", "warn"))
}

/// What one size measured: ours, and the baselines over the same database.
struct Sized {
    backup_sqlite: Ran,
    sqlite_dot_backup: Ran,
    copy_to_postgres: Ran,
    verify: Ran,
    backup_postgres: Ran,
    pg_dump: Ran,
    /// Beside the rows into and out of PostgreSQL, what sets their pace, over the same rows:
    /// SQLite's writer (`store copy` of the backup from PostgreSQL into a new SQLite file: the
    /// same writer, no checksums, no seal), and PostgreSQL's own load (`pg_restore -j 2` of
    /// `pg_dump`'s file, without the search indexes a copy leaves to `serve`).
    sqlite_import: Ran,
    pg_restore: Ran,
    /// The search indexes a copy into PostgreSQL leaves to the first `serve`'s indexer, built
    /// as it builds them (`CONCURRENTLY`), after the copy: not part of the copy's time.
    search_after_copy: Duration,
}

async fn measure(total: u64, postgres_name: &str) -> Option<Sized> {
    let (_admin, pg) = scratch_postgres(postgres_name).await?;
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let app = pcmail_server::start(&ServeConfig::on(dir.path().to_path_buf())).await.expect("start");
        fill(&app, total, chrono::Utc::now()).await;
        catch_up(&app).await;
    }
    if let Some(keep) = std::env::var_os("PCMAIL_BENCH_KEEP") {
        // For a profile of one step: the filled data dir, kept (`perf record pcmail-ctl backup …`).
        let kept = Path::new(&keep).join(format!("p14-{total}"));
        let _ = std::fs::create_dir_all(&kept);
        // The files as the steps find them (a WAL not yet checkpointed into the file), and a
        // page copy of them.
        let raw = kept.join("raw");
        let _ = std::fs::create_dir_all(&raw);
        for name in ["pcmail.db", "pcmail.db-wal"] {
            let _ = std::fs::copy(dir.path().join(name), raw.join(name));
        }
        let _ = dot_backup(&dir.path().join("pcmail.db"), &kept.join("pcmail.db")).status();
        eprintln!("P14: kept the {total}-mail data dir in {}", kept.display());
    }
    let db = dir.path().join("pcmail.db");
    let sqlite_url = format!("sqlite:{}", db.display());
    let out = |name: &str| dir.path().join(name).display().to_string();
    let data_dir = dir.path().display().to_string();

    let backup_sqlite = ctl(&["backup", &out("ours.db"), "--data-dir", &data_dir]);
    let sqlite_dot_backup = ran(&mut dot_backup(&db, Path::new(&out("dot-backup.db"))));
    let copy_to_postgres = ctl(&["store", "copy", "--from", &sqlite_url, "--to", &pg, "--data-dir", &data_dir]);
    let verify = ctl(&["store", "verify", "--from", &sqlite_url, "--to", &pg, "--data-dir", &data_dir]);
    let backup_postgres = ctl(&["backup", &out("ours-pg.db"), "--store", &pg, "--data-dir", &data_dir]);
    let pg_dump = ran(Command::new("pg_dump").args(["--format=custom", "--compress=0", "-f", &out("pg.dump"), &pg]));
    let started = Instant::now();
    let copied = pcmail_store::PgStore::open(&pg).await.expect("the copy opens");
    assert!(copied.index_search(0).await.expect("search indexes built").building, "the copy deferred them");
    let search_after_copy = started.elapsed();
    drop(copied);
    let (from, to) = (format!("sqlite:{}", out("ours-pg.db")), format!("sqlite:{}", out("imported.db")));
    let sqlite_import = ctl(&["store", "copy", "--from", &from, "--to", &to, "--data-dir", &data_dir]);
    let pg_restore = restore_without_search(&out("pg.dump"), &pg, &format!("{postgres_name}_restore")).await?;
    eprintln!("P14: {total} mails moved ({})", size_of(&db));
    Some(Sized {
        backup_sqlite,
        sqlite_dot_backup,
        copy_to_postgres,
        verify,
        backup_postgres,
        pg_dump,
        sqlite_import,
        pg_restore,
        search_after_copy,
    })
}

/// `pg_restore -j 2` of `dump` (of `source`) into a new database `name`, leaving out the
/// search (GIN) indexes as a copy does (`source` is itself a copy, whose search indexes the
/// first `serve` builds: until then its dump holds none to leave out). The database is dropped
/// after, so that nothing of it (its autovacuum) runs on into the next targets.
async fn restore_without_search(dump: &str, source: &str, name: &str) -> Option<Ran> {
    let (admin, target) = scratch_postgres(name).await?;
    let sql = "SELECT c.relname FROM pg_class c JOIN pg_am a ON a.oid = c.relam WHERE a.amname = 'gin'";
    let gin = Command::new("psql").args([source, "-AtXwc", sql]).output().expect("psql");
    assert!(gin.status.success(), "psql listing the search indexes: {}", String::from_utf8_lossy(&gin.stderr));
    let gin: Vec<String> =
        String::from_utf8_lossy(&gin.stdout).lines().map(|n| format!(" INDEX public {n} ")).collect();
    let listed = Command::new("pg_restore").args(["-l", dump]).output().expect("pg_restore -l");
    assert!(listed.status.success(), "pg_restore -l: {}", String::from_utf8_lossy(&listed.stderr));
    let kept: String = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .filter(|line| !gin.iter().any(|g| line.contains(g.as_str())))
        .map(|line| format!("{line}\n"))
        .collect();
    assert!(kept.contains(" TABLE DATA public mail "), "pg_restore -l lists mail's rows:\n{kept}");
    let list = tempfile::NamedTempFile::new().expect("list file");
    std::fs::write(list.path(), kept).expect("list");
    let list = list.path().display().to_string();
    let restored = ran(Command::new("pg_restore").args(["-j", "2", "-L", &list, "-d", &target, dump]));
    admin.batch_execute(&format!("DROP DATABASE {name} WITH (FORCE)")).await.expect("drop the restored database");
    Some(restored)
}

/// `sqlite3 FROM ".backup 'TO'"`: SQLite's own page copy, P14's SQLite baseline.
fn dot_backup(from: &Path, to: &Path) -> Command {
    let mut cmd = Command::new("sqlite3");
    cmd.arg(from).arg(format!(".backup '{}'", to.display()));
    cmd
}

fn size_of(path: &Path) -> String {
    let bytes = std::fs::metadata(path).map(|m| m.len()).unwrap_or(0);
    format!("{:.0} MB SQLite file", bytes as f64 / 1e6)
}

pub async fn p14() -> Vec<Row> {
    let total = mails();
    let (Some(small), Some(whole)) =
        (measure(total / 10, "pcmail_bench_p14_small").await, measure(total, "pcmail_bench_p14").await)
    else {
        return vec![Row::note("P14", "not run: PCMAIL_TEST_POSTGRES unreachable", "")];
    };
    let secs = |r: Ran| format!("{:.2} s", r.time.as_secs_f64());
    let rate = |ours: Ran, base: Duration| base.as_secs_f64() / ours.time.as_secs_f64();
    // Ours, its baseline over the same database, and its figure at a tenth of the rows.
    let ops: [(&str, Ran, Duration, Ran, &str); 4] = [
        ("backup, SQLite", whole.backup_sqlite, whole.sqlite_dot_backup.time, small.backup_sqlite, "sqlite3 .backup"),
        ("backup, PostgreSQL", whole.backup_postgres, whole.pg_dump.time, small.backup_postgres, "pg_dump"),
        (
            "store copy SQLite → PostgreSQL",
            whole.copy_to_postgres,
            whole.pg_dump.time,
            small.copy_to_postgres,
            "pg_dump",
        ),
        (
            "store verify SQLite ↔ PostgreSQL",
            whole.verify,
            whole.sqlite_dot_backup.time + whole.pg_dump.time,
            small.verify,
            "sqlite3 .backup + pg_dump",
        ),
    ];
    let mut rows = Vec::new();
    for (what, ours, base, tenth, baseline) in ops {
        rows.push(Row::at_least(
            "P14",
            format!("{what}, {total} mails: rate ÷ {baseline}"),
            rate(ours, base),
            0.3,
            "×",
        ));
        rows.push(Row::note(
            "",
            format!("{what}: ours / {baseline}"),
            format!("{} / {:.2} s", secs(ours), base.as_secs_f64()),
        ));
        rows.push(Row::at_most(
            "",
            format!("{what}: time at {total} ÷ at {} mails", total / 10),
            ours.time.as_secs_f64() / tenth.time.as_secs_f64(),
            12.0,
            "×",
        ));
        rows.push(Row::at_most(
            "",
            format!("{what}: peak RSS at {total} mails"),
            ours.peak_mib.max(tenth.peak_mib),
            200.0,
            "MiB",
        ));
    }
    // Beside the rows into and out of PostgreSQL, what sets their pace, over the same rows.
    let paces = [
        (
            "backup, PostgreSQL",
            whole.backup_postgres,
            whole.sqlite_import,
            "SQLite's writer alone (store copy of the same rows SQLite → SQLite, no checksums)",
        ),
        (
            "store copy SQLite → PostgreSQL",
            whole.copy_to_postgres,
            whole.pg_restore,
            "PostgreSQL's own load (pg_restore -j 2 of the dump, no search indexes)",
        ),
    ];
    for (what, ours, pace, how) in paces {
        rows.push(Row::note("", format!("{what}: beside it, {how}"), secs(pace)));
        rows.push(Row::note(
            "",
            format!("{what}: that rate ÷ pg_dump's"),
            format!("{:.2} ×", rate(pace, whole.pg_dump.time)),
        ));
        rows.push(Row::note("", format!("{what}: our rate ÷ that rate"), format!("{:.2} ×", rate(ours, pace.time))));
    }
    rows.push(Row::note(
        "",
        "after the copy: its search indexes, built by serve's indexer (CONCURRENTLY)",
        format!("{:.2} s", whole.search_after_copy.as_secs_f64()),
    ));
    rows
}
