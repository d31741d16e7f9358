//! Schedule crons (L14): each entry fires in its Schedule's time zone and enqueues the key of
//! its role.

use pcmail_core::Ts;

use crate::app::App;
use crate::key::Key;
use crate::runtime::CronEntry;

/// The next time any entry fires after `after`, and the keys that fire then.
pub fn next_fire(entries: &[CronEntry], after: Ts) -> Option<(Ts, Vec<Key>)> {
    let fires: Vec<(Ts, Key)> = entries.iter().filter_map(|e| Some((e.cron.next_after(after, e.tz)?, e.key))).collect();
    let first = fires.iter().map(|(t, _)| *t).min()?;
    let mut keys: Vec<Key> = fires.into_iter().filter(|(t, _)| *t == first).map(|(_, k)| k).collect();
    keys.sort();
    keys.dedup();
    Some((first, keys))
}

pub async fn run(app: App) {
    let mut specs = app.watch_specs();
    loop {
        specs.mark_unchanged();
        let now = crate::clock::now();
        let next = next_fire(&app.runtime().crons, now);
        let sleep = match &next {
            Some((at, _)) => (*at - now).to_std().unwrap_or_default(),
            None => std::time::Duration::from_secs(3600),
        };
        tokio::select! {
            _ = tokio::time::sleep(sleep) => {
                for key in next.map(|(_, keys)| keys).unwrap_or_default() {
                    app.queue().add(key);
                }
            }
            _ = specs.changed() => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(expr: &str, tz: &str, key: Key) -> CronEntry {
        CronEntry { tz: tz.parse().expect("tz"), cron: expr.parse().expect("cron"), key }
    }

    #[test]
    fn l14_next_fire_takes_the_earliest_entry_across_time_zones() {
        let after: Ts = "2026-11-30T02:03:00Z".parse().expect("time");
        let entries = [entry("0 12 * * *", "Asia/Tokyo", Key::MailSweep), entry("*/5 * * * *", "UTC", Key::Specs)];
        assert_eq!(next_fire(&entries, after), Some(("2026-11-30T02:05:00Z".parse().expect("t"), vec![Key::Specs])));
        let noon_tokyo: Ts = "2026-11-30T02:59:30Z".parse().expect("time");
        let both = next_fire(&entries, noon_tokyo).expect("fires");
        assert_eq!(both.1, vec![Key::MailSweep, Key::Specs]);
        assert_eq!(next_fire(&[], after), None);
    }
}
