//! Console sessions: a random id in an HttpOnly, SameSite=Strict cookie scoped to `/ui`, and a
//! CSRF token per session that every form carries. Kept in memory: a restart signs people out.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, header};

const COOKIE: &str = "pcmail_session";
/// A session lasts a working day without being used.
const IDLE: Duration = Duration::from_secs(12 * 3600);

/// A signed-in session: its CSRF token, the admin token it signed in with (its hash), and
/// when it was last used.
struct Session {
    csrf: String,
    admin_hash: String,
    used: Instant,
}

/// The system gave no random bytes for a session's id or CSRF token.
#[derive(Debug, thiserror::Error)]
#[error("no randomness for {what}: {error}")]
pub struct NoRandomness {
    what: &'static str,
    error: getrandom::Error,
}

#[derive(Default)]
pub struct Sessions {
    by_id: Mutex<HashMap<String, Session>>,
}

impl Sessions {
    /// A new session signed in with the admin token whose hash is `admin_hash`; answers its id.
    pub fn create(&self, admin_hash: &str) -> Result<String, NoRandomness> {
        let id = crate::auth::new_token("").map_err(|e| NoRandomness { what: "a session", error: e })?;
        let csrf = crate::auth::new_token("").map_err(|e| NoRandomness { what: "a CSRF token", error: e })?;
        let mut map = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
        map.retain(|_, s| s.used.elapsed() < IDLE);
        map.insert(id.clone(), Session { csrf, admin_hash: admin_hash.to_string(), used: Instant::now() });
        Ok(id)
    }

    /// The CSRF token of a live session (and the session is used now). T18: a session signed
    /// in with an admin token that has since been replaced is over.
    pub fn csrf(&self, id: &str, admin_hash: &str) -> Option<String> {
        let mut map = self.by_id.lock().unwrap_or_else(PoisonError::into_inner);
        let live = map.get(id).is_some_and(|s| s.used.elapsed() < IDLE && s.admin_hash == admin_hash);
        if !live {
            map.remove(id);
            return None;
        }
        let entry = map.get_mut(id)?;
        entry.used = Instant::now();
        Some(entry.csrf.clone())
    }

    pub fn remove(&self, id: &str) {
        self.by_id.lock().unwrap_or_else(PoisonError::into_inner).remove(id);
    }
}

/// The session id the request's cookie carries.
pub fn cookie(headers: &HeaderMap) -> Option<String> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value.to_string())
}

pub fn set_cookie(id: &str) -> String {
    format!("{COOKIE}={id}; Path=/ui; HttpOnly; SameSite=Strict; Max-Age={}", IDLE.as_secs())
}

pub fn clear_cookie() -> String {
    format!("{COOKIE}=; Path=/ui; HttpOnly; SameSite=Strict; Max-Age=0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn console_sessions_carry_their_own_csrf_token_and_end_on_logout() {
        let s = Sessions::default();
        let (a, b) = (s.create("h").expect("a"), s.create("h").expect("b"));
        let (ca, cb) = (s.csrf(&a, "h").expect("live"), s.csrf(&b, "h").expect("live"));
        assert_ne!(ca, cb, "each session its own token");
        assert_ne!(a, ca, "the token is not the session id");
        s.remove(&a);
        assert_eq!(s.csrf(&a, "h"), None);
        assert!(set_cookie(&b).contains("HttpOnly") && set_cookie(&b).contains("SameSite=Strict"));
        let mut headers = HeaderMap::new();
        headers.insert(header::COOKIE, format!("other=1; {COOKIE}={b}").parse().expect("header"));
        assert_eq!(cookie(&headers).as_deref(), Some(b.as_str()));
    }

    #[test]
    fn t18_a_session_ends_when_the_admin_token_it_signed_in_with_is_replaced() {
        let s = Sessions::default();
        let id = s.create("old").expect("session");
        assert!(s.csrf(&id, "old").is_some());
        assert_eq!(s.csrf(&id, "rotated"), None, "signed out by the rotation");
        assert_eq!(s.csrf(&id, "old"), None, "and gone, not just hidden");
    }
}
