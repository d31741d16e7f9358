//! X4: the shell of a long verb's progress. On a terminal (stderr is one) the line of
//! `pcmail_core::progress::line` is redrawn in place — a carriage return, erase to the end of the
//! line — at most ten times a second; anywhere else nothing is drawn at all. The summary line is
//! always written, on stderr like every word a verb says about itself: stdout stays what scripts
//! parse (ids, `-o json`, `store verify`'s table).

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use pcmail_core::progress::{self, Redraw, Tally};

/// Erases the line the cursor is on, from a carriage return.
const ERASE: &str = "\r\x1b[K";

pub struct Meter {
    verb: &'static str,
    unit: &'static str,
    started: Instant,
    tty: bool,
    phase: Option<&'static str>,
    /// When the pass in progress began, since the verb did: its line's time and rate are its own.
    phase_began: Duration,
    of: Option<u64>,
    tally: Tally,
    redraw: Redraw,
    shown: bool,
    /// The count the line last drawn showed.
    drawn: u64,
}

impl Meter {
    /// A meter for `verb`, counting `unit` (`rows`, `jobs`, `items`), drawing only when stderr
    /// is a terminal.
    pub fn new(verb: &'static str, unit: &'static str) -> Meter {
        Meter {
            verb,
            unit,
            started: Instant::now(),
            tty: std::io::stderr().is_terminal(),
            phase: None,
            phase_began: Duration::ZERO,
            of: None,
            tally: Tally::default(),
            redraw: Redraw::default(),
            shown: false,
            drawn: 0,
        }
    }

    /// How many `unit` the verb will do, when it knows.
    pub fn of(mut self, of: u64) -> Meter {
        self.of = Some(of);
        self
    }

    /// Starts a pass of its own (`checking`, `restoring`): counted from zero, drawn at once.
    pub fn phase(&mut self, phase: &'static str) {
        // The pass on the line ends with its last count; one already put away stays away.
        if self.shown {
            self.flush();
        }
        self.phase = Some(phase);
        self.phase_began = self.started.elapsed();
        self.tally = Tally::default();
        self.drawn = 0;
        self.redraw = Redraw::default();
    }

    /// Counts `n` more of `part`; redraws when a redraw is due.
    pub fn add(&mut self, part: &str, n: u64) {
        // An empty batch (a tab with nothing to move) says nothing new.
        if n == 0 {
            return;
        }
        self.tally.add(part, n);
        if self.tty && self.redraw.due(self.started.elapsed() - self.phase_began) {
            self.draw();
        }
    }

    /// The counting a store's copy, digest or check is handed (once a batch).
    pub fn rows(&mut self) -> impl FnMut(&'static str, u64) + Send + '_ {
        |tab, n| self.add(tab, n)
    }

    /// Draws what is counted now, due or not, unless the line shows it already: the last count
    /// of a pass is shown.
    pub fn flush(&mut self) {
        if self.tty && self.tally.total() > self.drawn {
            self.draw();
        }
    }

    fn draw(&mut self) {
        let at = self.started.elapsed() - self.phase_began;
        let line = progress::line(self.verb, self.phase, &self.tally, self.of, self.unit, at);
        let mut err = std::io::stderr().lock();
        // A progress line that cannot be written is not worth failing the verb for.
        let _ = write!(err, "{ERASE}{line}").and_then(|()| err.flush());
        self.shown = true;
        self.drawn = self.tally.total();
    }

    /// Ends a pass: its last count drawn, then the line taken away for what is said next.
    pub fn pause(&mut self) {
        self.flush();
        self.clear();
    }

    /// Takes the progress line away, so that another line can be written where it was.
    pub fn clear(&mut self) {
        if self.shown {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "{ERASE}").and_then(|()| err.flush());
            self.shown = false;
        }
    }

    /// Lines for stdout, written around the progress line when both go to the terminal.
    pub fn println(&mut self, lines: impl IntoIterator<Item = String>) {
        let both = self.shown && std::io::stdout().is_terminal();
        if both {
            self.clear();
        }
        for line in lines {
            println!("{line}");
        }
        if both {
            self.draw();
        }
    }

    /// Awaits `work`, which tells nothing until it ends, showing on a terminal how long it has
    /// been waited for.
    pub async fn wait<T>(&mut self, what: &'static str, work: impl Future<Output = T>) -> T {
        if !self.tty {
            return work.await;
        }
        let mut work = std::pin::pin!(work);
        let mut tick = tokio::time::interval(progress::REDRAW_EVERY);
        loop {
            tokio::select! {
                done = &mut work => {
                    self.clear();
                    return done;
                }
                _ = tick.tick() => {
                    let line = format!("{}: {what} {}", self.verb, progress::seconds(self.started.elapsed()));
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "{ERASE}{line}").and_then(|()| err.flush());
                    self.shown = true;
                }
            }
        }
    }

    /// Since the verb began.
    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    /// Ends with the summary line: `what` done, `n` `unit` in all, written `into`.
    pub fn finish(mut self, what: &str, n: u64, into: Option<&str>) {
        self.flush();
        self.clear();
        eprintln!("{}", progress::summary(self.verb, what, n, self.unit, self.elapsed(), into));
    }
}

impl Drop for Meter {
    /// A verb that fails leaves no half-drawn line before its error.
    fn drop(&mut self) {
        self.clear();
    }
}
