//! Starting, killing and restarting `serve`, and running CLI verbs against it.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

pub const BIN: &str = env!("CARGO_BIN_EXE_pcmail-ctl");

pub fn examples() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("manifests/examples")
}

pub struct Server {
    pub dir: tempfile::TempDir,
    pub url: String,
    child: Option<Child>,
    apply: Option<PathBuf>,
    listen: String,
    extra: Vec<String>,
    /// The open-file limit serve runs under (`ulimit -n`), when a test sets one.
    nofile: Option<u64>,
    /// The CA the CLI trusts (`PCMAIL_CA`) for a server on HTTPS.
    pub ca: Option<PathBuf>,
    /// More variables in serve's environment.
    env: Vec<(String, String)>,
    /// The `pcmail-ctl` that serves, when not this build's (the previous release's, V5).
    bin: Option<PathBuf>,
}

impl Server {
    /// A server on a fresh data dir with the example manifests applied at start.
    pub fn start() -> Server {
        Server::start_with(Some(examples()))
    }

    pub fn start_with(apply: Option<PathBuf>) -> Server {
        Server::start_opts(apply, "127.0.0.1:0", &[])
    }

    /// A fixed `listen` keeps the address across restarts (for a scraping Prometheus).
    pub fn start_opts(apply: Option<PathBuf>, listen: &str, extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let extra = extra.iter().map(|s| s.to_string()).collect();
        let mut s = Server {
            dir,
            url: String::new(),
            child: None,
            apply,
            listen: listen.to_string(),
            extra,
            nofile: None,
            ca: None,
            env: vec![],
            bin: None,
        };
        s.spawn();
        s
    }

    /// [`Server::start_opts`] with more variables in serve's environment (a secret that must
    /// reach no child of serve's).
    pub fn start_env(apply: Option<PathBuf>, extra: &[&str], env: &[(&str, &str)]) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut s = Server {
            dir,
            url: String::new(),
            child: None,
            apply,
            listen: "127.0.0.1:0".to_string(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            nofile: None,
            ca: None,
            env: env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            bin: None,
        };
        s.spawn();
        s
    }

    /// A server whose open-file limit is `nofile` (soft and hard, as `ulimit -n` sets both), its
    /// log kept in [`Server::log`].
    pub fn start_limited(nofile: u64, extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("serve.log"), "").expect("serve.log");
        let extra = extra.iter().map(|s| s.to_string()).collect();
        let mut s = Server {
            dir,
            url: String::new(),
            child: None,
            apply: Some(examples()),
            listen: "127.0.0.1:0".into(),
            extra,
            nofile: Some(nofile),
            ca: None,
            env: vec![],
            bin: None,
        };
        s.spawn();
        s
    }

    /// A server on HTTPS at `listen` with this certificate and key; the CLI trusts `ca`.
    /// Over HTTPS; what serve logs is kept in [`Server::log`].
    pub fn start_tls(listen: &str, cert: &Path, key: &Path, ca: &Path) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("serve.log"), "").expect("serve.log");
        let extra =
            vec!["--tls-cert".into(), cert.display().to_string(), "--tls-key".into(), key.display().to_string()];
        let mut s = Server {
            dir,
            url: String::new(),
            child: None,
            apply: Some(examples()),
            listen: listen.into(),
            extra,
            nofile: None,
            ca: Some(ca.to_path_buf()),
            env: vec![],
            bin: None,
        };
        s.spawn();
        s
    }

    /// As [`Server::start_opts`], with what serve logs kept in [`Server::log`].
    pub fn start_logged(apply: Option<PathBuf>) -> Server {
        Server::start_logged_opts(apply, &[])
    }

    pub fn start_logged_opts(apply: Option<PathBuf>, extra: &[&str]) -> Server {
        Server::start_logged_on(apply, extra, |_| {})
    }

    /// As [`Server::start_logged_opts`], with `prepare` run on the data dir's path before serve
    /// first starts (a small disk mounted there).
    pub fn start_logged_on(apply: Option<PathBuf>, extra: &[&str], prepare: impl FnOnce(&Path)) -> Server {
        let mut s = Server::unstarted_logged_on(apply, extra, prepare);
        s.spawn();
        s
    }

    /// [`Server::start_logged_on`] short of starting serve, for a test that sets its
    /// environment first ([`Server::set_env`]) and then calls [`Server::spawn`].
    pub fn unstarted_logged_on(apply: Option<PathBuf>, extra: &[&str], prepare: impl FnOnce(&Path)) -> Server {
        let s = Server::start_opts_unstarted(apply, extra);
        prepare(&s.dir.path().join("data"));
        std::fs::write(s.dir.path().join("serve.log"), "").expect("serve.log");
        s
    }

    /// What serve has logged so far (a server started with [`Server::start_logged`]).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("serve.log")).unwrap_or_default()
    }

    /// Another replica of `first` (C1): its own data dir and port, the same admin token, store
    /// and manifests.
    pub fn replica_of(first: &Server) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("data")).expect("data dir");
        std::fs::copy(first.dir.path().join("data/admin.token"), dir.path().join("data/admin.token"))
            .expect("share the admin token");
        let listen =
            if first.listen.ends_with(":0") { first.listen.clone() } else { format!("127.0.0.1:{}", free_port()) };
        let mut s = Server {
            dir,
            url: String::new(),
            child: None,
            apply: first.apply.clone(),
            listen,
            extra: first.extra.clone(),
            nofile: first.nofile,
            ca: first.ca.clone(),
            env: vec![],
            bin: first.bin.clone(),
        };
        s.spawn();
        s
    }

    /// [`Server::start_opts`] served by another build's `pcmail-ctl` (the previous release's).
    pub fn start_bin(bin: &Path, apply: Option<PathBuf>, extra: &[&str]) -> Server {
        let mut s = Server::start_opts_unstarted(apply, extra);
        s.bin = Some(bin.to_path_buf());
        s.spawn();
        s
    }

    /// [`Server::replica_of`] served by `bin` (a replica of another release, V5).
    pub fn replica_on(first: &Server, bin: &Path) -> Server {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(dir.path().join("data")).expect("data dir");
        std::fs::copy(first.dir.path().join("data/admin.token"), dir.path().join("data/admin.token"))
            .expect("share the admin token");
        let mut s = Server::start_opts_unstarted(first.apply.clone(), &[]);
        s.dir = dir;
        s.extra = first.extra.clone();
        s.bin = Some(bin.to_path_buf());
        s.spawn();
        s
    }

    fn start_opts_unstarted(apply: Option<PathBuf>, extra: &[&str]) -> Server {
        Server {
            dir: tempfile::tempdir().expect("tempdir"),
            url: String::new(),
            child: None,
            apply,
            listen: "127.0.0.1:0".into(),
            extra: extra.iter().map(|s| s.to_string()).collect(),
            nofile: None,
            ca: None,
            env: vec![],
            bin: None,
        }
    }

    /// Whether this replica holds the leader lease, as its `/metrics` says.
    pub fn is_leader(&self) -> bool {
        self.metric("pcmail_leader") == Some(1.0)
    }

    /// The value of one series of `/metrics` (`pcmail_waits_parked{kind="poll"}`), if it is there.
    pub fn metric(&self, series: &str) -> Option<f64> {
        let rt = tokio::runtime::Runtime::new().expect("rt");
        let body =
            rt.block_on(async { reqwest::get(format!("{}/metrics", self.url)).await.ok()?.text().await.ok() })?;
        body.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// As [`Server::metric`], through `http` (a server over TLS).
    pub fn metric_over(&self, http: &reqwest::blocking::Client, series: &str) -> Option<f64> {
        let body = http.get(format!("{}/metrics", self.url)).send().ok()?.text().ok()?;
        body.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// Until `n` waits of `kind` (`poll`, `status`) are parked on this server: what a test
    /// sends next must wake them, not find them not yet asking.
    pub fn await_parked(&self, kind: &str, n: u32) {
        let series = format!("pcmail_waits_parked{{kind=\"{kind}\"}}");
        eventually(10, &format!("{n} parked {kind} wait(s)"), || {
            (self.metric(&series) == Some(f64::from(n))).then_some(())
        });
    }

    /// Until `reconciler` (`notify`, `mail-sweep`, …) has finished `passes` more passes than when
    /// asked: a test that checks "nothing more happens" then knows the controller looked again,
    /// instead of hoping a sleep was long enough.
    pub fn await_passes(&self, reconciler: &str, passes: u32) {
        let series = format!("pcmail_reconcile_duration_seconds_count{{reconciler=\"{reconciler}\"}}");
        let from = self.metric(&series).unwrap_or(0.0);
        eventually(30, &format!("{passes} more {reconciler} pass(es)"), || {
            (self.metric(&series).unwrap_or(0.0) >= from + f64::from(passes)).then_some(())
        });
    }

    /// The variables added to serve's environment from its next start on (E13: a faked clock
    /// for one run and not the next).
    pub fn set_env(&mut self, env: &[(&str, &str)]) {
        self.env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    }

    /// Starts `serve` again on the same data dir (and the same port, if it was fixed).
    pub fn spawn(&mut self) {
        let mut cmd = Command::new(self.bin.as_deref().unwrap_or(Path::new(BIN)));
        cmd.args(["serve", "--listen", &self.listen])
            .args(&self.extra)
            .arg("--data-dir")
            .arg(self.dir.path().join("data"));
        if let Some(a) = &self.apply {
            cmd.arg("--apply").arg(a);
        }
        #[cfg(unix)]
        if let Some(n) = self.nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: setrlimit is async-signal-safe and touches only the child.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit { rlim_cur: n, rlim_max: n };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) == 0 {
                        Ok(())
                    } else {
                        Err(std::io::Error::last_os_error())
                    }
                });
            }
        }
        // `serve.log` in the test's dir, when a test reads what serve logged.
        let log = self.dir.path().join("serve.log");
        let stderr = if log.exists() {
            Stdio::from(std::fs::OpenOptions::new().append(true).open(&log).expect("serve.log"))
        } else {
            Stdio::inherit()
        };
        // Warnings and errors, unless the test asks for another filter in its environment.
        cmd.env("PCMAIL_LOG", "warn").envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut child = cmd.stdout(Stdio::piped()).stderr(stderr).spawn().expect("spawn serve");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {}
        });
        let line = rx.recv_timeout(Duration::from_secs(30)).expect("serve did not report its address");
        self.url = line.rsplit(' ').next().expect("address").to_string();
        self.child = Some(child);
    }

    /// The running serve's process id (for its `/proc/PID/status`).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn admin_token(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("data/admin.token")).expect("admin token").trim().to_string()
    }

    /// SIGKILL, as a crash or the OOM killer would.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM, as systemd stops a service; answers the exit code and how long it took.
    pub fn terminate(&mut self) -> (Option<i32>, Duration) {
        let mut child = self.child.take().expect("running");
        let started = std::time::Instant::now();
        let sent = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill");
        assert!(sent.success());
        let status = child.wait().expect("wait");
        (status.code(), started.elapsed())
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// Runs a CLI verb as `token` with a private PCMAIL_HOME per token.
    pub fn ctl(&self, token: &str, args: &[&str]) -> Output {
        self.ctl_stdin(token, args, None)
    }

    /// The PCMAIL_HOME that `ctl` uses for `token`: one per machine, as on separate PCs.
    pub fn home_of(&self, token: &str) -> PathBuf {
        self.dir.path().join(format!("home-{}", &token[token.len().saturating_sub(8)..]))
    }

    /// Runs `hook EVENT` in `token`'s home with `input` on stdin and no server settings at all.
    pub fn hook(&self, token: &str, event: &str, input: serde_json::Value) -> Output {
        let mut child = Command::new(BIN)
            .args(["hook", event])
            .env("PCMAIL_HOME", self.home_of(token))
            .env_remove("PCMAIL_SERVER")
            .env_remove("PCMAIL_TOKEN")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn hook");
        use std::io::Write;
        child.stdin.take().expect("stdin").write_all(input.to_string().as_bytes()).expect("stdin");
        child.wait_with_output().expect("hook output")
    }

    pub fn ctl_stdin(&self, token: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
        self.ctl_via(Path::new(BIN), &self.url, token, args, stdin)
    }

    /// Runs `bin` (another release's `pcmail-ctl`) as `token` against `url` (this server, or a
    /// proxy in front of it), in the same home [`Server::ctl`] uses for `token`.
    pub fn ctl_via(&self, bin: &Path, url: &str, token: &str, args: &[&str], stdin: Option<&[u8]>) -> Output {
        let home = self.home_of(token);
        let mut cmd = Command::new(bin);
        match &self.ca {
            Some(ca) => cmd.env("PCMAIL_CA", ca),
            None => cmd.env_remove("PCMAIL_CA"),
        };
        let mut child = cmd
            .args(args)
            .env("PCMAIL_SERVER", url)
            .env("PCMAIL_TOKEN", token)
            .env("PCMAIL_HOME", home)
            .env_remove("PCMAIL_AS")
            .current_dir(self.dir.path())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn ctl");
        if let Some(input) = stdin {
            use std::io::Write;
            child.stdin.take().expect("stdin").write_all(input).expect("write stdin");
        }
        drop(child.stdin.take());
        child.wait_with_output().expect("ctl output")
    }

    pub fn admin(&self, args: &[&str]) -> Output {
        self.ctl(&self.admin_token(), args)
    }

    /// Issues a machine token for `machine` and returns it.
    pub fn token(&self, machine: &str) -> String {
        let out = self.admin(&["token", "issue", machine]);
        assert!(out.status.success(), "token issue {machine}: {}", stderr(&out));
        stdout(&out).trim().to_string()
    }

    pub fn http(&self) -> reqwest::Client {
        reqwest::Client::new()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

pub fn code(o: &Output) -> i32 {
    o.status.code().unwrap_or(-1)
}

/// Runs a CLI verb that must succeed and returns its stdout, trimmed.
#[track_caller]
pub fn ok(o: Output) -> String {
    assert!(o.status.success(), "exit {}: {}{}", code(&o), stdout(&o), stderr(&o));
    stdout(&o).trim().to_string()
}

pub fn json(o: Output) -> serde_json::Value {
    serde_json::from_str(&ok(o)).expect("json output")
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

/// Polls `check` every 100 ms until it returns Some, or panics after `secs` seconds.
#[track_caller]
pub fn eventually<T>(secs: u64, what: &str, mut check: impl FnMut() -> Option<T>) -> T {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = check() {
            return v;
        }
        assert!(std::time::Instant::now() < deadline, "timed out after {secs}s waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A database of its own on the test PostgreSQL (`PCMAIL_TEST_POSTGRES`, which `.ci/run`
/// starts), dropped when the test ends.
pub struct PgScratch {
    pub url: String,
    name: String,
}

fn pg_admin_url() -> String {
    std::env::var("PCMAIL_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

fn pg_admin(sql: &str) {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    rt.block_on(async {
        let (client, conn) = tokio_postgres::connect(&pg_admin_url(), tokio_postgres::NoTls)
            .await
            .expect("PostgreSQL (.ci/run starts it)");
        tokio::spawn(conn);
        client.batch_execute(sql).await.expect(sql);
    });
}

impl PgScratch {
    pub fn new() -> PgScratch {
        let name = format!("pcmail_e2e_{}_{}", std::process::id(), free_port());
        pg_admin(&format!("CREATE DATABASE {name}"));
        let admin = pg_admin_url();
        let base = admin.rsplit_once('/').map_or(admin.as_str(), |(b, _)| b);
        PgScratch { url: format!("{base}/{name}"), name }
    }

    /// Drops the database now, under whoever is connected to it (the store going away).
    pub fn drop_now(&self) {
        pg_admin(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
    }

    /// Runs `sql` in this database and answers the rows' first columns as text.
    pub fn query(&self, sql: &str) -> Vec<Vec<String>> {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
        rt.block_on(async {
            let (client, conn) = tokio_postgres::connect(&self.url, tokio_postgres::NoTls).await.expect("connect");
            tokio::spawn(conn);
            let rows = client.simple_query(sql).await.expect(sql);
            rows.into_iter()
                .filter_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => {
                        Some((0..r.len()).map(|i| r.get(i).unwrap_or_default().to_string()).collect())
                    }
                    _ => None,
                })
                .collect()
        })
    }
}

impl Drop for PgScratch {
    fn drop(&mut self) {
        pg_admin(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name));
    }
}
