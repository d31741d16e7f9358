//! M9/M10: alerts and arrival notices. An alert is one row per (kind, subject), upserted; it
//! fires when its condition holds and resolves when it clears. Each row also records which of
//! its states was last notified, which is what makes every state notified exactly once.

mod notify;
mod unwritable;

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::Ts;
use crate::health::silent_since;
use crate::mail::{Mail, MailKind, MailState};
use crate::manifest::spec::{MailPolicySpec, RosterSpec};
pub use notify::{alertmanager_api_body, chat_text, webhook_body};
pub use unwritable::Unwritable;

crate::wire_enum! {
    pub enum AlertKind as "alert kind" {
        /// Delivered but not seen within the unread SLA (2h urgent / 6h normal).
        UnreadSla = "unread-sla",
        /// Still `new` after `undeliveredAfter`: the recipient's poller is not taking mail.
        Undelivered = "undelivered",
        /// A machine has not polled for `receiverDownAfter`.
        ReceiverDown = "receiver-down",
        /// A one-shot notice that a decision, work or urgent mail arrived.
        Arrival = "arrival",
        /// I4: an inbound chat message still unanswered after `escalateAfter`.
        IntentUnanswered = "intent-unanswered",
        /// T4: one chat message recorded twice with different texts (one of them forged or garbled).
        IntentConflict = "intent-conflict",
        /// I9: a PC's chat poller and another poller of the same bot take each other's updates.
        ChannelConflict = "channel-conflict",
        /// E15: the store refuses writes for want of space. Kept in memory and posted from there
        /// (`Unwritable`), never a row of the alerts tab (the store cannot take one): see
        /// [`AlertKind::is_stored`].
        StoreUnwritable = "store-unwritable",
    }
}

impl AlertKind {
    /// Whether the alerts tab holds this kind (every kind but the in-memory store-unwritable).
    pub fn is_stored(self) -> bool {
        match self {
            AlertKind::UnreadSla
            | AlertKind::Undelivered
            | AlertKind::ReceiverDown
            | AlertKind::Arrival
            | AlertKind::IntentUnanswered
            | AlertKind::IntentConflict
            | AlertKind::ChannelConflict => true,
            AlertKind::StoreUnwritable => false,
        }
    }

    /// Whether the mail sweep owns this kind: fires it from the mail and polls it reads, and
    /// resolves it when they no longer say so. The others are raised and resolved where their
    /// cause is seen (a poller's report, a second recording, an arrival).
    pub fn swept(self) -> bool {
        match self {
            AlertKind::UnreadSla | AlertKind::Undelivered | AlertKind::ReceiverDown | AlertKind::IntentUnanswered => {
                true
            }
            AlertKind::Arrival
            | AlertKind::IntentConflict
            | AlertKind::ChannelConflict
            | AlertKind::StoreUnwritable => false,
        }
    }

    /// The `alertname` pcmail posts: never one of the Prometheus rules' (`manifests/prometheus`),
    /// whose alerts count machines where these name one mail, so Alertmanager never groups the
    /// two sources as one alert (O6).
    pub fn alertname(self) -> &'static str {
        match self {
            AlertKind::UnreadSla => "PcmailMailUnread",
            AlertKind::Undelivered => "PcmailMailUndelivered",
            AlertKind::ReceiverDown => "PcmailMachineSilent",
            AlertKind::Arrival => "PcmailArrival",
            AlertKind::IntentUnanswered => "PcmailIntentUnanswered",
            AlertKind::IntentConflict => "PcmailIntentConflict",
            AlertKind::ChannelConflict => "PcmailChannelConflict",
            AlertKind::StoreUnwritable => "PcmailStoreRefusingWrites",
        }
    }
}

crate::wire_enum! {
    pub enum AlertState as "alert state" {
        Firing = "firing",
        Resolved = "resolved",
        /// Arrival notices: notified once, never resolved.
        Notice = "notice",
    }
}

/// One row of the `alerts` tab.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Alert {
    pub kind: AlertKind,
    /// A mail id, or a machine label for receiver-down.
    pub subject: String,
    pub state: AlertState,
    pub summary: String,
    /// Bounded labels for routing: `to`, `from`, `urgency`, `machine`.
    pub labels: BTreeMap<String, String>,
    pub firing_since: Ts,
    pub resolved_at: Option<Ts>,
    /// The state that was last posted; equal to `state` once notified.
    pub notified: Option<AlertState>,
    pub last_sent_at: Option<Ts>,
    pub updated_at: Ts,
}

impl Alert {
    pub fn needs_notification(&self) -> bool {
        self.notified != Some(self.state)
    }
}

/// M9's conditions, each a pure predicate of a mail and the time.
pub fn is_undelivered(m: &Mail, p: &MailPolicySpec, now: Ts) -> bool {
    m.state == MailState::New && now >= m.created_at + p.undelivered_after.to_chrono()
}

/// The policy's SLA for the mail's urgency, or its kind's own bound when that is sooner.
pub fn unread_sla(m: &Mail, p: &MailPolicySpec) -> chrono::TimeDelta {
    let policy = if m.urgent { p.unread_sla.urgent } else { p.unread_sla.normal };
    m.kind.read_within().map_or(policy, |k| k.min(policy)).to_chrono()
}

/// The shortest [`unread_sla`] any mail can have: how far back the sweep looks for candidates
/// (R3: a kind's own bound reaches the sweep's query without a copy of it there).
pub fn shortest_unread_sla(p: &MailPolicySpec) -> chrono::TimeDelta {
    let kinds = MailKind::ALL.into_iter().filter_map(MailKind::read_within);
    kinds.chain([p.unread_sla.urgent, p.unread_sla.normal]).min().unwrap_or_default().to_chrono()
}

pub fn is_unread_past_sla(m: &Mail, p: &MailPolicySpec, now: Ts) -> bool {
    m.state == MailState::Delivered && m.delivered_at.is_some_and(|d| now >= d + unread_sla(m, p))
}

pub fn is_receiver_down(last_poll: Ts, p: &MailPolicySpec, now: Ts) -> bool {
    now >= last_poll + p.receiver_down_after.to_chrono()
}

/// I4: an intent still open after `escalate_after`.
pub fn is_intent_unanswered(m: &Mail, escalate_after: crate::duration::Dur, now: Ts) -> bool {
    m.kind.is_intent() && !m.state.is_terminal() && now >= m.created_at + escalate_after.to_chrono()
}

/// What the sweep observed: candidate mail (a superset of the breaching ones is fine), the
/// mail behind every open alert, each machine's last poll, and the open alerts themselves.
pub struct AlertInputs<'a> {
    pub mails: &'a [Mail],
    pub last_polls: &'a [(String, Ts)],
    pub roster: Option<&'a RosterSpec>,
    pub open: &'a [Alert],
    /// The IntentPolicy's `escalateAfter` (I4).
    pub escalate_after: crate::duration::Dur,
    /// E18: since when the server has been up without a break (`health::Uptime`).
    pub up_since: Ts,
}

/// Counts for the breach gauges, by bounded labels only.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Breaches {
    pub undelivered: BTreeMap<String, u64>,
    pub unread: BTreeMap<(String, Urgency), u64>,
    pub firing: BTreeMap<AlertKind, u64>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlertPlan {
    pub upsert: Vec<Alert>,
    pub breaches: Breaches,
}

crate::wire_enum! {
    /// Which unread SLA a mail is held to; the `urgency` label of alerts and metrics.
    pub enum Urgency as "urgency" {
        Urgent = "urgent",
        Normal = "normal",
    }
}

impl Urgency {
    pub fn of(m: &Mail) -> Urgency {
        if m.urgent { Urgency::Urgent } else { Urgency::Normal }
    }
}

/// What breaches now: one alert's identity (kind and subject) and what it says.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Breaching {
    kind: AlertKind,
    subject: String,
    summary: String,
    labels: BTreeMap<String, String>,
}

fn labels<const N: usize>(pairs: [(&str, String); N]) -> BTreeMap<String, String> {
    pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// M9: fires what breaches and is not yet firing, resolves what fires and no longer breaches.
/// Receiver-down watches only machines of the Roster that have polled at least once. E18: a
/// machine's undelivered mail is one alert (its subject the machine) whose summary lists the
/// mail, rewritten when the list changes.
pub fn plan_alerts(inputs: &AlertInputs<'_>, policy: &MailPolicySpec, now: Ts) -> AlertPlan {
    let mut breaches = Breaches::default();
    let mut firing = mail_breaches(inputs, policy, now, &mut breaches);
    firing.extend(receivers_down(inputs, policy, now));
    let upsert = upserts(&firing, inputs.open, &mut breaches, now);
    AlertPlan { upsert, breaches }
}

/// What each mail breaches (each counted once however often it is listed), counted into
/// `breaches`: an unanswered intent and an unread SLA alert per mail, and E18's one undelivered
/// alert per machine listing its mail.
fn mail_breaches(
    inputs: &AlertInputs<'_>,
    policy: &MailPolicySpec,
    now: Ts,
    breaches: &mut Breaches,
) -> Vec<Breaching> {
    let mut firing = Vec::new();
    let mut seen_mail = BTreeSet::new();
    let mut undelivered: BTreeMap<&str, Vec<&Mail>> = BTreeMap::new();
    for m in inputs.mails.iter().filter(|m| seen_mail.insert(m.id.as_str())) {
        if is_undelivered(m, policy, now) {
            *breaches.undelivered.entry(m.to.clone()).or_default() += 1;
            undelivered.entry(m.to.as_str()).or_default().push(m);
        }
        if is_intent_unanswered(m, inputs.escalate_after, now) {
            firing.push(intent_unanswered(m, now));
        }
        if is_unread_past_sla(m, policy, now) {
            *breaches.unread.entry((m.to.clone(), Urgency::of(m))).or_default() += 1;
            firing.push(unread_past_sla(m, now));
        }
    }
    // E18: one cause, one alert — a machine's undelivered mail is one alert listing it.
    firing.extend(undelivered.iter().map(|(to, mails)| Breaching {
        kind: AlertKind::Undelivered,
        subject: to.to_string(),
        summary: undelivered_summary(to, mails, policy),
        labels: labels([("to", to.to_string()), ("urgency", undelivered_urgency(mails).as_str().to_string())]),
    }));
    firing
}

fn intent_unanswered(m: &Mail, now: Ts) -> Breaching {
    let age = format_age(now - m.created_at);
    let summary = format!("{} message unanswered for {age} ({}): {}", m.channel, m.from, m.body);
    Breaching {
        kind: AlertKind::IntentUnanswered,
        subject: m.id.clone(),
        summary: crate::present::cut(&summary, 300),
        labels: labels([("to", m.to.clone()), ("channel", m.channel.clone())]),
    }
}

fn unread_past_sla(m: &Mail, now: Ts) -> Breaching {
    let age = format_age(now - m.delivered_at.unwrap_or(now));
    Breaching {
        kind: AlertKind::UnreadSla,
        subject: m.id.clone(),
        summary: format!("{} delivered to {} {age} ago, still unread: {}", m.id, m.to, title(m)),
        labels: labels([
            ("to", m.to.clone()),
            ("from", m.from.clone()),
            ("urgency", Urgency::of(m).as_str().to_string()),
        ]),
    }
}

/// The Roster's machines that have not polled for too long. E18: a machine's silence counts
/// only while the server was up to hear it; one that is already down stays down until it polls.
fn receivers_down(inputs: &AlertInputs<'_>, policy: &MailPolicySpec, now: Ts) -> Vec<Breaching> {
    let in_roster = |name: &str| inputs.roster.is_some_and(|r| r.machines.iter().any(|m| m.label == name));
    let open_down: BTreeSet<&str> = inputs
        .open
        .iter()
        .filter(|a| a.kind == AlertKind::ReceiverDown && a.state == AlertState::Firing)
        .map(|a| a.subject.as_str())
        .collect();
    let mut firing = Vec::new();
    for (machine, last) in inputs.last_polls.iter().filter(|(name, _)| in_roster(name)) {
        let since = if open_down.contains(machine.as_str()) { *last } else { silent_since(*last, inputs.up_since) };
        if is_receiver_down(since, policy, now) {
            firing.push(Breaching {
                kind: AlertKind::ReceiverDown,
                subject: machine.clone(),
                summary: format!("{machine} has not polled for {}", format_age(now - *last)),
                labels: labels([("machine", machine.clone())]),
            });
        }
    }
    firing
}

/// The rows `firing` leads to against what is `open`: new alerts fire, an undelivered alert whose
/// list changed is rewritten, and a swept alert no longer breaching resolves.
fn upserts(firing: &[Breaching], open: &[Alert], breaches: &mut Breaches, now: Ts) -> Vec<Alert> {
    let mut upsert = Vec::new();
    let open: BTreeMap<(AlertKind, &str), &Alert> = open
        .iter()
        .filter(|a| a.state == AlertState::Firing && a.kind.swept())
        .map(|a| ((a.kind, a.subject.as_str()), a))
        .collect();
    let still: BTreeSet<(AlertKind, &str)> = firing.iter().map(|b| (b.kind, b.subject.as_str())).collect();
    for Breaching { kind, subject, summary, labels } in firing {
        *breaches.firing.entry(*kind).or_default() += 1;
        let held = open.get(&(*kind, subject.as_str()));
        if let Some(held) = held.filter(|a| a.kind == AlertKind::Undelivered && a.summary != *summary) {
            upsert.push(relisted(held, summary, labels, now));
        }
        if held.is_none() {
            upsert.push(Alert {
                kind: *kind,
                subject: subject.clone(),
                state: AlertState::Firing,
                summary: summary.clone(),
                labels: labels.clone(),
                firing_since: now,
                resolved_at: None,
                notified: None,
                last_sent_at: None,
                updated_at: now,
            });
        }
    }
    for (key, alert) in &open {
        if !still.contains(key) {
            upsert.push(Alert {
                state: AlertState::Resolved,
                resolved_at: Some(now),
                updated_at: now,
                ..(*alert).clone()
            });
        }
    }
    upsert
}

/// I9: the alert row a poller report leads to, if any: firing while `machine`'s poller of
/// `channel` conflicts with another, resolved once it polls fine again.
pub fn poller_alert(
    open: Option<&Alert>,
    channel: &str,
    machine: &str,
    conflict: Option<&str>,
    now: Ts,
) -> Option<Alert> {
    match (open.filter(|a| a.state == AlertState::Firing), conflict) {
        (None, Some(why)) => Some(Alert {
            kind: AlertKind::ChannelConflict,
            subject: format!("{channel}/{machine}"),
            state: AlertState::Firing,
            summary: crate::present::cut(
                &format!("{machine}'s {channel} poller is not the only one reading the bot: {why}"),
                300,
            ),
            labels: BTreeMap::from([
                ("machine".to_string(), machine.to_string()),
                ("channel".to_string(), channel.to_string()),
            ]),
            firing_since: now,
            resolved_at: None,
            notified: None,
            last_sent_at: None,
            updated_at: now,
        }),
        (Some(firing), None) => {
            Some(Alert { state: AlertState::Resolved, resolved_at: Some(now), updated_at: now, ..firing.clone() })
        }
        _ => None,
    }
}

/// O6: a machine's undelivered alert is about urgent mail when any of its mail is urgent.
fn undelivered_urgency(mails: &[&Mail]) -> Urgency {
    if mails.iter().any(|m| m.urgent) { Urgency::Urgent } else { Urgency::Normal }
}

/// E18: the undelivered alert `held` once its list of mail changed: the row says so, and what
/// was posted stays posted — unless the change makes it louder or quieter (O6: an urgent mail
/// joined or left), which is posted again with its new severity.
fn relisted(held: &Alert, summary: &str, labels: &BTreeMap<String, String>, now: Ts) -> Alert {
    let changed = Alert { summary: summary.to_string(), labels: labels.clone(), updated_at: now, ..held.clone() };
    let renotify = severity(&changed) != severity(held);
    Alert { notified: if renotify { None } else { held.notified }, ..changed }
}

/// Mail an undelivered alert's summary names; the rest are counted.
const LISTED: usize = 10;

/// E18: one line for all of a machine's undelivered mail, oldest first: stable while the list
/// is (no age in it), so an unchanged list rewrites nothing.
fn undelivered_summary(to: &str, mails: &[&Mail], policy: &MailPolicySpec) -> String {
    let mut mails = mails.to_vec();
    mails.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
    let n = mails.len();
    let listed: Vec<String> =
        mails.iter().take(LISTED).map(|m| format!("{} ({})", m.id, crate::present::cut(&title(m), 40))).collect();
    let more = if n > LISTED { format!(" and {} more", n - LISTED) } else { String::new() };
    let within = policy.undelivered_after;
    let mail = if n == 1 { "mail" } else { "mails" };
    format!("{n} {mail} to {to} not delivered within {within}: {}{more}", listed.join(", "))
}

/// What a summary calls a mail: its subject, else the start of its body (O6: never a dangling
/// ": ").
fn title(m: &Mail) -> String {
    let subject = m.subject.trim();
    if !subject.is_empty() {
        return subject.to_string();
    }
    let first = m.body.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("(no subject or body)");
    crate::present::cut(first, 80)
}

/// O6: how loud an alert is — `critical` for urgent mail, `warning` for everything else.
pub fn severity(a: &Alert) -> &'static str {
    if a.kind == AlertKind::StoreUnwritable {
        return "critical";
    }
    if a.labels.get("urgency").is_some_and(|u| u == Urgency::Urgent.as_str()) { "critical" } else { "warning" }
}

/// M10: mail of a notifying kind (decision and work requests) and urgent mail notify the
/// humans once per id on arrival.
pub fn arrival_notice(m: &Mail, now: Ts) -> Option<Alert> {
    let notable = m.kind.notifies_on_arrival() || m.urgent;
    notable.then(|| Alert {
        kind: AlertKind::Arrival,
        subject: m.id.clone(),
        state: AlertState::Notice,
        summary: format!(
            "{}{} from {} to {}: {}",
            if m.urgent { "urgent " } else { "" },
            m.kind,
            m.from,
            m.to,
            title(m)
        ),
        labels: BTreeMap::from([
            ("to".to_string(), m.to.clone()),
            ("from".to_string(), m.from.clone()),
            ("urgency".to_string(), Urgency::of(m).as_str().to_string()),
        ]),
        firing_since: now,
        resolved_at: None,
        notified: None,
        last_sent_at: None,
        updated_at: now,
    })
}

fn format_age(d: chrono::TimeDelta) -> String {
    let s = d.num_seconds().max(0);
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        _ => format!("{}h{}m", s / 3600, (s % 3600) / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::fixtures::{at, mail};
    use crate::manifest::spec::Machine;

    fn policy() -> MailPolicySpec {
        MailPolicySpec::default()
    }

    fn delivered(id: &str, urgent: bool, at_: Ts) -> Mail {
        let mut m = mail(id, "pc1", "pc2");
        m.urgent = urgent;
        m.state = MailState::Delivered;
        m.delivered_at = Some(at_);
        m
    }

    fn plan(mails: &[Mail], open: &[Alert], now: Ts) -> AlertPlan {
        let escalate_after = crate::duration::Dur::from_mins(10);
        plan_alerts(
            &AlertInputs { mails, last_polls: &[], roster: None, open, escalate_after, up_since: at(0) },
            &policy(),
            now,
        )
    }

    const H: i64 = 3600;

    #[test]
    fn m9_unread_sla_is_2h_for_urgent_and_6h_for_normal() {
        let urgent = delivered("mail--00000001", true, at(0));
        let normal = delivered("mail--00000002", false, at(0));
        let at_2h = plan(&[urgent.clone(), normal.clone()], &[], at(2 * H));
        assert_eq!(at_2h.upsert.len(), 1);
        assert_eq!((at_2h.upsert[0].kind, at_2h.upsert[0].subject.as_str()), (AlertKind::UnreadSla, "mail--00000001"));
        assert_eq!(at_2h.breaches.unread.get(&("pc2".into(), Urgency::Urgent)), Some(&1));
        assert!(plan(std::slice::from_ref(&normal), &[], at(6 * H - 1)).upsert.is_empty());
        assert_eq!(plan(&[normal], &[], at(6 * H)).upsert.len(), 1);
    }

    #[test]
    fn m9_the_sweeps_window_reaches_back_to_the_shortest_sla_any_mail_is_held_to() {
        let p = policy();
        let shortest = shortest_unread_sla(&p);
        assert_eq!(shortest, chrono::TimeDelta::hours(2));
        for kind in MailKind::ALL {
            for urgent in [false, true] {
                let m = Mail { kind, ..delivered("mail--00000001", urgent, at(0)) };
                let by_policy = if urgent { p.unread_sla.urgent } else { p.unread_sla.normal };
                let sla = unread_sla(&m, &p);
                assert!(sla >= shortest, "{kind} urgent={urgent}");
                assert_eq!(sla, kind.read_within().map_or(by_policy, |k| k.min(by_policy)).to_chrono(), "{kind}");
            }
        }
    }

    #[test]
    fn i9_the_sweep_never_resolves_an_alert_it_does_not_raise() {
        let conflict =
            poller_alert(None, "telegram", "desk", Some("Conflict: terminated by other getUpdates request"), at(5))
                .expect("fires");
        let m = mail("mail--00000001", "pc1", "pc2");
        let p = plan(std::slice::from_ref(&m), std::slice::from_ref(&conflict), at(30 * 60));
        assert_eq!(p.upsert.iter().map(|a| a.kind).collect::<Vec<_>>(), [AlertKind::Undelivered]);
        assert!(plan(&[], &[conflict], at(H)).upsert.is_empty(), "the poller's report resolves it, not the sweep");
        assert!(AlertKind::ALL.iter().filter(|k| k.swept()).count() == 4);
    }

    #[test]
    fn m9_undelivered_fires_after_30m_of_new() {
        let m = mail("mail--00000001", "pc1", "pc2");
        assert!(plan(std::slice::from_ref(&m), &[], at(30 * 60 - 1)).upsert.is_empty());
        let p = plan(&[m], &[], at(30 * 60));
        assert_eq!((p.upsert[0].kind, p.upsert[0].state), (AlertKind::Undelivered, AlertState::Firing));
        assert_eq!(p.breaches.undelivered.get("pc2"), Some(&1));
    }

    #[test]
    fn m9_alert_resolves_when_the_mail_is_seen_and_firing_is_not_repeated() {
        let m = delivered("mail--00000001", false, at(0));
        let fired = plan(std::slice::from_ref(&m), &[], at(7 * H)).upsert;
        assert_eq!(fired.len(), 1);
        assert!(plan(std::slice::from_ref(&m), &fired, at(8 * H)).upsert.is_empty(), "already firing: no new row");
        let mut seen = m;
        seen.state = MailState::Seen;
        let resolved = plan(&[seen], &fired, at(9 * H)).upsert;
        assert_eq!(resolved.len(), 1);
        assert_eq!(
            (resolved[0].state, resolved[0].resolved_at, resolved[0].firing_since),
            (AlertState::Resolved, Some(at(9 * H)), at(7 * H))
        );
        assert!(resolved[0].needs_notification());
    }

    #[test]
    fn m9_receiver_down_per_machine_only_for_roster_machines() {
        let roster = RosterSpec {
            owner: "pc1".into(),
            machines: ["pc1", "pc2"]
                .iter()
                .enumerate()
                .map(|(i, l)| Machine { number: i as u32 + 1, label: l.to_string(), hostname: None, aliases: vec![] })
                .collect(),
        };
        let polls = vec![("pc1".to_string(), at(0)), ("pc2".to_string(), at(500)), ("gone".to_string(), at(0))];
        let escalate_after = crate::duration::Dur::from_mins(10);
        let inputs = AlertInputs {
            mails: &[],
            last_polls: &polls,
            roster: Some(&roster),
            open: &[],
            escalate_after,
            up_since: at(0),
        };
        let p = plan_alerts(&inputs, &policy(), at(600));
        let subjects: Vec<_> = p.upsert.iter().map(|a| (a.kind, a.subject.as_str())).collect();
        assert_eq!(subjects, [(AlertKind::ReceiverDown, "pc1")]);
        // pc1 polls again: its alert resolves.
        let polls = vec![("pc1".to_string(), at(650)), ("pc2".to_string(), at(500))];
        let inputs = AlertInputs {
            mails: &[],
            last_polls: &polls,
            roster: Some(&roster),
            open: &p.upsert,
            escalate_after,
            up_since: at(0),
        };
        let p2 = plan_alerts(&inputs, &policy(), at(700));
        assert_eq!(p2.upsert.iter().map(|a| a.state).collect::<Vec<_>>(), [AlertState::Resolved]);
    }

    fn roster(labels: &[&str]) -> RosterSpec {
        RosterSpec {
            owner: labels[0].into(),
            machines: labels
                .iter()
                .enumerate()
                .map(|(i, l)| Machine { number: i as u32 + 1, label: l.to_string(), hostname: None, aliases: vec![] })
                .collect(),
        }
    }

    #[test]
    fn e18_undelivered_mail_of_one_machine_is_one_alert_listing_its_mails() {
        let mails: Vec<Mail> = (1..=21)
            .map(|n| {
                let mut m = mail(&format!("mail--{n:08x}"), "pc1", if n == 21 { "pc3" } else { "pc2" });
                m.created_at = at(n);
                m
            })
            .collect();
        let p = plan(&mails[..3], &[], at(3600));
        assert_eq!(p.upsert.len(), 1, "three mails to pc2, one alert: {:?}", p.upsert);
        let a = &p.upsert[0];
        assert_eq!(
            (a.kind, a.subject.as_str(), a.labels.get("to").map(String::as_str)),
            (AlertKind::Undelivered, "pc2", Some("pc2"))
        );
        for m in &mails[..3] {
            assert!(a.summary.contains(&m.id), "{} lists {}", a.summary, m.id);
        }
        assert!(a.summary.starts_with("3 mails to pc2 not delivered within 30m: "), "{}", a.summary);
        assert_eq!(p.breaches.undelivered.get("pc2"), Some(&3));
        assert_eq!(p.breaches.firing.get(&AlertKind::Undelivered), Some(&1));

        // Unchanged: nothing to write, however long it lasts.
        assert!(plan(&mails[..3], &p.upsert, at(7200)).upsert.is_empty());
        // More mail joins: the same alert, its list rewritten, what was posted kept.
        let mut posted = p.upsert.clone();
        posted[0].notified = Some(AlertState::Firing);
        let grown = plan(&mails, &posted, at(7200)).upsert;
        assert_eq!(grown.len(), 2, "pc2's alert rewritten and pc3's fired: {grown:?}");
        let pc2 = grown.iter().find(|a| a.subject == "pc2").expect("pc2");
        assert!(!pc2.needs_notification() && pc2.firing_since == at(3600));
        assert!(pc2.summary.starts_with("20 mails") && pc2.summary.ends_with(" and 10 more"), "{}", pc2.summary);
        // Every mail delivered: one resolve.
        let resolved = plan(&[], &posted, at(7300)).upsert;
        assert_eq!(
            resolved.iter().map(|a| (a.subject.as_str(), a.state)).collect::<Vec<_>>(),
            [("pc2", AlertState::Resolved)]
        );
    }

    #[test]
    fn o6_undelivered_and_unread_sla_alerts_of_urgent_mail_are_critical_with_an_urgency_label() {
        let mut urgent_new = mail("mail--00000001", "pc1", "pc2");
        urgent_new.urgent = true;
        let urgent_read = delivered("mail--00000002", true, at(0));
        let normal_new = mail("mail--00000003", "pc1", "pc3");
        let p = plan(&[urgent_new, urgent_read, normal_new], &[], at(3 * H)).upsert;
        let of = |kind: AlertKind, subject: &str| {
            let a = p.iter().find(|a| a.kind == kind && a.subject == subject).expect("alert");
            (severity(a), a.labels.get("urgency").map(String::as_str))
        };
        assert_eq!(of(AlertKind::Undelivered, "pc2"), ("critical", Some("urgent")));
        assert_eq!(of(AlertKind::UnreadSla, "mail--00000002"), ("critical", Some("urgent")));
        assert_eq!(of(AlertKind::Undelivered, "pc3"), ("warning", Some("normal")));
    }

    #[test]
    fn o6_an_urgent_mail_joining_a_posted_undelivered_alert_posts_it_again_as_critical() {
        let normal = mail("mail--00000001", "pc1", "pc2");
        let mut posted = plan(std::slice::from_ref(&normal), &[], at(H)).upsert;
        posted[0].notified = Some(AlertState::Firing);
        assert_eq!(severity(&posted[0]), "warning");
        let mut urgent = mail("mail--00000002", "pc1", "pc2");
        urgent.urgent = true;
        let grown = plan(&[normal, urgent], &posted, at(2 * H)).upsert;
        assert_eq!(grown.len(), 1, "{grown:?}");
        assert_eq!((severity(&grown[0]), grown[0].needs_notification()), ("critical", true));
        assert_eq!(grown[0].firing_since, at(H), "the same alert, louder");
    }

    #[test]
    fn e18_an_undelivered_alert_of_an_older_build_one_per_mail_resolves_into_the_machine_alert() {
        let m = mail("mail--00000001", "pc1", "pc2");
        let old = Alert { subject: m.id.clone(), ..plan(std::slice::from_ref(&m), &[], at(3600)).upsert[0].clone() };
        let p = plan(std::slice::from_ref(&m), std::slice::from_ref(&old), at(3700)).upsert;
        let got: Vec<_> = p.iter().map(|a| (a.subject.as_str(), a.state)).collect();
        assert_eq!(got, [("pc2", AlertState::Firing), ("mail--00000001", AlertState::Resolved)]);
    }

    #[test]
    fn e18_receiver_down_is_judged_against_the_servers_uptime() {
        let roster = roster(&["pc1", "pc2"]);
        let escalate_after = crate::duration::Dur::from_mins(10);
        let polls = vec![("pc1".to_string(), at(0)), ("pc2".to_string(), at(0))];
        let inputs = |open: &'static [Alert], up_since| AlertInputs {
            mails: &[],
            last_polls: &polls,
            roster: Some(&roster),
            open,
            escalate_after,
            up_since,
        };
        // Up since 0: ten minutes of silence is down.
        assert_eq!(plan_alerts(&inputs(&[], at(0)), &policy(), at(600)).upsert.len(), 2);
        // The server was paused (or restarted) and is up again since 300: nobody could poll it
        // meanwhile, so nobody is down before 900.
        assert!(plan_alerts(&inputs(&[], at(300)), &policy(), at(899)).upsert.is_empty());
        assert_eq!(plan_alerts(&inputs(&[], at(300)), &policy(), at(900)).upsert.len(), 2);
    }

    #[test]
    fn e18_a_machine_already_down_stays_down_across_a_restart_until_it_polls() {
        let roster = roster(&["pc1"]);
        let escalate_after = crate::duration::Dur::from_mins(10);
        let polls = vec![("pc1".to_string(), at(0))];
        let fired = plan_alerts(
            &AlertInputs {
                mails: &[],
                last_polls: &polls,
                roster: Some(&roster),
                open: &[],
                escalate_after,
                up_since: at(0),
            },
            &policy(),
            at(600),
        )
        .upsert;
        let restarted = AlertInputs {
            mails: &[],
            last_polls: &polls,
            roster: Some(&roster),
            open: &fired,
            escalate_after,
            up_since: at(700),
        };
        assert!(plan_alerts(&restarted, &policy(), at(701)).upsert.is_empty(), "no resolve and no second firing");
    }

    #[test]
    fn i4_intents_pending_past_escalate_after_escalate_and_resolve_when_answered() {
        let msg = crate::intent::InboundMessage {
            channel: "telegram".into(),
            chat: "1".into(),
            message: "2".into(),
            from: "kim".into(),
            text: "hi".into(),
            edited: false,
        };
        let intent = crate::intent::intent_mail(&msg, "pc2", at(0), crate::duration::Dur::from_hours(72));
        assert!(plan(std::slice::from_ref(&intent), &[], at(599)).upsert.is_empty());
        let fired = plan(std::slice::from_ref(&intent), &[], at(600)).upsert;
        assert_eq!(fired.iter().map(|a| a.kind).collect::<Vec<_>>(), [AlertKind::IntentUnanswered]);
        let mut done = intent;
        done.state = MailState::Done;
        assert_eq!(plan(&[done], &fired, at(700)).upsert[0].state, AlertState::Resolved);
    }

    #[test]
    fn alert_kinds_round_trip_through_their_stored_names() {
        for kind in AlertKind::ALL {
            assert_eq!(kind.as_str().parse::<AlertKind>(), Ok(kind));
            assert_eq!(serde_json::to_value(kind).ok(), Some(serde_json::Value::String(kind.as_str().into())));
        }
    }

    #[test]
    fn i9_a_poller_conflict_fires_once_and_resolves_when_polling_is_fine_again() {
        let fired =
            poller_alert(None, "telegram", "desk", Some("Conflict: terminated by other getUpdates request"), at(5))
                .expect("fires");
        assert_eq!(
            (fired.kind, fired.subject.as_str(), fired.state),
            (AlertKind::ChannelConflict, "telegram/desk", AlertState::Firing)
        );
        assert!(fired.summary.contains("terminated by other getUpdates"));
        assert_eq!(poller_alert(Some(&fired), "telegram", "desk", Some("again"), at(6)), None, "already firing");
        let resolved = poller_alert(Some(&fired), "telegram", "desk", None, at(9)).expect("resolves");
        assert_eq!((resolved.state, resolved.resolved_at), (AlertState::Resolved, Some(at(9))));
        assert_eq!(poller_alert(None, "telegram", "desk", None, at(9)), None, "nothing to resolve");
    }

    #[test]
    fn o6_a_summary_names_a_mail_without_subject_by_its_body() {
        let mut m = mail("mail--00000001", "pc1", "pc2");
        (m.kind, m.subject, m.body) = (MailKind::Decision, String::new(), "\n  ship it?\nmore".into());
        let notice = arrival_notice(&m, at(0)).expect("a notice");
        assert!(notice.summary.ends_with(": ship it?"), "{}", notice.summary);
        m.body.clear();
        assert!(arrival_notice(&m, at(0)).expect("a notice").summary.ends_with("(no subject or body)"));
    }

    #[test]
    fn m10_arrival_notice_for_decision_work_and_urgent_only() {
        let mut m = mail("mail--00000001", "pc1", "pc2");
        assert_eq!(arrival_notice(&m, at(0)), None);
        m.kind = MailKind::Decision;
        assert_eq!(arrival_notice(&m, at(0)).map(|a| a.state), Some(AlertState::Notice));
        m.kind = MailKind::Note;
        m.urgent = true;
        assert!(arrival_notice(&m, at(0)).is_some());
    }
}
