//! The HTTP API's JSON bodies, shared by the server and the CLI so that both sides agree.
//! Requests refuse unknown fields: a typo is an error, never silently ignored. Every request
//! body says what makes it valid on its own ([`Validate`]: T5's ranges, T6's names and texts);
//! the server checks that once, where every body is parsed, before any handler sees it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::bounds;
use crate::duration::Dur;
use crate::jobs::Job;
use crate::mail::Mail;
pub use crate::mail::SendRequest;
use crate::manifest::ApplyOutcome;
use crate::manifest::spec::FunctionSpec;
pub use crate::validate::{Invalid, Validate, line, name, opt, text};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SendResponse {
    pub id: String,
    /// False when an identical reply already existed (M6) and nothing new was stored.
    pub created: bool,
    /// T4: this record of an intent differs from the one stored under its key; both are kept
    /// and an `intent-conflict` alert is raised.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub conflict: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StepRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Validate for StepRequest {
    fn validate(&self) -> Result<(), Invalid> {
        opt(&self.result, |r| text("result", r))?;
        opt(&self.reason, |r| text("reason", r))
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PollResponse {
    pub mail: Vec<Mail>,
    /// Send this back as `cursor` on the next poll; re-sending an older one re-delivers (M11).
    pub cursor: i64,
    /// The store's identity (E5): send it back as `store` with the cursor, so a cursor that
    /// belongs to another store starts again from 0.
    #[serde(default)]
    pub store: String,
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
    /// `kind/name` on the wire, e.g. `mail/mail--0a1b2c3d` or `roster/office`.
    pub object: crate::trail::ObjectRef,
    /// Lenient: a newer server's reason is [`Reason::Other`](crate::trail::Reason::Other).
    #[serde(deserialize_with = "crate::trail::lenient_reason")]
    pub reason: crate::trail::Reason,
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

impl Validate for ApplyRequest {
    /// The manifests themselves are checked by the manifest validator (T7), with positions.
    fn validate(&self) -> Result<(), Invalid> {
        self.files
            .iter()
            .enumerate()
            .try_for_each(|(i, f)| line("name", &f.name, 1000).map_err(|e| e.within("files", i)))
    }
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

impl Validate for TokenRequest {
    fn validate(&self) -> Result<(), Invalid> {
        line("machine", &self.machine, 200)
    }
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

/// `POST /api/v1/intents/poller`: how a PC's own chat poller is (I9) — a conflict with another
/// poller of the same bot (None: polling fine again), and messages dropped since the last report
/// (chats outside `allowedChats`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PollerReport {
    pub channel: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conflict: Option<String>,
    #[serde(default)]
    pub dropped: u64,
}

impl Validate for PollerReport {
    fn validate(&self) -> Result<(), Invalid> {
        name("channel", &self.channel)?;
        opt(&self.conflict, |c| line("conflict", c, 1000))?;
        bounds::count("dropped", self.dropped, 0, 1_000_000_000)?;
        Ok(())
    }
}

/// V1: the API level this build speaks. It counts additions of routes and fields clients may
/// rely on; a client names the level a verb needs when the server's is lower (V3).
pub const API_LEVEL: u32 = 2;

/// `GET /api/v1/version` (V1): what the server runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VersionInfo {
    pub version: String,
    pub api_level: u32,
}

/// V1: the version in a client's `User-Agent: pcmail-ctl/VERSION (OS)`, when it is one of
/// ours and a plausible version (kept per machine, so bounded and plain).
pub fn client_version(user_agent: &str) -> Option<String> {
    let version = user_agent.strip_prefix("pcmail-ctl/")?.split_whitespace().next()?;
    let plain = version.chars().all(|c| c.is_ascii_alphanumeric() || ".+-".contains(c));
    (plain && (1..=32).contains(&version.len())).then(|| version.to_string())
}

/// `GET /api/v1/machines` (V1): a machine as its polls show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineSeen {
    pub name: String,
    pub last_poll_at: crate::Ts,
    /// The client version of its last poll; empty when it did not say.
    pub client: String,
}

/// The start of what every server since the first answers to a route it does not have (a
/// JSON 404); a client tells "no such route" from "no such mail" by it (V3).
pub const NO_SUCH_ROUTE: &str = "no such route";

/// V3: whether an error answer means the server lacks the route (an older server): its JSON
/// 404 for unknown routes, or 405 for a method the route does not have yet.
pub fn route_missing(status: u16, message: &str) -> bool {
    status == 405 || (status == 404 && message.starts_with(NO_SUCH_ROUTE))
}

/// V3: the sentence a client says when the server is older than a verb needs. `server` is
/// None when the server is older than the version route itself.
pub fn server_too_old(server: Option<&VersionInfo>, client_version: &str) -> String {
    let server = server
        .map_or_else(|| "before 0.2, API level 1".to_string(), |v| format!("{}, API level {}", v.version, v.api_level));
    format!(
        "the server ({server}) is older than this verb needs ({client_version}+, API level {API_LEVEL}); upgrade the server"
    )
}

/// `POST /api/v1/refusals` (T10): a queued call the server refused for good, reported once by
/// the PC that keeps it, so a refusal is never silent on the server's side either.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RefusedCall {
    pub action: crate::agent::QueuedCall,
    pub target: String,
    pub reason: String,
}

impl Validate for RefusedCall {
    fn validate(&self) -> Result<(), Invalid> {
        line("target", &self.target, 200)?;
        line("reason", &self.reason, 2000)
    }
}

/// `POST /api/v1/jobs`: one job for the queue.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EnqueueRequest {
    pub queue: String,
    pub function: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub payload: Option<serde_json::Value>,
    #[serde(default)]
    pub priority: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique_key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_after: Option<Dur>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_attempts: Option<u32>,
    /// E12: the unique key holds over a finished job of it for this long (so a retry after a
    /// lost answer makes no second job); the WorkerPool's `uniqueFor` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique_for: Option<Dur>,
    /// Only the server links a job to a ledger row (T3): a request that sets this is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ledger_ref: Option<String>,
}

impl Validate for EnqueueRequest {
    fn validate(&self) -> Result<(), Invalid> {
        name("queue", &self.queue)?;
        name("function", &self.function)?;
        if self.ledger_ref.is_some() {
            return Err(Invalid::new(
                "ledgerRef",
                "ledgerRef is set by the server alone: only its heavy ledger rows are linked to jobs",
            ));
        }
        opt(&self.unique_key, |k| {
            line("uniqueKey", k, 200)?;
            if k.trim().is_empty() {
                return Err(Invalid::new("uniqueKey", "uniqueKey must not be empty (leave it out for no key)"));
            }
            if k.starts_with(crate::jobs::LEDGER_UNIQUE_PREFIX) {
                let m = format!(
                    "uniqueKey {k:?} is reserved: keys starting {:?} belong to heavy ledger rows",
                    crate::jobs::LEDGER_UNIQUE_PREFIX
                );
                return Err(Invalid::new("uniqueKey", m));
            }
            Ok(())
        })?;
        opt(&self.run_after, |d| {
            Ok(bounds::duration("runAfter", *d, Dur::default(), bounds::MAX_RUN_AFTER).map(drop)?)
        })?;
        opt(&self.unique_for, |d| {
            Ok(bounds::duration("uniqueFor", *d, Dur::default(), bounds::MAX_DURATION).map(drop)?)
        })?;
        opt(&self.max_attempts, |n| Ok(bounds::count("maxAttempts", u64::from(*n), 1, bounds::MAX_ATTEMPTS).map(drop)?))
    }
}

/// `POST /api/v1/jobs`'s body: one job, or a list enqueued in one transaction (P10), each
/// job's unique key honoured as if it came alone, in order.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum EnqueueBody {
    One(EnqueueRequest),
    Many(Vec<EnqueueRequest>),
}

impl EnqueueBody {
    pub fn into_jobs(self) -> Vec<EnqueueRequest> {
        match self {
            EnqueueBody::One(r) => vec![r],
            EnqueueBody::Many(list) => list,
        }
    }
}

/// By hand rather than `untagged`: an object or a list is told apart by its first token, and
/// a wrong field inside either keeps the error that names it.
impl<'de> Deserialize<'de> for EnqueueBody {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Either;
        impl<'de> serde::de::Visitor<'de> for Either {
            type Value = EnqueueBody;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a job object or a list of job objects")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, map: A) -> Result<EnqueueBody, A::Error> {
                EnqueueRequest::deserialize(serde::de::value::MapAccessDeserializer::new(map)).map(EnqueueBody::One)
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, seq: A) -> Result<EnqueueBody, A::Error> {
                Vec::deserialize(serde::de::value::SeqAccessDeserializer::new(seq)).map(EnqueueBody::Many)
            }
        }
        d.deserialize_any(Either)
    }
}

impl Validate for EnqueueBody {
    fn validate(&self) -> Result<(), Invalid> {
        match self {
            EnqueueBody::One(r) => r.validate(),
            EnqueueBody::Many(list) => {
                bounds::count("jobs", list.len() as u64, 1, bounds::MAX_ENQUEUE)?;
                list.iter().enumerate().try_for_each(|(i, r)| r.validate().map_err(|e| e.within("jobs", i)))
            }
        }
    }
}

/// The answer to an [`EnqueueBody`], in its shape: one answer, or one per job in order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum EnqueueAnswer {
    One(Box<EnqueueResponse>),
    Many(Vec<EnqueueResponse>),
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EnqueueResponse {
    pub job: Job,
    /// False when a live job already held the unique key (J6): that job is answered.
    pub created: bool,
}

/// `POST /api/v1/jobs/claim` (J1, J7): up to `limit` due jobs of `queue`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClaimRequest {
    pub queue: String,
    #[serde(default = "one")]
    pub limit: u64,
    /// The worker's own name, shown in `leaseOwner` after the machine's.
    pub owner: String,
    #[serde(default = "minute")]
    pub lease: Dur,
}

fn one() -> u64 {
    1
}

fn minute() -> Dur {
    Dur::from_secs(60)
}

impl Validate for ClaimRequest {
    fn validate(&self) -> Result<(), Invalid> {
        name("queue", &self.queue)?;
        bounds::count("limit", self.limit, 1, bounds::MAX_CLAIM)?;
        crate::jobs::check_worker_name(&self.owner).map_err(|m| Invalid::new("owner", m.to_string()))?;
        bounds::duration("lease", self.lease, bounds::MIN_LEASE, bounds::MAX_MAX_LEASE)?;
        Ok(())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClaimResponse {
    /// The only answer that carries lease tokens (T1).
    pub jobs: Vec<Job>,
    /// The Functions the claimed jobs name, so an external worker can run them.
    pub functions: BTreeMap<String, FunctionSpec>,
}

/// `POST /api/v1/jobs/{id}/heartbeat|complete|fail`: what the lease holder reports.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseReport {
    /// The lease token from the claim; required for heartbeat, complete and fail.
    #[serde(default)]
    pub token: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease: Option<Dur>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Validate for LeaseReport {
    fn validate(&self) -> Result<(), Invalid> {
        line("token", &self.token, 200)?;
        opt(&self.lease, |d| Ok(bounds::duration("lease", *d, bounds::MIN_LEASE, bounds::MAX_MAX_LEASE).map(drop)?))?;
        opt(&self.result, |r| text("result", r))?;
        opt(&self.error, |e| text("error", e))
    }
}

fn project(field: Option<&String>) -> Result<(), Invalid> {
    field.map_or(Ok(()), |p| name("project", p))
}

/// `POST /api/v1/ledger/push` (L7): tasks for a project's ledger; any machine may push.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PushRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    pub items: Vec<crate::ledger::Incoming>,
}

impl Validate for PushRequest {
    fn validate(&self) -> Result<(), Invalid> {
        project(self.project.as_ref())?;
        self.items.iter().enumerate().try_for_each(|(i, item)| item.validate().map_err(|e| e.within("items", i)))
    }
}

/// The answer of `GET /api/v1/jobs` (U3): a page of jobs, newest first, and how many more
/// match after it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct JobList {
    pub jobs: Vec<Job>,
    pub more: u64,
}

/// U5: the text a search looks for, as given: trimmed, not empty, one line of at most
/// [`crate::search::MAX_TEXT`] characters (T14) without refused characters (T6).
pub fn search_text(q: &str) -> Result<String, Invalid> {
    let text = q.trim();
    if text.is_empty() {
        return Err(Invalid::new("q", "q is empty: say what to search for"));
    }
    line("q", text, crate::search::MAX_TEXT)?;
    Ok(text.to_string())
}

/// The answer of `GET /api/v1/search` (U5): mail (newest first) and ledger rows holding the text.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SearchResults {
    pub mail: Vec<Mail>,
    pub rows: Vec<crate::ledger::Row>,
    /// T14: the search's time ran out before it had looked everywhere: all it answers holds
    /// the text, but more may. Absent (false) from servers older than T14.
    #[serde(default)]
    pub truncated: bool,
    /// P13: mail stored since the search index's last batch, which the search read row by row
    /// instead (it is found all the same). Absent (0) from servers older than P13.
    #[serde(default)]
    pub behind: u64,
}

/// The answer of `POST /api/v1/ledger/push` (L7): what one merge did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MergeCounts {
    pub added: usize,
    pub updated: usize,
    pub skipped: usize,
}

/// The answer of `POST /api/v1/ledger/sync`: one project's pull.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncReport {
    pub project: String,
    pub counts: MergeCounts,
    /// Sources that could not be read, with why; the others were merged.
    pub errors: Vec<String>,
}

/// The answer of `GET /api/v1/ledger/view` (L14/L15): the cross-project view as text.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LedgerView {
    pub view: String,
}

/// `POST /api/v1/ledger/rows/{id}` (L3, L16): the fields a person may change with `set-row`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RowEdit {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub assignee: Option<String>,
}

impl RowEdit {
    /// The edit as the ledger's planner takes it; a state it cannot be is refused here.
    pub fn edit(self) -> Result<crate::ledger::Edit, crate::ledger::BadEditState> {
        Ok(crate::ledger::Edit {
            state: crate::ledger::Edit::state(self.state.as_deref())?,
            instruction: self.instruction,
            run: self.run,
            due: self.due,
            assignee: self.assignee,
        })
    }
}

impl Validate for RowEdit {
    fn validate(&self) -> Result<(), Invalid> {
        project(self.project.as_ref())?;
        opt(&self.state, |s| line("state", s, 50))?;
        opt(&self.instruction, |i| text("instruction", i))?;
        opt(&self.due, |d| line("due", d, 100))?;
        opt(&self.assignee, |a| line("assignee", a, 200))
    }
}

/// `POST /api/v1/ledger/rows/{id}/run`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RunRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    /// Answer when the run has finished, with its result; else once it is claimed.
    #[serde(default)]
    pub wait: bool,
}

impl Validate for RunRequest {
    fn validate(&self) -> Result<(), Invalid> {
        project(self.project.as_ref())
    }
}

/// `POST /api/v1/ledger/sync`: one project, or the default one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProjectBody {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
}

impl Validate for ProjectBody {
    fn validate(&self) -> Result<(), Invalid> {
        project(self.project.as_ref())
    }
}

/// `POST /api/v1/ledger/purge` (L15): a source's untouched rows; a dry run unless `yes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PurgeRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project: Option<String>,
    pub source: String,
    #[serde(default)]
    pub yes: bool,
}

impl Validate for PurgeRequest {
    fn validate(&self) -> Result<(), Invalid> {
        project(self.project.as_ref())?;
        line("source", &self.source, 200)
    }
}

/// The answer to a [`PurgeRequest`]: what was (or would be) deleted, and what was kept and why.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PurgeReport {
    pub dry_run: bool,
    pub delete: Vec<String>,
    pub kept: Vec<Kept>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Kept {
    pub id: String,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_a_client_version_is_read_from_our_user_agent_only() {
        assert_eq!(client_version("pcmail-ctl/0.2.0 (linux)").as_deref(), Some("0.2.0"));
        assert_eq!(client_version("pcmail-ctl/0.3.0-rc.1+abc").as_deref(), Some("0.3.0-rc.1+abc"));
        assert_eq!(client_version("curl/8.0"), None);
        assert_eq!(client_version("pcmail-ctl/<script> (x)"), None);
        assert_eq!(client_version(&format!("pcmail-ctl/{}", "9".repeat(33))), None);
        assert_eq!(client_version("pcmail-ctl/"), None);
    }

    #[test]
    fn v3_a_missing_route_is_told_from_a_missing_mail_and_named_with_both_versions() {
        assert!(route_missing(404, "no such route; the API lives under /api/v1/"));
        assert!(route_missing(405, ""));
        assert!(!route_missing(404, "mail mail--0000aaaa not found"));
        assert!(!route_missing(400, "no such route"));
        let old = VersionInfo { version: "0.2.0".into(), api_level: 1 };
        assert_eq!(
            server_too_old(Some(&old), "0.3.0"),
            format!(
                "the server (0.2.0, API level 1) is older than this verb needs (0.3.0+, API level {API_LEVEL}); upgrade the server"
            )
        );
        assert!(server_too_old(None, "0.3.0").starts_with("the server (before 0.2, API level 1) is older"));
    }

    #[test]
    fn t14_a_search_text_is_at_most_256_characters_and_the_error_names_q() {
        assert_eq!(search_text(&format!("  {}  ", "請".repeat(256))), Ok("請".repeat(256)));
        let long = search_text(&"Z".repeat(257)).expect_err("too long");
        assert_eq!(long.field, "q");
        assert!(long.message.contains("257") && long.message.contains("256"), "{}", long.message);
    }

    #[test]
    fn t5_t6_a_body_names_the_field_that_is_wrong() {
        let ok = EnqueueRequest { queue: "q".into(), function: "f".into(), ..Default::default() };
        assert_eq!(ok.validate(), Ok(()));
        for (field, bad) in [
            ("queue", EnqueueRequest { queue: "Q 1".into(), ..ok.clone() }),
            ("function", EnqueueRequest { function: "x".repeat(64), ..ok.clone() }),
            ("ledgerRef", EnqueueRequest { ledger_ref: Some("office/T-0001".into()), ..ok.clone() }),
            ("uniqueKey", EnqueueRequest { unique_key: Some("ledger:office/T-0001".into()), ..ok.clone() }),
            ("uniqueKey", EnqueueRequest { unique_key: Some("a\0".into()), ..ok.clone() }),
            ("maxAttempts", EnqueueRequest { max_attempts: Some(0), ..ok.clone() }),
            ("maxAttempts", EnqueueRequest { max_attempts: Some(u32::MAX), ..ok.clone() }),
            ("runAfter", EnqueueRequest { run_after: Some(Dur::from_hours(24 * 366)), ..ok.clone() }),
        ] {
            let e = bad.validate().expect_err(field);
            assert_eq!(e.field, field);
            assert!(e.message.contains(field), "{}", e.message);
        }
        let claim = ClaimRequest { queue: "q".into(), limit: 101, owner: "w".into(), lease: Dur::from_secs(60) };
        assert_eq!(claim.validate().map_err(|e| e.field), Err("limit".into()));
        let claim = ClaimRequest { limit: 1, lease: Dur::from_hours(24 * 3650), ..claim };
        assert_eq!(claim.validate().map_err(|e| e.field), Err("lease".into()));
        let send = SendRequest { to: "pc".into(), subject: "a\u{2028}b".into(), ..Default::default() };
        let e = send.validate().expect_err("one line");
        assert_eq!(e.message, "subject must be one line, but contains U+2028 at character 2");
        let send = SendRequest { to: "pc".into(), body: "\u{202E}".into(), ..Default::default() };
        assert_eq!(send.validate().map_err(|e| e.field), Err("body".into()));
        let send = SendRequest {
            to: "pc".into(),
            body: "b".into(),
            ttl: Some(Dur::from_hours(24 * 366)),
            ..Default::default()
        };
        assert!(send.validate().expect_err("ttl").message.starts_with("ttl 366d is out of range"));
    }

    #[test]
    fn p10_an_enqueue_body_is_one_job_or_a_list_and_a_bad_job_names_its_index() {
        let one: EnqueueBody = serde_json::from_str(r#"{"queue": "q", "function": "f"}"#).expect("one");
        assert!(matches!(&one, EnqueueBody::One(r) if r.queue == "q"));
        let many: EnqueueBody =
            serde_json::from_str(r#"[{"queue": "q", "function": "f"}, {"queue": "r", "function": "f"}]"#)
                .expect("many");
        assert_eq!(many.clone().into_jobs().len(), 2);
        assert_eq!(many.validate(), Ok(()));
        let bad: EnqueueBody =
            serde_json::from_str(r#"[{"queue": "q", "function": "f"}, {"queue": "Q Q", "function": "f"}]"#)
                .expect("parses");
        assert_eq!(bad.validate().map_err(|e| e.field), Err("jobs[1].queue".into()));
        let typo = serde_json::from_str::<EnqueueBody>(r#"[{"queue": "q", "functoin": "f"}]"#).expect_err("typo");
        assert!(typo.to_string().contains("functoin"), "{typo}");
        assert!(serde_json::from_str::<EnqueueBody>("3").is_err());
        let empty: EnqueueBody = serde_json::from_str("[]").expect("parses");
        assert_eq!(empty.validate().map_err(|e| e.field), Err("jobs".into()));
        let ok = EnqueueRequest { queue: "q".into(), function: "f".into(), ..Default::default() };
        let too_many = EnqueueBody::Many(vec![ok; bounds::MAX_ENQUEUE as usize + 1]);
        assert!(too_many.validate().is_err());
    }

    #[test]
    fn t6_a_problem_inside_a_list_names_its_index() {
        let e = Invalid::new("task", "task contains U+0000 at character 1").within("items", 2);
        assert_eq!(
            (e.field.as_str(), e.message.as_str()),
            ("items[2].task", "items[2].task contains U+0000 at character 1")
        );
    }
}
