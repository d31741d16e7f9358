//! H2/H3: what a Claude Code hook puts in front of the agent, from the local inbox alone.
//!
//! The old hook showed mail oldest first and cut the block at 1500 characters, so past 100
//! unread mails new ones never appeared. Here groups come in priority order, newest first, each
//! mail and the whole block are cut by characters, and whatever is not shown is counted.

use crate::Ts;
use crate::mail::{Mail, MailState, PresentationGroup};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub per_mail: usize,
    pub total: usize,
    /// Mails shown per group: decisions, work/urgent, answers, others.
    pub groups: [usize; PresentationGroup::ALL.len()],
}

/// DESIGN H2's numbers.
pub const LIMITS: Limits = Limits { per_mail: 240, total: 1800, groups: [3, 3, 3, 2] };

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Presentation {
    /// The block for `additionalContext`; empty when there is nothing to say.
    pub text: String,
    /// Mails shown now: mark presented in this session and queue `seen` (H3).
    pub shown: Vec<String>,
    /// Answers to me among `shown`: acked automatically once shown (H2).
    pub acked: Vec<String>,
}

/// Which H2 group a mail belongs to (0 = shown first), or None if it is not presented here
/// (terminal, expired, or of a kind never presented: an intent, which has its own listing).
pub fn group(m: &Mail, now: Ts) -> Option<usize> {
    if m.state.is_terminal() || m.expires_at <= now {
        return None;
    }
    PresentationGroup::of(m.kind, m.urgent).map(PresentationGroup::index)
}

/// One line for a mail, cut to `max` characters (never inside a UTF-8 sequence).
pub fn line(m: &Mail, max: usize) -> String {
    let tag = match (m.kind, m.urgent) {
        (k, true) => format!("{k}, urgent"),
        (k, false) => k.to_string(),
    };
    let body = m.body.split_whitespace().collect::<Vec<_>>().join(" ");
    cut(&format!("[{tag}] {} from {}: {} — {body}", m.id, m.from, m.subject), max)
}

/// The first `max` characters of `s`, with `…` marking a cut.
pub fn cut(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        return s.to_string();
    }
    s.chars().take(max.saturating_sub(1)).chain(std::iter::once('…')).collect()
}

/// What a hook counts but does not list: the mails [`group`] places (open, not expired, of a
/// presented kind) and the expired ones. A cache keeps these as counts, so a hook reads only the few
/// mails it may show, whatever the size of the inbox (P5).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub eligible: usize,
    pub expired: usize,
}

impl Tally {
    /// The tally of a whole inbox, counted.
    pub fn of(inbox: &[Mail], now: Ts) -> Tally {
        let expired = inbox
            .iter()
            .filter(|m| m.kind.group().is_some())
            .filter(|m| m.state == MailState::Expired || (!m.state.is_terminal() && m.expires_at <= now))
            .count();
        Tally { eligible: inbox.iter().filter(|m| group(m, now).is_some()).count(), expired }
    }
}

/// The mails [`present_heads`] may show: of each group, the newest not yet shown in `session`,
/// at most the group's cap, in group order.
pub fn heads<'a>(inbox: &'a [Mail], session: &str, now: Ts, limits: Limits) -> Vec<&'a Mail> {
    let mut groups: [Vec<&Mail>; 4] = Default::default();
    for m in inbox.iter().filter(|m| m.presented_session.as_deref() != Some(session)) {
        if let Some(g) = group(m, now) {
            groups[g].push(m);
        }
    }
    let mut out = Vec::new();
    for (g, mut mails) in groups.into_iter().enumerate() {
        mails.sort_by(newest_first);
        out.extend(mails.into_iter().take(limits.groups[g]));
    }
    out
}

fn newest_first(a: &&Mail, b: &&Mail) -> std::cmp::Ordering {
    b.created_at.cmp(&a.created_at).then(b.seq.cmp(&a.seq))
}

/// K5: the session's own tools first (the plugin's MCP server), the CLI for a session without it.
const HEADER: &str = "pcmail — mail for this PC (read: the mcp__plugin_pcmail_pcmail__read tool · reply: \
mcp__plugin_pcmail_pcmail__reply; without the plugin: pcmail-ctl read ID, pcmail-ctl reply ID --body …):";

/// Builds the block for `session` from every mail in the local inbox.
pub fn present(inbox: &[Mail], session: &str, now: Ts, limits: Limits) -> Presentation {
    let heads: Vec<Mail> = heads(inbox, session, now, limits).into_iter().cloned().collect();
    present_heads(&heads, Tally::of(inbox, now), now, limits)
}

/// Builds the block from the group heads ([`heads`]) and the tally of the rest: every mail
/// the tally counts as eligible and that is not shown now is counted in the last line.
pub fn present_heads(heads: &[Mail], tally: Tally, now: Ts, limits: Limits) -> Presentation {
    let mut groups: [Vec<&Mail>; 4] = Default::default();
    for m in heads {
        if let Some(g) = group(m, now) {
            groups[g].push(m);
        }
    }
    let footer = |n: usize| format!("+{n} more ({} expired not shown): pcmail-ctl inbox", tally.expired);
    let mut out = Presentation::default();
    let mut lines: Vec<String> = Vec::new();
    let mut used = HEADER.chars().count() + 1;
    // Room is kept for the footer, whose count is at most the eligible mails.
    let footer_room = footer(tally.eligible).chars().count();
    for (g, mut mails) in groups.into_iter().enumerate() {
        mails.sort_by(newest_first);
        for m in mails.into_iter().take(limits.groups[g]) {
            let l = line(m, limits.per_mail);
            if used + l.chars().count() + 1 + footer_room > limits.total {
                continue;
            }
            used += l.chars().count() + 1;
            if m.kind.is_answer() && m.reply_to.is_some() {
                out.acked.push(m.id.clone());
            }
            out.shown.push(m.id.clone());
            lines.push(l);
        }
    }
    let not_shown = tally.eligible.saturating_sub(out.shown.len());
    if lines.is_empty() && not_shown == 0 {
        return out;
    }
    if !lines.is_empty() {
        lines.insert(0, HEADER.into());
    }
    if not_shown > 0 || tally.expired > 0 {
        lines.push(footer(not_shown));
    }
    out.text = lines.join("\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::MailKind;
    use crate::mail::fixtures::{at, mail};

    fn m(n: u32, kind: MailKind, urgent: bool, created: i64) -> Mail {
        let mut m = mail(&format!("mail--{n:08x}"), "desk", "me");
        m.seq = i64::from(n);
        m.kind = kind;
        m.urgent = urgent;
        m.created_at = at(created);
        m.expires_at = at(10_000);
        m.state = MailState::Delivered;
        if kind == MailKind::Answer {
            m.reply_to = Some("mail--ffffffff".into());
        }
        m
    }

    fn ids(p: &Presentation) -> Vec<u32> {
        p.shown.iter().map(|id| u32::from_str_radix(&id[6..], 16).unwrap_or(0)).collect()
    }

    #[test]
    fn h2_groups_in_order_with_their_counts() {
        let mut inbox = Vec::new();
        for n in 0..5 {
            inbox.push(m(n, MailKind::Note, false, i64::from(n)));
            inbox.push(m(10 + n, MailKind::Answer, false, i64::from(n)));
            inbox.push(m(20 + n, MailKind::Work, false, i64::from(n)));
            inbox.push(m(30 + n, MailKind::Decision, false, i64::from(n)));
        }
        let p = present(&inbox, "s1", at(100), Limits { total: 100_000, ..LIMITS });
        // decisions (3), work/urgent (3), answers (3), others (2), newest first in each.
        assert_eq!(ids(&p), [34, 33, 32, 24, 23, 22, 14, 13, 12, 4, 3]);
        assert!(p.text.ends_with("+9 more (0 expired not shown): pcmail-ctl inbox"), "{}", p.text);
    }

    #[test]
    fn h2_urgent_mail_is_in_the_work_group_newest_first() {
        let inbox = [m(1, MailKind::Note, true, 1), m(2, MailKind::Work, false, 2), m(3, MailKind::Note, false, 3)];
        let p = present(&inbox, "s1", at(100), LIMITS);
        assert_eq!(ids(&p), [2, 1, 3]);
    }

    #[test]
    fn h2_each_mail_is_cut_to_240_characters_by_characters() {
        let mut long = m(1, MailKind::Note, false, 1);
        long.body = "日本語のテキスト".repeat(100);
        let p = present(&[long], "s1", at(100), LIMITS);
        let line = p.text.lines().nth(1).expect("the mail line");
        assert_eq!(line.chars().count(), 240);
        assert!(line.ends_with('…'));
    }

    #[test]
    fn h2_the_whole_block_stays_within_1800_characters_and_counts_the_rest() {
        let inbox: Vec<Mail> = (0..40)
            .map(|n| {
                let mut x = m(n, if n % 2 == 0 { MailKind::Decision } else { MailKind::Work }, false, i64::from(n));
                x.body = "あ".repeat(400);
                x
            })
            .collect();
        let limits = Limits { groups: [20, 20, 3, 2], ..LIMITS };
        let p = present(&inbox, "s1", at(100), limits);
        assert!(p.text.chars().count() <= 1800, "{}", p.text.chars().count());
        let shown = p.shown.len();
        assert!(shown >= 6, "{shown}");
        assert!(
            p.text.ends_with(&format!("+{} more (0 expired not shown): pcmail-ctl inbox", 40 - shown)),
            "{}",
            p.text
        );
    }

    #[test]
    fn h2_expired_mail_is_never_shown_but_counted_in_the_last_line() {
        let mut old = m(1, MailKind::Decision, false, 1);
        old.expires_at = at(50);
        let mut expired = m(2, MailKind::Note, false, 1);
        expired.state = MailState::Expired;
        let p = present(&[old, expired, m(3, MailKind::Note, false, 2)], "s1", at(100), LIMITS);
        assert_eq!(ids(&p), [3]);
        assert!(p.text.ends_with("+0 more (2 expired not shown): pcmail-ctl inbox"), "{}", p.text);
    }

    #[test]
    fn h3_mail_shown_in_this_session_appears_only_in_the_count_line() {
        let mut shown = m(1, MailKind::Decision, false, 1);
        shown.presented_session = Some("s1".into());
        let fresh = m(2, MailKind::Note, false, 2);
        let p = present(&[shown.clone(), fresh], "s1", at(100), LIMITS);
        assert_eq!(ids(&p), [2]);
        assert!(p.text.ends_with("+1 more (0 expired not shown): pcmail-ctl inbox"), "{}", p.text);
        // Another session sees it again.
        assert_eq!(ids(&present(&[shown], "s2", at(100), LIMITS)), [1]);
    }

    #[test]
    fn h2_answers_to_me_are_acked_once_shown() {
        let p = present(&[m(1, MailKind::Answer, false, 1), m(2, MailKind::Note, false, 2)], "s1", at(100), LIMITS);
        assert_eq!(p.acked, ["mail--00000001"]);
    }

    #[test]
    fn p5_heads_and_a_tally_present_exactly_what_the_whole_inbox_does() {
        let mut inbox: Vec<Mail> = (0..30)
            .map(|n| {
                m(n, [MailKind::Decision, MailKind::Note, MailKind::Answer][n as usize % 3], n % 7 == 0, i64::from(n))
            })
            .collect();
        inbox[4].presented_session = Some("s1".into());
        inbox[5].expires_at = at(50);
        inbox[6].state = MailState::Expired;
        inbox[7].kind = MailKind::Intent;
        let whole = present(&inbox, "s1", at(100), LIMITS);
        let heads = heads(&inbox, "s1", at(100), LIMITS);
        assert_eq!(heads.len(), 10, "decisions 3, work/urgent 2 (all there are), answers 3, others 2");
        assert!(whole.shown.iter().all(|id| heads.iter().any(|h| h.id == *id)));
        assert_eq!(Tally::of(&inbox, at(100)), Tally { eligible: 27, expired: 2 });
        let owned: Vec<Mail> = heads.into_iter().cloned().collect();
        assert_eq!(present_heads(&owned, Tally::of(&inbox, at(100)), at(100), LIMITS), whole);
        let footer = format!("+{} more (2 expired not shown): pcmail-ctl inbox", 27 - whole.shown.len());
        assert!(whole.text.ends_with(&footer), "{}", whole.text);
    }

    #[test]
    fn nothing_to_show_is_an_empty_text() {
        let mut done = m(1, MailKind::Note, false, 1);
        done.state = MailState::Done;
        assert_eq!(present(&[done], "s1", at(100), LIMITS), Presentation::default());
    }
}
