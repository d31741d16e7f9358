//! One module per group of verbs. Each returns the process exit code, or an error that
//! `exit` maps to one.

mod agent;
mod doctor;
mod jobs;
mod ledger;
mod mail;
mod search;
mod serve;
mod specs;
mod store;

use anyhow::Context;
use pcmail_core::api::{StepRequest, TokenRequest, TokenResponse, WhoAmI};

use pcmail_agent::client::{Client, ClientConfig, ClientError, config_path, home, read_ca, write_private};
use pcmail_agent::mail::Action;

use crate::args::{Cli, Command, IntentCommand, Paging, TokenCommand};

pub use agent::hook;

/// U6: a listing's first `limit` items, or with `--all` every page of `page_size` (each after
/// the last item of the one before), and how many more match. `fetch(after, limit)` reads a page.
/// A page the server answered short (T15 caps a page's bytes) is followed to the limit.
async fn pages<T, F, Fut>(
    paging: Paging,
    page_size: usize,
    key: impl Fn(&T) -> String,
    mut fetch: F,
) -> Result<(Vec<T>, u64), ClientError>
where
    F: FnMut(Option<String>, usize) -> Fut,
    Fut: std::future::Future<Output = Result<(Vec<T>, u64), ClientError>>,
{
    let wanted = if paging.all { usize::MAX } else { paging.limit };
    let (mut items, mut more) = fetch(None, if paging.all { page_size } else { paging.limit }).await?;
    while more > 0 && items.len() < wanted {
        let (next, left) = fetch(items.last().map(&key), page_size.min(wanted - items.len())).await?;
        if next.is_empty() {
            break;
        }
        items.extend(next);
        more = left;
    }
    Ok((items, more))
}

/// A page's query: the filters given, the page size and the cursor.
fn page_query<'a>(
    filters: &[(&'a str, Option<String>)],
    limit: usize,
    after: Option<String>,
) -> Vec<(&'a str, String)> {
    let mut query: Vec<(&str, String)> =
        filters.iter().filter_map(|(name, value)| Some((*name, value.clone()?))).collect();
    query.push(("limit", limit.to_string()));
    query.extend(after.map(|a| ("after", a)));
    query
}

pub async fn run(cli: Cli) -> anyhow::Result<i32> {
    let conn = cli.conn;
    match cli.command {
        Command::Serve(args) => serve::run(args).await,
        Command::Login { server, token } => login(server, token, conn.ca.as_deref()).await,
        Command::Hook { event } => Ok(hook(&event)),
        Command::Mcp { wait, channels } => {
            agent::mcp(
                Client::resolve(conn.server, conn.token, conn.as_machine, conn.ca.as_deref(), &home()),
                wait,
                channels,
            )
            .await
        }
        Command::Telegram { command } => agent::telegram(command).await,
        command @ (Command::Completion { .. } | Command::Explain { .. } | Command::Schema) => offline(command),
        Command::Doctor { output } => doctor::run(conn, output).await,
        Command::Version { output } => {
            let client = Client::resolve(conn.server, conn.token, conn.as_machine, conn.ca.as_deref(), &home());
            version(client.ok(), output).await
        }
        Command::Backup { file, store } => store::backup(file, store).await,
        Command::Restore { file, store, force } => store::restore(file, store, force).await,
        Command::Store { command } => store::run(command).await,
        Command::Intent { command: IntentCommand::Record { channel, chat, message, from, text } } => {
            let client = Client::resolve(conn.server, conn.token, conn.as_machine, conn.ca.as_deref(), &home()).ok();
            agent::record_intent(client, channel, chat, message, from, text).await
        }
        command => {
            let client = Client::resolve(conn.server, conn.token, conn.as_machine, conn.ca.as_deref(), &home())?;
            run_with_client(&client, command).await
        }
    }
}

/// The verbs that talk to the server as the configured machine or admin.
async fn run_with_client(client: &Client, command: Command) -> anyhow::Result<i32> {
    match command {
        Command::Apply { file, dry_run } => specs::apply(client, &file, dry_run).await,
        Command::Diff { file } => specs::diff(client, &file).await,
        Command::Get { kind, name, output } => specs::get(client, &kind, name.as_deref(), output).await,
        Command::Describe { kind, name, output } => specs::describe(client, &kind, &name, output).await,
        Command::Delete { kind, name } => specs::delete(client, &kind, &name).await,
        Command::Token { command: TokenCommand::Issue { machine } } => {
            let t: TokenResponse = client.post("/api/v1/tokens", &TokenRequest { machine }).await?;
            eprintln!("token for {} (shown once; store it now):", t.machine);
            println!("{}", t.token);
            Ok(0)
        }
        Command::Send(args) => mail::send(client, args).await,
        Command::Inbox { sent, state, machine, paging, output } => {
            mail::inbox(client, sent, state, machine, paging, output).await
        }
        Command::Read { id, output } => mail::read(client, &id, output).await,
        Command::Ack { id } => mail::step(client, &id, Action::Ack, StepRequest::default()).await,
        Command::Fail { id, reason } => {
            let body = StepRequest { reason: Some(reason), ..Default::default() };
            mail::step(client, &id, Action::Fail, body).await
        }
        Command::Reply { id, body, auto } => mail::reply(client, &id, &body, auto).await,
        Command::Status { id, wait_for, timeout, output } => mail::status(client, &id, wait_for, timeout, output).await,
        Command::Poll { wait, output, quiet } => mail::poll(client, wait, output, quiet).await,
        Command::Agent { command, wait, logging } => agent::run(client, command, wait, &logging).await,
        Command::Alerts { state, machine, paging, output } => {
            mail::alerts(client, state, machine, paging, output).await
        }
        Command::Search { text, within, limit, output } => search::run(client, &text, within, limit, output).await,
        Command::Ledger { project, command } => ledger::run(client, project, command).await,
        Command::Jobs { command } => jobs::run(client, command).await,
        Command::Worker { queue, lease, once } => jobs::worker(client, &queue, lease, once).await,
        other @ (Command::Serve(_)
        | Command::Login { .. }
        | Command::Hook { .. }
        | Command::Mcp { .. }
        | Command::Telegram { .. }
        | Command::Completion { .. }
        | Command::Doctor { .. }
        | Command::Explain { .. }
        | Command::Schema
        | Command::Backup { .. }
        | Command::Restore { .. }
        | Command::Store { .. }
        | Command::Version { .. }
        | Command::Intent { .. }) => Err(anyhow::anyhow!("internal: {other:?} is dispatched before a client is made")),
    }
}

/// The verbs that need neither a server nor a login: X1's completion, X2's explain and schema.
fn offline(command: Command) -> anyhow::Result<i32> {
    match command {
        Command::Completion { shell } => completion(shell),
        Command::Explain { path } => {
            let text = pcmail_core::manifest::schema::explain(&path)
                .map_err(|e| crate::exit::CliError::new(crate::exit::Exit::Error, e.to_string()))?;
            print!("{text}");
            Ok(0)
        }
        Command::Schema => {
            let schema = pcmail_core::manifest::schema::json_schema();
            println!("{}", serde_json::to_string_pretty(&schema).context("writing the schema")?);
            Ok(0)
        }
        other => Err(anyhow::anyhow!("internal: {other:?} is not an offline verb")),
    }
}

/// X1: the completion script of `shell` on stdout.
fn completion(shell: clap_complete::Shell) -> anyhow::Result<i32> {
    use std::io::Write;
    let mut cmd = <Cli as clap::CommandFactory>::command();
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "pcmail-ctl", &mut script);
    let mut script = String::from_utf8(script).context("the completion script is not UTF-8")?;
    if shell == clap_complete::Shell::Bash {
        // clap_complete's bash script spells a subcommand's state two ways when the binary's
        // name has a hyphen (clap-rs/clap#6421), so nothing after the verb completes; the
        // dispatch loop's spelling is the right one. A no-op once clap_complete is fixed.
        script = script.replace("pcmail__subcmd__ctl__subcmd__", "pcmail__ctl__subcmd__");
    }
    std::io::stdout().write_all(script.as_bytes()).context("writing the completion script")?;
    Ok(0)
}

/// V1: this build's version and API level, and the server's when one answers. A server that
/// cannot be asked is said, not an error: the client's own version is still worth printing.
async fn version(client: Option<Client>, output: crate::args::Output) -> anyhow::Result<i32> {
    use pcmail_core::api::{API_LEVEL, VersionInfo};
    let ours = VersionInfo { version: env!("CARGO_PKG_VERSION").to_string(), api_level: API_LEVEL };
    let server = match &client {
        Some(c) => c.server_version().await.map_err(|e| e.to_string()),
        None => Err("no server configured (pcmail-ctl login)".to_string()),
    };
    let answer = serde_json::json!({
        "client": ours,
        "server": server.as_ref().ok().cloned().flatten(),
    });
    if !crate::output::structured(output, &answer)? {
        println!("client: pcmail-ctl {} (API level {})", ours.version, ours.api_level);
        match &server {
            Ok(Some(s)) => println!("server: pcmail-ctl {} (API level {})", s.version, s.api_level),
            Ok(None) => println!("server: older than the version route (before API level 2); upgrade the server"),
            Err(e) => println!("server: not reached ({e})"),
        }
    }
    Ok(0)
}

/// Checks the token against the server before saving it, so a typo is caught now.
async fn login(server: String, token: String, ca: Option<&std::path::Path>) -> anyhow::Result<i32> {
    let ca = ca.map(read_ca).transpose()?;
    let client = Client::new(&server, &token, None, ca.clone(), std::time::Duration::from_secs(30))?;
    let who: WhoAmI = client.get("/api/v1/whoami", &[]).await?;
    let config = ClientConfig { server, token, ca };
    let path = config_path(&home());
    write_private(&path, &serde_json::to_string_pretty(&config)?).context("saving the client config")?;
    let identity = who.machine.unwrap_or_else(|| "admin".into());
    eprintln!("logged in to {} as {identity}; config saved to {}", config.server, path.display());
    Ok(0)
}
