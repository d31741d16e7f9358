//! E16/E17: the rules of a Function's process (and a ledger source command's) — how much of its
//! output is kept while it is read, what counts as its success, and which processes are its own
//! when it ends. The shell (`server/src/exec.rs`) reads pipes and `/proc`; nothing here does IO.

use std::collections::VecDeque;
use std::time::Duration;

/// At most this much of a Function's stdout is ever held (its result).
pub const FUNCTION_STDOUT: usize = 1 << 20;
/// At most this much of a ledger source command's stdout (its JSON lines) is ever held.
pub const SOURCE_STDOUT: usize = 8 << 20;
/// The end of stderr kept for an error message.
pub const STDERR_TAIL: usize = 4 << 10;
/// The environment variable every process of one run inherits: how its strays are found after
/// they left its session (`setsid`).
pub const RUN_MARK: &str = "PCMAIL_RUN";

/// Which part of a stream a [`Capped`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// The first `cap` bytes (a result is read from its start).
    Head,
    /// The last `cap` bytes (an error is said at the end of stderr).
    Tail,
}

/// A stream read through a cap: every byte counted, never more than `cap` held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capped {
    cap: usize,
    keep: Keep,
    kept: VecDeque<u8>,
    seen: u64,
}

impl Capped {
    pub fn new(cap: usize, keep: Keep) -> Capped {
        Capped { cap, keep, kept: VecDeque::new(), seen: 0 }
    }

    /// Takes one chunk read: counts it and keeps what the cap allows.
    pub fn push(&mut self, chunk: &[u8]) {
        self.seen = self.seen.saturating_add(chunk.len() as u64);
        match self.keep {
            Keep::Head => {
                let room = self.cap.saturating_sub(self.kept.len());
                self.kept.extend(&chunk[..chunk.len().min(room)]);
            }
            Keep::Tail => {
                let tail = &chunk[chunk.len().saturating_sub(self.cap)..];
                let over = (self.kept.len() + tail.len()).saturating_sub(self.cap);
                self.kept.drain(..over);
                self.kept.extend(tail);
            }
        }
    }

    /// Every byte the stream carried, kept or not.
    pub fn seen(&self) -> u64 {
        self.seen
    }

    /// Whether bytes were dropped: the stream passed its cap.
    pub fn over(&self) -> bool {
        self.seen > self.kept.len() as u64
    }

    pub fn held(&self) -> usize {
        self.kept.len()
    }

    pub fn cap(&self) -> usize {
        self.cap
    }

    /// What was kept.
    pub fn bytes(&self) -> Vec<u8> {
        let (a, b) = self.kept.as_slices();
        [a, b].concat()
    }

    /// What was kept, as text (a character cut at the edge becomes U+FFFD).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.bytes()).into_owned()
    }
}

/// How a run ended, as the shell saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// It exited (or was killed by a signal); `success` is its exit status' verdict.
    Exited { success: bool },
    /// Its timeout passed first.
    TimedOut,
}

/// What a run's end means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Its stdout is the result.
    Succeeded,
    /// It exited 0 but wrote more than the cap: its result would be a cut one.
    OutputOverCap,
    /// It failed: its status and the end of its stderr say why.
    Failed,
    TimedOut,
}

/// E16: success is the exit status alone — pipes a stray descendant still holds say nothing —
/// and a result past its cap is refused rather than recorded cut.
pub fn verdict(ended: Ended, stdout: &Capped) -> Verdict {
    match ended {
        Ended::TimedOut => Verdict::TimedOut,
        Ended::Exited { success: false } => Verdict::Failed,
        Ended::Exited { success: true } if stdout.over() => Verdict::OutputOverCap,
        Ended::Exited { success: true } => Verdict::Succeeded,
    }
}

/// Where `program` is looked for, in order, as `execvp` would: itself when it names a path
/// (holds a `/`), else each directory of `path` (the child's PATH; an empty entry is the current
/// directory).
pub fn candidates(program: &str, path: Option<&str>) -> Vec<String> {
    if program.contains('/') {
        return vec![program.to_string()];
    }
    let path = path.unwrap_or("/usr/local/bin:/usr/bin:/bin");
    path.split(':').map(|dir| if dir.is_empty() { program.to_string() } else { format!("{dir}/{program}") }).collect()
}

/// A child's whole environment from `(key, value)` pairs in the order they were set: a later
/// value of a key replaces an earlier one (as std's `Command::env`), one entry per key.
pub fn environment<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<(&'a str, &'a str)> {
    let map: std::collections::BTreeMap<&str, &str> = pairs.into_iter().collect();
    map.into_iter().collect()
}

/// The last `chars` characters of a trimmed text (an error's stderr line).
pub fn tail_chars(text: &str, chars: usize) -> String {
    let text = text.trim();
    let start = text.char_indices().rev().nth(chars.saturating_sub(1)).map_or(0, |(i, _)| i);
    if chars == 0 { String::new() } else { text[start..].to_string() }
}

/// One run's processes: its session (and process group, both the Function's pid), when it
/// started, and the mark its environment carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunId {
    pub session: i32,
    /// The Function's start (`/proc/PID/stat` field 22, clock ticks since boot); 0 if unknown.
    pub started: u64,
    pub mark: Mark,
}

/// The `PCMAIL_RUN` a run's processes carry: one run's, or every run of one `serve` — whose
/// runs' marks all begin with the serve's ([`run_mark`]), so that a serve records itself once,
/// not each run, for the reap after its crash.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mark {
    Run(String),
    Serve(String),
}

/// The mark of the `n`th run of the serve marked `serve`.
pub fn run_mark(serve: &str, n: u64) -> String {
    format!("{serve}-{n}")
}

/// Whether a process is one of a run's, from its `/proc/PID/stat` alone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Member {
    Yes,
    No,
    /// Outside its session and group but started since the run did: its environment says
    /// ([`RunId::marked`]).
    AskEnviron,
}

impl RunId {
    /// Whether the process `/proc/PID/stat` describes is this run's and still to be killed: in
    /// its session or group, or — for a `setsid` grandchild that left both — to be asked its
    /// environment, if it started no earlier than the run (older ones cannot descend from it,
    /// and their environments are never read). A zombie is already dead.
    pub fn member(&self, stat: &str) -> Member {
        let Some(fields) = stat_fields(stat) else { return Member::No };
        if matches!(fields.state, 'Z' | 'X') {
            return Member::No;
        }
        // Session 0 is the kernel's threads', 1 init's: never a run's.
        if self.session > 1 && (fields.pgrp == self.session || fields.session == self.session) {
            return Member::Yes;
        }
        if fields.started >= self.started { Member::AskEnviron } else { Member::No }
    }

    /// Whether a process' environment (`/proc/PID/environ`, NUL-separated) carries the mark.
    pub fn marked(&self, environ: &[u8]) -> bool {
        let (entry, whole) = match &self.mark {
            Mark::Run(run) => (format!("{RUN_MARK}={run}"), true),
            // Every `run_mark(serve, n)`, and nothing else: the serve's mark ends at the dash.
            Mark::Serve(serve) => (format!("{RUN_MARK}={serve}-"), false),
        };
        environ.split(|b| *b == 0).any(|e| if whole { e == entry.as_bytes() } else { e.starts_with(entry.as_bytes()) })
    }
}

struct StatFields {
    state: char,
    pgrp: i32,
    session: i32,
    started: u64,
}

/// `/proc/PID/stat`: `pid (comm) state ppid pgrp session … starttime(22) …`; comm may hold
/// spaces and parens, so the fields are read after its last `)`.
fn stat_fields(stat: &str) -> Option<StatFields> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().take(20).collect();
    let state = f.first()?.chars().next()?;
    let pgrp = f.get(2)?.parse().ok()?;
    let session = f.get(3)?.parse().ok()?;
    // A stat too short to say when it started is asked, never skipped.
    let started = f.get(19).and_then(|t| t.parse().ok()).unwrap_or(u64::MAX);
    Some(StatFields { state, pgrp, session, started })
}

/// A time since boot (`CLOCK_BOOTTIME`) in the clock ticks `/proc/PID/stat` counts a start in
/// (`clk_tck` a second, rounded down as the kernel does): read just before a child starts, it
/// is no later than the child's own start.
pub fn boot_ticks(since_boot: std::time::Duration, clk_tck: u64) -> u64 {
    let ticks = since_boot.as_nanos().saturating_mul(u128::from(clk_tck)) / 1_000_000_000;
    u64::try_from(ticks).unwrap_or(u64::MAX)
}

/// When the process `/proc/PID/stat` describes started (0 if it does not say).
pub fn started(stat: &str) -> u64 {
    stat_fields(stat).map_or(0, |f| if f.started == u64::MAX { 0 } else { f.started })
}

/// What `/proc` says of the pid counter at one moment (P9: where a run's strays can be).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PidCounter {
    /// The last pid handed out in this pid namespace (`/proc/loadavg`'s last field).
    pub last: i32,
    /// Tasks alive, zombies included (`/proc/loadavg`'s `running/total`).
    pub tasks: u64,
    /// Forks since boot, threads included (`/proc/stat`'s `processes`); None when `/proc/stat`
    /// was not read (P9: the kernel writes all of it, every CPU's and interrupt's counts, for
    /// one line).
    pub forks: Option<u64>,
    /// `/proc/sys/kernel/pid_max`.
    pub max: i32,
    /// When the read began and when it ended, on the reader's monotonic clock: what it says
    /// held at some moment between the two.
    pub from: Duration,
    pub until: Duration,
}

impl PidCounter {
    /// Reads the files' texts (`stat` None: not read), read between `from` and `until`; None
    /// if one of them does not say.
    pub fn parse(
        loadavg: &str,
        stat: Option<&str>,
        pid_max: &str,
        (from, until): (Duration, Duration),
    ) -> Option<PidCounter> {
        let mut fields = loadavg.split_whitespace().skip(3);
        let tasks = fields.next()?.split_once('/')?.1.parse().ok()?;
        let last = fields.next()?.parse().ok()?;
        let forks = match stat {
            Some(stat) => Some(stat.lines().find_map(|l| l.strip_prefix("processes "))?.trim().parse().ok()?),
            None => None,
        };
        let max = pid_max.trim().parse().ok()?;
        Some(PidCounter { last, tasks, forks, max, from, until })
    }
}

/// The pids Linux keeps back when its counter comes round (`RESERVED_PIDS`).
const RESERVED_PIDS: u64 = 300;

/// Less CPU time than any fork or thread creation takes (a `clone` allocates a task, its
/// kernel stack and its pid: several microseconds on any machine Linux runs on today), so a
/// machine of `cpus` CPUs forks at most `cpus × elapsed ÷ FORK_AT_LEAST` times in `elapsed`.
pub const FORK_AT_LEAST: Duration = Duration::from_micros(2);

/// The pids a run's strays can hold when it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Suspects {
    /// Any pid: the counter may have come round since the run's child started, or `/proc` did
    /// not say.
    Everywhere,
    /// The pids handed out since the run's child got `child`, up to `last`, in the counter's
    /// cycle: `(child, last]`.
    Since { child: i32, last: i32 },
}

impl Suspects {
    /// E16 at P9's rate: a stray descends from the run's child, so it got its pid after the
    /// child's. Linux hands pids out in a cycle, each the next free one after the last, so every
    /// pid given since lies in `(child, last]` — until the counter passes `child` again. To do
    /// that it must move a whole cycle: one step per fork since and one per pid in use it
    /// skips, at most three per task alive when the child started (its own, its group's and its
    /// session's). `before` is any reading taken before the child started: it undercounts no
    /// fork, and the tasks then were at most its tasks and its forks since. The forks since are
    /// `/proc/stat`'s count where both readings have it, else the most `cpus` can make in the
    /// time between them ([`FORK_AT_LEAST`]).
    pub fn of(child: i32, before: PidCounter, now: PidCounter, cpus: u64) -> Suspects {
        let max = before.max.min(now.max);
        let forks = match (before.forks, now.forks) {
            (Some(before), Some(now)) => now.checked_sub(before),
            // From the earliest moment `before` can speak of to the latest `now` can.
            _ => now.until.checked_sub(before.from).map(|elapsed| most_forks(elapsed, cpus)),
        };
        let moved = forks.map(|forks| {
            let in_use = before.tasks.saturating_add(forks).saturating_mul(3);
            forks.saturating_add(in_use)
        });
        let cycle = u64::try_from(max).unwrap_or(0).saturating_sub(RESERVED_PIDS + 1);
        match moved {
            Some(moved) if moved < cycle && 0 < child && child < max && 0 < now.last && now.last < max => {
                Suspects::Since { child, last: now.last }
            }
            _ => Suspects::Everywhere,
        }
    }

    pub fn holds(&self, pid: i32) -> bool {
        match *self {
            Suspects::Everywhere => true,
            Suspects::Since { child, last } if child <= last => child < pid && pid <= last,
            Suspects::Since { child, last } => pid > child || pid <= last,
        }
    }

    /// The suspects one by one, when there are at most `limit` of them (else None: list them
    /// from `/proc`).
    pub fn few(&self, limit: usize) -> Option<Vec<i32>> {
        let Suspects::Since { child, last } = *self else { return None };
        if child > last {
            return None;
        }
        let count = usize::try_from(last - child).ok()?;
        (count <= limit).then(|| (child + 1..=last).collect())
    }
}

/// The most forks `cpus` CPUs can make in `elapsed` ([`FORK_AT_LEAST`]), rounded up.
fn most_forks(elapsed: Duration, cpus: u64) -> u64 {
    let each = FORK_AT_LEAST.as_nanos();
    let forks = elapsed.as_nanos().saturating_mul(u128::from(cpus.max(1))).div_ceil(each);
    u64::try_from(forks).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn e16_a_head_cap_keeps_the_first_bytes_and_counts_all() {
        let mut c = Capped::new(10, Keep::Head);
        c.push(b"hello ");
        c.push(b"world, and more");
        assert_eq!((c.text().as_str(), c.seen(), c.over(), c.held()), ("hello worl", 21, true, 10));
        for _ in 0..1000 {
            c.push(&[b'x'; 4096]);
        }
        assert_eq!(c.held(), 10, "never more than the cap held");
        assert_eq!(c.seen(), 21 + 4096 * 1000);
    }

    #[test]
    fn e16_a_tail_cap_keeps_the_last_bytes() {
        let mut c = Capped::new(5, Keep::Tail);
        c.push(b"abc");
        assert_eq!((c.text().as_str(), c.over()), ("abc", false));
        c.push(b"defg");
        assert_eq!(c.text(), "cdefg");
        c.push(b"0123456789");
        assert_eq!((c.text().as_str(), c.held(), c.seen()), ("56789", 5, 17));
        c.push(b"Z");
        assert_eq!(c.text(), "6789Z");
    }

    #[test]
    fn e16_a_stream_exactly_at_its_cap_is_not_over() {
        let mut c = Capped::new(4, Keep::Head);
        c.push(b"abcd");
        assert!(!c.over());
        c.push(b"");
        assert!(!c.over());
        c.push(b"e");
        assert!(c.over());
    }

    #[test]
    fn e16_success_is_the_exit_status_and_a_result_past_its_cap_is_refused() {
        let small = Capped::new(8, Keep::Head);
        let mut big = Capped::new(8, Keep::Head);
        big.push(&[0; 9]);
        assert_eq!(verdict(Ended::Exited { success: true }, &small), Verdict::Succeeded);
        assert_eq!(verdict(Ended::Exited { success: true }, &big), Verdict::OutputOverCap);
        assert_eq!(verdict(Ended::Exited { success: false }, &big), Verdict::Failed);
        assert_eq!(verdict(Ended::TimedOut, &small), Verdict::TimedOut);
    }

    #[test]
    fn tail_chars_counts_characters_not_bytes() {
        assert_eq!(tail_chars("  nope\n", 500), "nope");
        assert_eq!(tail_chars("見積書を送る", 2), "送る");
        assert_eq!(tail_chars("abc", 0), "");
    }

    fn counter(last: i32, tasks: u64, forks: u64) -> PidCounter {
        PidCounter { last, tasks, forks: Some(forks), max: 32768, from: Duration::ZERO, until: Duration::ZERO }
    }

    /// A reading of `/proc/loadavg` alone, `at` microseconds in.
    fn glance(last: i32, tasks: u64, at: u64) -> PidCounter {
        let at = Duration::from_micros(at);
        PidCounter { last, tasks, forks: None, max: 32768, from: at, until: at }
    }

    #[test]
    fn e16_a_start_read_off_the_boot_clock_is_in_the_ticks_of_proc_stat() {
        assert_eq!(boot_ticks(Duration::from_millis(123_456_789), 100), 12_345_678);
        assert_eq!(boot_ticks(Duration::from_nanos(9_999_999), 100), 0, "rounded down");
        assert_eq!(boot_ticks(Duration::from_secs(3), 250), 750);
        assert_eq!(boot_ticks(Duration::MAX, 1_000_000), u64::MAX);
    }

    #[test]
    fn e16_the_pid_counter_is_read_from_loadavg_stat_and_pid_max() {
        let stat = "cpu  1 2 3\nintr 5 6\nctxt 9\nprocesses 14465\nprocs_running 1\n";
        assert_eq!(
            PidCounter::parse("0.08 0.51 0.31 1/138 12782\n", Some(stat), "32768\n", (Duration::ZERO, Duration::ZERO)),
            Some(counter(12782, 138, 14465))
        );
        let at = (Duration::from_millis(7), Duration::from_millis(7));
        assert_eq!(
            PidCounter::parse("0.08 0.51 0.31 1/138 12782\n", None, "32768", at),
            Some(glance(12782, 138, 7_000))
        );
        assert_eq!(PidCounter::parse("0.08 0.51 0.31 1/138\n", Some(stat), "32768", at), None, "no last pid");
        let no_count = PidCounter::parse("0.08 0.51 0.31 1/138 12782", Some("cpu 1\n"), "32768", at);
        assert_eq!(no_count, None, "a /proc/stat without a fork count");
        assert_eq!(PidCounter::parse("0.08 0.51 0.31 1/138 12782", Some(stat), "", at), None);
    }

    #[test]
    fn e16_strays_are_looked_for_among_the_pids_handed_out_since_the_child_until_the_counter_can_come_round() {
        let before = counter(4000, 100, 10_000);
        let since = Suspects::of(4001, before, counter(4010, 104, 10_012), 2);
        assert_eq!(since, Suspects::Since { child: 4001, last: 4010 });
        assert!(since.holds(4002) && since.holds(4010));
        assert!(!since.holds(4001) && !since.holds(4011) && !since.holds(300), "the child and older pids");
        assert_eq!(since.few(16), Some((4002..=4010).collect()));
        assert_eq!(since.few(8), None, "nine suspects: listed from /proc");
        // The counter came round past pid_max: the cycle's two ends.
        let wrapped = Suspects::of(32700, before, counter(320, 104, 10_500), 2);
        assert!(wrapped.holds(32767) && wrapped.holds(300) && !wrapped.holds(4000) && !wrapped.holds(32700));
        assert_eq!(wrapped.few(1 << 20), None);
        // Enough forks (or pids in use to skip) to pass the child again: any pid may be a stray.
        assert_eq!(Suspects::of(4001, before, counter(4010, 100, 10_000 + 8_100), 2), Suspects::Everywhere);
        assert_eq!(
            Suspects::of(4001, counter(4000, 10_900, 10_000), counter(4010, 5, 10_012), 2),
            Suspects::Everywhere
        );
        // An earlier reading serves as well, its forks since counted as tasks that may have been
        // alive when the child started: 8,100 + 3 × (100 + 8,100) passes a cycle, 1,000 does not.
        assert!(matches!(Suspects::of(4001, before, counter(4010, 100, 11_000), 2), Suspects::Since { .. }));
        assert_eq!(
            Suspects::of(4001, before, counter(4010, 100, 9_999), 2),
            Suspects::Everywhere,
            "a counter gone back"
        );
        assert_eq!(Suspects::of(0, before, counter(4010, 100, 10_001), 2), Suspects::Everywhere, "no child pid");
        assert!(Suspects::Everywhere.holds(1) && Suspects::Everywhere.few(usize::MAX).is_none());
    }

    #[test]
    fn e16_without_a_fork_count_the_forks_since_are_the_most_the_cpus_can_make_in_the_time() {
        // 2 CPUs in 4 ms: at most 4,000 forks, 4,000 + 3 × (140 + 4,000) = 16,420 steps, under
        // the 32,467 of a cycle: only the pids since the child.
        let since = Suspects::of(4001, glance(4000, 140, 1_000), glance(4010, 140, 5_000), 2);
        assert_eq!(since, Suspects::Since { child: 4001, last: 4010 });
        // 9 ms, or four times the CPUs, could come round.
        assert_eq!(Suspects::of(4001, glance(4000, 140, 1_000), glance(4010, 140, 10_000), 2), Suspects::Everywhere);
        assert_eq!(Suspects::of(4001, glance(4000, 140, 1_000), glance(4010, 140, 5_000), 8), Suspects::Everywhere);
        // One reading without the count is enough to fall back on the time; a clock gone back
        // says nothing.
        let counted = PidCounter { from: Duration::from_micros(1_000), ..counter(4000, 140, 10_000) };
        assert!(matches!(Suspects::of(4001, counted, glance(4010, 140, 5_000), 2), Suspects::Since { .. }));
        assert_eq!(Suspects::of(4001, glance(4000, 140, 5_000), glance(4010, 140, 1_000), 2), Suspects::Everywhere);
        // Both counts known: the count decides, whatever the time.
        let later = PidCounter { until: Duration::from_secs(3_600), ..counter(4010, 140, 10_012) };
        // The time runs from when `before`'s read began to when `now`'s ended: a read that took
        // 5 ms counts, though each reading was stamped once.
        let slow = PidCounter { until: Duration::from_micros(10_000), ..glance(4010, 140, 5_000) };
        assert_eq!(Suspects::of(4001, glance(4000, 140, 1_000), slow, 2), Suspects::Everywhere);
        assert!(matches!(Suspects::of(4001, counted, later, 2), Suspects::Since { .. }));
        assert_eq!(most_forks(Duration::from_nanos(1), 1), 1, "rounded up");
        assert_eq!(most_forks(Duration::MAX, u64::MAX), u64::MAX);
    }

    fn run() -> RunId {
        RunId { session: 4242, started: 500, mark: Mark::Run(run_mark("9", 1)) }
    }

    /// A stat line with `state pgrp session` and `starttime`.
    fn stat(pid: i32, comm: &str, state: char, pgrp: i32, session: i32, started: u64) -> String {
        format!("{pid} ({comm}) {state} 1 {pgrp} {session} 0 -1 4194304 1 0 0 0 0 0 0 0 20 0 1 0 {started} 1 1")
    }

    #[test]
    fn e16_a_run_owns_its_session_and_group_and_asks_younger_strays_for_its_mark() {
        let r = run();
        assert_eq!(r.member(&stat(4250, "sleep", 'S', 4242, 4242, 600)), Member::Yes, "its group and session");
        assert_eq!(r.member(&stat(4251, "sh", 'S', 4251, 4242, 600)), Member::Yes, "another group of its session");
        assert_eq!(r.member(&stat(4260, "sleep", 'S', 4260, 4260, 600)), Member::AskEnviron, "left both");
        assert_eq!(r.member(&stat(4260, "sleep", 'S', 4260, 4260, 500)), Member::AskEnviron, "the same tick");
        assert_eq!(r.member(&stat(300, "sshd", 'S', 300, 300, 40)), Member::No, "older than the run");
        assert_eq!(r.member(&stat(4250, "sleep", 'Z', 4242, 4242, 600)), Member::No, "a zombie is dead already");
        assert!(r.marked(b"PATH=/bin\0PCMAIL_RUN=9-1\0HOME=/"));
        assert!(!r.marked(b"PCMAIL_RUN=9-10\0"), "another run's mark");
        assert!(!r.marked(b"XPCMAIL_RUN=9-1\0"));
        let unknown = RunId { session: 0, started: 0, mark: Mark::Run("9-1".into()) };
        assert_eq!(unknown.member(&stat(2, "kthreadd", 'S', 0, 0, 1)), Member::AskEnviron, "never by session 0");
        assert_eq!(started(&stat(4250, "sleep", 'S', 1, 1, 77)), 77);
    }

    #[test]
    fn e16_a_reap_after_a_crash_finds_every_run_of_the_serve_and_no_other_serves() {
        let serve = RunId { session: 0, started: 500, mark: Mark::Serve("9-ab12".into()) };
        for n in [1, 10, 12_345] {
            let env = format!("PATH=/bin\0PCMAIL_RUN={}\0", run_mark("9-ab12", n));
            assert!(serve.marked(env.as_bytes()), "run {n} of the serve");
        }
        assert!(!serve.marked(b"PCMAIL_RUN=9-ab123-1\0"), "a serve whose mark only begins the same");
        assert!(!serve.marked(b"PCMAIL_RUN=9-ab12\0"), "the serve's own mark is no run's");
        assert!(!serve.marked(b"XPCMAIL_RUN=9-ab12-1\0"));
    }

    #[test]
    fn e16_a_comm_with_spaces_and_parens_is_read_after_its_last_paren() {
        let r = run();
        assert_eq!(r.member(&stat(4250, "a) S 1 2 (x", 'S', 4242, 4242, 600)), Member::Yes);
        assert_eq!(r.member(&stat(4250, "a) S 1 4242 4242 (x)", 'S', 7, 7, 1)), Member::No);
        assert_eq!(r.member("4250 (sleep) S 1 7 7"), Member::AskEnviron, "a short stat is asked");
        assert_eq!(r.member("garbage"), Member::No);
        assert_eq!(r.member(""), Member::No);
    }

    #[test]
    fn e16_a_program_is_looked_for_in_the_childs_path_as_execvp_does() {
        assert_eq!(candidates("./run.sh", Some("/bin")), vec!["./run.sh"]);
        assert_eq!(candidates("true", Some("/a::/b")), vec!["/a/true", "true", "/b/true"]);
        assert_eq!(candidates("true", None)[0], "/usr/local/bin/true");
    }

    #[test]
    fn e17_a_later_variable_replaces_an_earlier_one() {
        let env = environment([("A", "1"), ("B", "2"), ("A", "3")]);
        assert_eq!(env, vec![("A", "3"), ("B", "2")]);
    }
}
