//! The mail verbs every PC uses: send, inbox, read, ack, reply, fail, status, poll.

use std::io::Read;

use anyhow::Context;
use pcmail_agent::client::{Client, home};
use pcmail_agent::mail::{self, Action};
use pcmail_core::alert::Alert;
use pcmail_core::api::{SendRequest, StepRequest};
use pcmail_core::duration::Dur;
use pcmail_core::mail::{Mail, MailState};
use pcmail_core::page::{MAX_MAIL_PAGE, MAX_PAGE, alert_cursor};

use crate::args::{Output, Paging, SendArgs};
use crate::exit::{CliError, Exit};
use crate::output::{self, cut};

/// `-` reads the text from stdin, which must be UTF-8.
fn text_arg(value: &str) -> anyhow::Result<String> {
    if value != "-" {
        return Ok(value.to_string());
    }
    let mut bytes = Vec::new();
    std::io::stdin().read_to_end(&mut bytes).context("reading the body from stdin")?;
    String::from_utf8(bytes).map_err(|e| {
        CliError::new(
            Exit::Error,
            format!("the body on stdin is not valid UTF-8 (at byte {})", e.utf8_error().valid_up_to()),
        )
        .into()
    })
}

pub async fn send(client: &Client, args: SendArgs) -> anyhow::Result<i32> {
    let sent = match &args.reply_to {
        Some(parent) => mail::reply(client, parent, text_arg(&args.body)?, args.auto, Some(args.subject)).await?,
        None => {
            let req = SendRequest {
                id: None,
                to: args.to,
                kind: Some(args.kind),
                subject: args.subject,
                body: text_arg(&args.body)?,
                urgent: args.urgent,
                auto: args.auto,
                ttl: args.ttl,
                reply_to: None,
            };
            mail::send(client, req).await?
        }
    };
    println!("{}", sent.id);
    Ok(0)
}

/// M5: a reply to a reply is refused before anything is sent (exit 3).
pub async fn reply(client: &Client, parent: &str, body: &str, auto: bool) -> anyhow::Result<i32> {
    let sent = mail::reply(client, parent, text_arg(body)?, auto, None).await?;
    println!("{}", sent.id);
    Ok(0)
}

fn when(t: Option<pcmail_core::Ts>) -> String {
    t.map_or_else(|| "-".into(), |t| t.format("%Y-%m-%d %H:%M:%S").to_string())
}

fn mail_rows(mails: &[Mail], sent: bool) -> Vec<Vec<String>> {
    mails
        .iter()
        .map(|m| {
            vec![
                m.id.clone(),
                if sent { m.to.clone() } else { m.from.clone() },
                format!("{}{}", m.kind, if m.urgent { "!" } else { "" }),
                m.state.to_string(),
                when(Some(m.created_at)),
                cut(&m.subject, 60),
            ]
        })
        .collect()
}

/// U3/U6: mail to me (or that I sent), newest first; open only unless `--all` (every mail,
/// every page) or `--state`. A peek: nothing is marked.
pub async fn inbox(
    client: &Client,
    sent: bool,
    state: Option<String>,
    machine: Option<String>,
    paging: Paging,
    out: Output,
) -> anyhow::Result<i32> {
    let mailbox = if sent { "sent" } else { "inbox" };
    let filters = [
        ("box", Some(mailbox.to_string())),
        ("all", Some(paging.all.to_string())),
        ("state", state.clone()),
        ("machine", machine),
    ];
    let (mails, more) = super::pages(
        paging,
        MAX_MAIL_PAGE,
        |m: &Mail| m.id.clone(),
        |after, limit| {
            let query = super::page_query(&filters, limit, after);
            async move { client.get_page::<Mail>("/api/v1/mail", &query).await }
        },
    )
    .await?;
    output::listing(output::kinds::MAIL, &mails, more, out, |mails| {
        if mails.is_empty() {
            let open = if paging.all || state.is_some() { "" } else { "open " };
            eprintln!("no {open}{mailbox} mail");
        } else {
            output::table(
                &["ID", if sent { "TO" } else { "FROM" }, "KIND", "STATE", "CREATED", "SUBJECT"],
                &mail_rows(mails, sent),
            );
        }
    })?;
    Ok(0)
}

pub async fn read(client: &Client, id: &str, out: Output) -> anyhow::Result<i32> {
    let mail = mail::step(client, id, Action::Seen, &StepRequest::default()).await?;
    if !output::structured(out, &mail)? {
        println!("id:      {}", mail.id);
        println!("from:    {}", mail.from);
        println!("to:      {}", mail.to);
        println!("kind:    {}{}", mail.kind, if mail.urgent { " (urgent)" } else { "" });
        if let Some(parent) = &mail.reply_to {
            println!("reply to: {parent}");
        }
        println!("subject: {}", mail.subject);
        println!("state:   {}", mail.state);
        println!();
        println!("{}", mail.body);
    }
    Ok(0)
}

pub async fn step(client: &Client, id: &str, action: Action, body: StepRequest) -> anyhow::Result<i32> {
    let mail = mail::step(client, id, action, &body).await?;
    println!("{} {}", mail.id, mail.state);
    Ok(0)
}

/// M12: the timeline of one mail; with `--wait-for`, returns once that state (or a terminal
/// one) is reached, exit 5 when `timeout` passes first.
pub async fn status(
    client: &Client,
    id: &str,
    wait_for: Option<MailState>,
    timeout: Dur,
    out: Output,
) -> anyhow::Result<i32> {
    let (status, reached) = mail::status(client, id, wait_for, timeout.to_std()).await?;
    if !output::structured(out, &status)? {
        let m = &status.mail;
        println!("{}  {} → {}  {}  {}", m.id, m.from, m.to, m.kind, m.subject);
        println!("state: {}", m.state);
        let rows: Vec<Vec<String>> = m
            .timeline()
            .into_iter()
            .map(|e| vec![e.milestone.label().into(), when(e.at), e.by.unwrap_or_default().into()])
            .collect();
        output::table(&["STEP", "AT", "BY"], &rows);
        if let Some(r) = &m.result {
            println!("result: {}", cut(r, 200));
        }
        if let Some(r) = &m.fail_reason {
            println!("fail reason: {r}");
        }
    }
    if !reached {
        return Err(CliError::new(
            Exit::Timeout,
            format!(
                "{id} is still {} after {timeout}, not {}",
                status.mail.state,
                wait_for.map(MailState::as_str).unwrap_or_default()
            ),
        )
        .into());
    }
    Ok(0)
}

/// M11: one cycle of the agent: queued calls flushed, then mail after the cached cursor
/// fetched into the cache. A lost answer is simply fetched again: the cursor moves only with
/// the mail it covers.
pub async fn poll(client: &Client, wait: Dur, out: Output, quiet: bool) -> anyhow::Result<i32> {
    let report = pcmail_agent::sync::cycle(client, &home(), wait.to_std()).await?;
    if quiet {
        return Ok(0);
    }
    let json = serde_json::json!({"mail": report.mail, "sent": report.sent, "waiting": report.waiting});
    if !output::structured(out, &json)? {
        if report.mail.is_empty() {
            eprintln!("no new mail");
        } else {
            output::table(&["ID", "FROM", "KIND", "STATE", "CREATED", "SUBJECT"], &mail_rows(&report.mail, false));
        }
        if !report.merged.quarantined.is_empty() {
            eprintln!("quarantined (reported failed): {}", report.merged.quarantined.join(", "));
        }
        if report.waiting > 0 {
            eprintln!("{} server call(s) still queued", report.waiting);
        }
    }
    Ok(0)
}

/// U3/U6: the alerts tab, most recently changed first (admin).
pub async fn alerts(
    client: &Client,
    state: Option<String>,
    machine: Option<String>,
    paging: Paging,
    out: Output,
) -> anyhow::Result<i32> {
    let filters = [("state", state), ("machine", machine)];
    let (alerts, more) = super::pages(paging, MAX_PAGE, alert_cursor, |after, limit| {
        let query = super::page_query(&filters, limit, after);
        async move { client.get_page::<Alert>("/api/v1/alerts", &query).await }
    })
    .await?;
    output::listing(output::kinds::ALERT, &alerts, more, out, |alerts| {
        let rows: Vec<Vec<String>> = alerts
            .iter()
            .map(|a| {
                vec![
                    a.kind.to_string(),
                    a.subject.clone(),
                    a.state.as_str().to_string(),
                    a.notified.map_or("-", |n| n.as_str()).to_string(),
                    when(Some(a.firing_since)),
                    cut(&a.summary, 70),
                ]
            })
            .collect();
        output::table(&["KIND", "SUBJECT", "STATE", "NOTIFIED", "SINCE", "SUMMARY"], &rows);
    })?;
    Ok(0)
}
