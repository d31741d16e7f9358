//! The mail sweep: M8 expiry, then M9 alerts, then the breach gauges. Idle passes only probe
//! partial indexes, so their cost does not grow with the size of the mail tab (P1).

use std::collections::BTreeSet;

use pcmail_core::Ts;
use pcmail_core::alert::{AlertInputs, AlertKind, plan_alerts, shortest_unread_sla};
use pcmail_core::mail::plan_expiry;
use pcmail_store::{MailSelect, MailWrites, Store, StoreError};

use crate::app::App;
use crate::key::Key;
use crate::mailbox::Moves;

/// Expiry is written in transactions of at most this many mails (P2: 10k in one).
pub const EXPIRY_BATCH: usize = 10_000;
/// Candidates per condition per pass; more are taken by the next pass.
const ALERT_CANDIDATES: usize = 10_000;

#[derive(Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub expired: usize,
    pub alerts_changed: usize,
}

pub async fn run(app: &App, now: Ts) -> Result<SweepReport, StoreError> {
    let expired = expire(app, now).await?;
    let alerts_changed = alerts(app, now).await?;
    Ok(SweepReport { expired, alerts_changed })
}

/// M8: expires every open mail past its expiry, one transaction per batch.
pub async fn expire(app: &App, now: Ts) -> Result<usize, StoreError> {
    let mut total = 0;
    loop {
        // A read-only probe first, so an idle pass never takes the writer.
        if app.store().select_mail(MailSelect::Expiring { now, limit: 1 }).await?.is_empty() {
            return Ok(total);
        }
        let (n, moves) = app
            .store()
            .mail_transaction(MailSelect::Expiring { now, limit: EXPIRY_BATCH }, move |rows| {
                let (mut writes, mut moves) = (MailWrites::default(), Moves::default());
                for (before, expired) in plan_expiry(&rows, now) {
                    moves.record(&mut writes, Some(before), expired, "controller", now);
                }
                let n = writes.update.len();
                (writes, (n, moves))
            })
            .await?;
        moves.publish(app);
        total += n;
        if n < EXPIRY_BATCH {
            return Ok(total);
        }
    }
}

/// M9: fires and resolves alerts; the notifier posts them after the rows are written.
async fn alerts(app: &App, now: Ts) -> Result<usize, StoreError> {
    let rt = app.runtime();
    let policy = &rt.mail_policy;
    let min_sla = shortest_unread_sla(policy);
    let store = app.store();
    let escalate_after = rt.intent_policy.escalate_after;
    let (undelivered, unread, intents, open, polls) = tokio::try_join!(
        store.select_mail(MailSelect::Undelivered {
            created_before: now - policy.undelivered_after.to_chrono(),
            limit: ALERT_CANDIDATES
        }),
        store.select_mail(MailSelect::Unread { delivered_before: now - min_sla, limit: ALERT_CANDIDATES }),
        store.select_mail(MailSelect::OpenIntents {
            created_before: now - escalate_after.to_chrono(),
            limit: ALERT_CANDIDATES
        }),
        store.firing_alerts(),
        store.last_polls(),
    )?;
    let mut mails = undelivered;
    mails.extend(unread);
    mails.extend(intents);
    let known: BTreeSet<&str> = mails.iter().map(|m| m.id.as_str()).collect();
    let behind_open: Vec<String> = open
        .iter()
        .filter(|a| {
            // E18: an undelivered alert names a machine; the mail behind it is all candidates.
            a.kind == AlertKind::UnreadSla && !known.contains(a.subject.as_str())
        })
        .map(|a| a.subject.clone())
        .collect();
    if !behind_open.is_empty() {
        mails.extend(store.select_mail(MailSelect::Ids(behind_open)).await?);
    }
    // E18: this pass is one of the server's ticks too, so a pass right after a pause already
    // knows the server was away.
    let up_since = app.liveness().tick(now);
    let inputs = AlertInputs {
        mails: &mails,
        last_polls: &polls,
        roster: rt.roster.as_ref(),
        open: &open,
        escalate_after,
        up_since,
    };
    let plan = plan_alerts(&inputs, policy, now);

    let metrics = app.metrics();
    let machines: Vec<String> = rt.roster.iter().flat_map(|r| r.machines.iter().map(|m| m.label.clone())).collect();
    metrics.mail.set_breaches(&plan.breaches, &machines);
    for (machine, at) in &polls {
        metrics.machines.polled(machine, *at);
    }
    let changed = plan.upsert.len();
    if changed > 0 {
        for a in &plan.upsert {
            tracing::info!(kind = %a.kind, subject = %a.subject, state = a.state.as_str(), "alert");
        }
        store.write_alerts(plan.upsert).await?;
        app.queue().add(Key::Notify);
    }
    Ok(changed)
}
