//! The clock jumping forwards and backwards under every planner (an NTP step, a laptop waking,
//! a VM restored from a snapshot). Every rule takes `now` as an argument, so each is driven here
//! with times out of order: nothing moves backwards, nothing fires early, nothing fires twice.

use crate::Ts;
use crate::duration::Dur;

fn t(secs: i64) -> Ts {
    chrono::DateTime::from_timestamp(1_800_000_000 + secs, 0).unwrap_or_default()
}

const HOUR: i64 = 3600;
const DAY: i64 = 24 * HOUR;

fn mail() -> crate::mail::Mail {
    crate::mail::Mail::new("mail--00000001".into(), "pc1".into(), "pc2".into(), t(0), t(HOUR))
}

#[test]
fn clock_m1_m2_a_step_stamped_after_a_backward_jump_never_moves_a_mail_back() {
    use crate::mail::{MailState, Step, apply_step};
    let delivered = apply_step(&mail(), &Step::Deliver, "pc2", t(600)).expect("delivered");
    // The clock steps back an hour, then the mail is read.
    let seen = apply_step(&delivered, &Step::See, "pc2", t(600 - HOUR)).expect("seen");
    assert_eq!(seen.state, MailState::Seen);
    assert_eq!(seen.delivered_at, Some(t(600)), "the first stamp stands");
    assert_eq!(apply_step(&seen, &Step::Deliver, "pc2", t(900)), None, "never back to delivered");
}

#[test]
fn clock_m8_expiry_never_fires_early_and_fires_once_after_a_forward_jump() {
    use crate::mail::plan_expiry;
    let m = mail();
    assert!(plan_expiry(std::slice::from_ref(&m), t(-DAY)).is_empty(), "clock far behind: nothing expires");
    assert!(plan_expiry(std::slice::from_ref(&m), t(HOUR - 1)).is_empty());
    let moved = plan_expiry(std::slice::from_ref(&m), t(30 * DAY));
    assert_eq!(moved.len(), 1, "a jump far ahead expires it");
    let expired = moved[0].1.clone();
    assert!(plan_expiry(std::slice::from_ref(&expired), t(60 * DAY)).is_empty(), "and only once");
    assert!(plan_expiry(&[expired], t(0)).is_empty(), "a jump back does not revive it");
}

#[test]
fn clock_m9_i4_alerts_need_their_full_age_whichever_way_the_clock_went() {
    use crate::alert::{is_intent_unanswered, is_receiver_down, is_undelivered, is_unread_past_sla};
    use crate::manifest::spec::MailPolicySpec;
    let p = MailPolicySpec::default();
    let m = mail();
    assert!(!is_undelivered(&m, &p, t(-HOUR)), "a mail from the future is not late");
    assert!(is_undelivered(&m, &p, t(DAY)));
    let delivered =
        crate::mail::Mail { state: crate::mail::MailState::Delivered, delivered_at: Some(t(0)), ..m.clone() };
    assert!(!is_unread_past_sla(&delivered, &p, t(-DAY)));
    assert!(!is_receiver_down(t(DAY), &p, t(0)), "a last poll stamped ahead is not a dead receiver");
    let intent = crate::mail::Mail { kind: crate::mail::MailKind::Intent, ..m };
    assert!(!is_intent_unanswered(&intent, Dur::from_secs(HOUR as u64), t(-DAY)));
}

#[test]
fn clock_j2_j4_retries_are_never_scheduled_before_now() {
    use crate::jobs::{Job, plan_failure, plan_rescue};
    let job = Job { attempts: 1, ..Job::new("job-1".into(), "q".into(), "f".into(), "{}".into(), t(DAY)) };
    for now in [t(-DAY), t(0), t(DAY), t(30 * DAY)] {
        let failed = plan_failure(&job, "boom", now, 0.5);
        assert!(failed.run_after >= now, "retry at {} before now {now}", failed.run_after);
        let rescued = plan_rescue(&job, now, 0.5);
        assert!(rescued.run_after >= now);
    }
}

#[test]
fn clock_c1_a_lease_is_not_taken_early_when_the_store_clock_jumps_back() {
    use crate::lease::{CONTROLLER, Leadership, plan_acquire};
    let d = chrono::TimeDelta::seconds(15);
    let (held, _) = plan_acquire(None, CONTROLLER, "a", t(0), d);
    let held = held.expect("a leads");
    let (write, who) = plan_acquire(Some(&held), CONTROLLER, "b", t(-HOUR), d);
    assert_eq!(write, None);
    assert!(matches!(who, Leadership::Following { .. }));
    let (renewed, _) = plan_acquire(Some(&held), CONTROLLER, "a", t(-HOUR), d);
    assert_eq!(renewed.map(|l| l.acquired_at), Some(t(0)), "the holder keeps its term");
}

#[test]
fn clock_l11_stale_runs_are_judged_by_the_clock_now() {
    use crate::ledger::RowState;
    use crate::ledger::plan_stale;
    let row = crate::ledger::Row {
        state: RowState::Running,
        executed_at: Some(t(0)),
        ..crate::ledger::fixtures::row(1, "s", "task", RowState::Running)
    };
    let stale_after = Dur::from_secs(1800);
    assert!(plan_stale(&row, stale_after, t(-HOUR)).is_none(), "a jump back makes nothing stale");
    assert!(plan_stale(&row, stale_after, t(1799)).is_none());
    let stale = plan_stale(&row, stale_after, t(DAY)).expect("a jump ahead does");
    assert_eq!(stale.failures, 1, "counted once");
    assert!(plan_stale(&stale, stale_after, t(2 * DAY)).is_none(), "and never again");
}

#[test]
fn clock_cron_the_next_firing_is_always_after_now() {
    let cron: crate::cron::Cron = "*/10 * * * *".parse().expect("cron");
    let tz = crate::cron::parse_tz("Asia/Tokyo").expect("tz");
    for now in [t(0), t(-HOUR), t(DAY), t(-DAY), t(7)] {
        let next = cron.next_after(now, tz).expect("a next firing");
        assert!(next > now && next - now <= chrono::TimeDelta::minutes(10), "{now} → {next}");
    }
}
