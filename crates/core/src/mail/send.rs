//! Sending and replying: exact recipients (M3), loop guards (M5), fixed reply ids (M6), and the
//! parent moving to done with the reply as its result (M7).

use super::{Mail, MailKind, Step, apply_step};
use crate::Ts;
use crate::bounds;
use crate::duration::Dur;
use crate::ids;
use crate::manifest::spec::{MailPolicySpec, RosterSpec};
use crate::roster::{self, ResolveError};
use crate::validate::{Invalid, Validate, line, opt, text};
use serde::{Deserialize, Serialize};

pub const MAX_SUBJECT_CHARS: usize = 200;
pub const MAX_BODY_BYTES: usize = 64 * 1024;

/// A send or reply as a client asks for it (the body of `POST /api/v1/mail`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SendRequest {
    /// M4: the client draws the id; on a duplicate it draws again once. Absent: the server draws.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Ignored for replies, which always go back to the parent's sender.
    #[serde(default)]
    pub to: String,
    #[serde(default)]
    pub kind: Option<MailKind>,
    #[serde(default)]
    pub subject: String,
    #[serde(default)]
    pub body: String,
    #[serde(default)]
    pub urgent: bool,
    #[serde(default)]
    pub auto: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttl: Option<Dur>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
}

impl Validate for SendRequest {
    /// Everything a send must be whoever sends it; `plan_send` holds it for every path.
    fn validate(&self) -> Result<(), Invalid> {
        line("to", &self.to, 200)?;
        line("subject", &self.subject, MAX_SUBJECT_CHARS)?;
        text("body", &self.body)?;
        if self.body.len() > MAX_BODY_BYTES {
            let n = self.body.len();
            return Err(Invalid::new("body", format!("body is {n} bytes, more than the limit of {MAX_BODY_BYTES}")));
        }
        opt(&self.ttl, |d| Ok(bounds::duration("ttl", *d, Dur::default(), bounds::MAX_TTL).map(drop)?))?;
        if let Some(k) = self.kind.filter(|k| !k.can_be_sent()) {
            let m = format!("kind {k} is recorded with `intent record` (POST /api/v1/intents), not sent");
            return Err(Invalid::new("kind", m));
        }
        if self.reply_to.is_none() && self.subject.trim().is_empty() && self.body.trim().is_empty() {
            return Err(Invalid::new("body", "a mail needs a subject or a body"));
        }
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    #[error(transparent)]
    Unresolved(#[from] ResolveError),
    #[error("refused as a loop: {0}")]
    Loop(String),
    #[error("mail id {0} already exists")]
    DuplicateId(String),
    #[error("mail {0} not found")]
    ParentNotFound(String),
    #[error("only the recipient of {0} may reply to it")]
    NotRecipient(String),
    #[error("{0}")]
    Invalid(String),
}

pub struct SendContext<'a> {
    pub roster: Option<&'a RosterSpec>,
    pub policy: &'a MailPolicySpec,
    pub now: Ts,
    /// A freshly drawn random id, used when the request brings none or a reply needs a new one.
    pub fresh_id: String,
}

/// The ids the shell loads, in one transaction, before calling [`plan_send`]:
/// `(candidate id, parent id)`.
pub fn send_ids(req: &SendRequest, sender: &str, fresh_id: &str) -> (String, Option<String>) {
    match &req.reply_to {
        Some(parent) => (ids::reply_id(parent, sender), Some(parent.clone())),
        None => (req.id.clone().unwrap_or_else(|| fresh_id.to_string()), None),
    }
}

/// What the store holds for the ids of [`send_ids`], plus the fresh id's and, for a reply
/// that brings its own id, that id's.
#[derive(Debug, Default)]
pub struct SendObserved<'a> {
    pub candidate: Option<&'a Mail>,
    pub parent: Option<&'a Mail>,
    pub fresh_taken: bool,
    pub client_row: Option<&'a Mail>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    Created,
    /// M6: the identical reply was already stored; its id is answered and nothing is added.
    AlreadySent,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendPlan {
    pub id: String,
    pub outcome: SendOutcome,
    pub insert: Option<Mail>,
    /// M7: the parent moved to done by this reply (None if it was already terminal).
    pub parent_update: Option<Mail>,
}

pub fn plan_send(
    req: &SendRequest,
    sender: &str,
    seen: SendObserved<'_>,
    ctx: &SendContext<'_>,
) -> Result<SendPlan, SendError> {
    req.validate().map_err(|e| SendError::Invalid(e.message))?;
    let expires_at = ctx
        .now
        .checked_add_signed(req.ttl.unwrap_or(ctx.policy.ttl).to_chrono())
        .ok_or_else(|| SendError::Invalid("ttl is too large".into()))?;
    let draft = Draft { req, sender, now: ctx.now, expires_at };
    match &req.reply_to {
        None => plan_new(&draft, &seen, ctx),
        Some(parent_id) => plan_reply(&draft, parent_id, &seen, ctx),
    }
}

/// What every mail a request makes shares, new or reply.
struct Draft<'a> {
    req: &'a SendRequest,
    sender: &'a str,
    now: Ts,
    expires_at: Ts,
}

impl Draft<'_> {
    fn mail(&self, id: String, to: String, kind: MailKind, hop: u32) -> Mail {
        let req = self.req;
        Mail {
            kind,
            subject: req.subject.clone(),
            body: req.body.clone(),
            urgent: req.urgent,
            auto: req.auto,
            hop,
            reply_to: req.reply_to.clone(),
            ..Mail::new(id, self.sender.to_string(), to, self.now, self.expires_at)
        }
    }

    /// M4/M6: `same`, stored already, is this request sent again after a lost answer (same
    /// sender, body and parent), not another mail.
    fn is_resent_as(&self, same: &Mail) -> bool {
        same.from == self.sender && same.body == self.req.body && same.reply_to == self.req.reply_to
    }
}

/// A mail's id must have the stored shape (M4: the client may draw it).
fn check_mail_id(id: &str) -> Result<(), SendError> {
    if ids::is_mail_id(id) {
        Ok(())
    } else {
        Err(SendError::Invalid(format!("mail id {id:?} must be {}", ids::MAIL_ID_SHAPE)))
    }
}

/// A new mail (M3: to exactly one machine of the Roster).
fn plan_new(draft: &Draft<'_>, seen: &SendObserved<'_>, ctx: &SendContext<'_>) -> Result<SendPlan, SendError> {
    let req = draft.req;
    let to = roster::resolve(ctx.roster, &req.to)?;
    let id = req.id.clone().unwrap_or_else(|| ctx.fresh_id.clone());
    check_mail_id(&id)?;
    let mail = draft.mail(id.clone(), to, req.kind.unwrap_or_default(), 0);
    if let Some(same) = seen.candidate {
        // A client re-sending after a lost answer gets the same id, not a duplicate (M4).
        if draft.is_resent_as(same) && same.to == mail.to && same.subject == mail.subject {
            return Ok(SendPlan { id, outcome: SendOutcome::AlreadySent, insert: None, parent_update: None });
        }
        return Err(SendError::DuplicateId(id));
    }
    Ok(SendPlan { id, outcome: SendOutcome::Created, insert: Some(mail), parent_update: None })
}

/// A reply (M5–M7): to the parent's sender, under the loop guards, moving the parent to done.
fn plan_reply(
    draft: &Draft<'_>,
    parent_id: &str,
    seen: &SendObserved<'_>,
    ctx: &SendContext<'_>,
) -> Result<SendPlan, SendError> {
    let (req, sender) = (draft.req, draft.sender);
    // T16: a parent the sender may not see is, to the sender, not there.
    let visible = seen.parent.filter(|p| p.to == sender || p.from == sender);
    let parent = visible.ok_or_else(|| SendError::ParentNotFound(parent_id.to_string()))?;
    let hop = check_reply(parent, req, sender, ctx)?;
    let parent_update = apply_step(parent, &Step::Done { result: Some(req.body.clone()) }, sender, ctx.now);
    let id = match reply_id(draft, parent, seen, ctx)? {
        ReplyId::Resent(id) => {
            return Ok(SendPlan { id, outcome: SendOutcome::AlreadySent, insert: None, parent_update });
        }
        ReplyId::New(id) => id,
    };
    let subject = if req.subject.is_empty() { format!("Re: {}", parent.subject) } else { req.subject.clone() };
    let mut mail = draft.mail(id.clone(), parent.from.clone(), req.kind.unwrap_or(MailKind::Answer), hop);
    mail.subject = subject;
    Ok(SendPlan { id, outcome: SendOutcome::Created, insert: Some(mail), parent_update })
}

/// Whether `sender` may reply to `parent` at all; answers the reply's hop (M5's loop guards).
fn check_reply(parent: &Mail, req: &SendRequest, sender: &str, ctx: &SendContext<'_>) -> Result<u32, SendError> {
    if parent.to != sender {
        return Err(SendError::NotRecipient(parent.id.clone()));
    }
    if !parent.kind.can_be_answered_by_mail() {
        return Err(SendError::Invalid(format!(
            "{} is an inbound {} message: answer it with the chat's reply tool (or ack it), not with mail",
            parent.id, parent.channel
        )));
    }
    if roster::resolve(ctx.roster, &parent.from).is_err() {
        return Err(SendError::Invalid(format!(
            "{} came from {:?}, which is not a machine of the Roster, so a reply could never be delivered",
            parent.id, parent.from
        )));
    }
    if req.auto && parent.auto {
        return Err(SendError::Loop(format!("{} is automatic and so is this reply", parent.id)));
    }
    let hop = parent.hop + 1;
    if hop >= ctx.policy.max_hop {
        return Err(SendError::Loop(format!("hop {hop} reaches maxHop {}", ctx.policy.max_hop)));
    }
    Ok(hop)
}

/// The id a reply is stored under, or the id it already was.
enum ReplyId {
    New(String),
    Resent(String),
}

/// M6: a reply's id is fixed by its parent and sender; the identical reply again is the one
/// stored.
fn reply_id(
    draft: &Draft<'_>,
    parent: &Mail,
    seen: &SendObserved<'_>,
    ctx: &SendContext<'_>,
) -> Result<ReplyId, SendError> {
    match seen.candidate {
        None => Ok(ReplyId::New(ids::reply_id(&parent.id, draft.sender))),
        Some(same) if draft.is_resent_as(same) => Ok(ReplyId::Resent(same.id.clone())),
        // M6: a different body must not be swallowed by an earlier receipt-ack. It takes the
        // client's id when it brings one, so that re-sending it after a lost answer is the
        // same mail again, not a second one.
        Some(_) => match (&draft.req.id, seen.client_row) {
            (Some(_), Some(same)) if draft.is_resent_as(same) => Ok(ReplyId::Resent(same.id.clone())),
            (Some(id), Some(_)) => Err(SendError::DuplicateId(id.clone())),
            (Some(id), None) => check_mail_id(id).map(|()| ReplyId::New(id.clone())),
            (None, _) if seen.fresh_taken => Err(SendError::DuplicateId(ctx.fresh_id.clone())),
            (None, _) => Ok(ReplyId::New(ctx.fresh_id.clone())),
        },
    }
}

/// M5, client side: a reply to a mail that is itself a reply is refused before sending;
/// a new mail starts a new thread.
pub fn reply_refusal(parent: &Mail) -> Option<String> {
    parent
        .reply_to
        .as_ref()
        .map(|grand| format!("{} is itself a reply (to {grand}); send a new mail to start a new thread", parent.id))
}

#[cfg(test)]
mod tests {
    use super::super::MailState;
    use super::super::fixtures::{at, mail};
    use super::*;
    use crate::manifest::spec::Machine;

    fn roster() -> RosterSpec {
        let m = |n, l: &str| Machine { number: n, label: l.into(), hostname: None, aliases: vec![] };
        RosterSpec { owner: "pc1".into(), machines: vec![m(1, "pc1"), m(2, "pc2")] }
    }

    fn ctx<'a>(r: &'a RosterSpec, p: &'a MailPolicySpec) -> SendContext<'a> {
        SendContext { roster: Some(r), policy: p, now: at(10), fresh_id: "mail--0000f0e5".into() }
    }

    fn send(to: &str) -> SendRequest {
        SendRequest { to: to.into(), subject: "hi".into(), body: "hello".into(), ..Default::default() }
    }

    fn reply(parent: &str, body: &str) -> SendRequest {
        SendRequest { reply_to: Some(parent.into()), body: body.into(), ..Default::default() }
    }

    #[test]
    fn m3_send_resolves_to_the_canonical_label() {
        let (r, p) = (roster(), MailPolicySpec::default());
        let plan = plan_send(&send("2"), "pc1", SendObserved::default(), &ctx(&r, &p)).expect("sends");
        let mail = plan.insert.expect("inserts");
        assert_eq!((mail.to.as_str(), mail.hop, mail.state), ("pc2", 0, MailState::New));
        assert_eq!(mail.expires_at, at(10) + p.ttl.to_chrono());
    }

    #[test]
    fn m3_unresolved_recipient_sends_nothing() {
        let (r, p) = (roster(), MailPolicySpec::default());
        let err = plan_send(&send("pc"), "pc1", SendObserved::default(), &ctx(&r, &p)).expect_err("refused");
        assert!(matches!(err, SendError::Unresolved(ResolveError::Unresolved { .. })));
    }

    #[test]
    fn m4_duplicate_client_id_is_refused_for_a_retry() {
        let (r, p) = (roster(), MailPolicySpec::default());
        let taken = mail("mail--00000001", "pc1", "pc2");
        let req = SendRequest { id: Some(taken.id.clone()), ..send("pc2") };
        let seen = SendObserved { candidate: Some(&taken), ..Default::default() };
        assert_eq!(plan_send(&req, "pc1", seen, &ctx(&r, &p)), Err(SendError::DuplicateId(taken.id.clone())));
    }

    #[test]
    fn m5_auto_reply_to_auto_mail_is_refused() {
        let (r, p) = (roster(), MailPolicySpec::default());
        let mut parent = mail("mail--00000001", "pc1", "pc2");
        parent.auto = true;
        let req = SendRequest { auto: true, ..reply(&parent.id, "ok") };
        let seen = SendObserved { parent: Some(&parent), ..Default::default() };
        assert!(matches!(plan_send(&req, "pc2", seen, &ctx(&r, &p)), Err(SendError::Loop(_))));
    }

    #[test]
    fn m5_hop_reaching_max_hop_is_refused_and_reply_hop_is_parent_plus_one() {
        let (r, p) = (roster(), MailPolicySpec::default());
        let mut parent = mail("mail--00000001", "pc1", "pc2");
        parent.hop = 1;
        let seen = SendObserved { parent: Some(&parent), ..Default::default() };
        let plan = plan_send(&reply(&parent.id, "ok"), "pc2", seen, &ctx(&r, &p)).expect("hop 2 < 3");
        assert_eq!(plan.insert.map(|m| m.hop), Some(2));
        parent.hop = 2;
        let seen = SendObserved { parent: Some(&parent), ..Default::default() };
        assert!(matches!(plan_send(&reply(&parent.id, "ok"), "pc2", seen, &ctx(&r, &p)), Err(SendError::Loop(_))));
    }

    #[test]
    fn m5_reply_to_a_reply_is_refused_by_the_client() {
        let mut parent = mail("mail--00000002", "pc2", "pc1");
        assert_eq!(reply_refusal(&parent), None);
        parent.reply_to = Some("mail--00000001".into());
        assert!(reply_refusal(&parent).is_some_and(|m| m.contains("new thread")));
    }

    #[test]
    fn m6_m7_reply_gets_the_fixed_id_and_sets_parent_done_with_result() {
        let (r, p) = (roster(), MailPolicySpec::default());
        let parent = mail("mail--00000001", "pc1", "pc2");
        let seen = SendObserved { parent: Some(&parent), ..Default::default() };
        let plan = plan_send(&reply(&parent.id, "answer"), "pc2", seen, &ctx(&r, &p)).expect("replies");
        assert_eq!(plan.id, ids::reply_id("mail--00000001", "pc2"));
        let reply = plan.insert.expect("inserted");
        assert_eq!((reply.to.as_str(), reply.kind, reply.subject.as_str()), ("pc1", MailKind::Answer, "Re: s"));
        let parent = plan.parent_update.expect("parent moves");
        assert_eq!((parent.state, parent.result.as_deref()), (MailState::Done, Some("answer")));
    }

    #[test]
    fn m6_same_reply_again_answers_the_same_id_and_adds_nothing() {
        let (r, p) = (roster(), MailPolicySpec::default());
        let parent = mail("mail--00000001", "pc1", "pc2");
        let first = plan_send(
            &reply(&parent.id, "answer"),
            "pc2",
            SendObserved { parent: Some(&parent), ..Default::default() },
            &ctx(&r, &p),
        )
        .expect("replies");
        let stored = first.insert.expect("inserted");
        let done_parent = first.parent_update.expect("done");
        let seen = SendObserved { parent: Some(&done_parent), candidate: Some(&stored), ..Default::default() };
        let again = plan_send(&reply(&parent.id, "answer"), "pc2", seen, &ctx(&r, &p)).expect("idempotent");
        assert_eq!(
            (again.id, again.outcome, again.insert, again.parent_update),
            (stored.id, SendOutcome::AlreadySent, None, None)
        );
    }

    #[test]
    fn m6_second_reply_with_new_body_gets_new_id() {
        let (r, p) = (roster(), MailPolicySpec::default());
        let parent = mail("mail--00000001", "pc1", "pc2");
        let mut ack = mail(&ids::reply_id(&parent.id, "pc2"), "pc2", "pc1");
        ack.reply_to = Some(parent.id.clone());
        ack.body = "received, working on it".into();
        let seen = SendObserved { parent: Some(&parent), candidate: Some(&ack), ..Default::default() };
        let plan = plan_send(&reply(&parent.id, "the real answer"), "pc2", seen, &ctx(&r, &p)).expect("replies");
        assert_eq!(plan.id, ctx(&r, &p).fresh_id);
        assert_eq!(plan.insert.map(|m| m.body), Some("the real answer".into()));
    }

    #[test]
    fn m4_resending_the_same_mail_with_the_same_id_answers_that_id() {
        let (r, p) = (roster(), MailPolicySpec::default());
        let req = SendRequest { id: Some("mail--00000001".into()), ..send("pc2") };
        let first = plan_send(&req, "pc1", SendObserved::default(), &ctx(&r, &p)).expect("sends").insert.expect("row");
        let seen = SendObserved { candidate: Some(&first), ..Default::default() };
        let again = plan_send(&req, "pc1", seen, &ctx(&r, &p)).expect("idempotent");
        assert_eq!(
            (again.id.as_str(), again.outcome, again.insert),
            ("mail--00000001", SendOutcome::AlreadySent, None)
        );
    }

    #[test]
    fn m7_a_kind_is_sent_and_answered_by_mail_exactly_as_its_properties_say() {
        let (r, p) = (roster(), MailPolicySpec::default());
        for kind in MailKind::ALL {
            let req = SendRequest { kind: Some(kind), ..send("pc2") };
            let sent = plan_send(&req, "pc1", SendObserved::default(), &ctx(&r, &p));
            assert_eq!(sent.is_ok(), kind.can_be_sent(), "{kind}: {sent:?}");
            let parent = Mail { kind, ..mail("mail--00000009", "pc1", "pc2") };
            let seen = SendObserved { parent: Some(&parent), ..Default::default() };
            let answered = plan_send(&reply(&parent.id, "x"), "pc2", seen, &ctx(&r, &p));
            assert_eq!(answered.is_ok(), kind.can_be_answered_by_mail(), "{kind}: {answered:?}");
        }
    }

    #[test]
    fn intents_cannot_be_sent_or_replied_to_as_mail_and_huge_ttls_are_refused() {
        let (r, p) = (roster(), MailPolicySpec::default());
        let as_intent = SendRequest { kind: Some(MailKind::Intent), ..send("pc2") };
        assert!(matches!(
            plan_send(&as_intent, "pc1", SendObserved::default(), &ctx(&r, &p)),
            Err(SendError::Invalid(_))
        ));
        let mut intent = mail("mail--00000009", "telegram:kim", "pc2");
        intent.kind = MailKind::Intent;
        let seen = SendObserved { parent: Some(&intent), ..Default::default() };
        let err = plan_send(&reply(&intent.id, "x"), "pc2", seen, &ctx(&r, &p)).expect_err("refused");
        assert!(err.to_string().contains("reply tool"), "{err}");
        let huge = SendRequest { ttl: Some("99999999999d".parse().expect("parses")), ..send("pc2") };
        assert!(
            plan_send(&huge, "pc1", SendObserved::default(), &ctx(&r, &p))
                .is_err_and(|e| e.to_string().contains("ttl"))
        );
    }

    #[test]
    fn m6_a_retried_second_reply_with_its_client_id_is_not_duplicated() {
        let (r, p) = (roster(), MailPolicySpec::default());
        let parent = mail("mail--00000001", "pc1", "pc2");
        let mut ack = mail(&ids::reply_id(&parent.id, "pc2"), "pc2", "pc1");
        ack.reply_to = Some(parent.id.clone());
        let req = SendRequest { id: Some("mail--0000c11e".into()), ..reply(&parent.id, "the real answer") };
        let seen = SendObserved { parent: Some(&parent), candidate: Some(&ack), ..Default::default() };
        let first = plan_send(&req, "pc2", seen, &ctx(&r, &p)).expect("replies");
        assert_eq!(first.id, "mail--0000c11e");
        let stored = first.insert.expect("row");
        let seen = SendObserved {
            parent: Some(&parent),
            candidate: Some(&ack),
            client_row: Some(&stored),
            ..Default::default()
        };
        let retry = plan_send(&req, "pc2", seen, &ctx(&r, &p)).expect("idempotent");
        assert_eq!((retry.id.as_str(), retry.outcome), ("mail--0000c11e", SendOutcome::AlreadySent));
    }

    #[test]
    fn only_the_recipient_may_reply() {
        let (r, p) = (roster(), MailPolicySpec::default());
        let parent = mail("mail--00000001", "pc1", "pc2");
        let seen = SendObserved { parent: Some(&parent), ..Default::default() };
        assert!(matches!(
            plan_send(&reply(&parent.id, "x"), "pc1", seen, &ctx(&r, &p)),
            Err(SendError::NotRecipient(_))
        ));
    }

    #[test]
    fn oversize_body_and_multiline_subject_are_refused() {
        let (r, p) = (roster(), MailPolicySpec::default());
        let big = SendRequest { body: "x".repeat(MAX_BODY_BYTES + 1), ..send("pc2") };
        let err = plan_send(&big, "pc1", SendObserved::default(), &ctx(&r, &p)).expect_err("too big");
        assert!(err.to_string().contains("limit of 65536"), "{err}");
        let two_lines = SendRequest { subject: "a\nb".into(), ..send("pc2") };
        assert!(plan_send(&two_lines, "pc1", SendObserved::default(), &ctx(&r, &p)).is_err());
    }
}
