//! X2: the one description of every kind's fields — type, required, default, range and a
//! sentence — from which `schema` writes the JSON Schema, `explain` prints a field, and
//! `check_object` takes the ranges of every count and duration. The typed structs of `spec`
//! are held to it by the tests below (the same field names, required fields and defaults), so
//! the schema, `explain` and apply's validation cannot disagree.

use crate::bounds::{MAX_ATTEMPTS, MAX_COUNT, MAX_DURATION, MAX_MAX_LEASE, MAX_TTL, MIN_LEASE};
use crate::duration::Dur;

use super::Kind;

/// A field's type, with the range or the values it may take.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Ty {
    /// Text on one line (no line break, control character, NUL or bidi override), maybe empty.
    Line,
    /// Text on one line, not empty.
    Word,
    /// Any text without NUL (an argv element, an environment value).
    Text,
    /// A T6 name: 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit.
    Name,
    /// An `http://` or `https://` URL on one line.
    Url,
    /// A whole number from `min` to `max`.
    Count {
        min: u64,
        max: u64,
    },
    /// Any whole number (a Telegram chat id).
    Integer,
    /// A duration (`30s`, `10m`, `2h`, `3d`, `1h30m`) from `min` to `max`; a `min` of 1ms reads
    /// "longer than 0s".
    Duration {
        min: Dur,
        max: Dur,
    },
    Bool,
    /// One of these strings.
    Enum(&'static [&'static str]),
    Object(&'static [Field]),
    List(&'static Ty),
    /// A list of at least one element.
    NonEmptyList(&'static Ty),
    /// Five cron fields: minute hour day-of-month month day-of-week.
    Cron,
    /// An IANA time zone name (`Asia/Tokyo`, `UTC`).
    TimeZone,
    /// A mapping of keys (no '=' or NUL) to values of this type.
    Map(&'static Ty),
}

/// One field of a spec (or of an object inside one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Field {
    /// As written in YAML (camelCase).
    pub name: &'static str,
    pub ty: Ty,
    pub required: bool,
    /// The value an omitted field takes, in YAML notation.
    pub default: Option<&'static str>,
    pub description: &'static str,
}

/// One kind: what it is for and its spec's fields.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct KindFields {
    pub kind: Kind,
    pub description: &'static str,
    pub spec: &'static [Field],
}

const fn req(name: &'static str, ty: Ty, description: &'static str) -> Field {
    Field { name, ty, required: true, default: None, description }
}
const fn opt(name: &'static str, ty: Ty, description: &'static str) -> Field {
    Field { name, ty, required: false, default: None, description }
}
const fn def(name: &'static str, ty: Ty, default: &'static str, description: &'static str) -> Field {
    Field { name, ty, required: false, default: Some(default), description }
}

/// A strictly positive duration of at most ten years.
const POSITIVE: Ty = Ty::Duration { min: Dur::from_millis(1), max: MAX_DURATION };
const ANY_DURATION: Ty = Ty::Duration { min: Dur::from_millis(0), max: MAX_DURATION };
const KEPT: Ty = Ty::Duration { min: MIN_LEASE, max: MAX_DURATION };
const RATE: Ty = Ty::Count { min: 1, max: MAX_COUNT };
const NAMES: Ty = Ty::List(&Ty::Name);

const MACHINE: &[Field] = &[
    req("number", Ty::Count { min: 0, max: u32::MAX as u64 }, "The machine's number, a name it answers to (M3)."),
    req("label", Ty::Name, "The machine's label: its name in every rule, token and listing."),
    opt("hostname", Ty::Line, "The machine's hostname, another name it answers to."),
    def("aliases", Ty::List(&Ty::Name), "[]", "More names the machine answers to."),
];

const ROSTER: &[Field] = &[
    req(
        "machines",
        Ty::NonEmptyList(&Ty::Object(MACHINE)),
        "The machines that exchange mail; every name any of them answers to is unique.",
    ),
    req("owner", Ty::Name, "The label of the machine that receives intents (inbound chat messages, I1)."),
];

const UNREAD_SLA: &[Field] = &[
    def("urgent", ANY_DURATION, "2h", "An urgent mail unread this long raises an unread-SLA alert."),
    def("normal", ANY_DURATION, "6h", "A normal mail unread this long raises an unread-SLA alert."),
];

const NOTIFY: &[Field] = &[
    req("webhook", Ty::Url, "Where alerts are posted (an Alertmanager's base URL with format alertmanager-api)."),
    def(
        "format",
        Ty::Enum(&["alertmanager", "alertmanager-api", "discord", "slack"]),
        "alertmanager",
        "The body posted: Alertmanager webhook v4 JSON, Alertmanager's API, Discord or Slack.",
    ),
    def("minInterval", ANY_DURATION, "1m", "At most one post per interval; alerts due meanwhile share a post."),
];

const MAIL_POLICY: &[Field] = &[
    def(
        "ttl",
        Ty::Duration { min: Dur::from_millis(1), max: MAX_TTL },
        "72h",
        "A mail not done this long after it was sent expires.",
    ),
    def("unreadSla", Ty::Object(UNREAD_SLA), "{}", "How long a delivered mail may stay unread, by urgency."),
    def(
        "undeliveredAfter",
        ANY_DURATION,
        "30m",
        "A mail not delivered this long raises its recipient's undelivered alert.",
    ),
    def("receiverDownAfter", ANY_DURATION, "10m", "A machine that has not polled this long is reported down."),
    def(
        "maxHop",
        Ty::Count { min: 1, max: 100 },
        "3",
        "How many automatic replies a thread may chain before a reply is refused as a loop.",
    ),
    opt("notify", Ty::Object(NOTIFY), "Posts alerts to a webhook; without it alerts are only listed."),
    def("retention", KEPT, "90d", "Closed mail (done, failed, expired) is kept this long after it closed (E7)."),
    def("eventRetention", KEPT, "30d", "Events and settled alerts are kept this long (E7)."),
];

const INTENT_POLICY: &[Field] = &[
    def("channel", Ty::Name, "telegram", "The channel whose messages are recorded as intents."),
    def(
        "replyTool",
        Ty::Word,
        "mcp__plugin_telegram_telegram__reply",
        "The Claude Code tool whose call answers an intent.",
    ),
    def(
        "reactTool",
        Ty::Word,
        "mcp__plugin_telegram_telegram__react",
        "The Claude Code tool whose call marks an intent seen.",
    ),
    def("remindAfter", ANY_DURATION, "3m", "A pending intent is reminded after a Bash call once it is this old."),
    def("remindEvery", POSITIVE, "5m", "Reminders of one intent are at least this far apart."),
    def("escalateAfter", ANY_DURATION, "10m", "An intent unanswered this long raises an intent-unanswered alert."),
    def(
        "recorders",
        NAMES,
        "[]",
        "The machines (Roster labels) that may record intents; empty means the Roster owner alone (T4).",
    ),
    def(
        "allowedChats",
        Ty::List(&Ty::Integer),
        "[]",
        "The chats pcmail's Telegram poller records; empty means every chat the bot is in (I9).",
    ),
];

const RATE_LIMIT: &[Field] = &[
    req("perMinute", RATE, "How many starts a minute."),
    def("burst", RATE, "1", "How many starts may come at once before the rate holds."),
];

const WORKER_POOL: &[Field] = &[
    req(
        "workers",
        Ty::Count { min: 0, max: 256 },
        "How many Functions this server runs at once for the pool's queues (0: external workers only).",
    ),
    def("queues", NAMES, "[]", "The job queues the pool's workers claim from."),
    def(
        "leaseDuration",
        Ty::Duration { min: MIN_LEASE, max: MAX_MAX_LEASE },
        "60s",
        "How long a claim holds a job between heartbeats; at most the pool's maxLease.",
    ),
    def("staleAfter", ANY_DURATION, "30m", "A ledger run with no word this long is marked stale."),
    def("maxAttempts", Ty::Count { min: 1, max: MAX_ATTEMPTS }, "3", "A job that failed this many times is dead."),
    opt(
        "rateLimit",
        Ty::Object(RATE_LIMIT),
        "At most perMinute job starts a minute, in bursts of burst; without it, no limit.",
    ),
    def(
        "externalWorkers",
        NAMES,
        "[]",
        "The machines (Roster labels) that may also claim these queues over the API (T2).",
    ),
    opt(
        "maxLease",
        Ty::Duration { min: MIN_LEASE, max: MAX_MAX_LEASE },
        "The longest lease a claim or heartbeat may ask for; 1h when absent (T5).",
    ),
    def("retention", KEPT, "7d", "Finished jobs of the pool's queues are kept this long (E7)."),
    def(
        "sharedUniqueKeys",
        Ty::Bool,
        "false",
        "Whether a job's unique key holds across machines; off, each machine's keys are its own (T12).",
    ),
    opt(
        "uniqueFor",
        ANY_DURATION,
        "How long a finished job's unique key still answers for it, unless the job says (E12).",
    ),
];

const FUNCTION: &[Field] = &[
    req(
        "command",
        Ty::NonEmptyList(&Ty::Text),
        "The argv run for each job, without a shell; the first element names the program.",
    ),
    req(
        "mode",
        Ty::Enum(&["generate", "send", "heavy"]),
        "generate makes a reply, send sends mail, heavy runs a long ledger task.",
    ),
    def("timeout", POSITIVE, "10m", "A run longer than this is killed and fails."),
    opt(
        "rateLimit",
        Ty::Object(RATE_LIMIT),
        "At most perMinute runs a minute, in bursts of burst; without it, no limit.",
    ),
    def("env", Ty::Map(&Ty::Text), "{}", "Environment variables set for the command."),
];

const AGGREGATE: &[Field] = &[req("title", Ty::Text, "The title of the one row the source's items are folded into.")];

const SOURCE: &[Field] = &[
    req("name", Ty::Word, "The source's name, unique in the Ledger; push:… names are a machine's own pushes."),
    opt("file", Ty::Text, "A file whose items are rows (exactly one of file or command)."),
    opt("command", Ty::List(&Ty::Text), "An argv whose output's items are rows (exactly one of file or command)."),
    opt(
        "format",
        Ty::Enum(&["csv", "json", "yaml", "jsonl"]),
        "How the items are written; from the file's extension when absent.",
    ),
    opt("aggregate", Ty::Object(AGGREGATE), "Folds the items into one row instead of one row each."),
    def("countOnly", Ty::Bool, "false", "Whether the row shows only how many items there are."),
];

const PUSHER: &[Field] = &[
    req("machine", Ty::Name, "The machine (a Roster label) that may push."),
    def("sources", Ty::List(&Ty::Word), "[]", "The sources it may push rows of, beside its own push:<machine>."),
];

const LEDGER: &[Field] = &[
    req("project", Ty::Name, "The project this Ledger keeps tasks for; one Ledger per project."),
    def("sources", Ty::List(&Ty::Object(SOURCE)), "[]", "Where rows come from at each sync."),
    def("viewCap", Ty::Count { min: 1, max: MAX_COUNT }, "20", "How many rows the project's view shows."),
    def(
        "pushers",
        Ty::List(&Ty::Object(PUSHER)),
        "[]",
        "Machines that may push rows beside their own push:<machine> source (T11).",
    ),
];

const ENTRY: &[Field] = &[
    req(
        "role",
        Ty::Enum(&["execute-checked", "sync", "auto-execute", "rebuild-view", "mail-sweep"]),
        "What runs at each time the cron names.",
    ),
    req("cron", Ty::Cron, "Five cron fields: minute hour day-of-month month day-of-week."),
    opt(
        "maxPerRun",
        Ty::Count { min: 1, max: MAX_COUNT },
        "How many rows (projects for sync) one run takes; 1 ticked row, 2 auto-executed rows, every project when absent.",
    ),
];

const SCHEDULE: &[Field] = &[
    def("timezone", Ty::TimeZone, "UTC", "The IANA time zone the crons are read in (e.g. Asia/Tokyo)."),
    req("entries", Ty::NonEmptyList(&Ty::Object(ENTRY)), "The roles to run and when."),
];

/// Every kind, in [`Kind::ALL`]'s order.
pub const KINDS: [KindFields; 7] = [
    KindFields {
        kind: Kind::Roster,
        description: "The machines that exchange mail and the one that receives intents; one Roster.",
        spec: ROSTER,
    },
    KindFields {
        kind: Kind::MailPolicy,
        description: "How long mail lives, when it raises alerts and where they are posted; one MailPolicy.",
        spec: MAIL_POLICY,
    },
    KindFields {
        kind: Kind::IntentPolicy,
        description: "How inbound chat messages (intents) are recorded, reminded and escalated; one IntentPolicy.",
        spec: INTENT_POLICY,
    },
    KindFields {
        kind: Kind::WorkerPool,
        description: "Workers that claim and run jobs of its queues with Functions.",
        spec: WORKER_POOL,
    },
    KindFields {
        kind: Kind::Function,
        description: "A program run for a job or a ledger task, with the payload on stdin.",
        spec: FUNCTION,
    },
    KindFields {
        kind: Kind::Ledger,
        description: "A project's task ledger: where its rows come from and who may push them.",
        spec: LEDGER,
    },
    KindFields {
        kind: Kind::Schedule,
        description: "When the ledger roles and the mail sweep run, as crons in one time zone.",
        spec: SCHEDULE,
    },
];

/// The fields of `kind`'s spec.
pub fn kind_fields(kind: Kind) -> &'static KindFields {
    let i = Kind::ALL.iter().position(|k| *k == kind).unwrap_or(0);
    &KINDS[i]
}

impl Ty {
    /// The fields inside an object, or inside a list's or map's objects.
    pub fn fields(&self) -> Option<&'static [Field]> {
        match self {
            Ty::Object(f) => Some(f),
            Ty::List(t) | Ty::NonEmptyList(t) | Ty::Map(t) => t.fields(),
            _ => None,
        }
    }

    /// kubectl explain's notation: `<string>`, `<[]Object>`, `<map[string]string>`.
    pub fn type_name(&self) -> String {
        match self {
            Ty::Line | Ty::Word | Ty::Text | Ty::Name | Ty::Url | Ty::Enum(_) | Ty::Cron | Ty::TimeZone => {
                "string".into()
            }
            Ty::Count { .. } | Ty::Integer => "integer".into(),
            Ty::Duration { .. } => "duration".into(),
            Ty::Bool => "boolean".into(),
            Ty::Object(_) => "Object".into(),
            Ty::List(t) | Ty::NonEmptyList(t) => format!("[]{}", t.type_name()),
            Ty::Map(t) => format!("map[string]{}", t.type_name()),
        }
    }

    /// What values the type takes, in words (empty when any value of its type will do).
    pub fn allowed(&self) -> String {
        match self {
            Ty::Line => "one line of text".into(),
            Ty::Word => "one line of text, not empty".into(),
            Ty::Text => "any text without NUL".into(),
            Ty::Name => {
                "a name: 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit".into()
            }
            Ty::Url => "an http:// or https:// URL".into(),
            Ty::Count { min, max } => format!("{min} to {max}"),
            Ty::Integer => String::new(),
            Ty::Duration { min, max } => match min.as_millis() {
                0 => format!("0s to {max}, written like 30s, 10m, 2h, 3d or 1h30m"),
                1 => format!("longer than 0s, at most {max}, written like 30s, 10m, 2h, 3d or 1h30m"),
                _ => format!("{min} to {max}, written like 30s, 10m, 2h, 3d or 1h30m"),
            },
            Ty::Bool => "true or false".into(),
            Ty::Cron => "five cron fields (minute hour day-of-month month day-of-week), e.g. \"0 2 * * *\"".into(),
            Ty::TimeZone => "an IANA time zone name, e.g. Asia/Tokyo or UTC".into(),
            Ty::Enum(values) => format!("one of {}", values.join(", ")),
            Ty::Object(_) => String::new(),
            Ty::List(t) => t.allowed(),
            Ty::NonEmptyList(t) => match t.allowed() {
                a if a.is_empty() => "at least one element".into(),
                a => format!("at least one element, each {a}"),
            },
            Ty::Map(t) => match t.allowed() {
                a if a.is_empty() => "keys without '=' or NUL".into(),
                a => format!("keys without '=' or NUL, values {a}"),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::{Spec, parse_file};
    use super::*;

    /// A value of `ty` that every rule of `check_object` accepts.
    fn sample(ty: &Ty) -> String {
        match ty {
            Ty::Line | Ty::Word => "\"x y\"".into(),
            Ty::Cron => "\"0 2 * * *\"".into(),
            Ty::TimeZone => "Asia/Tokyo".into(),
            Ty::Text => "echo".into(),
            Ty::Name => "desk".into(),
            Ty::Url => "https://example.invalid/hook".into(),
            Ty::Count { min, max } => (*max).min(min + 2).to_string(),
            Ty::Integer => "-100".into(),
            Ty::Duration { .. } => "2s".into(),
            Ty::Bool => "true".into(),
            Ty::Enum(values) => values[values.len() - 1].into(),
            Ty::Object(fields) => object(fields, |_| true),
            Ty::List(t) | Ty::NonEmptyList(t) => format!("[{}]", sample(t)),
            Ty::Map(t) => format!("{{K: {}}}", sample(t)),
        }
    }

    /// A flow mapping of the fields `keep` keeps, each with its sample value.
    fn object(fields: &[Field], keep: impl Fn(&Field) -> bool) -> String {
        let items: Vec<String> =
            fields.iter().filter(|f| keep(f)).map(|f| format!("{}: {}", f.name, sample(&f.ty))).collect();
        format!("{{{}}}", items.join(", "))
    }

    fn doc(kind: Kind, spec: &str) -> String {
        format!("apiVersion: pcmail/v1\nkind: {kind}\nmetadata: {{name: x}}\nspec: {spec}\n")
    }

    fn spec_of(kind: Kind, spec: &str) -> Result<Spec, String> {
        match parse_file("m.yaml", &doc(kind, spec)) {
            Ok(mut docs) => Ok(docs.remove(0).spec),
            Err(e) => Err(format!("{e:?}")),
        }
    }

    /// The keys of every object in `v`, with their paths, `[]` for list elements.
    fn keys(v: &serde_json::Value, path: &str, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(m) => {
                for (k, v) in m {
                    let p = format!("{path}.{k}");
                    out.push(p.clone());
                    if k != "env" {
                        keys(v, &p, out);
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|i| keys(i, &format!("{path}[]"), out)),
            _ => {}
        }
    }

    fn table_keys(fields: &[Field], path: &str, out: &mut Vec<String>) {
        for f in fields {
            let p = format!("{path}.{}", f.name);
            out.push(p.clone());
            let inner = match f.ty {
                Ty::List(_) | Ty::NonEmptyList(_) => format!("{p}[]"),
                _ => p,
            };
            if let Some(fs) = f.ty.fields().filter(|_| !matches!(f.ty, Ty::Map(_))) {
                table_keys(fs, &inner, out);
            }
        }
    }

    #[test]
    fn x2_the_table_names_exactly_the_fields_serde_accepts_and_writes() {
        for k in KINDS {
            // Every field set: serde accepts each, and writes each back (none is unknown to it).
            let full = object(k.spec, |_| true);
            let spec = spec_of(k.kind, &full).unwrap_or_else(|e| panic!("{}: {full}: {e}", k.kind));
            let mut written = Vec::new();
            keys(&spec.to_json(), "spec", &mut written);
            let mut table = Vec::new();
            table_keys(k.spec, "spec", &mut table);
            written.sort();
            table.sort();
            assert_eq!(written, table, "{}: the table and the struct name the same fields", k.kind);
        }
    }

    #[test]
    fn x2_the_required_fields_and_defaults_of_the_table_are_serdes() {
        for k in KINDS {
            let minimal = object(k.spec, |f| f.required);
            let bare = spec_of(k.kind, &minimal).unwrap_or_else(|e| panic!("{}: {e}", k.kind));
            // Writing every default explicitly is the same spec as leaving it out.
            let with_defaults: Vec<String> = k
                .spec
                .iter()
                .filter_map(|f| match (f.required, f.default) {
                    (true, _) => Some(format!("{}: {}", f.name, sample(&f.ty))),
                    (false, Some(d)) => Some(format!("{}: {d}", f.name)),
                    (false, None) => None,
                })
                .collect();
            let explicit = spec_of(k.kind, &format!("{{{}}}", with_defaults.join(", ")))
                .unwrap_or_else(|e| panic!("{}: {e}", k.kind));
            assert_eq!(bare.to_json(), explicit.to_json(), "{}: the table's defaults are serde's", k.kind);
            for f in k.spec.iter().filter(|f| f.required) {
                let without = object(k.spec, |g| g.required && g.name != f.name);
                let e = spec_of(k.kind, &without).expect_err("a required field left out");
                assert!(e.contains(&format!("missing field `{}`", f.name)), "{}.{}: {e}", k.kind, f.name);
            }
        }
    }

    /// Every count and duration of `fields`, nested ones too, with its JSON pointer (the first
    /// element of a list).
    fn ranged(fields: &'static [Field], at: &str, out: &mut Vec<(String, &'static Field)>) {
        for f in fields {
            let pointer = format!("{at}/{}", f.name);
            match f.ty {
                Ty::Count { .. } | Ty::Duration { .. } => out.push((pointer, f)),
                Ty::Object(inner) => ranged(inner, &pointer, out),
                Ty::List(t) | Ty::NonEmptyList(t) => {
                    if let Ty::Object(inner) = t {
                        ranged(inner, &format!("{pointer}/0"), out);
                    }
                }
                _ => {}
            }
        }
    }

    #[test]
    fn x2_every_count_and_duration_range_of_the_table_is_what_apply_refuses() {
        let mut checked = 0;
        for k in KINDS {
            // Every field set (nested ones too), each with a value in range.
            let full = spec_of(k.kind, &object(k.spec, |_| true)).expect("parses").to_json();
            let mut fields = Vec::new();
            ranged(k.spec, "", &mut fields);
            for (pointer, f) in fields {
                let bounds = match f.ty {
                    Ty::Count { max, .. } if max == u64::from(u32::MAX) => vec![],
                    Ty::Count { min: 0, max } => vec![(json!(max), json!(max + 1))],
                    Ty::Count { min, max } => vec![(json!(max), json!(max + 1)), (json!(min), json!(min - 1))],
                    Ty::Duration { max, .. } => {
                        vec![(json!(max.to_string()), json!(Dur::from_millis(max.as_millis() + 1000).to_string()))]
                    }
                    _ => vec![],
                };
                checked += bounds.len();
                for (inside, outside) in bounds {
                    let at_field = |value: &serde_json::Value| {
                        let mut v = full.clone();
                        if let Some(slot) = v.pointer_mut(&pointer) {
                            *slot = value.clone();
                        }
                        if f.name == "leaseDuration" {
                            v["maxLease"] = json!("1d");
                        }
                        let spec = Spec::from_json(k.kind, v).expect("a spec");
                        let mut problems = super::super::check_object("x", &spec);
                        problems.retain(|p| p.needle == f.name);
                        problems
                    };
                    assert_eq!(at_field(&inside), vec![], "{}{pointer} = {inside} is in range", k.kind);
                    let refused = at_field(&outside);
                    let shown = outside.as_str().map_or(outside.to_string(), str::to_string);
                    assert!(
                        refused.len() == 1 && refused[0].message.contains(&format!(" {shown} is out of range")),
                        "{}{pointer} = {outside}: {refused:?}",
                        k.kind
                    );
                }
            }
        }
        assert!(checked > 30, "every bound is tried: {checked}");
    }
}
