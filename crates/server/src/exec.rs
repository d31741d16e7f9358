//! Running a Function as a child process, for ledger rows (L12, L13) and jobs (§8), and a
//! ledger source command (E17): argv without a shell, the input on stdin, a cleared
//! environment plus `PASSED` and the caller's variables, and E16 — its own session, stdout and
//! stderr capped while read, success by its exit status, and every process of the run killed
//! at its timeout, when it exits, and when `serve` stops.
//!
//! A run's processes are its session (the Function's pid, also its group) and, for a
//! grandchild that called `setsid` and so left both, the mark `PCMAIL_RUN` every descendant
//! inherits in its environment (found in `/proc/*/environ`, as Jenkins' ProcessTreeKiller
//! finds a build's strays). A process that also clears its environment escapes; only a cgroup
//! would hold it, and `serve` may not own one.

use std::future::Future;
use std::pin::Pin;
use std::process::ExitStatus;
#[cfg(not(target_os = "linux"))]
use std::process::Stdio;
use std::sync::{Mutex, PoisonError};
use std::task::Poll;
use std::time::Duration;

#[cfg(target_os = "linux")]
use pcmail_core::exec::Suspects;
use pcmail_core::exec::{self as rules, Capped, Ended, Keep, Mark, Member, PidCounter, RunId, Verdict};
use pcmail_core::manifest::spec::FunctionSpec;
use tokio::io::{AsyncRead, AsyncWriteExt};
use tokio::task::JoinHandle;

/// Variables passed through from the server's environment; everything else is dropped.
const PASSED: [&str; 5] = ["PATH", "HOME", "LANG", "TMPDIR", "SYSTEMROOT"];
/// How long output still buffered in the pipes is read once the run's processes are killed.
const DRAIN_GRACE: Duration = Duration::from_millis(500);
/// What one read of a Function's stdout or stderr takes at most.
const READ_CHUNK: usize = 8 << 10;
/// A ledger source command's timeout.
pub const SOURCE_TIMEOUT: Duration = Duration::from_secs(300);
/// Sweeps of `/proc` at one run's end: a stray forking while it is killed is caught by the next.
#[cfg(target_os = "linux")]
const SWEEPS: usize = 4;
/// Entries of `/proc` looked at in one sweep.
#[cfg(target_os = "linux")]
const MAX_PROCS: usize = 1 << 20;
/// Up to this many suspects are asked one by one; more, and `/proc` is listed.
#[cfg(target_os = "linux")]
const PROBE_MAX: usize = 512;

/// Why a Function's run failed; the text is what a ledger row or a job records.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("function {0} has an empty command")]
    EmptyCommand(String),
    #[error("cannot start {program:?}: {source}")]
    Spawn { program: String, source: std::io::Error },
    #[error("timed out after {0}")]
    Timeout(pcmail_core::duration::Dur),
    #[error("waiting for {program:?}: {source}")]
    Wait { program: String, source: std::io::Error },
    /// It ran and failed: its exit status and the end of its stderr.
    #[error("{status}: {stderr_tail}")]
    Exit { status: std::process::ExitStatus, stderr_tail: String },
    /// It exited 0 but its stdout passed the cap: a cut result is not recorded.
    #[error("stdout passed its {cap}-byte cap ({seen} bytes written); the result is not kept")]
    OutputOverCap { cap: usize, seen: u64 },
}

/// One child process to run under E16.
struct Process<'a> {
    program: &'a str,
    args: &'a [String],
    env: Vec<(String, String)>,
    input: Vec<u8>,
    timeout: Duration,
    stdout_cap: usize,
}

/// How one process ended and what it wrote (capped).
struct Finished {
    ended: Ended,
    status: Option<ExitStatus>,
    stdout: Capped,
    stderr: Capped,
}

/// Runs `function` with `input` on stdin and `vars` (the `PCMAIL_*` of this one run) in its
/// environment. Ok is its stdout.
pub async fn run(
    name: &str,
    function: &FunctionSpec,
    vars: &[(&str, String)],
    input: String,
) -> Result<String, ExecError> {
    let Some((program, args)) = function.command.split_first() else {
        return Err(ExecError::EmptyCommand(name.to_string()));
    };
    // Each run builds its own environment, so nothing set for one run (L12's instruction)
    // reaches another.
    let mut env: Vec<(String, String)> = function.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    env.push(("PCMAIL_FUNCTION".into(), name.into()));
    env.extend(vars.iter().map(|(k, v)| ((*k).to_string(), v.clone())));
    let process = Process {
        program,
        args,
        env,
        input: input.into_bytes(),
        timeout: function.timeout.to_std(),
        stdout_cap: rules::FUNCTION_STDOUT,
    };
    let spawn_error = |source| ExecError::Spawn { program: program.clone(), source };
    let done = run_process(process).await.map_err(spawn_error)?;
    match (rules::verdict(done.ended, &done.stdout), done.status) {
        (Verdict::Succeeded, _) => Ok(done.stdout.text()),
        (Verdict::TimedOut, _) => Err(ExecError::Timeout(function.timeout)),
        (Verdict::OutputOverCap, _) => {
            Err(ExecError::OutputOverCap { cap: done.stdout.cap(), seen: done.stdout.seen() })
        }
        (Verdict::Failed, Some(status)) => {
            Err(ExecError::Exit { status, stderr_tail: rules::tail_chars(&done.stderr.text(), 500) })
        }
        (Verdict::Failed, None) => {
            Err(ExecError::Wait { program: program.clone(), source: std::io::Error::other("its exit status was lost") })
        }
    }
}

/// Why a ledger source command gave no text; each cause but an empty command names its program.
#[derive(Debug, thiserror::Error)]
pub enum SourceCommandError {
    #[error("empty command")]
    Empty,
    #[error("{program}: {source}")]
    Io { program: String, source: std::io::Error },
    #[error("{program}: output is not UTF-8")]
    NotUtf8 { program: String },
    #[error("{program}: timed out after {}s", SOURCE_TIMEOUT.as_secs())]
    Timeout { program: String },
    #[error("{program}: output passed its {cap}-byte cap ({seen} bytes written)")]
    OutputOverCap { program: String, cap: usize, seen: u64 },
    #[error("{program}: {status}")]
    Exit { program: String, status: ExitStatus },
    #[error("{program}: its exit status was lost")]
    StatusLost { program: String },
}

/// E17: a ledger source command (L7's JSON lines) runs as a Function does — cleared
/// environment, its own session, output capped — under [`SOURCE_TIMEOUT`]. Ok is its stdout;
/// the error names the program, as `pull` reports it.
pub async fn run_source(argv: &[String]) -> Result<String, SourceCommandError> {
    let (program, args) = argv.split_first().ok_or(SourceCommandError::Empty)?;
    let process = Process {
        program,
        args,
        env: vec![],
        input: vec![],
        timeout: SOURCE_TIMEOUT,
        stdout_cap: rules::SOURCE_STDOUT,
    };
    let done =
        run_process(process).await.map_err(|source| SourceCommandError::Io { program: program.clone(), source })?;
    let program = program.clone();
    match (rules::verdict(done.ended, &done.stdout), done.status) {
        (Verdict::Succeeded, _) => {
            String::from_utf8(done.stdout.bytes()).map_err(|_| SourceCommandError::NotUtf8 { program })
        }
        (Verdict::TimedOut, _) => Err(SourceCommandError::Timeout { program }),
        (Verdict::OutputOverCap, _) => {
            Err(SourceCommandError::OutputOverCap { program, cap: done.stdout.cap(), seen: done.stdout.seen() })
        }
        (Verdict::Failed, Some(status)) => Err(SourceCommandError::Exit { program, status }),
        (Verdict::Failed, None) => Err(SourceCommandError::StatusLost { program }),
    }
}

/// Spawns `p` in a session of its own, feeds its stdin, reads its output through the caps and
/// waits for its exit status or its timeout, whichever comes first; then kills whatever of the
/// run is left and reads what the pipes still hold for a short grace.
#[cfg(target_os = "linux")]
async fn run_process(p: Process<'_>) -> std::io::Result<Finished> {
    let mark = new_mark();
    let env = environment(&p, &mark);
    let path = env.iter().find(|(k, _)| *k == "PATH").map(|(_, v)| *v);
    let paths = rules::candidates(p.program, path);
    let argv: Vec<&str> = std::iter::once(p.program).chain(p.args.iter().map(String::as_str)).collect();
    // The function creates files with its user's usual permissions, not serve's 077 (T8).
    let umask = pcmail_store::private::inherited_umask();
    let plan = crate::spawner::Plan { paths: &paths, argv: &argv, env: &env, umask, input: &p.input };
    // Both read before the child starts: no fork since goes uncounted, and no stray of the
    // run started earlier than this.
    let (before, started) = (earlier_readings(), boot_ticks());
    let mut child = crate::spawner::spawn(&plan)?;
    let born = before.map(|(before, counted)| Born { child: child.pid, asked: child.asked, before, counted });
    let guard = Live::register(RunId { session: child.pid, started, mark: Mark::Run(mark) }, born);
    let mut caps = output_caps(&p);
    let (ended, status) = {
        let reading = std::pin::pin!(read_both(child.stdout.take(), child.stderr.take(), &mut caps));
        let mut output = Draining::new(reading);
        let feed = child.stdin.take().and_then(|stdin| feed(Some(stdin), p.input[child.fed..].to_vec()));
        let waited = tokio::time::timeout(p.timeout, output.beside(child.exit.wait())).await;
        if let Some(feed) = feed {
            feed.abort();
        }
        // E16: the run is over the moment its process exits (or its timeout passes): everything
        // it left behind is killed now, whatever still holds its pipes.
        drop(guard);
        let (ended, status) = match waited {
            Ok(status) => {
                let status = status?;
                (Ended::Exited { success: status.success() }, Some(status))
            }
            Err(_) => {
                child.exit.kill();
                let _ = tokio::time::timeout(Duration::from_secs(1), output.beside(child.exit.wait())).await;
                (Ended::TimedOut, None)
            }
        };
        output.finish().await;
        (ended, status)
    };
    let (stdout, stderr) = caps;
    Ok(Finished { ended, status, stdout, stderr })
}

/// E4: the input is written inside the timeout, beside the wait; a function that never reads
/// it (or a stray holding its stdin) blocks nothing but its own task. P9: an input the pipe
/// takes at once needs no task (on Linux the spawner wrote it before the start, and this
/// writes only what was left).
fn feed<W: tokio::io::AsyncWrite + Unpin + Send + 'static>(stdin: Option<W>, input: Vec<u8>) -> Option<JoinHandle<()>> {
    let mut writing = Box::pin(async move {
        if let Some(mut stdin) = stdin {
            // A function that does not read its stdin is not an error.
            let _ = stdin.write_all(&input).await;
        }
    });
    // The task's first poll registers its own waker; this one is never woken.
    let mut here = std::task::Context::from_waker(std::task::Waker::noop());
    match std::future::Future::poll(writing.as_mut(), &mut here) {
        std::task::Poll::Ready(()) => None,
        std::task::Poll::Pending => Some(tokio::spawn(writing)),
    }
}

/// The child's whole environment: `PASSED` from serve's, the run's variables, the run mark.
fn environment<'a>(p: &'a Process<'_>, mark: &'a str) -> Vec<(&'a str, &'a str)> {
    let passed = passed().iter().map(|(k, v)| (*k, v.as_str()));
    let run = p.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).chain([(rules::RUN_MARK, mark)]);
    rules::environment(passed.chain(run))
}

/// `PASSED` as serve was started with them, read once (P9: not looked up in serve's whole
/// environment at every run; serve never changes its own).
fn passed() -> &'static [(&'static str, String)] {
    static PASSED_NOW: std::sync::OnceLock<Vec<(&'static str, String)>> = std::sync::OnceLock::new();
    PASSED_NOW.get_or_init(|| PASSED.iter().filter_map(|k| std::env::var(k).ok().map(|v| (*k, v))).collect())
}

/// Elsewhere than Linux: std's spawn, with the session and umask set by a `pre_exec` hook.
#[cfg(not(target_os = "linux"))]
async fn run_process(p: Process<'_>) -> std::io::Result<Finished> {
    let mark = new_mark();
    let mut child = command(&p, &mark).spawn()?;
    let session = child.id().and_then(|pid| i32::try_from(pid).ok()).unwrap_or(0);
    let guard = Live::register(RunId { session, started: started_at(session), mark: Mark::Run(mark) }, None);
    let mut caps = output_caps(&p);
    let (ended, status) = {
        let reading = std::pin::pin!(read_both(child.stdout.take(), child.stderr.take(), &mut caps));
        let mut output = Draining::new(reading);
        let feed = feed(child.stdin.take(), p.input);
        let waited = tokio::time::timeout(p.timeout, output.beside(child.wait())).await;
        if let Some(feed) = feed {
            feed.abort();
        }
        drop(guard);
        let (ended, status) = match waited {
            Ok(status) => {
                let status = status?;
                (Ended::Exited { success: status.success() }, Some(status))
            }
            Err(_) => {
                let _ = child.start_kill();
                let _ = tokio::time::timeout(Duration::from_secs(1), output.beside(child.wait())).await;
                (Ended::TimedOut, None)
            }
        };
        output.finish().await;
        (ended, status)
    };
    let (stdout, stderr) = caps;
    Ok(Finished { ended, status, stdout, stderr })
}

/// The command for `p`: no shell, the cleared environment, a session of its own.
#[cfg(not(target_os = "linux"))]
fn command(p: &Process<'_>, mark: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(p.program);
    cmd.args(p.args).env_clear().envs(environment(p, mark));
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    #[cfg(unix)]
    {
        let umask = pcmail_store::private::inherited_umask();
        // SAFETY: setsid and umask are async-signal-safe and touch no memory of the parent.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setsid() < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if let Some(mask) = umask {
                    libc::umask(mask as libc::mode_t);
                }
                Ok(())
            });
        }
    }
    cmd
}

/// A run's stdout, kept from its head, and the tail of its stderr.
fn output_caps(p: &Process<'_>) -> (Capped, Capped) {
    (Capped::new(p.stdout_cap, Keep::Head), Capped::new(rules::STDERR_TAIL, Keep::Tail))
}

/// Both pipes read to their ends into their caps, in the run's own task (P9: not a task a
/// pipe, spawned, woken and joined at every run).
async fn read_both<O: AsyncRead + Unpin, E: AsyncRead + Unpin>(
    stdout: Option<O>,
    stderr: Option<E>,
    (out, err): &mut (Capped, Capped),
) {
    tokio::join!(read_capped(stdout, out), read_capped(stderr, err));
}

thread_local! {
    /// Where a pipe's bytes land on their way into a cap: one a thread, so no run's state
    /// carries a buffer (P9: most runs write nothing).
    static SCRATCH: std::cell::RefCell<Box<[u8]>> = std::cell::RefCell::new(vec![0; READ_CHUNK].into_boxed_slice());
}

/// Reads `pipe` to its end, keeping what `cap` allows: a writer past the cap is drained, never
/// blocked, and never held.
async fn read_capped<R: AsyncRead + Unpin>(pipe: Option<R>, cap: &mut Capped) {
    let Some(mut pipe) = pipe else { return };
    std::future::poll_fn(|cx| {
        SCRATCH.with_borrow_mut(|scratch| {
            loop {
                let mut read = tokio::io::ReadBuf::new(scratch);
                match std::pin::Pin::new(&mut pipe).poll_read(cx, &mut read) {
                    Poll::Ready(Ok(())) if !read.filled().is_empty() => cap.push(read.filled()),
                    // Its end, or an error that ends it.
                    Poll::Ready(_) => return Poll::Ready(()),
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
    })
    .await
}

/// A run's output being read while its exit is awaited, and for [`DRAIN_GRACE`] after.
struct Draining<'a, F> {
    reading: Pin<&'a mut F>,
    done: bool,
}

impl<'a, F: Future<Output = ()>> Draining<'a, F> {
    fn new(reading: Pin<&'a mut F>) -> Self {
        Draining { reading, done: false }
    }

    /// `other`'s output, the pipes read beside it meanwhile.
    async fn beside<T>(&mut self, other: impl Future<Output = T>) -> T {
        let mut other = std::pin::pin!(other);
        loop {
            tokio::select! {
                biased;
                out = &mut other => return out,
                () = self.reading.as_mut(), if !self.done => self.done = true,
            }
        }
    }

    /// What the pipes still hold once the run's processes are killed, for a short grace: a
    /// stray that escaped the kill keeps a pipe open.
    async fn finish(mut self) {
        if !self.done {
            let _ = tokio::time::timeout(DRAIN_GRACE, self.reading.as_mut()).await;
        }
    }
}

/// Every run alive in this process, so that `serve`'s stop kills them all ([`stop_all`]).
static LIVE: Mutex<Vec<(u64, RunId, Option<Born>)>> = Mutex::new(Vec::new());
static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

/// One run registered in [`LIVE`]; dropped (its process exited, its timeout passed, or its
/// future was dropped), it kills every process of the run.
struct Live {
    key: u64,
    run: RunId,
    born: Option<Born>,
}

impl Live {
    fn register(run: RunId, born: Option<Born>) -> Live {
        let key = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        LIVE.lock().unwrap_or_else(PoisonError::into_inner).push((key, run.clone(), born));
        Live { key, run, born }
    }
}

impl Drop for Live {
    fn drop(&mut self) {
        kill_run(&self.run, self.born.as_ref());
        LIVE.lock().unwrap_or_else(PoisonError::into_inner).retain(|(k, _, _)| *k != self.key);
    }
}

/// A run's child pid and the pid counter just before it started: where its strays can be
/// ([`Suspects`]). `counted` is the last reading with `/proc/stat`'s fork count taken before
/// it, for when the time since `before` cannot rule out a counter come round.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(not(target_os = "linux"), allow(dead_code))]
struct Born {
    child: i32,
    /// When the child's start was asked for ([`crate::spawner::Child::asked`]).
    asked: u64,
    before: PidCounter,
    counted: PidCounter,
}

#[cfg(target_os = "linux")]
impl Born {
    /// P9: a glance at `/proc/loadavg` mostly does; `/proc/stat` is read only when it does not.
    fn suspects(born: Option<&Born>) -> Suspects {
        let Some(b) = born else { return Suspects::Everywhere };
        let cpus = cpus();
        if let Some(now) = pid_counter(false) {
            match Suspects::of(b.child, b.before, now, cpus) {
                Suspects::Everywhere => {}
                since => return since,
            }
        }
        match pid_counter(true) {
            Some(now) => Suspects::of(b.child, b.counted, now, cpus),
            None => Suspects::Everywhere,
        }
    }
}

/// The CPUs that can fork beside us: all the machine has, not our share.
#[cfg(target_os = "linux")]
fn cpus() -> u64 {
    static CPUS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    // SAFETY: sysconf reads a constant.
    *CPUS.get_or_init(|| u64::try_from(unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) }).unwrap_or(0).max(1))
}

/// The last reading of the pid counter, and the last with its fork count, kept for the next
/// run's start: any reading taken before a child started serves as its `before`
/// ([`Suspects::of`]), so one reading a run is enough.
#[cfg(target_os = "linux")]
static READING: Mutex<(Option<PidCounter>, Option<PidCounter>)> = Mutex::new((None, None));

/// The pid counter now, `/proc/stat`'s fork count with it if `counted`; None where `/proc`
/// does not say.
#[cfg(target_os = "linux")]
fn pid_counter(counted: bool) -> Option<PidCounter> {
    static LOADAVG: KeptOpen = KeptOpen::new("/proc/loadavg");
    static PID_MAX: KeptOpen = KeptOpen::new("/proc/sys/kernel/pid_max");
    let (mut loadavg, mut pid_max) = ([0u8; 128], [0u8; 32]);
    let from = reading_clock();
    let loadavg = LOADAVG.read(&mut loadavg)?;
    let stat = if counted { Some(std::fs::read_to_string("/proc/stat").ok()?) } else { None };
    let pid_max = PID_MAX.read(&mut pid_max)?;
    let now = PidCounter::parse(loadavg, stat.as_deref(), pid_max, (from, reading_clock()));
    let mut kept = READING.lock().unwrap_or_else(PoisonError::into_inner);
    kept.0 = now;
    if counted {
        kept.1 = now;
    }
    now
}

/// A small `/proc` file opened once and read again from its start each time: P9 reads two at
/// every run's end, and their opening and closing was most of what reading them cost.
#[cfg(target_os = "linux")]
struct KeptOpen {
    path: &'static str,
    file: std::sync::OnceLock<std::fs::File>,
}

#[cfg(target_os = "linux")]
impl KeptOpen {
    const fn new(path: &'static str) -> Self {
        KeptOpen { path, file: std::sync::OnceLock::new() }
    }

    /// The whole file as the kernel writes it now; None where it cannot be opened (tried again
    /// next time) or read, or does not fit `buf`.
    fn read<'b>(&self, buf: &'b mut [u8]) -> Option<&'b str> {
        use std::os::unix::fs::FileExt;
        let file = match self.file.get() {
            Some(file) => file,
            None => {
                let opened = std::fs::File::open(self.path).ok()?;
                self.file.get_or_init(|| opened)
            }
        };
        // Positioned at 0, each read has the kernel write the file afresh.
        let n = file.read_at(buf, 0).ok()?;
        (n < buf.len()).then(|| std::str::from_utf8(&buf[..n]).ok()).flatten()
    }
}

/// The monotonic clock pid-counter readings are stamped with.
#[cfg(target_os = "linux")]
fn reading_clock() -> Duration {
    static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    ORIGIN.get_or_init(std::time::Instant::now).elapsed()
}

/// How old the last counted reading may be before a run's start takes a new one: a run whose
/// end cannot rely on the time alone then counts forks from less than this ago.
#[cfg(target_os = "linux")]
const RECOUNT_AFTER: Duration = Duration::from_millis(100);

/// The last readings of the pid counter (taken now when there are none, or the counted one
/// is older than [`RECOUNT_AFTER`]): the latest, and the latest with a fork count.
#[cfg(target_os = "linux")]
fn earlier_readings() -> Option<(PidCounter, PidCounter)> {
    let kept = *READING.lock().unwrap_or_else(PoisonError::into_inner);
    match kept {
        (Some(latest), Some(counted)) if reading_clock().saturating_sub(counted.until) < RECOUNT_AFTER => {
            Some((latest, counted))
        }
        _ => pid_counter(true).map(|now| (now, now)),
    }
}

/// Now on the clock `/proc/PID/stat` counts starts by, in its ticks (0 if unknown).
#[cfg(target_os = "linux")]
fn boot_ticks() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec; sysconf reads a constant.
    let (read, clk_tck) =
        unsafe { (libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut ts), libc::sysconf(libc::_SC_CLK_TCK)) };
    match (read, u64::try_from(ts.tv_sec), u32::try_from(ts.tv_nsec), u64::try_from(clk_tck)) {
        (0, Ok(secs), Ok(nanos), Ok(tck)) if tck > 0 => rules::boot_ticks(Duration::new(secs, nanos), tck),
        _ => 0,
    }
}

/// E16 after a crash: this serve's record in the data dir (a file named by its mark), so that
/// the next `serve` there kills what one killed by SIGKILL left running. One record a serve,
/// written at its start, not one a run: every run's mark begins with the serve's.
static RECORD: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
/// The folder of the records in the data dir.
pub const RUNS_DIR: &str = "runs";

/// This serve's mark: its pid and randomness (a pid is reused), begun by no other serve's.
fn serve_mark() -> &'static str {
    static MARK: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    MARK.get_or_init(|| {
        let mut b = [0u8; 6];
        let _ = crate::random::fill(&mut b);
        format!("{}-{}", std::process::id(), pcmail_core::ids::hex(&b))
    })
}

/// E16 at `serve`'s start: kills what the runs of the serves recorded in `data_dir` left
/// running — a `serve` killed by SIGKILL takes only its direct children with it (PDEATHSIG) —
/// then records this serve there. A record whose serve still runs (another serve on the same
/// data dir) is left alone. Only a process that carries a recorded mark in its environment and
/// started no earlier than its serve (or its run, in a record of a release that recorded each
/// run) is killed, never by its group or session alone: a pid or a session id reused since
/// belongs to someone else. Answers how many processes were killed.
pub fn reap_left_runs(data_dir: &std::path::Path) -> std::io::Result<usize> {
    let dir = data_dir.join(RUNS_DIR);
    std::fs::create_dir_all(&dir)?;
    let mut killed = 0;
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let Some(name) = entry.file_name().to_str().map(String::from) else { continue };
        let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
        let fields: Vec<u64> = text.split_whitespace().filter_map(|f| f.parse().ok()).collect();
        let (serve, serve_started, run) = match fields[..] {
            [serve, started] => (serve, started, RunId { session: 0, started, mark: Mark::Serve(name) }),
            [serve, serve_started, started] => {
                (serve, serve_started, RunId { session: 0, started, mark: Mark::Run(name) })
            }
            _ => {
                let _ = std::fs::remove_file(entry.path());
                continue;
            }
        };
        let serve = i32::try_from(serve).unwrap_or(0);
        if serve > 0
            && u32::try_from(serve).is_ok_and(|p| p != std::process::id())
            && started_at(serve) == serve_started
        {
            continue;
        }
        killed += kill_marked(&run);
        let _ = std::fs::remove_file(entry.path());
    }
    let own = dir.join(serve_mark());
    let started = started_at(i32::try_from(std::process::id()).unwrap_or(0));
    // Best effort: runs are not refused for a record that cannot be written (a full disk).
    let _ = std::fs::write(&own, format!("{} {started}\n", std::process::id()));
    let _ = RECORD.set(own);
    Ok(killed)
}

/// Kills every process carrying `run`'s mark (its session 0: no group or session is asked).
fn kill_marked(run: &RunId) -> usize {
    #[cfg(target_os = "linux")]
    {
        let mut killed = 0;
        for _ in 0..SWEEPS {
            match sweep(run, Suspects::Everywhere, None) {
                0 => break,
                n => killed += n,
            }
        }
        killed
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = run;
        0
    }
}

/// A mark no other run shares: this serve's and a counter.
fn new_mark() -> String {
    rules::run_mark(serve_mark(), NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
}

/// When process `pid` started (0 if unknown: every stray's environment is then asked).
fn started_at(pid: i32) -> u64 {
    #[cfg(target_os = "linux")]
    if pid > 0 {
        return std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(0, |stat| rules::started(&stat));
    }
    let _ = pid;
    0
}

/// E16 at `serve`'s stop: every run still alive is killed with all it started.
pub fn stop_all() {
    let runs: Vec<(RunId, Option<Born>)> =
        LIVE.lock().unwrap_or_else(PoisonError::into_inner).iter().map(|(_, r, b)| (r.clone(), *b)).collect();
    for (run, born) in &runs {
        kill_run(run, born.as_ref());
    }
    if let Some(own) = RECORD.get() {
        let _ = std::fs::remove_file(own);
    }
}

/// Kills the run's process group, then (Linux) every process in its session or carrying its
/// mark, sweeping `/proc` until a sweep finds none; each sweep asks only the pids handed out
/// since the run's child, where they can be told (P9).
fn kill_run(run: &RunId, born: Option<&Born>) {
    #[cfg(unix)]
    if run.session > 1 {
        // SAFETY: kill(2) with a negative pid signals the process group the run created.
        unsafe {
            libc::kill(-run.session, libc::SIGKILL);
        }
    }
    #[cfg(target_os = "linux")]
    for _ in 0..SWEEPS {
        let suspects = Born::suspects(born);
        // Only where no pid was handed out twice since the reading taken before the run's start
        // does a later start's pid belong to that start alone.
        let after = born.filter(|_| matches!(suspects, Suspects::Since { .. })).map(|b| b.asked);
        if sweep(run, suspects, after) == 0 {
            break;
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = born;
}

/// One pass over the `suspects` among `/proc`'s processes: SIGKILL to each the run owns;
/// answers how many. `after`: when the run's start was asked for, when the suspects are the
/// pids handed out since its child.
#[cfg(target_os = "linux")]
fn sweep(run: &RunId, suspects: Suspects, after: Option<u64>) -> usize {
    let pids: Vec<i32> = match suspects.few(PROBE_MAX) {
        Some(few) => few,
        None => {
            let Ok(dir) = std::fs::read_dir("/proc") else { return 0 };
            dir.take(MAX_PROCS)
                .flatten()
                .filter_map(|entry| entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()))
                .filter(|pid| suspects.holds(*pid))
                .collect()
        }
    };
    let me = std::process::id();
    let mut killed = 0;
    for pid in pids {
        // A child of this serve not yet reaped, being started, or asked for since this run's (its
        // pid given to no one else since): another run's own process, no stray of this run (P9: at 4
        // runs at once most suspects are these, and reading each one's `stat` cost serve about
        // an eighth of its time a job). This run's own child is unreaped too while a timeout or
        // a drop ends the run: `kill_run` has killed its group before sweeping.
        let another_run = |pid| {
            crate::spawner::unreaped(pid)
                || crate::spawner::starting(pid)
                || after.is_some_and(|after| crate::spawner::started_after(pid, after))
        };
        if u32::try_from(pid).is_ok_and(|p| p == me) || pid <= 1 || another_run(pid) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let owned = match run.member(&stat) {
            Member::Yes => true,
            Member::No => false,
            Member::AskEnviron => std::fs::read(format!("/proc/{pid}/environ")).is_ok_and(|env| run.marked(&env)),
        };
        if owned {
            // SAFETY: kill(2) of one process this run started.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
            }
            killed += 1;
        }
    }
    killed
}

#[cfg(test)]
#[cfg(unix)]
mod tests {
    use std::collections::BTreeMap;

    use pcmail_core::duration::Dur;
    use pcmail_core::manifest::spec::FunctionMode;

    use super::*;

    fn vars(instruction: &str) -> Vec<(&'static str, String)> {
        let mut v = vec![("PCMAIL_ROW_ID", "T-0001".to_string())];
        if !instruction.is_empty() {
            v.push(("PCMAIL_INSTRUCTION", instruction.to_string()));
        }
        v
    }

    fn function(script: &str, timeout: Dur) -> FunctionSpec {
        FunctionSpec {
            command: vec!["sh".into(), "-c".into(), script.into()],
            mode: FunctionMode::Generate,
            timeout,
            rate_limit: None,
            env: BTreeMap::from([("EXTRA".to_string(), "x".to_string())]),
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn p9_the_pid_counter_read_again_from_its_kept_files_moves_with_each_process_started() {
        let before = pid_counter(false).expect("a reading");
        for _ in 0..3 {
            assert!(std::process::Command::new("true").status().expect("true runs").success());
        }
        let after = pid_counter(false).expect("another reading");
        assert_ne!(after.last, before.last, "a kept file read again says what holds now");
        let pid_max = std::fs::read_to_string("/proc/sys/kernel/pid_max").expect("pid_max");
        let pid_max: i32 = pid_max.trim().parse().expect("a number");
        assert_eq!((before.max, after.max), (pid_max, pid_max));
        let longer = KeptOpen::new("/proc/self/status").read(&mut [0u8; 16]).map(String::from);
        assert_eq!(longer, None, "a file longer than the buffer is not taken in part");
        assert_eq!(KeptOpen::new("/nonexistent/pid_max").read(&mut [0u8; 16]), None);
    }

    #[tokio::test]
    async fn l12_the_input_arrives_on_stdin_with_a_minimal_environment_for_this_run_only() {
        let f = function("cat; echo; env | sort", Dur::from_secs(10));
        let out = run("f", &f, &vars("be brief"), "PROMPT".into()).await.expect("runs");
        assert!(out.starts_with("PROMPT\n"), "{out}");
        assert!(
            out.contains("PCMAIL_INSTRUCTION=be brief")
                && out.contains("PCMAIL_ROW_ID=T-0001")
                && out.contains("EXTRA=x")
        );
        assert!(!out.contains("CARGO_"), "the server's environment does not leak: {out}");
        let without = run("f", &f, &vars(""), String::new()).await.expect("runs");
        assert!(!without.contains("PCMAIL_INSTRUCTION"), "{without}");
    }

    /// Live (not zombie) processes whose argv is exactly `argv`, looked for in `/proc`.
    #[cfg(target_os = "linux")]
    fn running(argv: &[&str]) -> Vec<String> {
        let want: Vec<u8> = argv.iter().flat_map(|a| a.bytes().chain([0])).collect();
        let mut found = vec![];
        for entry in std::fs::read_dir("/proc").expect("proc").flatten().take(1 << 20) {
            let pid = entry.file_name().to_string_lossy().to_string();
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let zombie = stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()) == Some("Z");
            if cmdline == want && !zombie {
                found.push(pid);
            }
        }
        found
    }

    /// Waits up to 2 s for no process with `argv` to be running.
    #[cfg(target_os = "linux")]
    fn gone(argv: &[&str]) -> bool {
        for _ in 0..40 {
            if running(argv).is_empty() {
                return true;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        false
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn e16_a_start_reaps_every_run_of_a_dead_serve_and_an_earlier_releases_run_records_and_spares_the_rest() {
        let dir = tempfile::tempdir().expect("tempdir");
        let runs = dir.path().join(RUNS_DIR);
        std::fs::create_dir_all(&runs).expect("runs dir");
        let marked = |mark: &str, secs: &str| {
            std::process::Command::new("sleep").arg(secs).env(rules::RUN_MARK, mark).spawn().expect("sleep")
        };
        // A serve that died (pid 0 is no serve's), recorded once; and a run of a release that
        // recorded each run (its serve's pid, its start and the run's).
        std::fs::write(runs.join("77-00ab12cd34ef"), "0 0\n").expect("serve record");
        std::fs::write(runs.join("66-1-99aa"), "0 0 0\n").expect("run record");
        let mut children = [
            marked(&rules::run_mark("77-00ab12cd34ef", 3), "3201"),
            marked(&rules::run_mark("77-00ab12cd34ef", 40), "3202"),
            marked("66-1-99aa", "3203"),
            marked(&rules::run_mark("77-00ab12cd34efff", 1), "3204"),
        ];
        let killed = reap_left_runs(dir.path()).expect("reap");
        std::thread::sleep(std::time::Duration::from_millis(200));
        let ended: Vec<bool> = children.iter_mut().map(|c| c.try_wait().expect("wait").is_some()).collect();
        for child in &mut children {
            let _ = child.kill();
            let _ = child.wait();
        }
        assert_eq!(ended, [true, true, true, false], "a process of another serve's mark is spared");
        // A process a sweep killed may still be dying at the next, and is counted again.
        assert!(killed >= 3, "two runs of the dead serve and the earlier release's run: {killed}");
        let left: Vec<String> = std::fs::read_dir(&runs)
            .expect("runs")
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .collect();
        assert_eq!(left, vec![serve_mark().to_string()], "the dead records go; this serve's own is written");
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn e16_a_timeout_kills_the_group_and_a_grandchild_that_left_the_session() {
        let script = "sleep 3101 & setsid sleep 3102 & wait";
        let err =
            run("f", &function(script, Dur::from_millis(500)), &vars(""), String::new()).await.expect_err("times out");
        assert!(matches!(err, ExecError::Timeout(d) if d == Dur::from_millis(500)), "{err}");
        assert!(gone(&["sleep", "3101"]), "the background child outlived the timeout");
        assert!(gone(&["sleep", "3102"]), "the setsid grandchild outlived the timeout");
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn e16_what_a_successful_function_left_running_is_killed_and_its_pipes_wait_for_nothing() {
        // Both strays hold stdout and stderr open: success is the exit status, not the pipes.
        let script = "sleep 3103 & setsid sleep 3104 & echo done";
        let started = std::time::Instant::now();
        let out = run("f", &function(script, Dur::from_secs(20)), &vars(""), String::new()).await.expect("succeeds");
        assert_eq!(out, "done\n");
        assert!(started.elapsed() < std::time::Duration::from_secs(2), "{:?}", started.elapsed());
        assert!(gone(&["sleep", "3103"]) && gone(&["sleep", "3104"]), "strays outlived the function");
    }

    #[tokio::test]
    async fn e16_stdout_past_its_cap_is_drained_and_refused_and_stderr_keeps_its_tail() {
        let f = function("head -c 3000000 /dev/zero", Dur::from_secs(20));
        let err = run("f", &f, &vars(""), String::new()).await.expect_err("over its cap");
        assert!(matches!(err, ExecError::OutputOverCap { cap: 1_048_576, seen: 3_000_000 }), "{err}");
        let f = function("head -c 100000 /dev/zero | tr '\\0' x >&2; echo END >&2; exit 1", Dur::from_secs(20));
        let err = run("f", &f, &vars(""), String::new()).await.expect_err("fails");
        let ExecError::Exit { stderr_tail, .. } = err else { panic!("{err}") };
        assert!(stderr_tail.ends_with("xxxxEND") && stderr_tail.chars().count() == 500, "{stderr_tail}");
    }

    #[tokio::test]
    async fn e17_a_source_command_runs_with_a_cleared_environment() {
        // cargo sets CARGO_* for the test binary: none of serve's own environment passes.
        let argv = |s: &str| vec!["sh".to_string(), "-c".to_string(), s.to_string()];
        let out = run_source(&argv("env")).await.expect("runs");
        assert!(!out.contains("CARGO_") && out.contains("PCMAIL_RUN="), "{out}");
        let err = run_source(&argv("head -c 9000000 /dev/zero")).await.expect_err("over its cap").to_string();
        assert!(err.starts_with("sh: output passed its 8388608-byte cap (9000000 bytes"), "{err}");
        assert_eq!(run_source(&argv("exit 2")).await.expect_err("fails").to_string(), "sh: exit status: 2");
    }

    #[tokio::test]
    async fn e4_a_function_that_never_reads_a_256k_payload_is_killed_at_its_timeout() {
        let payload = "x".repeat(256 * 1024);
        let outcome = run("f", &function("sleep 30", Dur::from_millis(500)), &vars(""), payload).await;
        let err = outcome.expect_err("not left blocked on the full pipe");
        assert_eq!(err.to_string(), "timed out after 500ms");
    }

    #[tokio::test]
    async fn a_failing_function_reports_its_exit_status_and_stderr() {
        let err = run("f", &function("echo nope >&2; exit 3", Dur::from_secs(10)), &vars(""), String::new())
            .await
            .expect_err("fails");
        assert!(
            matches!(&err, ExecError::Exit { status, stderr_tail } if status.code() == Some(3) && stderr_tail == "nope"),
            "{err}"
        );
        assert_eq!(err.to_string(), "exit status: 3: nope");
    }

    #[tokio::test]
    async fn e16_a_program_that_cannot_start_is_a_spawn_error_naming_it() {
        let mut f = function("", Dur::from_secs(10));
        f.command = vec!["pcmail-no-such-program".into()];
        let err = run("f", &f, &vars(""), String::new()).await.expect_err("not found");
        assert!(
            matches!(&err, ExecError::Spawn { program, source } if program == "pcmail-no-such-program"
                && source.kind() == std::io::ErrorKind::NotFound),
            "{err}"
        );
        // The same run with the program found by the child's PATH starts.
        f.command = vec!["sh".into(), "-c".into(), "echo ok".into()];
        assert_eq!(run("f", &f, &vars(""), String::new()).await.expect("runs"), "ok\n");
    }
}
