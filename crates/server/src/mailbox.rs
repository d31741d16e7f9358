//! The shell of the mail rules: each call loads rows in one store transaction, asks a planner
//! of pcmail-core what to do, writes that, and wakes the long-polls.

use std::time::Duration;

use pcmail_core::Ts;
use pcmail_core::agent::{REFUSALS_PER_HOUR, Report};
use pcmail_core::alert::{arrival_notice, poller_alert};
use pcmail_core::api::{Event, PollResponse, PollerReport, RefusedCall, SendRequest, SendResponse};
use pcmail_core::ids;
use pcmail_core::intent::{InboundMessage, Recording, intent_mail, may_record, plan_edit, plan_record, stored_intent};
use pcmail_core::mail::{
    Mail, MailState, SendContext, SendObserved, SendOutcome, Step, apply_step, can_move, can_view, deliver_or_expire,
    plan_send, poll_start, send_ids,
};
use pcmail_core::roster::{ResolveError, resolve};
use pcmail_core::trail::{ObjectRef, Reason};
use pcmail_store::{Heartbeat, MailSelect, MailWrites, Store};

use crate::app::App;
use crate::auth::Caller;
use crate::error::ServiceError;
use crate::metrics::Wait;
use crate::wakeups::Topic;

/// The event that records one mail's move, for `status`'s timeline.
pub fn transition_event(before: Option<&Mail>, after: &Mail, actor: &str, now: Ts) -> Event {
    let (reason, message) = match before {
        None => (Reason::Sent, format!("{} → {} ({})", after.from, after.to, after.kind)),
        Some(b) => (Reason::of_state(after.state), format!("{} → {}", b.state, after.state)),
    };
    Event { at: now, object: ObjectRef::mail(&after.id), reason, message, actor: actor.to_string() }
}

/// The state changes one transaction made, counted in `pcmail_mail_transitions_total` once it
/// has committed, the mails they moved (whose status waits they wake) and the recipients of the
/// mail it added (whose long-polls they wake).
#[derive(Debug, Default)]
pub struct Moves {
    transitions: Vec<(Option<MailState>, MailState)>,
    moved: Vec<String>,
    arrivals: Vec<String>,
}

impl Moves {
    /// Writes `after` (a new row when `before` is None) with its event, and remembers the move.
    pub fn record(&mut self, writes: &mut MailWrites, before: Option<&Mail>, after: Mail, actor: &str, now: Ts) {
        writes.events.push(transition_event(before, &after, actor, now));
        self.transitions.push((before.map(|b| b.state), after.state));
        self.moved.push(after.id.clone());
        if before.is_some() {
            writes.update.push(after);
        } else {
            self.arrivals.push(after.to.clone());
            writes.insert.push(after);
        }
    }

    /// Counts the committed moves; wakes the status waits of the mail that moved, and the
    /// long-polls of the recipients of new mail (only new mail can land after a poller's cursor).
    pub fn publish(mut self, app: &App) {
        for (from, to) in self.transitions {
            app.metrics().mail.moved(from, to);
        }
        for id in self.moved {
            app.wakeups().wake(&Topic::Mail(id));
        }
        self.arrivals.sort();
        self.arrivals.dedup();
        for to in self.arrivals {
            app.wakeups().wake(&Topic::Inbox(to));
        }
    }
}

fn random_id() -> Result<String, ServiceError> {
    let mut bytes = [0u8; 4];
    crate::random::fill(&mut bytes).map_err(|e| ServiceError::internal(format!("no randomness: {e}")))?;
    Ok(ids::mail_id(bytes))
}

pub async fn send(app: &App, sender: &str, req: SendRequest, now: Ts) -> Result<SendResponse, ServiceError> {
    let rt = app.runtime();
    // M4: several ids drawn, the first free one taken (a new mail's id is the server's pick).
    let drawn = (0..ids::DRAWS).map(|_| random_id()).collect::<Result<Vec<_>, _>>()?;
    let (first_candidate, parent_id) = send_ids(&req, sender, &drawn[0]);
    let mut load = drawn.clone();
    load.push(first_candidate);
    load.extend(parent_id.clone());
    // A reply that brings its own id: whether that id is already this reply (a retry).
    let client_id = req.id.clone().filter(|_| req.reply_to.is_some());
    load.extend(client_id.clone());
    let sender = sender.to_string();
    let (plan, moves, notice) = app
        .store()
        .mail_transaction(MailSelect::Ids(load), move |rows| {
            let find = |id: &str| rows.iter().find(|m| m.id == id);
            let fresh_id = ids::first_free(&drawn, |id| find(id).is_some()).to_string();
            let (candidate_id, _) = send_ids(&req, &sender, &fresh_id);
            let observed = SendObserved {
                candidate: find(&candidate_id),
                parent: parent_id.as_deref().and_then(find),
                fresh_taken: find(&fresh_id).is_some(),
                client_row: client_id.as_deref().and_then(find),
            };
            let ctx =
                SendContext { roster: rt.roster.as_ref(), policy: &rt.mail_policy, now, fresh_id: fresh_id.clone() };
            match plan_send(&req, &sender, observed, &ctx) {
                Ok(plan) => {
                    let (mut writes, mut moves) = (MailWrites::default(), Moves::default());
                    if let Some(m) = &plan.insert {
                        writes.alerts.extend(arrival_notice(m, now));
                        moves.record(&mut writes, None, m.clone(), &sender, now);
                    }
                    if let Some(p) = &plan.parent_update {
                        moves.record(&mut writes, parent_id.as_deref().and_then(find), p.clone(), &sender, now);
                    }
                    let notice = !writes.alerts.is_empty();
                    (writes, Ok((plan, moves, notice)))
                }
                Err(e) => (MailWrites::default(), Err(e)),
            }
        })
        .await??;
    moves.publish(app);
    if notice {
        app.queue().add(crate::key::Key::Notify);
    }
    Ok(SendResponse { id: plan.id, created: plan.outcome == SendOutcome::Created, conflict: false })
}

/// I1/T4: the intent mail for `msg`, addressed to the Roster owner, stored once per key, by
/// the IntentPolicy's recorders only. A second record with another text keeps both (an event
/// and an `intent-conflict` alert) and answers `conflict`.
pub async fn record_intent(
    app: &App,
    caller: &Caller,
    msg: InboundMessage,
    now: Ts,
) -> Result<SendResponse, ServiceError> {
    let rt = app.runtime();
    let roster = rt.roster.as_ref().ok_or_else(|| ServiceError::from_resolve(ResolveError::NoRoster))?;
    let owner = resolve(Some(roster), &roster.owner).map_err(ServiceError::from_resolve)?;
    if !may_record(&caller.principal, &rt.intent_policy, &owner) {
        let recorders =
            if rt.intent_policy.recorders.is_empty() { owner.clone() } else { rt.intent_policy.recorders.join(", ") };
        return Err(ServiceError::forbidden(format!(
            "only the IntentPolicy's recorders ({recorders}) may record intents; list this machine in its recorders"
        )));
    }
    if msg.channel != rt.intent_policy.channel {
        return Err(ServiceError::unprocessable(format!(
            "channel {:?} is not the IntentPolicy's ({:?})",
            msg.channel, rt.intent_policy.channel
        )));
    }
    let recorder = caller.machine().unwrap_or("admin").to_string();
    let mail = intent_mail(&msg, &owner, now, rt.mail_policy.ttl);
    let edited = msg.edited;
    let key = mail.external_key.clone();
    let legacy = ids::legacy_intent_id(key.as_deref().unwrap_or_default());
    let (outcome, moves) = app
        .store()
        .mail_transaction(MailSelect::Ids(vec![mail.id.clone(), legacy]), move |rows| {
            let (mut writes, mut moves) = (MailWrites::default(), Moves::default());
            let stored = match stored_intent(&rows, &mail) {
                Ok(stored) => stored,
                Err(taken) => return (writes, (Err(ServiceError::conflict(taken.to_string())), moves)),
            };
            let id = stored.map_or_else(|| mail.id.clone(), |m| m.id.clone());
            // K8: an edit is an event on its intent, never a second intent nor a conflict.
            let plan = if edited {
                plan_edit(stored, mail, &recorder, now)
            } else {
                plan_record(stored, mail, &recorder, now)
            };
            let outcome = match plan {
                Recording::New(mail) => {
                    moves.record(&mut writes, None, mail, &recorder, now);
                    (id, true, false)
                }
                Recording::Same => (id, false, false),
                Recording::Edited(event) => {
                    writes.events.push(event);
                    (id, false, false)
                }
                Recording::Conflict { event, alert } => {
                    writes.events.push(event);
                    writes.alerts.push(alert);
                    (id, false, true)
                }
            };
            (writes, (Ok(outcome), moves))
        })
        .await?;
    let (id, created, conflict) = outcome?;
    moves.publish(app);
    if conflict {
        tracing::warn!(id = %id, recorder = caller.machine().unwrap_or("admin"), "an intent was recorded again with another text");
        app.queue().add(crate::key::Key::Notify);
    }
    Ok(SendResponse { id, created, conflict })
}

/// I9: a recorder's poller report. The channel must be the IntentPolicy's (so the metric's
/// labels stay what the specs say); a conflict fires `channel-conflict` for that machine, a
/// report without one resolves it; drops are counted in `pcmail_intents_dropped_total`.
pub async fn poller_report(app: &App, caller: &Caller, report: PollerReport, now: Ts) -> Result<(), ServiceError> {
    let rt = app.runtime();
    let roster = rt.roster.as_ref().ok_or_else(|| ServiceError::from_resolve(ResolveError::NoRoster))?;
    let owner = resolve(Some(roster), &roster.owner).map_err(ServiceError::from_resolve)?;
    if !may_record(&caller.principal, &rt.intent_policy, &owner) {
        return Err(ServiceError::forbidden("only the IntentPolicy's recorders run a chat poller"));
    }
    if report.channel != rt.intent_policy.channel {
        return Err(ServiceError::unprocessable(format!(
            "channel {:?} is not the IntentPolicy's ({:?})",
            report.channel, rt.intent_policy.channel
        )));
    }
    if report.dropped > 0 {
        app.metrics().machines.intents_dropped(&report.channel, report.dropped);
    }
    let machine = caller.machine().unwrap_or("admin");
    let subject = format!("{}/{machine}", report.channel);
    let open = app.store().firing_alerts().await?;
    let current =
        open.iter().find(|a| a.kind == pcmail_core::alert::AlertKind::ChannelConflict && a.subject == subject);
    if let Some(alert) = poller_alert(current, &report.channel, machine, report.conflict.as_deref(), now) {
        app.store().write_alerts(vec![alert]).await?;
        app.queue().add(crate::key::Key::Notify);
    }
    Ok(())
}

/// T10: a PC reports a queued call the server refused; counted, and kept as an event of that
/// machine naming the call and why, so an operator sees what a PC holds back.
pub async fn refused(app: &App, caller: &Caller, call: RefusedCall, now: Ts) -> Result<(), ServiceError> {
    let machine = caller
        .machine()
        .ok_or_else(|| ServiceError::bad_request("only a machine reports its refused calls (use --as MACHINE)"))?;
    match app.access().refusal_report(machine, call.action, &call.target, now) {
        Report::Record => {}
        Report::Repeat => return Ok(()),
        Report::TooMany => {
            return Err(ServiceError::too_many(format!(
                "{machine} reported more than {REFUSALS_PER_HOUR} refused calls within the hour; this one is kept on the PC and reported later (T10)"
            )));
        }
    }
    let event = Event {
        at: now,
        object: ObjectRef::machine(machine),
        reason: Reason::PendingRefused,
        message: format!("{} {} was refused and is kept on the PC: {}", call.action, call.target, call.reason),
        actor: machine.to_string(),
    };
    let writes = MailWrites { events: vec![event], ..MailWrites::default() };
    app.store().mail_transaction(MailSelect::Ids(vec![]), move |_| (writes, ())).await?;
    app.metrics().machines.call_refused(call.action);
    tracing::warn!(machine, action = %call.action, target = %call.target, reason = %call.reason, "a PC reports a refused call");
    Ok(())
}

/// Seen, ack (done) or fail one mail, as its recipient (C3). Answers the mail as it now is.
pub async fn step(app: &App, caller: &Caller, id: &str, step: Step, now: Ts) -> Result<Mail, ServiceError> {
    let actor = caller.machine().unwrap_or("admin").to_string();
    let principal = caller.principal.clone();
    let id_owned = id.to_string();
    let (mail, moves) = app
        .store()
        .mail_transaction(MailSelect::Ids(vec![id.to_string()]), move |mut rows| {
            // T16: a mail the caller may not even see answers as one that is not there.
            let Some(mail) = rows.pop().filter(|m| can_view(m, &principal)) else {
                return (MailWrites::default(), Err(ServiceError::mail_not_found(&id_owned)));
            };
            if !can_move(&mail, &principal) {
                let e = ServiceError::forbidden(format!("mail {id_owned} is not addressed to you"));
                return (MailWrites::default(), Err(e));
            }
            let (mut writes, mut moves) = (MailWrites::default(), Moves::default());
            match apply_step(&mail, &step, &actor, now) {
                Some(next) => {
                    moves.record(&mut writes, Some(&mail), next.clone(), &actor, now);
                    (writes, Ok((next, moves)))
                }
                // M1: an equal, earlier or post-terminal step answers ok with the current state.
                None => (writes, Ok((mail, moves))),
            }
        })
        .await??;
    moves.publish(app);
    Ok(mail)
}

/// T15: the first mails of a poll's page whose texts stay within
/// [`MAX_PAGE_BYTES`](pcmail_core::page::MAX_PAGE_BYTES) (always one). The rest are neither
/// answered nor delivered: the cursor stops at the last one answered and the next poll gets them.
fn within_page_bytes(rows: Vec<Mail>) -> Vec<Mail> {
    let budget = pcmail_core::page::MAX_PAGE_BYTES;
    let mut used = 0usize;
    let mut shown = 0;
    rows.into_iter()
        .take_while(|m| {
            let fits = pcmail_core::page::fits(used, m.text_bytes(), shown, budget);
            used = used.saturating_add(m.text_bytes());
            shown += 1;
            fits
        })
        .collect()
}

/// One M11 cursor poll: the caller's mail after `cursor`, `new` ones marked delivered.
async fn poll_once(
    app: &App,
    machine: &str,
    cursor: i64,
    limit: usize,
    heartbeat: Option<&str>,
    now: Ts,
) -> Result<PollResponse, ServiceError> {
    let who = machine.to_string();
    let heartbeat = heartbeat.map(|client| Heartbeat { machine: who.clone(), at: now, client: client.to_string() });
    let select = MailSelect::After { to: who.clone(), cursor, limit };
    // Most wake-ups of a long-poll find nothing new: answer those from a reader, without
    // queueing behind the single writer.
    if heartbeat.is_none() {
        let rows = within_page_bytes(app.store().select_mail(select.clone()).await?);
        if rows.iter().all(|m| m.state != MailState::New) {
            let cursor = rows.last().map_or(cursor, |m| m.seq);
            return Ok(PollResponse { mail: rows, cursor, store: app.identity().to_string() });
        }
    }
    let store = app.identity().to_string();
    let (response, moves) = app
        .store()
        .mail_transaction(select, move |rows| {
            let mut writes = MailWrites { heartbeat, ..Default::default() };
            let mut moves = Moves::default();
            let rows = within_page_bytes(rows);
            let mut out = Vec::with_capacity(rows.len());
            for mail in rows {
                match deliver_or_expire(&mail, &who, now) {
                    Some(next) => {
                        moves.record(&mut writes, Some(&mail), next.clone(), &who, now);
                        out.push(next);
                    }
                    None => out.push(mail),
                }
            }
            let cursor = out.last().map_or(cursor, |m| m.seq);
            (writes, (PollResponse { mail: out, cursor, store }, moves))
        })
        .await?;
    moves.publish(app);
    Ok(response)
}

/// Long-polls up to `wait`: returns as soon as there is mail after the cursor. A cursor of
/// another store (`client_store`), or beyond this one's last seq, starts from 0 (E5).
pub async fn poll(
    app: &App,
    caller: &Caller,
    (cursor, client_store): (i64, Option<&str>),
    limit: usize,
    wait: Duration,
    client: &str,
) -> Result<PollResponse, ServiceError> {
    let machine = caller.require_machine()?;
    let last_seq = if cursor > 0 { app.store().mail_last_seq().await? } else { 0 };
    let cursor = poll_start(cursor, client_store, app.identity(), last_seq);
    let deadline = tokio::time::Instant::now() + wait;
    // Subscribed before the first query, so mail that lands in between is not missed.
    let mut arrivals = app.wakeups().subscribe(Topic::Inbox(machine.to_string()));
    let mut shutdown = app.watch_shutdown();
    let mut first = true;
    let mut ended = false;
    let recheck = app.recheck_every();
    let hold = (wait > Duration::ZERO).then(|| app.wakeups().hold(machine));
    loop {
        // T18: a token reissued or revoked while this poll waited delivers nothing.
        if !first && !crate::auth::still_valid(app, caller).await? {
            return Err(ServiceError::unauthorized(
                "token not recognized; it was reissued or revoked while this poll waited",
            ));
        }
        let heartbeat = first.then_some(client);
        if first {
            app.metrics().machines.client_seen(machine, client);
        }
        let response = poll_once(app, machine, cursor, limit, heartbeat, crate::clock::now()).await?;
        first = false;
        if !response.mail.is_empty() || ended || tokio::time::Instant::now() >= deadline || *shutdown.borrow() {
            return Ok(response);
        }
        // Sleep until mail for this machine arrives; other machines' mail wakes nothing here.
        let next_look = deadline.min(tokio::time::Instant::now() + recheck);
        let _parked = app.metrics().surface.parked(Wait::Poll);
        tokio::select! {
            _ = tokio::time::sleep_until(next_look) => {}
            _ = shutdown.changed() => {}
            _ = arrivals.changed() => {}
            _ = async { if let Some(h) = &hold { h.ended().await } else { std::future::pending().await } } => ended = true,
        }
    }
}

/// M12: waits until the mail reaches `target` (or any terminal state), or `wait` passes.
pub async fn wait_for(
    app: &App,
    caller: &Caller,
    id: &str,
    target: Option<MailState>,
    wait: Duration,
) -> Result<Mail, ServiceError> {
    let deadline = tokio::time::Instant::now() + wait;
    // Subscribed before each look: a move between the look and the wait wakes it.
    let mut changes = app.wakeups().subscribe(Topic::Mail(id.to_string()));
    let mut shutdown = app.watch_shutdown();
    let hold = app.wakeups().hold(caller.machine().unwrap_or("admin"));
    let mut ended = false;
    loop {
        let mail =
            app.store().get_mail(id).await?.ok_or_else(|| ServiceError::not_found(format!("mail {id} not found")))?;
        let reached = target.is_none_or(|t| mail.state.rank() >= t.rank() || mail.state.is_terminal());
        if reached || ended || tokio::time::Instant::now() >= deadline || *shutdown.borrow() {
            return Ok(mail);
        }
        let _parked = app.metrics().surface.parked(Wait::Status);
        tokio::select! {
            _ = tokio::time::sleep_until(deadline.min(tokio::time::Instant::now() + app.recheck_every())) => {}
            _ = changes.changed() => {}
            _ = shutdown.changed() => {}
            _ = hold.ended() => ended = true,
        }
    }
}
