//! Service-account authentication: an RS256-signed JWT exchanged at the token endpoint for an
//! access token, cached and refreshed a minute before it expires.

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use ring::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use serde::Deserialize;

use crate::StoreError;

pub const SCOPE: &str = "https://www.googleapis.com/auth/spreadsheets";
pub const GOOGLE_TOKEN_URL: &str = "https://oauth2.googleapis.com/token";

/// The fields of a service account's JSON key file this adapter uses.
#[derive(Debug, Clone, Deserialize)]
pub struct ServiceAccount {
    pub client_email: String,
    pub private_key: String,
    #[serde(default)]
    pub token_uri: Option<String>,
}

impl ServiceAccount {
    pub fn load(path: &Path) -> Result<ServiceAccount, StoreError> {
        let bad = |why: String| StoreError::Credentials { whose: path.display().to_string(), reason: why };
        let text = std::fs::read_to_string(path).map_err(|e| bad(format!("cannot read the credentials file: {e}")))?;
        serde_json::from_str(&text)
            .map_err(|e| bad(format!("not a service-account key (client_email, private_key): {e}")))
    }
}

/// A signer for one service account's key.
pub struct Signer {
    key: RsaKeyPair,
    email: String,
}

impl std::fmt::Debug for Signer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signer").field("email", &self.email).finish_non_exhaustive()
    }
}

impl Signer {
    /// From the account's PKCS#8 PEM key (`-----BEGIN PRIVATE KEY-----`).
    pub fn new(account: &ServiceAccount) -> Result<Signer, StoreError> {
        let body: String =
            account.private_key.lines().filter(|l| !l.starts_with("-----")).flat_map(|l| l.trim().chars()).collect();
        let bad = |why: &str| StoreError::Credentials { whose: account.client_email.clone(), reason: why.into() };
        let der = STANDARD.decode(body).map_err(|_| bad("private_key is not PEM (base64)"))?;
        let key = RsaKeyPair::from_pkcs8(&der).map_err(|_| bad("private_key is not a PKCS#8 RSA key"))?;
        Ok(Signer { key, email: account.client_email.clone() })
    }

    /// The JWT bearer assertion for `audience` (the token URL), valid for an hour from `now`.
    pub fn assertion(&self, audience: &str, now: i64) -> Result<String, StoreError> {
        let header = URL_SAFE_NO_PAD.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
        let claims = serde_json::json!({
            "iss": self.email, "scope": SCOPE, "aud": audience, "iat": now, "exp": now + 3600
        });
        let claims = URL_SAFE_NO_PAD.encode(claims.to_string());
        let signed = format!("{header}.{claims}");
        let mut signature = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, &ring::rand::SystemRandom::new(), signed.as_bytes(), &mut signature)
            .map_err(|_| StoreError::Backend("signing the service-account JWT failed".into()))?;
        Ok(format!("{signed}.{}", URL_SAFE_NO_PAD.encode(signature)))
    }
}

/// The claims of an assertion, for the local stand-in's checks.
pub fn claims(assertion: &str) -> Option<serde_json::Value> {
    let payload = assertion.split('.').nth(1)?;
    serde_json::from_slice(&URL_SAFE_NO_PAD.decode(payload).ok()?).ok()
}

/// Checks an assertion's RS256 signature against an RSA public key (PKCS#1 DER).
pub fn verify(assertion: &str, public_key_der: &[u8]) -> bool {
    let Some((signed, signature)) = assertion.rsplit_once('.') else { return false };
    let Ok(signature) = URL_SAFE_NO_PAD.decode(signature) else { return false };
    ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, public_key_der)
        .verify(signed.as_bytes(), &signature)
        .is_ok()
}
