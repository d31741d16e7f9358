//! P9/E16 on Linux: a Function's process started the way `posix_spawn` starts one —
//! `clone(CLONE_VM | CLONE_VFORK)`, so the server's address space is never copied — with what
//! std's `pre_exec` hook used to add (and which made std fork the whole server per job): its own
//! session, PR_SET_PDEATHSIG (it dies with a SIGKILLed `serve`), the Function's umask, stdin,
//! stdout and stderr on pipes, the signal mask emptied and SIGPIPE back to its default. The
//! child is waited on through the pidfd `clone` hands back, so no SIGCHLD handler is involved.
//!
//! The child runs on a stack of its own in the parent's memory, until `execve`, while the
//! calling thread is suspended: it only makes system calls on data prepared beforehand.

use std::collections::VecDeque;
use std::ffi::{CString, c_int, c_void};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, PoisonError};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;
use tokio::net::unix::pipe;

/// The child's stack until `execve`: a few system calls deep.
const STACK: usize = 64 << 10;

/// What to start: the candidate paths of the program (`core::exec::candidates`), its argv and
/// its whole environment, and the umask it gets (`None`: the server's).
pub struct Plan<'a> {
    pub paths: &'a [String],
    pub argv: &'a [&'a str],
    pub env: &'a [(&'a str, &'a str)],
    pub umask: Option<u32>,
    /// What its stdin reads before its end.
    pub input: &'a [u8],
}

/// A started child: its pipes and its exit.
pub struct Child {
    pub pid: i32,
    /// When its start was asked for, in the count of this process' start events (see
    /// [`started_after`]): before its `clone`, so before its pid was handed out.
    pub asked: u64,
    /// The writing end of its stdin while [`Plan::input`] is not all in the pipe yet.
    pub stdin: Option<pipe::Sender>,
    /// How much of the input the pipe took before the child started.
    pub fed: usize,
    pub stdout: Option<pipe::Receiver>,
    pub stderr: Option<pipe::Receiver>,
    pub exit: Exit,
}

/// The child's exit, read from its pidfd; dropped unreaped, the child is killed and reaped.
pub struct Exit {
    pid: i32,
    pidfd: Option<AsyncFd<OwnedFd>>,
}

/// The children started here: those not yet reaped, and the latest started, in the order
/// they were. Until it is reaped, a child's pid is its own: no other process can be given it —
/// so long as the kernel never reaps them itself, which [`children_kept`] sees to.
struct Children {
    unreaped: Vec<i32>,
    /// The latest starts, the newest last, at most [`RECENT`].
    recent: VecDeque<Start>,
    /// A count of events in order: each start asked for, and each start recorded.
    events: u64,
}

/// One start: its child's pid, the count when the start was asked for (before its `clone`,
/// so before its pid was handed out), and its order, the count once it was recorded (after).
#[derive(Clone, Copy)]
struct Start {
    pid: i32,
    asked: u64,
    order: u64,
}

static CHILDREN: Mutex<Children> = Mutex::new(Children { unreaped: Vec::new(), recent: VecDeque::new(), events: 0 });

/// Starts remembered: more than the runs of any pool start while one of them runs (P9).
const RECENT: usize = 1024;

fn children() -> std::sync::MutexGuard<'static, Children> {
    CHILDREN.lock().unwrap_or_else(PoisonError::into_inner)
}

/// SIGCHLD back to its default if `serve` was started with it ignored or with SA_NOCLDWAIT
/// (both pass through `execve`): the kernel would then reap exited children by itself, their
/// pids free for anyone while [`CHILDREN`] still holds them as unreaped, and `waitpid` would find none.
fn children_kept() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: sigaction reads (and then sets) this process' SIGCHLD disposition through
        // structs that outlive the calls.
        unsafe {
            let mut now: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(libc::SIGCHLD, std::ptr::null(), &mut now) == 0
                && (now.sa_sigaction == libc::SIG_IGN || now.sa_flags & libc::SA_NOCLDWAIT != 0)
            {
                let mut default: libc::sigaction = std::mem::zeroed();
                default.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGCHLD, &default, std::ptr::null_mut());
            }
        }
    });
}

/// Whether `pid` is a child started here and not yet reaped (P9: a sweep for another run's
/// strays knows it without reading `/proc`: it is that run's own process, in a session of its
/// own and carrying that run's mark).
pub fn unreaped(pid: i32) -> bool {
    children().unreaped.contains(&pid)
}

/// Whether `pid` is a child whose start was asked for here after the start asked at `after`
/// ([`Child::asked`]), reaped or not. P9: a sweep of the pids handed out since a run's child,
/// none given twice since a reading taken before the run's start was asked for
/// ([`pcmail_core::exec::Suspects`]), skips these: such a start's clone came after that
/// reading, so a pid of it among the suspects was handed out after the run's child, once, and
/// is that other run's child, never a stray of this run. Most suspects at 4 runs at once are
/// these. `after` is the run's asked count, not its record (after its exec): starts asked for
/// meanwhile on other threads are skipped too.
pub fn started_after(pid: i32, after: u64) -> bool {
    let kept = children();
    // Recorded in order: an entry recorded before `after` was asked for before it too.
    kept.recent
        .iter()
        .rev()
        .take_while(|start| start.order > after)
        .any(|start| start.pid == pid && start.asked > after)
}

/// A start about to be asked for: the count it was asked at.
fn asking() -> u64 {
    let mut kept = children();
    kept.events += 1;
    kept.events
}

/// Whether `pid` is a child being started here now: its `clone` has not returned, the child
/// not yet through its `execve` (P9: another thread's sweep finds it in `/proc` meanwhile).
pub fn starting(pid: i32) -> bool {
    pid > 0 && STARTING.iter().any(|slot| slot.load(Ordering::Acquire) == pid)
}

/// One slot a spawning thread holds ([`Starting`]); more threads than this spawn at once only
/// in a runtime of as many workers, and the rest start with none: a sweep then reads their
/// `stat` as it does any stranger's.
static STARTING: [AtomicI32; 16] = [const { AtomicI32::new(0) }; 16];

/// A slot of [`STARTING`] held while one child starts: 0 free, -1 held, else the child's pid.
struct Starting(Option<&'static AtomicI32>);

impl Starting {
    fn take() -> Starting {
        Starting(STARTING.iter().find(|slot| slot.compare_exchange(0, -1, Ordering::AcqRel, Ordering::Relaxed).is_ok()))
    }

    fn slot(&self) -> *const AtomicI32 {
        self.0.map_or(std::ptr::null(), std::ptr::from_ref)
    }
}

impl Drop for Starting {
    fn drop(&mut self) {
        if let Some(slot) = self.0 {
            slot.store(0, Ordering::Release);
        }
    }
}

/// A child just started, asked for at `asked` ([`asking`]): held until reaped, and remembered
/// as the latest start.
fn started(pid: i32, asked: u64) {
    let mut kept = children();
    kept.events += 1;
    let order = kept.events;
    kept.unreaped.push(pid);
    if kept.recent.len() == RECENT {
        kept.recent.pop_front();
    }
    kept.recent.push_back(Start { pid, asked, order });
}

fn held(pid: i32) {
    children().unreaped.push(pid);
}

/// Out of the unreaped before a reap: once reaped, the pid may be handed to anyone.
fn released(pid: i32) {
    children().unreaped.retain(|p| *p != pid);
}

/// What the child reads (and, on failure, writes its errno to) while the parent waits.
#[repr(C)]
struct Shared {
    paths: *const *const libc::c_char,
    argv: *const *const libc::c_char,
    envp: *const *const libc::c_char,
    fds: [c_int; 3],
    umask: libc::mode_t,
    set_umask: bool,
    parent: libc::pid_t,
    errno: c_int,
    /// Where the child writes its pid first thing ([`Starting`]); null if no slot was free.
    starting: *const AtomicI32,
}

fn cstring(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{s:?} holds a NUL byte")))
}

/// `key=value`, built in one allocation. Refused by its name alone: a value may be a secret
/// (a token passed through), and the error is shown wherever the run's failure is.
fn variable(key: &str, value: &str) -> io::Result<CString> {
    let mut bytes = Vec::with_capacity(key.len() + value.len() + 2);
    bytes.extend_from_slice(key.as_bytes());
    bytes.push(b'=');
    bytes.extend_from_slice(value.as_bytes());
    CString::new(bytes).map_err(|_| {
        let which = if key.contains('\0') { "the name of" } else { "the value of" };
        io::Error::new(io::ErrorKind::InvalidInput, format!("{which} variable {key:?} holds a NUL byte"))
    })
}

/// A NULL-terminated array of pointers into `strings` (which must outlive it).
fn pointers(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings.iter().map(|s| s.as_ptr()).chain([std::ptr::null()]).collect()
}

/// A pipe, both ends close-on-exec and numbered above stdio (the child's dup2 targets).
fn pipe_pair() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    // SAFETY: pipe2 writes two fds into the array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both fds were just opened and are owned here.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    Ok((above_stdio(r)?, above_stdio(w)?))
}

fn above_stdio(fd: OwnedFd) -> io::Result<OwnedFd> {
    if fd.as_raw_fd() > 2 {
        return Ok(fd);
    }
    // SAFETY: F_DUPFD_CLOEXEC returns a new fd owned here; `fd` is closed on drop.
    let new = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 3) };
    if new < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `new` was just opened.
    Ok(unsafe { OwnedFd::from_raw_fd(new) })
}

/// O_NONBLOCK on an end of a pipe just made, whose only status flag it then is.
fn nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on an fd owned here.
    if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK) } < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The child's stdin: a pipe holding as much of `input` as it takes before the child starts,
/// its writing end kept only if some is left ([`Child::fed`]). P9: most inputs fit, so most
/// runs write theirs here and register no writer with the runtime.
fn stdin_with(input: &[u8]) -> io::Result<(OwnedFd, Option<OwnedFd>, usize)> {
    let (read, write) = pipe_pair()?;
    nonblocking(&write)?;
    let mut fed = 0;
    while fed < input.len() {
        let rest = &input[fed..];
        // SAFETY: write(2) of a live slice into an fd owned here.
        let n = unsafe { libc::write(write.as_raw_fd(), rest.as_ptr().cast(), rest.len()) };
        match usize::try_from(n) {
            Ok(n) => fed += n,
            Err(_) => match io::Error::last_os_error() {
                e if e.kind() == io::ErrorKind::Interrupted => {}
                e if e.kind() == io::ErrorKind::WouldBlock => break,
                e => return Err(e),
            },
        }
    }
    Ok((read, (fed < input.len()).then_some(write), fed))
}

/// Starts `plan` (see the module doc). Must be called on a thread that lives as long as the
/// runtime (PR_SET_PDEATHSIG follows the thread that started the child): a runtime worker,
/// never a `spawn_blocking` thread.
pub fn spawn(plan: &Plan<'_>) -> io::Result<Child> {
    children_kept();
    let paths: Vec<CString> = plan.paths.iter().map(|p| cstring(p)).collect::<io::Result<_>>()?;
    let argv: Vec<CString> = plan.argv.iter().map(|a| cstring(a)).collect::<io::Result<_>>()?;
    let envp: Vec<CString> = plan.env.iter().map(|(k, v)| variable(k, v)).collect::<io::Result<_>>()?;
    let (paths_p, argv_p, envp_p) = (pointers(&paths), pointers(&argv), pointers(&envp));
    let (in_r, in_w, fed) = stdin_with(plan.input)?;
    let (out_r, out_w) = pipe_pair()?;
    let (err_r, err_w) = pipe_pair()?;
    let starting = Starting::take();
    let asked = asking();
    let mut shared = Shared {
        paths: paths_p.as_ptr(),
        argv: argv_p.as_ptr(),
        envp: envp_p.as_ptr(),
        fds: [in_r.as_raw_fd(), out_w.as_raw_fd(), err_w.as_raw_fd()],
        umask: plan.umask.unwrap_or(0) as libc::mode_t,
        set_umask: plan.umask.is_some(),
        // SAFETY: getpid has no preconditions.
        parent: unsafe { libc::getpid() },
        errno: 0,
        starting: starting.slot(),
    };
    let (pid, pidfd) = clone_child(&mut shared)?;
    drop((in_r, out_w, err_w));
    // SAFETY: clone wrote a pidfd owned here (CLONE_PIDFD).
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd) };
    // SAFETY: the child exited (vfork returned) or exec'd; its write, if any, is done.
    let errno = unsafe { std::ptr::read_volatile(&shared.errno) };
    if errno != 0 {
        // Let go before the reap frees its pid for anyone.
        drop(starting);
        let mut status = 0;
        // SAFETY: reaps the child that failed before its exec.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        return Err(io::Error::from_raw_os_error(errno));
    }
    started(pid, asked);
    // Told as started: the slot may go.
    drop(starting);
    // SAFETY: the pidfd is owned by the AsyncFd from here until it is dropped.
    let pidfd = match unsafe { AsyncFd::register_with_interest(pidfd, Interest::READABLE) } {
        Ok(fd) => fd,
        Err(e) => {
            kill_and_reap(pid);
            return Err(io::Error::from(e));
        }
    };
    let exit = Exit { pid, pidfd: Some(pidfd) };
    for fd in [&out_r, &err_r] {
        nonblocking(fd)?;
    }
    Ok(Child {
        pid,
        asked,
        stdin: in_w.map(pipe::Sender::from_owned_fd_unchecked).transpose()?,
        fed,
        stdout: Some(pipe::Receiver::from_owned_fd_unchecked(out_r)?),
        stderr: Some(pipe::Receiver::from_owned_fd_unchecked(err_r)?),
        exit,
    })
}

/// clone(CLONE_VM|CLONE_VFORK|CLONE_PIDFD) with every signal blocked around it, so that no
/// handler of the server runs in the child on the server's memory.
fn clone_child(shared: &mut Shared) -> io::Result<(i32, c_int)> {
    CHILD_STACK.with_borrow_mut(|stack| clone_on(stack, shared))
}

thread_local! {
    /// The child's stack, one a spawning thread and kept (P9: not 64 KiB allocated, faulted in
    /// and freed a job): the thread is suspended while its child runs on it (CLONE_VFORK), so
    /// no two children ever share one.
    static CHILD_STACK: std::cell::RefCell<Box<[std::mem::MaybeUninit<u8>]>> =
        std::cell::RefCell::new(Box::new_uninit_slice(STACK));
}

fn clone_on(stack: &mut [std::mem::MaybeUninit<u8>], shared: &mut Shared) -> io::Result<(i32, c_int)> {
    // The stack grows down from its 16-byte aligned top.
    let top = (stack.as_mut_ptr() as usize + stack.len()) & !15;
    let mut pidfd: c_int = -1;
    // SAFETY: the sets are initialised by sigfillset/pthread_sigmask before use; clone runs
    // `child` on `stack`, which outlives it (the parent is suspended until exec or exit), with
    // `shared`, which this frame owns for as long.
    let pid = unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_SETMASK, &all, &mut old);
        let pid = libc::clone(
            child,
            top as *mut c_void,
            libc::CLONE_VM | libc::CLONE_VFORK | libc::CLONE_PIDFD | libc::SIGCHLD,
            (shared as *mut Shared).cast::<c_void>(),
            &mut pidfd as *mut c_int,
        );
        let err = io::Error::last_os_error();
        libc::pthread_sigmask(libc::SIG_SETMASK, &old, std::ptr::null_mut());
        if pid < 0 {
            return Err(err);
        }
        pid
    };
    Ok((pid, pidfd))
}

/// The child, until `execve`: system calls only, on data prepared by [`spawn`].
extern "C" fn child(arg: *mut c_void) -> c_int {
    // SAFETY: `arg` is the `Shared` of the suspended parent; everything it points to lives.
    unsafe {
        let shared = &mut *arg.cast::<Shared>();
        if !shared.starting.is_null() {
            (*shared.starting).store(libc::getpid(), Ordering::Release);
        }
        // Handlers of the server must not run here: each caught signal back to its default,
        // SIGPIPE too (std ignores it in the server); the mask stays full until the exec.
        for sig in 1..libc::SIGRTMIN() {
            let mut action: libc::sigaction = std::mem::zeroed();
            if sig == libc::SIGKILL || sig == libc::SIGSTOP || libc::sigaction(sig, std::ptr::null(), &mut action) != 0
            {
                continue;
            }
            let caught = action.sa_sigaction != libc::SIG_DFL && action.sa_sigaction != libc::SIG_IGN;
            if caught || sig == libc::SIGPIPE {
                action.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(sig, &action, std::ptr::null_mut());
            }
        }
        // Its own session (and group, both its pid): a timeout or its end kills all it started.
        if libc::setsid() < 0 {
            fail(shared);
        }
        // If serve dies (SIGKILL included), the function dies with it; if serve died already,
        // the child is not left to run.
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) < 0 {
            fail(shared);
        }
        if libc::getppid() != shared.parent {
            libc::_exit(127);
        }
        if shared.set_umask {
            libc::umask(shared.umask);
        }
        for (target, fd) in shared.fds.iter().enumerate() {
            if libc::dup2(*fd, target as c_int) < 0 {
                fail(shared);
            }
        }
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        libc::pthread_sigmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
        // As execvp: the first candidate that exists; EACCES is kept if nothing else runs.
        let mut denied = false;
        let mut path = shared.paths;
        while !(*path).is_null() {
            libc::execve(*path, shared.argv, shared.envp);
            match *libc::__errno_location() {
                libc::EACCES => denied = true,
                libc::ENOENT | libc::ENOTDIR | libc::ELOOP | libc::ENAMETOOLONG => {}
                _ => fail(shared),
            }
            path = path.add(1);
        }
        if denied {
            *libc::__errno_location() = libc::EACCES;
        }
        fail(shared)
    }
}

/// Leaves the errno for the parent (shared memory) and exits without running anything of the
/// server's (no atexit, no flush).
unsafe fn fail(shared: &mut Shared) -> ! {
    // SAFETY: the errno location is this thread's; `shared` is the parent's, alive.
    unsafe {
        let errno = (*libc::__errno_location()).max(1);
        std::ptr::write_volatile(&mut shared.errno, errno);
        libc::_exit(127)
    }
}

impl Exit {
    /// Its exit status once it exited (reaped here).
    pub async fn wait(&mut self) -> io::Result<ExitStatus> {
        loop {
            let Some(fd) = &self.pidfd else { return Err(io::Error::other("already reaped")) };
            let mut ready = fd.readable().await?;
            if let Some(status) = reap(self.pid)? {
                drop(ready);
                self.pidfd = None;
                return Ok(status);
            }
            ready.clear_ready();
        }
    }

    /// SIGKILL to the child itself (its group is the run's to kill).
    pub fn kill(&self) {
        if let Some(fd) = &self.pidfd {
            // SAFETY: pidfd_send_signal on a pidfd owned here signals exactly this child.
            unsafe {
                libc::syscall(libc::SYS_pidfd_send_signal, fd.get_ref().as_raw_fd(), libc::SIGKILL, 0, 0);
            }
        }
    }
}

/// The exit status of `pid`, this process' child, if it has exited; it is then reaped.
fn reap(pid: i32) -> io::Result<Option<ExitStatus>> {
    let mut status = 0;
    released(pid);
    // SAFETY: the pid is this process' unreaped child (its pidfd is held until reaped).
    let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
    if got < 0 {
        return Err(io::Error::last_os_error());
    }
    if got == 0 {
        held(pid);
    }
    Ok((got != 0).then(|| ExitStatus::from_raw(status)))
}

impl Drop for Exit {
    fn drop(&mut self) {
        if self.pidfd.take().is_some() {
            kill_and_reap(self.pid);
        }
    }
}

/// SIGKILL to `pid`, a child of this process not yet reaped, then its reap (it exits at once).
fn kill_and_reap(pid: i32) {
    released(pid);
    // SAFETY: until it is reaped here, `pid` is this process' own child and no one else's.
    unsafe {
        libc::kill(pid, libc::SIGKILL);
        libc::waitpid(pid, &mut 0, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(argv: &[&str]) -> Child {
        let path = std::env::var("PATH").ok();
        let paths = pcmail_core::exec::candidates(argv[0], path.as_deref());
        let env = [("PATH", path.as_deref().unwrap_or_default())];
        spawn(&Plan { paths: &paths, argv, env: &env, umask: None, input: b"" }).expect("spawn")
    }

    /// E16: a child's variable that cannot be passed (a NUL byte) is named, and its value,
    /// which may be a secret, is never shown.
    #[test]
    fn e16_a_variable_holding_a_nul_byte_is_refused_by_its_name_and_its_value_never_shown() {
        let refused = variable("API_TOKEN", "s3cr\0et").expect_err("a NUL byte in the value");
        let said = refused.to_string();
        assert!(said.contains("the value of variable \"API_TOKEN\""), "{said}");
        assert!(!said.contains("s3cr") && !said.contains("et\""), "{said}");
        let refused = variable("API\0TOKEN", "fine").expect_err("a NUL byte in the name");
        assert!(refused.to_string().starts_with("the name of variable"), "{refused}");
        assert_eq!(variable("A", "b=c").expect("passed").as_bytes(), b"A=b=c");
    }

    #[test]
    fn p9_e16_a_start_asked_for_while_a_runs_child_is_exec_ing_is_known_as_after_it() {
        // Pids no kernel hands out (above the largest pid_max), so no real child is confused.
        let (run, other) = (5_000_001, 5_000_002);
        // The run's start is asked for; while its child is still exec'ing (its clone has not
        // returned), another thread asks for a start and records it first.
        let run_asked = asking();
        let other_asked = asking();
        started(other, other_asked);
        started(run, run_asked);
        assert!(started_after(other, run_asked), "asked for after the run's: its pid came after the run's child");
        // Recorded after the other, the run's own record would not have told it.
        let run_recorded = children().recent.iter().rev().find(|s| s.pid == run).map_or(0, |s| s.order);
        assert!(!started_after(other, run_recorded), "the record comes only once the run's child has exec'd");
        assert!(!started_after(run, other_asked), "asked for before the other: its clone may have come first");
        released(run);
        released(other);
    }

    #[tokio::test]
    async fn p9_e16_a_child_is_unreaped_until_its_exit_is_read_and_then_its_pid_is_no_longer_held() {
        let mut child = start(&["true"]);
        assert!(unreaped(child.pid), "a child started is held until it is reaped");
        // Exited but not yet reaped (a zombie): its pid is still its own.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(unreaped(child.pid));
        assert!(child.exit.wait().await.expect("status").success());
        assert!(!unreaped(child.pid), "a reaped child's pid may be anyone's");
    }

    /// Set in the copy of this test binary that the SIGCHLD test below starts.
    const IGNORED: &str = "PCMAIL_TEST_SIGCHLD_IGNORED";

    #[test]
    fn p9_e16_a_serve_started_with_sigchld_ignored_still_reaps_its_children() {
        if std::env::var_os(IGNORED).is_some() {
            // The copy: SIGCHLD came ignored through `execve`, as from a parent that ignored it.
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            let status = rt.block_on(async {
                let mut child = start(&["true"]);
                let pid = child.pid;
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                assert!(unreaped(pid), "the kernel must not have reaped it");
                child.exit.wait().await
            });
            assert!(status.expect("the exit status is read, not lost").success());
            return;
        }
        let mut copy = std::process::Command::new(std::env::current_exe().expect("test binary"));
        copy.args(["--exact", "spawner::tests::p9_e16_a_serve_started_with_sigchld_ignored_still_reaps_its_children"]);
        copy.env(IGNORED, "1");
        // SAFETY: the hook only sets a signal's disposition, which is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut copy, || {
                libc::signal(libc::SIGCHLD, libc::SIG_IGN);
                Ok(())
            });
        }
        let out = copy.output().expect("run the copy");
        let said = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success() && said.contains("1 passed"), "{said}{}", String::from_utf8_lossy(&out.stderr));
    }

    #[tokio::test]
    async fn p9_e16_a_child_dropped_unreaped_is_killed_reaped_and_let_go() {
        let child = start(&["sleep", "30"]);
        let pid = child.pid;
        assert!(unreaped(pid));
        drop(child);
        assert!(!unreaped(pid));
        // SAFETY: waitpid on a pid that is no longer this process' child only fails.
        let still_ours = unsafe { libc::waitpid(pid, &mut 0, libc::WNOHANG) };
        assert_eq!(still_ours, -1, "the child was reaped when it was dropped");
    }

    #[tokio::test]
    async fn p9_e16_a_child_started_after_a_runs_own_is_known_by_when_it_was_asked_reaped_or_not() {
        let mut first = start(&["true"]);
        let mut second = start(&["true"]);
        assert!(second.asked > first.asked, "starts are numbered in order");
        for child in [&mut first, &mut second] {
            assert!(child.exit.wait().await.expect("status").success());
        }
        assert!(started_after(second.pid, first.asked), "reaped, still known as started after the first");
        assert!(!started_after(first.pid, first.asked), "a run's own child is not after itself");
        assert!(!started_after(second.pid, second.asked));
        let me = i32::try_from(std::process::id()).expect("pid");
        assert!(!started_after(me, 0), "a process never started here is a stranger");
        assert!(!starting(first.pid) && !starting(second.pid), "a started child's slot is let go");
    }

    #[test]
    fn p9_e16_a_starting_slot_names_its_child_while_held_and_nothing_once_let_go() {
        let held = Starting::take();
        let slot = held.0.expect("a free slot");
        assert!(!starting(-1), "a held slot with no pid yet names no one");
        // What the child writes first thing (from the clone's shared memory).
        slot.store(4_000_000, Ordering::Release);
        assert!(starting(4_000_000));
        drop(held);
        assert!(!starting(4_000_000), "let go once the start is recorded");
        assert_eq!(slot.load(Ordering::Acquire), 0, "free for the next start");
    }
}
