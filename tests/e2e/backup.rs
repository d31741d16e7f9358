//! E14 end to end: a backup's checksums (each tab's and the whole file's) catch a bit flipped
//! anywhere, and `restore` says what it brings back and drops, refusing without `--force` to go
//! back in time or to replace machine tokens.

use std::path::Path;
use std::process::{Command, Output};

use crate::harness::{BIN, PgScratch, Server, eventually, examples, ok, stderr};

/// `pcmail-ctl` with no server or token: the store verbs need neither.
fn offline(args: &[&str]) -> Output {
    Command::new(BIN).args(args).env_remove("PCMAIL_STORE").output().expect("pcmail-ctl")
}

fn backup_of(s: &Server, file: &Path) {
    let data = s.dir.path().join("data").display().to_string();
    ok(offline(&["backup", &file.display().to_string(), "--data-dir", &data]));
}

fn restore(file: &Path, data: &Path, force: bool) -> Output {
    let (file, data) = (file.display().to_string(), data.display().to_string());
    let mut args = vec!["restore", file.as_str(), "--data-dir", data.as_str()];
    if force {
        args.push("--force");
    }
    offline(&args)
}

/// A text value of `tab` as the backup holds it (the longest one of the first row, so it is
/// found nowhere else by chance).
fn a_value_of(backup: &Path, tab: &str) -> String {
    let db = rusqlite::Connection::open_with_flags(backup, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY).expect("ro");
    let mut stmt = db.prepare(&format!("SELECT * FROM {tab} LIMIT 1")).expect("select");
    let n = stmt.column_count();
    let row: Vec<String> = stmt
        .query_row([], |r| Ok((0..n).filter_map(|i| r.get::<_, String>(i).ok()).collect()))
        .unwrap_or_else(|e| panic!("{tab} has a row: {e}"));
    row.into_iter().max_by_key(String::len).filter(|v| v.len() >= 8).unwrap_or_else(|| panic!("{tab}: no text"))
}

/// A copy of `backup` with one bit flipped in every place its bytes hold `needle` (a row and
/// any index over it), or at `at`.
fn flipped(backup: &Path, dir: &Path, name: &str, needle: Option<&str>, at: Option<usize>) -> std::path::PathBuf {
    let mut bytes = std::fs::read(backup).expect("read");
    let mut places: Vec<usize> = at.into_iter().collect();
    if let Some(needle) = needle {
        let n = needle.as_bytes();
        places.extend(bytes.windows(n.len()).enumerate().filter(|(_, w)| *w == n).map(|(i, _)| i + n.len() / 2));
    }
    assert!(!places.is_empty(), "{name}: {needle:?} is in the file");
    for i in places {
        bytes[i] ^= 0x04;
    }
    let out = dir.join(format!("{name}.db"));
    std::fs::write(&out, bytes).expect("write");
    out
}

#[test]
fn e14_a_bit_flipped_anywhere_in_a_backup_fails_restore_and_verify_naming_the_tab_or_the_file() {
    let s = Server::start();
    let desk = s.token("desk");
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "pay", "--body", "wire 100 EUR to ZEBRA-0042"]));
    ok(s.ctl(&desk, &["poll"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let backup = dir.path().join("b.db");
    backup_of(&s, &backup);
    let source = format!("sqlite:{}", s.dir.path().join("data/pcmail.db").display());
    let verify =
        |file: &Path| offline(&["store", "verify", "--from", &format!("sqlite:{}", file.display()), "--to", &source]);
    let fine = verify(&backup);
    assert_eq!(fine.status.code(), Some(0), "untouched it verifies: {}", stderr(&fine));

    let mut cases: Vec<(String, std::path::PathBuf)> = ["mail", "tokens", "specs", "events", "leases"]
        .into_iter()
        .map(|tab| {
            let value = a_value_of(&backup, tab);
            (format!("checksums in: {tab}"), flipped(&backup, dir.path(), tab, Some(&value), None))
        })
        .collect();
    // The header (SQLite's magic string) and the whole-file checksum itself: only the file says.
    for (name, at) in [("header", 3), ("file-sum", 69)] {
        cases.push(("checksums in: the file".into(), flipped(&backup, dir.path(), name, None, Some(at))));
    }
    for (needle, file) in cases {
        let target = dir.path().join(format!("restored-{}", file.file_stem().and_then(|n| n.to_str()).unwrap_or("")));
        let out = restore(&file, &target, false);
        assert!(!out.status.success() && stderr(&out).contains(&needle), "restore {file:?}: {}", stderr(&out));
        assert!(!target.join("pcmail.db").exists(), "{file:?}: checked before anything is written");
        let out = verify(&file);
        assert!(
            out.status.code().is_some_and(|c| c >= 2) && stderr(&out).contains(&needle),
            "verify {file:?}: {}",
            stderr(&out)
        );
    }
}

fn mails_in(data: &Path) -> i64 {
    let db = rusqlite::Connection::open(data.join("pcmail.db")).expect("db");
    db.query_row("SELECT count(*) FROM mail", [], |r| r.get(0)).expect("count")
}

#[test]
fn e14_restore_of_an_older_backup_refuses_without_force_lists_what_it_drops_and_force_does_it() {
    let mut s = Server::start();
    let desk = s.token("desk");
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--body", "before the backup"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let backup = dir.path().join("older.db");
    backup_of(&s, &backup);
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--body", "after the backup"]));
    s.terminate();
    let data = s.dir.path().join("data");

    let out = restore(&backup, &data, false);
    let said = stderr(&out);
    assert!(!out.status.success(), "going back in time needs --force: {said}");
    assert!(said.contains("the backup brings back:") && said.contains("mail 1"), "{said}");
    assert!(said.contains("holds, and the restore drops:") && said.contains("mail 2"), "{said}");
    assert!(said.contains("newest mail") && said.contains("tokens of desk"), "{said}");
    assert!(said.contains("refused: the target holds newer mail than the backup (seq 2 against 1)"), "{said}");
    assert_eq!(mails_in(&data), 2, "nothing was changed");

    let out = restore(&backup, &data, true);
    assert!(out.status.success(), "--force does it: {}", stderr(&out));
    assert_eq!(mails_in(&data), 1, "the store is the backup's");
    assert!(!data.join("pcmail.db.restoring").exists());
    s.spawn();
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--body", "the old token still works"]));
}

#[test]
fn e14_another_servers_backup_refuses_without_force_to_replace_machine_tokens() {
    let theirs = Server::start();
    let their_desk = theirs.token("desk");
    ok(theirs.ctl(&their_desk, &["send", "--to", "laptop", "--body", "elsewhere"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let backup = dir.path().join("theirs.db");
    backup_of(&theirs, &backup);
    drop(theirs);

    let mut ours = Server::start();
    let our_desk = ours.token("desk");
    ours.terminate();
    let data = ours.dir.path().join("data");
    let out = restore(&backup, &data, false);
    let said = stderr(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("refused: the backup's machine tokens differ from the target's (desk)"), "{said}");
    assert!(!said.contains("newer mail"), "no mail goes back in time: {said}");

    ok(restore(&backup, &data, true));
    ours.spawn();
    let refused = ours.ctl(&our_desk, &["inbox"]);
    assert!(!refused.status.success(), "this server's old token was replaced");
    ok(ours.ctl(&their_desk, &["inbox"]));
}

/// V5: a backup of each earlier schema — today's rows through only the columns that schema has
/// — restores directly into an empty data dir, migrated to today's; the oldest one is served.
#[test]
fn v5_restore_of_a_backup_of_each_earlier_schema_works_directly() {
    use pcmail_store::sqlite::schema;
    let s = Server::start();
    let desk = s.token("desk");
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "from an earlier release", "--body", "b"]));
    let dir = tempfile::tempdir().expect("tempdir");
    let today = dir.path().join("today.db");
    backup_of(&s, &today);
    let (_, known) = schema::versions_at(&today).expect("today's schema");
    for k in 1..known {
        let old = dir.path().join(format!("schema-{k}.db"));
        schema::create_at(&old, k).expect("an earlier schema");
        let copied = schema::copy_rows_as_at(&old, &today, &old).expect("rows valid at k");
        assert!(copied.contains(&("mail", 1)), "schema {k}: {copied:?}");
        let data = dir.path().join(format!("restored-{k}"));
        let out = restore(&old, &data, false);
        let said = stderr(&out);
        assert!(out.status.success(), "schema {k}: {said}");
        assert!(said.contains(&format!("is of schema {k} (this build's is {known})")), "{said}");
        assert_eq!(mails_in(&data), 1, "schema {k}");
        assert_eq!(schema::versions_at(&data.join("pcmail.db")).expect("version"), (known, known));
        assert_eq!(
            std::fs::read_dir(&data)
                .expect("dir")
                .filter_map(Result::ok)
                .filter(|e| { e.file_name().to_string_lossy().starts_with(".restore-schema") })
                .count(),
            0,
            "the migrated copy is gone"
        );
    }
    let restored = dir.path().join("restored-1");
    let s1 = Server::start_logged_on(None, &[], |data| {
        std::fs::rename(&restored, data).expect("the restored store as a data dir");
    });
    let inbox = crate::harness::json(s1.ctl(&s1.token("laptop"), &["inbox", "-o", "json"]));
    assert_eq!(inbox["items"][0]["subject"], "from an earlier release", "{inbox}");
}

/// `backup` or `restore` of the store `url` names, its working copy (a spreadsheet's) in `data`.
fn with_store(verb: &str, file: &Path, url: &str, data: &Path, force: bool) -> Output {
    let (file, data) = (file.display().to_string(), data.display().to_string());
    let mut args = vec![verb, file.as_str(), "--store", url, "--data-dir", data.as_str()];
    if force {
        args.push("--force");
    }
    offline(&args)
}

/// A server on `url` that sent one mail, was backed up into `backup`, sent two more and
/// stopped: the store now runs further than its backup.
fn ahead_of_its_backup(url: &str, backup: &Path) -> (Server, String) {
    let s = Server::start_opts(Some(examples()), "127.0.0.1:0", &["--store", url]);
    let desk = s.token("desk");
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "before the backup", "--body", "b"]));
    let data = s.dir.path().join("data");
    ok(with_store("backup", backup, url, &data, false));
    for n in 1..=2 {
        ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", &format!("after the backup {n}"), "--body", "b"]));
    }
    (s, desk)
}

/// What `restore` says before it changes anything: what comes back and what goes.
fn says_what_it_brings_and_drops(said: &str) {
    assert!(said.contains("the backup brings back:") && said.contains("mail 1"), "{said}");
    assert!(said.contains("holds, and the restore drops:") && said.contains("mail 3"), "{said}");
}

#[test]
fn e14_restore_force_replaces_a_postgresql_store_in_one_transaction_after_saying_what_it_drops() {
    let pg = PgScratch::new();
    let dir = tempfile::tempdir().expect("tempdir");
    let backup = dir.path().join("older.db");
    let (mut s, desk) = ahead_of_its_backup(&pg.url, &backup);
    s.terminate();
    let identity = pg.query("SELECT value FROM kv WHERE key = 'store/identity'");
    let data = s.dir.path().join("data");

    let out = with_store("restore", &backup, &pg.url, &data, false);
    let said = stderr(&out);
    assert!(!out.status.success(), "going back in time needs --force: {said}");
    says_what_it_brings_and_drops(&said);
    assert!(said.contains("refused: the target holds newer mail than the backup"), "{said}");
    assert_eq!(pg.query("SELECT count(*) FROM mail"), [["3"]], "nothing was changed");

    let out = with_store("restore", &backup, &pg.url, &data, true);
    let said = stderr(&out);
    assert!(out.status.success(), "--force replaces what PostgreSQL held: {said}");
    says_what_it_brings_and_drops(&said);
    assert!(said.contains("restore: ") && said.contains("mail 1") && said.contains(" rows in "), "{said}");
    assert_eq!(pg.query("SELECT subject FROM mail"), [["before the backup"]], "the store is the backup's");
    assert_ne!(pg.query("SELECT value FROM kv WHERE key = 'store/identity'"), identity, "E5: another store");
    s.spawn();
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "after the restore", "--body", "b"]));
    let seqs = pg.query("SELECT seq FROM mail ORDER BY seq");
    assert_eq!(seqs.len(), 2, "{seqs:?}");
    assert!(seqs[1][0].parse::<i64>().unwrap() > seqs[0][0].parse::<i64>().unwrap(), "numbered after: {seqs:?}");
}

#[test]
fn e14_restore_force_replaces_a_spreadsheets_rows_and_the_sheet_shows_the_backups() {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let standin = rt.block_on(crate::standin::Standin::start());
    let url = standin.store_url("");
    let dir = tempfile::tempdir().expect("tempdir");
    let backup = dir.path().join("older.db");
    let (mut s, desk) = ahead_of_its_backup(&url, &backup);
    let subjects = || -> Vec<String> {
        let cells = standin.cells("mail");
        let column = cells.first().and_then(|h| h.iter().position(|c| c == "subject")).unwrap_or(usize::MAX);
        cells.iter().skip(1).filter_map(|r| r.get(column).and_then(|v| v.as_str()).map(String::from)).collect()
    };
    eventually(30, "the three mails on the sheet", || (subjects().len() == 3).then_some(()));
    s.terminate();
    let data = s.dir.path().join("data");

    let out = with_store("restore", &backup, &url, &data, false);
    let said = stderr(&out);
    assert!(!out.status.success() && said.contains("refused: the target holds newer mail"), "{said}");
    assert_eq!(subjects().len(), 3, "nothing was changed");

    let out = with_store("restore", &backup, &url, &data, true);
    let said = stderr(&out);
    assert!(out.status.success(), "--force replaces what the spreadsheet held: {said}");
    says_what_it_brings_and_drops(&said);
    assert_eq!(subjects(), ["before the backup"], "the sheet shows the backup's mail once restore ends");
    s.spawn();
    ok(s.ctl(&desk, &["send", "--to", "laptop", "--subject", "after the restore", "--body", "b"]));
    eventually(30, "the new mail on the sheet beside the restored one", || {
        (subjects() == ["before the backup", "after the restore"]).then_some(())
    });
}
