//! The HTTP API's JSON bodies, shared by the server and the CLI so that both sides agree.
//! Requests refuse unknown fields: a typo is an error, never silently ignored.

use serde::{Deserialize, Serialize};

use crate::duration::Dur;
use crate::mail::{Mail, MailKind};
use crate::manifest::ApplyOutcome;

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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendResponse {
    pub id: String,
    /// False when an identical reply already existed (M6) and nothing new was stored.
    pub created: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollResponse {
    pub mail: Vec<Mail>,
    /// Send this back as `cursor` on the next poll; re-sending an older one re-delivers (M11).
    pub cursor: i64,
}

/// A mail and the trail of events that moved it, for `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MailStatus {
    pub mail: Mail,
    pub events: Vec<Event>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Event {
    pub at: crate::Ts,
    /// `kind/name`, e.g. `mail/mail--0a1b2c3d` or `roster/office`.
    pub object: String,
    pub reason: String,
    pub message: String,
    pub actor: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ApplyRequest {
    pub files: Vec<ManifestFile>,
    #[serde(default)]
    pub dry_run: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ManifestFile {
    pub name: String,
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyResult {
    pub kind: String,
    pub name: String,
    pub outcome: ApplyOutcome,
    pub generation: u64,
    /// For `diff`: the line diff of the stored spec against the applied one, as YAML.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub diff: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenRequest {
    pub machine: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TokenResponse {
    pub machine: String,
    pub token: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WhoAmI {
    /// The machine this caller acts as; None for the admin token without `as`.
    pub machine: Option<String>,
    pub admin: bool,
}

/// Every error body: a stable code the CLI maps to its exit code, and a message for people.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ErrorDetail {
    pub code: ErrorCode,
    pub message: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub details: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    BadRequest,
    Unauthorized,
    Forbidden,
    NotFound,
    Conflict,
    DuplicateId,
    RecipientUnresolved,
    LoopRefused,
    InvalidManifest,
    PayloadTooLarge,
    Unavailable,
    Internal,
}
