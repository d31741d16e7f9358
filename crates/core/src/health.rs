//! E15 and E18: the server's view of itself — its own uptime across pauses and restarts, what
//! is said in the log when the store's state or this replica's leadership changes (once per
//! change, then a reminder now and then, never once per request), and why it is not ready.

use crate::Ts;

/// How long the server may go unseen by its own ticks before it counts as having been away
/// (stopped, paused, a machine asleep): receivers are not blamed for that time.
pub const PAUSE_AFTER: chrono::TimeDelta = chrono::TimeDelta::seconds(5);

/// How often a trouble that lasts is said again in the log.
pub const REMIND_EVERY: chrono::TimeDelta = chrono::TimeDelta::seconds(60);

/// E15: how long after the last write refused for space a write must succeed to say the room
/// is back. A small write can fit in space the store already holds (SQLite reuses its log)
/// while a larger one is refused: without this, readiness would flap between the two.
pub const ROOM_BACK_AFTER: std::time::Duration = std::time::Duration::from_secs(5);

/// E15: whether a write that succeeded `since_refused` after the last refusal for space says
/// the refusal is over.
pub fn room_is_back(since_refused: std::time::Duration) -> bool {
    since_refused >= ROOM_BACK_AFTER
}

/// E18: since when this server has been up without a break, as its own ticks saw it. A tick
/// that comes more than [`PAUSE_AFTER`] after the last one (or before it: the clock stepped
/// back) starts the uptime again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Uptime {
    since: Ts,
    seen: Ts,
}

impl Uptime {
    pub fn started(now: Ts) -> Uptime {
        Uptime { since: now, seen: now }
    }

    /// Records a tick at `now`; answers whether it ends a break (the uptime starts again).
    pub fn tick(&mut self, now: Ts) -> bool {
        let gap = now - self.seen;
        let away = gap > PAUSE_AFTER || gap < -PAUSE_AFTER;
        if away {
            self.since = now;
        }
        if away || now > self.seen {
            self.seen = now;
        }
        away
    }

    pub fn since(&self) -> Ts {
        self.since
    }
}

/// E18: from when a machine's silence counts — its last poll, or the start of the server's
/// uptime if later: while the server was away nobody could poll it.
pub fn silent_since(last_poll: Ts, up_since: Ts) -> Ts {
    last_poll.max(up_since)
}

/// A line to log about a state that holds or ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Say<S> {
    /// It began, or changed to this.
    Began(S),
    /// It still holds ([`REMIND_EVERY`] after it was last said).
    Still(S),
    /// It is over.
    Ended(S),
}

/// E15: the log of one trouble, bounded to one line per change plus a reminder every
/// [`REMIND_EVERY`] however many requests meet it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Said<S> {
    said: Option<(S, Ts)>,
}

impl<S: Clone + PartialEq> Said<S> {
    /// The trouble as it is at `now` (`None`: all is well); answers what to log, if anything.
    pub fn observe(&mut self, current: Option<S>, now: Ts) -> Option<Say<S>> {
        match (self.said.take(), current) {
            (None, None) => None,
            (Some((was, _)), None) => Some(Say::Ended(was)),
            (Some((was, at)), Some(is)) if was == is => {
                let due = now - at >= REMIND_EVERY || now < at;
                self.said = Some((is.clone(), if due { now } else { at }));
                due.then_some(Say::Still(is))
            }
            (_, Some(is)) => {
                self.said = Some((is.clone(), now));
                Some(Say::Began(is))
            }
        }
    }
}

/// E15: why the store refuses writes, as `/readyz` names it (the disk, not "an error").
pub fn unwritable(refusal: &str) -> String {
    format!("the store refuses writes: its disk is full (E15); writes resume once space is freed ({refusal})")
}

/// E18: a change of this replica's leadership, for the log: gained or lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Leading {
    Gained,
    Lost,
}

/// Whether leadership changed between what was last said and what holds now.
pub fn leadership_change(said_leading: bool, leading: bool) -> Option<Leading> {
    match (said_leading, leading) {
        (false, true) => Some(Leading::Gained),
        (true, false) => Some(Leading::Lost),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::fixtures::at;

    #[test]
    fn e18_a_pause_of_the_server_starts_its_uptime_again_and_ticks_do_not() {
        let mut up = Uptime::started(at(0));
        for s in 1..=60 {
            assert!(!up.tick(at(s)));
        }
        assert_eq!(up.since(), at(0));
        assert!(up.tick(at(125)), "60 s unseen: a pause (SIGSTOP, a restart)");
        assert_eq!(up.since(), at(125));
        assert!(!up.tick(at(126)));
        assert!(up.tick(at(100)), "a clock stepped back counts as a break too");
        assert_eq!(up.since(), at(100));
    }

    #[test]
    fn e18_silence_counts_only_while_the_server_was_up() {
        assert_eq!(silent_since(at(10), at(70)), at(70), "polled before a pause: counted from the resume");
        assert_eq!(silent_since(at(80), at(70)), at(80));
    }

    #[test]
    fn e15_a_trouble_is_said_once_when_it_begins_then_every_minute_then_once_when_it_ends() {
        let mut said = Said::default();
        let full = || Some("disk full".to_string());
        assert_eq!(said.observe(full(), at(0)), Some(Say::Began("disk full".into())));
        let lines = (1..=59).filter_map(|s| said.observe(full(), at(s))).count();
        assert_eq!(lines, 0, "2,500 refused requests in a minute are not 2,500 lines");
        assert_eq!(said.observe(full(), at(60)), Some(Say::Still("disk full".into())));
        assert_eq!(said.observe(full(), at(61)), None);
        assert_eq!(said.observe(Some("read-only".into()), at(62)), Some(Say::Began("read-only".into())));
        assert_eq!(said.observe(None, at(63)), Some(Say::Ended("read-only".into())));
        assert_eq!(said.observe(None, at(64)), None);
    }

    #[test]
    fn e15_a_write_right_after_a_refusal_for_space_does_not_say_the_room_is_back() {
        assert!(!room_is_back(std::time::Duration::from_secs(1)));
        assert!(room_is_back(ROOM_BACK_AFTER));
    }

    #[test]
    fn e15_readiness_names_the_disk() {
        assert!(unwritable("database or disk is full").contains("disk is full"));
    }

    #[test]
    fn e18_leadership_changes_are_gained_or_lost() {
        assert_eq!(leadership_change(false, true), Some(Leading::Gained));
        assert_eq!(leadership_change(true, false), Some(Leading::Lost));
        assert_eq!(leadership_change(true, true), None);
        assert_eq!(leadership_change(false, false), None);
    }
}
