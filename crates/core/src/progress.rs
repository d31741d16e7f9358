//! X4: what a long verb (backup, restore, store copy and verify, `jobs enqueue -f`, ledger sync)
//! shows while it runs and the summary line it always ends with. The counting, when a redraw is
//! due and the words are here, with the time passed in as the time since the verb began; the
//! shell (`src/progress.rs`) decides whether there is a terminal to draw on at all.

use std::time::Duration;

/// A redrawn progress line is drawn at most this often (10 times a second).
pub const REDRAW_EVERY: Duration = Duration::from_millis(100);

/// A progress line is cut to this many characters, so that it never wraps on an 80-column
/// terminal (a wrapped line is not redrawn in place by a carriage return).
pub const LINE_WIDTH: usize = 79;

/// What a long verb has done so far: a count per part (a tab, a kind of answer), in the order
/// the parts were first seen; the part last counted is the one in progress.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Tally {
    parts: Vec<(String, u64)>,
    current: Option<usize>,
}

impl Tally {
    /// Counts `n` more of `part`, which becomes the part in progress.
    pub fn add(&mut self, part: &str, n: u64) {
        let at = match self.parts.iter().position(|(p, _)| p == part) {
            Some(at) => at,
            None => {
                self.parts.push((part.to_string(), 0));
                self.parts.len() - 1
            }
        };
        self.parts[at].1 += n;
        self.current = Some(at);
    }

    /// Everything counted, over every part.
    pub fn total(&self) -> u64 {
        self.parts.iter().map(|(_, n)| n).sum()
    }

    /// Each part with its count, in first-seen order.
    pub fn parts(&self) -> &[(String, u64)] {
        &self.parts
    }

    /// The part counted last, with its count.
    pub fn current(&self) -> Option<(&str, u64)> {
        self.current.and_then(|at| self.parts.get(at)).map(|(p, n)| (p.as_str(), *n))
    }
}

/// When a progress line is redrawn: the first time one is asked for, then no sooner than
/// [`REDRAW_EVERY`] after the last one drawn.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Redraw {
    last: Option<Duration>,
}

impl Redraw {
    /// Whether to draw at `at` (the time since the verb began); a yes counts as drawn.
    pub fn due(&mut self, at: Duration) -> bool {
        let due = self.last.is_none_or(|last| at.saturating_sub(last) >= REDRAW_EVERY);
        if due {
            self.last = Some(at);
        }
        due
    }
}

/// `n` with its thousands grouped: `29,400`.
pub fn grouped(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, d) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(d);
    }
    out
}

/// `n` things done in `elapsed`, per second (whole; a time under a millisecond counts as one).
pub fn rate(n: u64, elapsed: Duration) -> u64 {
    let ms = elapsed.as_millis().max(1);
    u64::try_from(u128::from(n) * 1000 / ms).unwrap_or(u64::MAX)
}

/// A time as the summary says it: `3.4 s` (tenths below 100 s), `250 s` above.
pub fn seconds(elapsed: Duration) -> String {
    let s = elapsed.as_secs_f64();
    if s < 100.0 { format!("{s:.1} s") } else { format!("{} s", elapsed.as_secs()) }
}

/// The counts of `parts` as a summary lists them, `mail 100,000, jobs 12`, leaving out the
/// parts that counted nothing (`nothing` when none counted anything).
pub fn counts<S: AsRef<str>>(parts: &[(S, u64)]) -> String {
    let listed: Vec<String> =
        parts.iter().filter(|(_, n)| *n > 0).map(|(p, n)| format!("{} {}", p.as_ref(), grouped(*n))).collect();
    if listed.is_empty() { "nothing".to_string() } else { listed.join(", ") }
}

/// The line a terminal shows while a verb runs, redrawn in place:
/// `backup: mail 45,000 · 46,003 rows · 29,400 rows/s · 1.6 s`; with a known `of`,
/// `jobs enqueue: 3,000/10,000 jobs · 1,200 jobs/s · 2.5 s`; `phase` names a pass of a verb that
/// makes several (`restore, checking: …`). Cut to [`LINE_WIDTH`].
pub fn line(verb: &str, phase: Option<&str>, tally: &Tally, of: Option<u64>, unit: &str, at: Duration) -> String {
    let head = match phase {
        Some(phase) => format!("{verb}, {phase}:"),
        None => format!("{verb}:"),
    };
    let total = tally.total();
    let done = match of {
        Some(of) => format!("{}/{} {unit}", grouped(total), grouped(of)),
        None => format!("{} {unit}", grouped(total)),
    };
    let part = match (tally.current(), tally.parts().len()) {
        // One part only says what the total says.
        (Some((part, n)), 2..) => format!(" {part} {} ·", grouped(n)),
        _ => String::new(),
    };
    let text = format!("{head}{part} {done} · {} {unit}/s · {}", grouped(rate(total, at)), seconds(at));
    text.chars().take(LINE_WIDTH).collect()
}

/// The line every long verb ends with, terminal or not:
/// `backup: mail 100,000, jobs 12 — 100,012 rows in 3.4 s (29,400 rows/s) → FILE`.
pub fn summary(verb: &str, what: &str, n: u64, unit: &str, elapsed: Duration, into: Option<&str>) -> String {
    let into = into.map(|to| format!(" → {to}")).unwrap_or_default();
    format!(
        "{verb}: {what} — {} {unit} in {} ({} {unit}/s){into}",
        grouped(n),
        seconds(elapsed),
        grouped(rate(n, elapsed))
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn x4_a_redraw_is_due_at_most_ten_times_a_second() {
        let mut redraw = Redraw::default();
        assert!(redraw.due(ms(0)), "the first one is drawn at once");
        assert!(!redraw.due(ms(40)) && !redraw.due(ms(99)));
        assert!(redraw.due(ms(100)));
        assert!(!redraw.due(ms(150)), "counted from the last one drawn, not the last one asked for");
        assert!(redraw.due(ms(230)));
        // A thousand batches in one second draw ten lines.
        let mut redraw = Redraw::default();
        assert_eq!((0..1000).filter(|i| redraw.due(ms(*i))).count(), 10);
        // A clock read out of order never panics nor draws early.
        assert!(!redraw.due(ms(5)));
    }

    #[test]
    fn x4_the_tally_counts_per_part_and_knows_the_part_in_progress() {
        let mut tally = Tally::default();
        assert_eq!((tally.total(), tally.current()), (0, None));
        tally.add("specs", 3);
        tally.add("mail", 1000);
        tally.add("mail", 500);
        assert_eq!(tally.total(), 1503);
        assert_eq!(tally.current(), Some(("mail", 1500)));
        tally.add("specs", 1);
        assert_eq!(tally.parts(), [("specs".to_string(), 4), ("mail".to_string(), 1500)]);
        assert_eq!(tally.current(), Some(("specs", 4)));
    }

    #[test]
    fn x4_numbers_are_grouped_and_rates_and_times_are_whole_or_tenths() {
        assert_eq!(grouped(0), "0");
        assert_eq!(grouped(999), "999");
        assert_eq!(grouped(1000), "1,000");
        assert_eq!(grouped(100_000), "100,000");
        assert_eq!(grouped(1_234_567), "1,234,567");
        assert_eq!(rate(100_000, ms(3400)), 29_411);
        assert_eq!(rate(5, Duration::ZERO), 5000, "under a millisecond counts as one");
        assert_eq!(rate(u64::MAX, Duration::ZERO), u64::MAX);
        assert_eq!(seconds(ms(3449)), "3.4 s");
        assert_eq!(seconds(ms(40)), "0.0 s");
        assert_eq!(seconds(ms(250_400)), "250 s");
    }

    #[test]
    fn x4_the_summary_names_counts_total_time_rate_and_where() {
        let parts = [("specs", 3), ("tokens", 0), ("mail", 100_000), ("jobs", 12)];
        assert_eq!(counts(&parts), "specs 3, mail 100,000, jobs 12");
        assert_eq!(counts::<&str>(&[("mail", 0)]), "nothing");
        assert_eq!(
            summary("backup", &counts(&parts), 100_015, "rows", ms(3400), Some("/b/x.db")),
            "backup: specs 3, mail 100,000, jobs 12 — 100,015 rows in 3.4 s (29,416 rows/s) → /b/x.db"
        );
        assert_eq!(
            summary("jobs enqueue", "2 job(s) enqueued", 2, "jobs", ms(100), None),
            "jobs enqueue: 2 job(s) enqueued — 2 jobs in 0.1 s (20 jobs/s)"
        );
    }

    #[test]
    fn x4_the_progress_line_shows_the_part_in_progress_the_total_and_the_rate_within_a_terminal_line() {
        let mut tally = Tally::default();
        tally.add("mail", 1000);
        assert_eq!(line("backup", None, &tally, None, "rows", ms(500)), "backup: 1,000 rows · 2,000 rows/s · 0.5 s");
        tally.add("specs", 3);
        tally.add("mail", 45_000);
        assert_eq!(
            line("restore", Some("checking"), &tally, None, "rows", ms(1600)),
            "restore, checking: mail 46,000 · 46,003 rows · 28,751 rows/s · 1.6 s"
        );
        let mut jobs = Tally::default();
        jobs.add("enqueued", 3000);
        assert_eq!(
            line("jobs enqueue", None, &jobs, Some(10_000), "jobs", ms(2500)),
            "jobs enqueue: 3,000/10,000 jobs · 1,200 jobs/s · 2.5 s"
        );
        let mut long = Tally::default();
        long.add(&"x".repeat(200), 1);
        long.add("y", 1);
        long.add(&"x".repeat(200), 1);
        let cut = line("store copy", None, &long, None, "rows", ms(1));
        assert_eq!(cut.chars().count(), LINE_WIDTH);
        assert!(!cut.contains('\n') && !cut.contains('\r'));
    }
}
