//! The command line, parsed by clap. Only shapes and defaults live here; meaning is given in
//! `commands/`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Parser, Subcommand, ValueEnum};
use pcmail_core::duration::Dur;
use pcmail_core::mail::{MailKind, MailState};
use pcmail_core::search::Scope;

use crate::logging::Logging;

#[derive(Debug, Parser)]
#[command(name = "pcmail-ctl", version, about = "Keeps several PCs' AI coding agents and their supervisors in step")]
pub struct Cli {
    #[command(flatten)]
    pub conn: Connection,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the server is and who we are (DESIGN §10).
#[derive(Debug, Clone, Args)]
pub struct Connection {
    /// Server URL [default: from `login`, else http://127.0.0.1:7420]
    #[arg(long, global = true, env = "PCMAIL_SERVER")]
    pub server: Option<String>,
    /// Bearer token [default: from `login`, else ./pcmail-data/admin.token]
    #[arg(long, global = true, env = "PCMAIL_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// With the admin token: act as this machine
    #[arg(long = "as", global = true, env = "PCMAIL_AS")]
    pub as_machine: Option<String>,
    /// A CA certificate (PEM) the server's TLS certificate chains to, trusted beside the
    /// system's roots [default: the one `login --ca` saved]
    #[arg(long, global = true, env = "PCMAIL_CA")]
    pub ca: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, Default, ValueEnum)]
pub enum Output {
    #[default]
    Table,
    /// A table with more columns where a verb has them (`get roster -o wide`: last poll, client)
    Wide,
    Yaml,
    Json,
}

/// U6: how much of a listing a list verb shows.
#[derive(Debug, Clone, Copy, Args)]
pub struct Paging {
    /// The first N (1–1000; mail 1–500)
    #[arg(long, default_value_t = 100, conflicts_with = "all")]
    pub limit: usize,
    /// Every match (for inbox: closed mail too), fetched a page at a time
    #[arg(long)]
    pub all: bool,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the controller, its HTTP API and the sweeps
    Serve(ServeArgs),
    /// Create or update objects from manifests (all or nothing)
    Apply {
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
        #[arg(long)]
        dry_run: bool,
    },
    /// Show what apply would change; exit 0 (none), 1 (changes), >1 (error)
    Diff {
        #[arg(short = 'f', long = "filename")]
        file: PathBuf,
    },
    /// List objects of a kind, or show one
    Get {
        #[arg(value_parser = KindName)]
        kind: String,
        name: Option<String>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Show one object with its status and events
    Describe {
        #[arg(value_parser = KindName)]
        kind: String,
        name: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Delete one object
    Delete {
        #[arg(value_parser = KindName)]
        kind: String,
        name: String,
    },
    /// Machine tokens
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Save the server URL and token for this PC under $PCMAIL_HOME
    Login {
        #[arg(long)]
        server: String,
        #[arg(long)]
        token: String,
    },
    /// Send a mail; prints its id
    Send(SendArgs),
    /// List my mail, newest first (open only, unless --all or --state)
    Inbox {
        /// Mail I sent instead of mail to me
        #[arg(long)]
        sent: bool,
        /// Only mail in this state (new, delivered, seen, done, failed, expired)
        #[arg(long)]
        state: Option<String>,
        /// Only mail from or to this machine
        #[arg(long)]
        machine: Option<String>,
        #[command(flatten)]
        paging: Paging,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Print a mail and mark it seen
    Read {
        id: String,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Mark a mail done without replying
    Ack { id: String },
    /// Reply to a mail; sets it done with the reply as its result
    Reply {
        id: String,
        /// The reply text, or - to read it from stdin
        #[arg(long)]
        body: String,
        #[arg(long)]
        auto: bool,
    },
    /// Mark a mail failed
    Fail {
        id: String,
        #[arg(long)]
        reason: String,
    },
    /// How far a mail got, with every timestamp
    Status {
        id: String,
        /// Return as soon as the mail is seen or done (or terminal); exit 5 on timeout
        #[arg(long, value_parser = PossibleValuesParser::new(MailState::AWAITABLE.map(MailState::as_str))
            .try_map(|s| s.parse::<MailState>()))]
        wait_for: Option<MailState>,
        #[arg(long, default_value = "5m")]
        timeout: Dur,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// This client's version and API level, and the server's (V1)
    Version {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Mail and ledger rows holding TEXT (Japanese too, parts of words too); a machine finds
    /// only the mail it sent or received
    Search {
        text: String,
        /// Only mail, or only ledger rows
        #[arg(long = "in", value_parser = PossibleValuesParser::new(Scope::NAMES).try_map(|s| s.parse::<Scope>()))]
        within: Option<Scope>,
        /// At most this many of each (1–100)
        #[arg(long, default_value_t = 20)]
        limit: usize,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// The alerts tab: what fired, what resolved, what was notified
    Alerts {
        /// firing, resolved or notice
        #[arg(long)]
        state: Option<String>,
        /// Only alerts that name this machine
        #[arg(long)]
        machine: Option<String>,
        #[command(flatten)]
        paging: Paging,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// One at-least-once poll into the local cache: queued calls sent, new mail fetched
    Poll {
        /// Long-poll up to this long for new mail
        #[arg(long, default_value = "0s")]
        wait: Dur,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
        /// Print nothing (for polls started by hooks)
        #[arg(long)]
        quiet: bool,
    },
    /// Poll in a loop (long-polling); `agent install` runs it as a service
    Agent {
        #[command(subcommand)]
        command: Option<AgentCommand>,
        /// Long-poll wait per cycle
        #[arg(long, default_value = "30s")]
        wait: Dur,
        #[command(flatten)]
        logging: Logging,
    },
    /// Claude Code hooks: hook JSON on stdin, JSON on stdout; never talks to the server
    Hook {
        #[arg(value_parser = ["session-start", "user-prompt-submit", "post-tool-use", "stop"])]
        event: String,
    },
    /// MCP server on stdio for Claude Code: mail tools, and new mail pushed into the session
    Mcp {
        /// Long-poll wait per cycle
        #[arg(long, default_value = "30s")]
        wait: Dur,
        /// The session was started with Claude Code's channels flag: a pushed mail counts as
        /// presented there, and its hooks only count it (Claude Code drops pushes silently
        /// otherwise, so without this the hooks show pushed mail too). K3: the environment takes
        /// 1/0, true/false, yes/no, on/off
        #[arg(long, env = "PCMAIL_CHANNELS", action = clap::ArgAction::SetTrue,
              value_parser = clap::builder::BoolishValueParser::new())]
        channels: bool,
    },
    /// The task ledger: one per project (`--project` may be left out while only one exists)
    Ledger {
        #[arg(long, global = true)]
        project: Option<String>,
        #[command(subcommand)]
        command: LedgerCommand,
    },
    /// The job queue
    Jobs {
        #[command(subcommand)]
        command: JobsCommand,
    },
    /// An external worker: claims jobs of a queue over the API, runs their functions, reports
    Worker {
        #[arg(long)]
        queue: String,
        #[arg(long, default_value = "60s")]
        lease: Dur,
        /// Stop when the queue has nothing due instead of waiting for more
        #[arg(long)]
        once: bool,
    },
    /// Inbound chat messages that must not be lost
    Intent {
        #[command(subcommand)]
        command: IntentCommand,
    },
    /// Copy the whole store, as one snapshot taken while it serves, into a new SQLite file
    Backup {
        file: PathBuf,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Bring a backup back into a store (a new data dir, or --store URL); says what it brings
    /// back and what the store held that it drops
    Restore {
        file: PathBuf,
        #[command(flatten)]
        store: StoreArgs,
        /// Replace a SQLite store even when that goes back in time (it holds newer mail) or
        /// replaces its machine tokens; stop its serve first
        #[arg(long)]
        force: bool,
    },
    /// Whole stores: move one to another adapter, or compare two
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// A shell's completion script on stdout (X1): `source <(pcmail-ctl completion bash)`
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Check this PC's setup, one line a check with its fix; exit 1 if any fails (X5)
    Doctor {
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// A manifest field's type, default, range and meaning (X2), as kubectl explain:
    /// `explain workerpool`, `explain workerpool.spec.rateLimit`
    Explain {
        /// KIND[.spec][.field…], in any case
        path: String,
    },
    /// The JSON Schema (draft 2020-12) of every manifest kind on stdout, for editors (X2)
    Schema,
    /// pcmail's own Telegram channel: this PC's bot, polled by `agent` (or `mcp`)
    Telegram {
        #[command(subcommand)]
        command: TelegramCommand,
    },
}

/// A manifest kind as kubectl users type it (`roster`, `Rosters`). X1: its possible values are
/// what completion offers; any spelling is passed on, and the verb says which kinds exist.
#[derive(Debug, Clone, Copy)]
pub struct KindName;

impl clap::builder::TypedValueParser for KindName {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        clap::builder::StringValueParser::new().parse_ref(cmd, arg, value)
    }

    fn possible_values(&self) -> Option<Box<dyn Iterator<Item = clap::builder::PossibleValue> + '_>> {
        let kinds =
            pcmail_core::manifest::Kind::ALL.into_iter().map(|k| clap::builder::PossibleValue::new(k.cli_name()));
        Some(Box::new(kinds))
    }
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Copy every tab into an empty store (SQLite → PostgreSQL as a team grows)
    Copy {
        #[command(flatten)]
        ends: StorePair,
    },
    /// Compare two stores tab by tab (rows and checksum); exit 0 if equal, 1 if they differ
    Verify {
        #[command(flatten)]
        ends: StorePair,
    },
}

#[derive(Debug, Args)]
pub struct StorePair {
    /// The store read (sqlite:PATH, postgres://…, sheets://…)
    #[arg(long)]
    pub from: String,
    /// The other store
    #[arg(long)]
    pub to: String,
    /// Where a sheets:// store keeps its working copy
    #[arg(long, default_value = "./pcmail-data")]
    pub data_dir: PathBuf,
}

#[derive(Debug, Subcommand)]
pub enum TelegramCommand {
    /// Save this PC's bot (its token, from BotFather) after checking it with Telegram
    Login {
        /// A file holding the bot token [default: PCMAIL_TELEGRAM_TOKEN]
        #[arg(long)]
        token_file: Option<PathBuf>,
        /// The Bot API's address
        #[arg(long, default_value = "https://api.telegram.org", env = "PCMAIL_TELEGRAM_API")]
        api: String,
        /// The chat Claude Code's permission prompts are asked in, the session owner's (K6)
        #[arg(long, env = "PCMAIL_TELEGRAM_OWNER_CHAT", allow_hyphen_values = true)]
        owner_chat: Option<i64>,
        /// Seconds a relayed permission prompt waits for its answer before it is denied (K6)
        #[arg(long, default_value_t = pcmail_core::permission::DEFAULT_TIMEOUT_SECS)]
        permission_timeout: u64,
        /// The largest photo or document downloaded into this PC's cache, in bytes (K7)
        #[arg(long, default_value_t = pcmail_core::telegram::DEFAULT_MAX_FILE_BYTES)]
        max_file_bytes: u64,
    },
    /// How this PC's bot is polled: offset, conflicts, drops (never the token)
    Status,
}

#[derive(Debug, Subcommand)]
pub enum AgentCommand {
    /// Write the service files for this OS (systemd user units, launchd plists, Task Scheduler XML)
    Install {
        #[arg(long, value_parser = ["linux", "macos", "windows"])]
        os: Option<String>,
        /// Where to write them [default: where the OS looks for them]
        #[arg(long)]
        dir: Option<PathBuf>,
    },
    /// Re-register the installed agent if its last run failed or its last poll is over 10m old
    Heal {
        #[arg(long, value_parser = ["linux", "macos", "windows"])]
        os: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum LedgerCommand {
    /// The project's rows, in id order
    List {
        /// todo, running, review, done, dropped or needs-human
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        function: Option<String>,
        /// Only rows assigned to this machine
        #[arg(long)]
        assignee: Option<String>,
        #[command(flatten)]
        paging: Paging,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Open rows of every project by due date, capped per project
    View,
    /// Correct one row (state, instruction, ▶ run, due, assignee); prints what was stored
    SetRow {
        id: String,
        /// todo, review, done, dropped, needs-human, or their Japanese labels
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        instruction: Option<String>,
        /// Tick ▶AI実行: the next execute-checked pass runs it
        #[arg(long)]
        run: bool,
        #[arg(long)]
        due: Option<String>,
        #[arg(long)]
        assignee: Option<String>,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Run one row's function now and wait for its result
    Run {
        id: String,
        /// Return once the row is claimed
        #[arg(long)]
        no_wait: bool,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Add a task; prints {added, updated, skipped} or {error}, and never fails its caller
    Push {
        /// The rows' source: this machine's own (push:MACHINE) when left out; others only as
        /// the Ledger's `pushers` grant them (T11)
        #[arg(long, default_value = "")]
        source: String,
        #[arg(long)]
        task: String,
        #[arg(long, default_value = "")]
        content: String,
        #[arg(long, default_value = "")]
        evidence: String,
        #[arg(long, default_value = "")]
        due: String,
        #[arg(long, default_value = "")]
        assignee: String,
        #[arg(long, default_value = "")]
        function: String,
    },
    /// Pull the project's sources now
    Sync,
    /// Delete a source's untouched rows (a dry run unless --yes)
    PurgeSource {
        source: String,
        #[arg(long)]
        yes: bool,
    },
    /// Run one execute-checked pass now, as its schedule would
    ExecuteChecked,
}

#[derive(Debug, Subcommand)]
pub enum JobsCommand {
    /// Queue a job, or every job of a JSON-lines file; prints each id in order (a live job
    /// holding a job's unique key is answered instead)
    Enqueue {
        #[arg(long, required_unless_present = "file", conflicts_with = "file")]
        queue: Option<String>,
        #[arg(long, required_unless_present = "file", conflicts_with = "file")]
        function: Option<String>,
        /// One job per line, as the API's enqueue body (`{"queue": …, "function": …}`); `-`
        /// reads stdin. Sent in requests of up to 1000 jobs, each one transaction
        #[arg(short = 'f', long)]
        file: Option<String>,
        /// JSON given to the function on stdin
        #[arg(long)]
        payload: Option<String>,
        #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
        priority: i64,
        #[arg(long)]
        unique_key: Option<String>,
        /// E12: the key also holds over a finished job of it for this long (a retry after a
        /// lost answer makes no second job); the WorkerPool's `uniqueFor` when left out
        #[arg(long, requires = "unique_key")]
        unique_for: Option<Dur>,
        #[arg(long)]
        run_after: Option<Dur>,
        #[arg(long)]
        max_attempts: Option<u32>,
    },
    /// Jobs, newest first
    List {
        #[arg(long)]
        queue: Option<String>,
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        function: Option<String>,
        #[command(flatten)]
        paging: Paging,
        #[arg(short, long, value_enum, default_value_t)]
        output: Output,
    },
    /// Run a dead, failed or cancelled job again
    Retry { id: String },
    /// Cancel a job
    Cancel { id: String },
}

#[derive(Debug, Subcommand)]
pub enum IntentCommand {
    /// Record an inbound message in the local cache first, then on the server
    Record {
        #[arg(long, default_value = "telegram")]
        channel: String,
        /// Telegram group chats have negative ids: `--chat -100123` is accepted
        #[arg(long, allow_hyphen_values = true)]
        chat: String,
        #[arg(long, allow_hyphen_values = true)]
        message: String,
        #[arg(long)]
        from: String,
        /// The message text, or - to read it from stdin
        #[arg(long)]
        text: String,
    },
}

/// Which store: `serve`'s, and what `backup` and `restore` read or fill.
#[derive(Debug, Args)]
pub struct StoreArgs {
    #[arg(long, default_value = "./pcmail-data")]
    pub data_dir: PathBuf,
    /// sqlite:PATH, postgres://USER@HOST/DB or sheets://SPREADSHEET_ID?credentials=KEY.json
    /// [default: sqlite:<data-dir>/pcmail.db]
    // Its value may hold a password: `--help` never prints it.
    #[arg(long, env = "PCMAIL_STORE", hide_env_values = true)]
    pub store: Option<String>,
}

impl StoreArgs {
    pub fn url(&self) -> String {
        self.store.clone().unwrap_or_else(|| pcmail_store::default_url(&self.data_dir))
    }
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    #[command(flatten)]
    pub logging: Logging,
    #[arg(long, default_value = "127.0.0.1:7420")]
    pub listen: SocketAddr,
    /// Apply the manifests in this file or directory at start
    #[arg(long)]
    pub apply: Option<PathBuf>,
    /// Allow plain HTTP on a non-loopback address
    #[arg(long)]
    pub insecure_listen: bool,
    /// Serve HTTPS with this certificate chain (PEM); reloaded when it changes on disk
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM) of --tls-cert
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// How often every reconciler runs even when nothing asked for it
    #[arg(long, default_value = "10s")]
    pub resync: Dur,
    /// How long the leader lease lasts without renewal (C1): with several replicas on
    /// PostgreSQL, another takes over within this long after the leader dies
    #[arg(long, default_value = "15s")]
    pub lease: Dur,
    /// Connections served at once (E1); kept under the process's file limit, and `/healthz`
    /// still answers when it is reached
    #[arg(long, default_value_t = 2048)]
    pub max_connections: usize,
    /// How long a client may take to send a request's head
    #[arg(long, default_value = "10s")]
    pub header_timeout: Dur,
    /// How long a connection may stay idle between requests
    #[arg(long, default_value = "60s")]
    pub idle_timeout: Dur,
    /// How long a client may take to send a request's body (T15); it must also keep at least
    /// 1 KiB/s after the body's first second
    #[arg(long, default_value = "30s")]
    pub body_timeout: Dur,
    /// How long a client may take to take an answer (T15); then the connection is closed
    #[arg(long, default_value = "30s")]
    pub write_timeout: Dur,
    /// On SIGTERM, how long running pool jobs get to finish (E17); those still running after
    /// it, and jobs claimed ahead, go back to the queue without spending an attempt
    #[arg(long, default_value = "30s")]
    pub shutdown_grace: Dur,
    /// P13's baseline in the benchmarks: do not fill the search index (searches stay whole,
    /// reading the mail the index lacks row by row)
    #[arg(long, hide = true)]
    pub no_search_index: bool,
}

#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Issue (or reissue) a machine's token; prints it once
    Issue { machine: String },
}

#[derive(Debug, Args)]
pub struct SendArgs {
    #[arg(long)]
    pub to: String,
    #[arg(long, default_value = "")]
    pub subject: String,
    /// The body text, or - to read it from stdin
    #[arg(long, default_value = "")]
    pub body: String,
    #[arg(long, default_value_t)]
    pub kind: MailKind,
    #[arg(long)]
    pub urgent: bool,
    #[arg(long)]
    pub ttl: Option<Dur>,
    #[arg(long)]
    pub reply_to: Option<String>,
    /// Mark this mail as automatically generated (M5 loop guard)
    #[arg(long)]
    pub auto: bool,
}
