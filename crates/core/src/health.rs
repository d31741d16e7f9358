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

/// E15: the `store-unwritable` alert of one episode of refusals for space, kept in memory
/// (the store cannot record it) and posted from there: one firing when the refusals begin, one
/// resolution when they end, re-sent only where the webhook's format needs a firing alert
/// repeated to stay active (`resend`, Alertmanager's own API). An episode that ends before its
/// firing was posted posts nothing. Nothing survives a restart: a server started on a full
/// disk posts its firing again; one restarted after space came back posts no resolution.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unwritable {
    episode: Option<Episode>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Episode {
    since: Ts,
    why: String,
    /// When the firing was last posted.
    sent: Option<Ts>,
    /// When the refusals ended; the resolution is then due.
    ended: Option<Ts>,
}

impl Unwritable {
    /// What the store's health says at `now`: why it refuses writes, or `None` when it takes them.
    pub fn observe(&mut self, refusing: Option<&str>, now: Ts) {
        match (&mut self.episode, refusing) {
            (None, Some(why)) => {
                self.episode = Some(Episode { since: now, why: why.to_string(), sent: None, ended: None });
            }
            // Refusing again before the resolution went out: the same episode goes on.
            (Some(e), Some(_)) => e.ended = None,
            (Some(e), None) if e.sent.is_none() => self.episode = None,
            (Some(e), None) => {
                e.ended.get_or_insert(now);
            }
            (None, None) => {}
        }
    }

    /// The alert to post now, if one is due; `subject` names this replica.
    pub fn due(&self, subject: &str, resend: Option<chrono::TimeDelta>, now: Ts) -> Option<crate::alert::Alert> {
        use crate::alert::{Alert, AlertKind, AlertState};
        let e = self.episode.as_ref()?;
        let state = match (e.ended, e.sent) {
            (Some(_), _) => AlertState::Resolved,
            (None, None) => AlertState::Firing,
            (None, Some(sent)) if resend.is_some_and(|every| now - sent >= every) => AlertState::Firing,
            (None, Some(_)) => return None,
        };
        Some(Alert {
            kind: AlertKind::StoreUnwritable,
            subject: subject.to_string(),
            state,
            summary: unwritable(&e.why),
            labels: Default::default(),
            firing_since: e.since,
            resolved_at: e.ended,
            notified: None,
            last_sent_at: e.sent,
            updated_at: e.ended.unwrap_or(e.since),
        })
    }

    /// Records that `alert` (an answer of [`Unwritable::due`]) was posted at `now`.
    pub fn posted(&mut self, alert: &crate::alert::Alert, now: Ts) {
        use crate::alert::AlertState;
        match (alert.state, &mut self.episode) {
            (AlertState::Resolved, Some(e)) if e.ended.is_some() => self.episode = None,
            (AlertState::Firing, Some(e)) => e.sent = Some(now),
            _ => {}
        }
    }
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

    fn post(u: &mut Unwritable, now: Ts) -> Option<crate::alert::AlertState> {
        let alert = u.due("replica-1", None, now)?;
        u.posted(&alert, now);
        Some(alert.state)
    }

    #[test]
    fn e15_store_unwritable_posts_one_firing_and_one_resolution_per_episode() {
        use crate::alert::{AlertKind, AlertState};
        let mut u = Unwritable::default();
        u.observe(None, at(0));
        assert_eq!(post(&mut u, at(0)), None, "nothing while the store takes writes");
        u.observe(Some("database or disk is full"), at(1));
        let firing = u.due("replica-1", None, at(1)).expect("due");
        assert_eq!(
            (firing.kind, firing.state, firing.firing_since),
            (AlertKind::StoreUnwritable, AlertState::Firing, at(1))
        );
        assert!(firing.summary.contains("disk is full"), "{}", firing.summary);
        assert_eq!(crate::alert::severity(&firing), "critical");
        // A post that failed is due again; one that succeeded is not, however long it lasts.
        assert_eq!(u.due("replica-1", None, at(2)).map(|a| a.state), Some(AlertState::Firing));
        assert_eq!(post(&mut u, at(2)), Some(AlertState::Firing));
        for t in 3..100 {
            u.observe(Some("database or disk is full"), at(t));
            assert_eq!(post(&mut u, at(t)), None, "posted once");
        }
        u.observe(None, at(100));
        u.observe(None, at(101));
        let resolved = u.due("replica-1", None, at(101)).expect("the resolution");
        assert_eq!((resolved.state, resolved.resolved_at), (AlertState::Resolved, Some(at(100))));
        assert_eq!(post(&mut u, at(101)), Some(AlertState::Resolved));
        assert_eq!(post(&mut u, at(102)), None, "resolved once");
        assert_eq!(u, Unwritable::default());
    }

    #[test]
    fn e15_store_unwritable_an_unposted_episode_posts_nothing_and_resends_only_where_asked() {
        use crate::alert::AlertState;
        let mut u = Unwritable::default();
        u.observe(Some("full"), at(0));
        u.observe(None, at(1));
        assert_eq!(post(&mut u, at(1)), None, "never fired, so nothing to resolve");
        u.observe(Some("full"), at(2));
        assert_eq!(post(&mut u, at(2)), Some(AlertState::Firing));
        // Refusing again before the resolution was posted: the same episode, no second firing.
        u.observe(None, at(3));
        u.observe(Some("full"), at(4));
        assert_eq!(post(&mut u, at(4)), None);
        let every = Some(chrono::TimeDelta::seconds(60));
        assert_eq!(u.due("r", every, at(61)), None);
        assert_eq!(u.due("r", every, at(62)).map(|a| a.state), Some(AlertState::Firing), "Alertmanager's API");
    }

    #[test]
    fn e15_store_unwritables_alertname_is_not_a_prometheus_rules() {
        let rules = include_str!("../../../manifests/prometheus/pcmail-rules.yaml");
        let name = crate::alert::AlertKind::StoreUnwritable.alertname();
        assert!(rules.contains("PcmailStoreUnwritable") && !rules.contains(&format!("alert: {name}")), "{name}");
    }
}
