//! The typed spec of every kind of DESIGN.md §3. Unknown fields are refused everywhere, and
//! every default is the one DESIGN.md names, so an omitted field means what the docs say.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::duration::Dur;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RosterSpec {
    pub machines: Vec<Machine>,
    /// The machine that receives intents (I1).
    pub owner: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Machine {
    pub number: u32,
    pub label: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
}

impl Machine {
    /// Every name the machine answers to, as written in the Roster.
    pub fn names(&self) -> impl Iterator<Item = String> + '_ {
        std::iter::once(self.label.clone())
            .chain(std::iter::once(self.number.to_string()))
            .chain(self.hostname.iter().cloned())
            .chain(self.aliases.iter().cloned())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MailPolicySpec {
    #[serde(default = "d_72h")]
    pub ttl: Dur,
    #[serde(default)]
    pub unread_sla: UnreadSla,
    #[serde(default = "d_30m")]
    pub undelivered_after: Dur,
    #[serde(default = "d_10m")]
    pub receiver_down_after: Dur,
    #[serde(default = "three")]
    pub max_hop: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notify: Option<Notify>,
    /// E7: closed mail (done, failed, expired) is kept this long after it closed.
    #[serde(default = "d_90d")]
    pub retention: Dur,
    /// E7: events and settled alerts are kept this long.
    #[serde(default = "d_30d")]
    pub event_retention: Dur,
}

impl Default for MailPolicySpec {
    fn default() -> Self {
        MailPolicySpec {
            ttl: d_72h(),
            unread_sla: UnreadSla::default(),
            undelivered_after: d_30m(),
            receiver_down_after: d_10m(),
            max_hop: 3,
            notify: None,
            retention: d_90d(),
            event_retention: d_30d(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct UnreadSla {
    #[serde(default = "d_2h")]
    pub urgent: Dur,
    #[serde(default = "d_6h")]
    pub normal: Dur,
}

impl Default for UnreadSla {
    fn default() -> Self {
        UnreadSla { urgent: d_2h(), normal: d_6h() }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Notify {
    pub webhook: String,
    #[serde(default)]
    pub format: NotifyFormat,
    #[serde(default = "d_1m")]
    pub min_interval: Dur,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotifyFormat {
    #[default]
    Alertmanager,
    AlertmanagerApi,
    Discord,
    Slack,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IntentPolicySpec {
    #[serde(default = "telegram")]
    pub channel: String,
    #[serde(default = "reply_tool")]
    pub reply_tool: String,
    #[serde(default = "react_tool")]
    pub react_tool: String,
    #[serde(default = "d_3m")]
    pub remind_after: Dur,
    #[serde(default = "d_5m")]
    pub remind_every: Dur,
    #[serde(default = "d_10m")]
    pub escalate_after: Dur,
    /// T4: the machines that may record intents; empty means the Roster owner alone.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub recorders: Vec<String>,
    /// I9: the chats whose messages pcmail's own Telegram poller records (others are dropped
    /// and counted); empty means every chat the bot is in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allowed_chats: Vec<i64>,
}

impl Default for IntentPolicySpec {
    fn default() -> Self {
        IntentPolicySpec {
            channel: telegram(),
            reply_tool: reply_tool(),
            react_tool: react_tool(),
            remind_after: d_3m(),
            remind_every: d_5m(),
            escalate_after: d_10m(),
            recorders: Vec::new(),
            allowed_chats: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WorkerPoolSpec {
    pub workers: u32,
    #[serde(default)]
    pub queues: Vec<String>,
    #[serde(default = "d_60s")]
    pub lease_duration: Dur,
    #[serde(default = "d_30m")]
    pub stale_after: Dur,
    #[serde(default = "three")]
    pub max_attempts: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    /// T2: the machines that may claim this pool's queues over the API (the admin always may).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub external_workers: Vec<String>,
    /// T5: the longest lease a claim or heartbeat on this pool's queues may ask for (1h when
    /// absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_lease: Option<Dur>,
    /// E7: finished jobs of this pool's queues are kept this long.
    #[serde(default = "d_7d")]
    pub retention: Dur,
    /// T12: a unique key on this pool's queues holds across machines (off: each machine's
    /// keys are its own, so no machine can take another's key first).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub shared_unique_keys: bool,
    /// E12: how long a finished job's unique key still answers for it, unless a job says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unique_for: Option<Dur>,
}

impl Default for WorkerPoolSpec {
    fn default() -> Self {
        WorkerPoolSpec {
            workers: 0,
            queues: Vec::new(),
            lease_duration: d_60s(),
            stale_after: d_30m(),
            max_attempts: 3,
            rate_limit: None,
            external_workers: Vec::new(),
            max_lease: None,
            retention: d_7d(),
            shared_unique_keys: false,
            unique_for: None,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RateLimit {
    pub per_minute: u32,
    #[serde(default = "one")]
    pub burst: u32,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FunctionSpec {
    /// argv, run without a shell.
    pub command: Vec<String>,
    pub mode: FunctionMode,
    #[serde(default = "d_10m")]
    pub timeout: Dur,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<RateLimit>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FunctionMode {
    Generate,
    Send,
    Heavy,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LedgerSpec {
    pub project: String,
    #[serde(default)]
    pub sources: Vec<LedgerSource>,
    #[serde(default = "twenty")]
    pub view_cap: u32,
    /// T11: sources a machine may push to beside its own `push:<machine>`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pushers: Vec<Pusher>,
}

impl LedgerSpec {
    pub fn new(project: &str) -> Self {
        LedgerSpec { project: project.into(), sources: vec![], view_cap: twenty(), pushers: vec![] }
    }
}

/// T11: `machine` may push rows of `sources` (a Roster label, T19).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Pusher {
    pub machine: String,
    #[serde(default)]
    pub sources: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LedgerSource {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<SourceFormat>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregate: Option<Aggregate>,
    #[serde(default)]
    pub count_only: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum SourceFormat {
    Csv,
    Json,
    Yaml,
    Jsonl,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Aggregate {
    pub title: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleSpec {
    #[serde(default = "utc")]
    pub timezone: String,
    pub entries: Vec<ScheduleEntry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ScheduleEntry {
    pub role: ScheduleRole,
    pub cron: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_per_run: Option<u32>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ScheduleRole {
    ExecuteChecked,
    Sync,
    AutoExecute,
    RebuildView,
    MailSweep,
}

impl ScheduleRole {
    /// L14: how many rows (or projects, for sync) one pass of the role takes: the `maxPerRun`
    /// of the first Schedule entry of the role that sets one, else the role's default — one
    /// ticked row, two auto-executed rows, every project.
    pub fn max_per_run(self, configured: &[(ScheduleRole, u32)]) -> Option<u32> {
        let default = match self {
            ScheduleRole::ExecuteChecked => Some(1),
            ScheduleRole::AutoExecute => Some(2),
            ScheduleRole::Sync | ScheduleRole::RebuildView | ScheduleRole::MailSweep => None,
        };
        configured.iter().find(|(r, _)| *r == self).map(|(_, n)| *n).or(default)
    }
}

fn d_60s() -> Dur {
    Dur::from_secs(60)
}
fn d_1m() -> Dur {
    Dur::from_mins(1)
}
fn d_3m() -> Dur {
    Dur::from_mins(3)
}
fn d_5m() -> Dur {
    Dur::from_mins(5)
}
fn d_10m() -> Dur {
    Dur::from_mins(10)
}
fn d_30m() -> Dur {
    Dur::from_mins(30)
}
fn d_2h() -> Dur {
    Dur::from_hours(2)
}
fn d_6h() -> Dur {
    Dur::from_hours(6)
}
fn d_72h() -> Dur {
    Dur::from_hours(72)
}
fn d_7d() -> Dur {
    Dur::from_hours(24 * 7)
}
fn d_30d() -> Dur {
    Dur::from_hours(24 * 30)
}
fn d_90d() -> Dur {
    Dur::from_hours(24 * 90)
}
fn one() -> u32 {
    1
}
fn three() -> u32 {
    3
}
fn twenty() -> u32 {
    20
}
fn telegram() -> String {
    "telegram".into()
}
fn reply_tool() -> String {
    "mcp__plugin_telegram_telegram__reply".into()
}
fn react_tool() -> String {
    "mcp__plugin_telegram_telegram__react".into()
}
fn utc() -> String {
    "UTC".into()
}

#[cfg(test)]
mod tests {
    use super::ScheduleRole;

    #[test]
    fn l14_max_per_run_is_the_first_configured_else_one_checked_two_auto_and_every_project() {
        let configured = [(ScheduleRole::AutoExecute, 5), (ScheduleRole::AutoExecute, 9), (ScheduleRole::Sync, 3)];
        assert_eq!(ScheduleRole::AutoExecute.max_per_run(&configured), Some(5));
        assert_eq!(ScheduleRole::Sync.max_per_run(&configured), Some(3));
        assert_eq!(ScheduleRole::ExecuteChecked.max_per_run(&configured), Some(1));
        assert_eq!(ScheduleRole::AutoExecute.max_per_run(&[]), Some(2));
        assert_eq!(ScheduleRole::Sync.max_per_run(&[]), None);
    }
}
