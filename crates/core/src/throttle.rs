//! T9: failed sign-ins are slowed per client address. The first few failures cost nothing (a
//! person mistypes); after `FREE_FAILURES` of them an address gets at most `PER_MINUTE` tries
//! in any minute until it signs in, so guessing the admin token is hopeless. Pure state: the
//! caller passes the time and keeps the value.

use std::collections::{HashMap, VecDeque};

use crate::Ts;

pub const FREE_FAILURES: u32 = 5;
pub const PER_MINUTE: usize = 5;
/// An address quiet this long starts again from zero (and is forgotten).
const FORGET_AFTER_SECS: i64 = 3600;
/// Addresses remembered at most; the quietest are forgotten first.
const MAX_CLIENTS: usize = 10_000;

#[derive(Debug, Default, Clone)]
struct Client {
    failures: u32,
    /// Tries made once throttled, within the last minute.
    recent: VecDeque<Ts>,
    last: Option<Ts>,
}

#[derive(Debug, Default, Clone)]
pub struct SignInThrottle {
    clients: HashMap<String, Client>,
}

impl SignInThrottle {
    /// A sign-in try from `client`: Ok to go on, or how many seconds to wait.
    /// An address that never failed costs one lookup and is not remembered (every request of
    /// every PC asks).
    pub fn attempt(&mut self, client: &str, now: Ts) -> Result<(), u64> {
        if !self.clients.contains_key(client) {
            return Ok(());
        }
        self.forget_quiet(now);
        let Some(c) = self.clients.get_mut(client) else { return Ok(()) };
        if c.last.is_some_and(|t| (now - t).num_seconds() >= FORGET_AFTER_SECS) {
            *c = Client::default();
        }
        c.last = Some(now);
        if c.failures < FREE_FAILURES {
            return Ok(());
        }
        while c.recent.front().is_some_and(|t| (now - *t).num_seconds() >= 60) {
            c.recent.pop_front();
        }
        if let Some(oldest) = c.recent.front().filter(|_| c.recent.len() >= PER_MINUTE) {
            return Err((60 - (now - *oldest).num_seconds()).max(1) as u64);
        }
        c.recent.push_back(now);
        Ok(())
    }

    pub fn failed(&mut self, client: &str, now: Ts) {
        self.forget_quiet(now);
        let c = self.clients.entry(client.to_string()).or_default();
        if c.last.is_some_and(|t| (now - t).num_seconds() >= FORGET_AFTER_SECS) {
            *c = Client::default();
        }
        c.failures = c.failures.saturating_add(1);
        c.last = Some(now);
    }

    pub fn succeeded(&mut self, client: &str) {
        self.clients.remove(client);
    }

    /// Full: forgets the addresses quiet for an hour, then the quietest tenth in one pass, so
    /// a flood of new addresses costs one sort per thousand of them, not a scan per failure.
    fn forget_quiet(&mut self, now: Ts) {
        if self.clients.len() < MAX_CLIENTS {
            return;
        }
        self.clients.retain(|_, c| c.last.is_some_and(|t| (now - t).num_seconds() < FORGET_AFTER_SECS));
        if self.clients.len() >= MAX_CLIENTS {
            let mut by_last: Vec<(Option<Ts>, String)> =
                self.clients.iter().map(|(k, c)| (c.last, k.clone())).collect();
            let cut = MAX_CLIENTS / 10;
            by_last.select_nth_unstable(cut);
            for (_, k) in &by_last[..cut] {
                self.clients.remove(k);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mail::fixtures::at;

    #[test]
    fn t9_after_five_failures_an_address_gets_five_tries_a_minute() {
        let mut t = SignInThrottle::default();
        for i in 0..5 {
            assert_eq!(t.attempt("10.0.0.9", at(i)), Ok(()), "the first failures are free");
            t.failed("10.0.0.9", at(i));
        }
        for i in 0..5 {
            assert_eq!(t.attempt("10.0.0.9", at(10 + i)), Ok(()));
            t.failed("10.0.0.9", at(10 + i));
        }
        assert_eq!(t.attempt("10.0.0.9", at(20)), Err(50), "the sixth try in a minute waits for the first to age");
        assert_eq!(t.attempt("10.0.0.10", at(20)), Ok(()), "another address is not slowed");
        assert_eq!(t.attempt("10.0.0.9", at(70)), Ok(()), "a minute later one more try");
        assert!(t.attempt("10.0.0.9", at(71)).is_ok());
        t.succeeded("10.0.0.9");
        for i in 0..5 {
            assert_eq!(t.attempt("10.0.0.9", at(72 + i)), Ok(()), "a sign-in clears the record");
        }
    }

    #[test]
    fn t9_an_address_quiet_for_an_hour_starts_again() {
        let mut t = SignInThrottle::default();
        for i in 0..12 {
            let _ = t.attempt("a", at(i));
            t.failed("a", at(i));
        }
        assert!(t.attempt("a", at(30)).is_err());
        assert_eq!(t.attempt("a", at(30 + 3600)), Ok(()));
    }

    #[test]
    fn t18_a_flood_of_addresses_forgets_the_quietest_tenth_in_one_pass() {
        let mut t = SignInThrottle::default();
        for _ in 0..FREE_FAILURES + PER_MINUTE as u32 {
            t.failed("guesser", at(1));
        }
        for i in 0..MAX_CLIENTS - 1 {
            t.failed(&format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255), at(2 + i as i64 / 100));
        }
        assert_eq!(t.clients.len(), MAX_CLIENTS);
        t.failed("newcomer", at(200));
        assert_eq!(t.clients.len(), MAX_CLIENTS - MAX_CLIENTS / 10 + 1, "a tenth forgotten in one pass");
        assert!(!t.clients.contains_key("guesser"), "the quietest go first");
        assert!(t.clients.contains_key("10.0.39.14") && t.clients.contains_key("newcomer"), "the most recent stay");
    }
}
