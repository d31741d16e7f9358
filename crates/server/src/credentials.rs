//! T18: what authentication checks against, kept current. The admin token is the file
//! `admin.token` as it is now — an operator who rewrites it is obeyed on the next request, with
//! no restart — and failed authentication on every surface is slowed per client address by one
//! throttle (a guesser switching from the console to the API gains nothing).

use std::path::PathBuf;
use std::sync::{Mutex, PoisonError};
use std::time::SystemTime;

use pcmail_core::Ts;
use pcmail_core::ids::sha256_hex;
use pcmail_core::throttle::SignInThrottle;

/// The admin token file, re-read when its size or modification time changes (a stat per
/// check; the hash is cached).
#[derive(Debug)]
pub struct AdminToken {
    path: Option<PathBuf>,
    seen: Mutex<Seen>,
}

#[derive(Debug, Clone)]
struct Seen {
    stamp: Option<(SystemTime, u64)>,
    hash: String,
}

impl AdminToken {
    /// The token of `path`, whose hash start-up already read.
    pub fn watch(path: PathBuf, hash: String) -> AdminToken {
        let stamp = stamp_of(&path);
        AdminToken { path: Some(path), seen: Mutex::new(Seen { stamp, hash }) }
    }

    /// A token that never changes (tests, and stores opened without a data dir).
    pub fn fixed(hash: String) -> AdminToken {
        AdminToken { path: None, seen: Mutex::new(Seen { stamp: None, hash }) }
    }

    /// The hash of the token in force. A file that is unreadable or empty keeps the last good
    /// token, logged once per change, so a half-written file never locks the admin out.
    pub fn hash(&self) -> String {
        let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(path) = &self.path else { return seen.hash.clone() };
        let stamp = stamp_of(path);
        if stamp != seen.stamp {
            seen.stamp = stamp;
            match std::fs::read_to_string(path).map(|t| t.trim().to_string()) {
                Ok(token) if !token.is_empty() => {
                    let hash = sha256_hex(&token);
                    if hash != seen.hash {
                        tracing::warn!(path = %path.display(), "admin.token changed; the new token is in force");
                        seen.hash = hash;
                    }
                }
                Ok(_) => tracing::warn!(path = %path.display(), "admin.token is empty; the previous token stays"),
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "admin.token unreadable; the previous token stays")
                }
            }
        }
        seen.hash.clone()
    }
}

fn stamp_of(path: &std::path::Path) -> Option<(SystemTime, u64)> {
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// T9/T18: failed authentication per client address, on every surface.
#[derive(Debug, Default)]
pub struct AuthFailures {
    throttle: Mutex<SignInThrottle>,
}

impl AuthFailures {
    /// Whether `client` may try now; else how many seconds it must wait.
    pub fn attempt(&self, client: &str, now: Ts) -> Result<(), u64> {
        self.throttle.lock().unwrap_or_else(PoisonError::into_inner).attempt(client, now)
    }

    pub fn failed(&self, client: &str, now: Ts) {
        self.throttle.lock().unwrap_or_else(PoisonError::into_inner).failed(client, now);
    }

    pub fn succeeded(&self, client: &str) {
        self.throttle.lock().unwrap_or_else(PoisonError::into_inner).succeeded(client);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn t18_a_rewritten_admin_token_is_in_force_at_once_and_an_empty_one_keeps_the_last() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("admin.token");
        std::fs::write(&path, "first\n").expect("write");
        let token = AdminToken::watch(path.clone(), sha256_hex("first"));
        assert_eq!(token.hash(), sha256_hex("first"));
        std::fs::write(&path, "second-token\n").expect("rewrite");
        assert_eq!(token.hash(), sha256_hex("second-token"));
        std::fs::write(&path, "").expect("empty");
        assert_eq!(token.hash(), sha256_hex("second-token"), "a half-written file locks no one out");
        assert_eq!(AdminToken::fixed("h".into()).hash(), "h");
    }
}
