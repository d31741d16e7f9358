//! C2/C3: the admin token file, machine tokens stored hashed, and who a request acts as.

use std::io::Write;
use std::path::Path;

use axum::http::HeaderMap;
use pcmail_core::ids::{hex, sha256_hex};
use pcmail_core::mail::Principal;
use pcmail_core::roster;
use pcmail_store::Store;

use crate::app::App;
use crate::config::ServeError;
use crate::error::ServiceError;

pub const ADMIN_TOKEN_FILE: &str = "admin.token";
/// Lets the admin act as a machine (send as it, poll its inbox).
pub const AS_HEADER: &str = "x-pcmail-as";

/// Who a request acts as, and whether it came with the admin token.
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal: Principal,
    pub admin: bool,
    /// The hash of the token it came with, so a long wait can ask whether it still holds.
    pub token_hash: String,
}

impl Caller {
    pub fn machine(&self) -> Option<&str> {
        match &self.principal {
            Principal::Machine(m) => Some(m),
            Principal::Admin => None,
        }
    }

    /// The machine this request acts as, or a 400 telling the admin to name one.
    pub fn require_machine(&self) -> Result<&str, ServiceError> {
        self.machine().ok_or_else(|| {
            ServiceError::bad_request("the admin token acts as no machine here; name one with --as MACHINE")
        })
    }

    /// Who this request is on the job queue: its machine, or the admin acting as none.
    pub fn actor(&self) -> pcmail_core::jobs::Actor<'_> {
        match &self.principal {
            Principal::Machine(m) => pcmail_core::jobs::Actor::Machine(m),
            Principal::Admin => pcmail_core::jobs::Actor::Admin,
        }
    }

    pub fn require_admin(&self) -> Result<(), ServiceError> {
        if self.admin { Ok(()) } else { Err(ServiceError::forbidden("this needs the admin token")) }
    }
}

pub fn new_token(prefix: &str) -> Result<String, getrandom::Error> {
    let mut bytes = [0u8; 24];
    crate::random::secret(&mut bytes)?;
    Ok(format!("{prefix}{}", hex(&bytes)))
}

/// Writes `admin.token` (0600) on first start; returns the hash of the token in force.
pub fn ensure_admin_token(dir: &Path) -> Result<String, ServeError> {
    let path = dir.join(ADMIN_TOKEN_FILE);
    let io_err = |source| ServeError::DataDir { path: path.clone(), source };
    match std::fs::read_to_string(&path) {
        Ok(t) if !t.trim().is_empty() => return Ok(sha256_hex(t.trim())),
        Ok(_) => {
            return Err(io_err(std::io::Error::other("admin.token is empty; delete it to have a new one written")));
        }
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(e)),
        Err(_) => {}
    }
    let token = new_token("pcm_admin_").map_err(|e| io_err(std::io::Error::other(e.to_string())))?;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    let mut file = options.open(&path).map_err(io_err)?;
    file.write_all(format!("{token}\n").as_bytes()).map_err(io_err)?;
    file.sync_all().map_err(io_err)?;
    Ok(sha256_hex(&token))
}

/// Compares two equal-length secrets' hashes without an early exit.
pub(crate) fn constant_time_eq(a: &str, b: &str) -> bool {
    a.len() == b.len() && a.bytes().zip(b.bytes()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

pub async fn authenticate(app: &App, headers: &HeaderMap) -> Result<Caller, ServiceError> {
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| ServiceError::unauthorized("missing bearer token; pass --token or run `pcmail-ctl login`"))?;
    let hash = sha256_hex(token);
    let as_machine = headers.get(AS_HEADER).map(|v| v.to_str().unwrap_or_default().to_string());
    if constant_time_eq(&hash, &app.access().admin_token_hash()) {
        let principal = match as_machine {
            None => Principal::Admin,
            Some(name) => {
                let rt = app.runtime();
                let label = roster::resolve(rt.roster.as_ref(), &name).map_err(ServiceError::from_resolve)?;
                Principal::Machine(label)
            }
        };
        return Ok(Caller { principal, admin: true, token_hash: hash });
    }
    // Lookup by the hash of a 192-bit random secret: its timing tells an attacker nothing.
    match app.store().machine_for_token(&hash).await? {
        Some(machine) => {
            if let Some(name) = as_machine {
                // Any name the machine answers to (alias, number, hostname) is itself.
                let rt = app.runtime();
                if roster::resolve(rt.roster.as_ref(), &name).ok().as_deref() != Some(machine.as_str()) {
                    return Err(ServiceError::forbidden(format!(
                        "a machine token acts only as its own machine ({machine})"
                    )));
                }
            }
            Ok(Caller { principal: Principal::Machine(machine), admin: false, token_hash: hash })
        }
        None => Err(ServiceError::unauthorized("token not recognized; it may have been reissued")),
    }
}

/// T18: whether the token a request came with is still in force — a long-poll asks before it
/// hands out mail, so a token reissued or revoked while it waited delivers nothing.
pub async fn still_valid(app: &App, caller: &Caller) -> Result<bool, ServiceError> {
    if caller.admin {
        return Ok(constant_time_eq(&caller.token_hash, &app.access().admin_token_hash()));
    }
    let now = app.store().machine_for_token(&caller.token_hash).await?;
    Ok(now.is_some() && now.as_deref() == caller.machine())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c2_constant_time_eq_compares_whole_strings() {
        assert!(constant_time_eq("abc", "abc"));
        assert!(!constant_time_eq("abc", "abd"));
        assert!(!constant_time_eq("abc", "abcd"));
    }

    #[test]
    fn c2_admin_token_file_is_written_once_with_mode_0600() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = ensure_admin_token(dir.path()).expect("write");
        let again = ensure_admin_token(dir.path()).expect("read");
        assert_eq!(first, again, "a restart keeps the token");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(dir.path().join(ADMIN_TOKEN_FILE)).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }
}
