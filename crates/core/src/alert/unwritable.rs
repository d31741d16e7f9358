//! E15: the `store-unwritable` alert, which lives in memory only: the store it would be a row
//! of is the one refusing writes.

use super::{Alert, AlertKind, AlertState};
use crate::Ts;

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
    pub fn due(&self, subject: &str, resend: Option<chrono::TimeDelta>, now: Ts) -> Option<Alert> {
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
            summary: crate::health::unwritable(&e.why),
            labels: Default::default(),
            firing_since: e.since,
            resolved_at: e.ended,
            notified: None,
            last_sent_at: e.sent,
            updated_at: e.ended.unwrap_or(e.since),
        })
    }

    /// Records that `alert` (an answer of [`Unwritable::due`]) was posted at `now`.
    pub fn posted(&mut self, alert: &Alert, now: Ts) {
        match (alert.state, &mut self.episode) {
            (AlertState::Resolved, Some(e)) if e.ended.is_some() => self.episode = None,
            (AlertState::Firing, Some(e)) => e.sent = Some(now),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::fixtures::at;

    fn post(u: &mut Unwritable, now: Ts) -> Option<AlertState> {
        let alert = u.due("replica-1", None, now)?;
        u.posted(&alert, now);
        Some(alert.state)
    }

    #[test]
    fn e15_store_unwritable_posts_one_firing_and_one_resolution_per_episode() {
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
        assert_eq!(super::super::severity(&firing), "critical");
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
        let rules = include_str!("../../../../manifests/prometheus/pcmail-rules.yaml");
        let name = AlertKind::StoreUnwritable.alertname();
        assert!(rules.contains("PcmailStoreUnwritable") && !rules.contains(&format!("alert: {name}")), "{name}");
    }
}
