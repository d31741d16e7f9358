//! The mail verbs of a PC — send, reply, read, ack/fail, status — shared by the CLI and the MCP
//! tools: each is the server call plus the local cache kept in step, answering data, never
//! printing. The rules they apply (M4–M7, M12) live in pcmail-core.

use std::time::{Duration, Instant};

use pcmail_core::api::{ErrorCode, MailStatus, SendRequest, SendResponse, StepRequest};
use pcmail_core::ids;
use pcmail_core::mail::{Mail, MailState, reply_refusal};

use crate::cache::Cache;
use crate::client::{Client, ClientError, home};

#[derive(Debug, thiserror::Error)]
pub enum MailError {
    #[error(transparent)]
    Client(#[from] ClientError),
    /// M5: refused before anything was sent.
    #[error("refused as a loop: {0}")]
    Loop(String),
    #[error("no randomness for a mail id: {0}")]
    Random(String),
}

/// A mail's server step that takes no reply, named as its route names it.
pub use pcmail_core::mail::Action;

fn random_mail_id() -> Result<String, MailError> {
    let mut bytes = [0u8; 4];
    getrandom::fill(&mut bytes).map_err(|e| MailError::Random(e.to_string()))?;
    Ok(ids::mail_id(bytes))
}

/// Best effort: a mail moved from this PC is moved in its cache too, so hooks and pushes do not
/// present it again. An admin's machine may have no cache; that is fine.
fn refresh_cache(mail: &Mail) {
    if let Ok(mut cache) = Cache::open(&home(), crate::hooks::HOOK_BUSY)
        && let Err(e) = cache.refresh(mail)
    {
        tracing::debug!(error = %e, "cache refresh skipped");
    }
}

/// M4: the id is drawn here; on a duplicate the client draws again once and resends. A reply
/// carries one too: it is used when the fixed reply id (M6) is taken by a different answer.
pub async fn send(client: &Client, mut req: SendRequest) -> Result<SendResponse, MailError> {
    req.id = Some(random_mail_id()?);
    match client.post("/api/v1/mail", &req).await {
        Err(e) if e.code() == Some(ErrorCode::DuplicateId) => {
            req.id = Some(random_mail_id()?);
            Ok(client.post("/api/v1/mail", &req).await?)
        }
        other => Ok(other?),
    }
}

/// M5–M7: a reply to a reply is refused here, before anything is sent; the parent is set done
/// with the reply by the server and refreshed in the cache.
pub async fn reply(
    client: &Client,
    parent: &str,
    body: String,
    auto: bool,
    subject: Option<String>,
) -> Result<SendResponse, MailError> {
    let status: MailStatus = client.get(&format!("/api/v1/mail/{parent}"), &[]).await?;
    if let Some(why) = reply_refusal(&status.mail) {
        return Err(MailError::Loop(why));
    }
    let req = SendRequest {
        reply_to: Some(parent.to_string()),
        body,
        auto,
        subject: subject.unwrap_or_default(),
        ..Default::default()
    };
    let sent = send(client, req).await?;
    if let Ok(parent) = client.get::<MailStatus>(&format!("/api/v1/mail/{parent}"), &[]).await {
        refresh_cache(&parent.mail);
    }
    Ok(sent)
}

/// Mail to me (or that I sent), open only unless `all`; a peek: nothing is marked.
pub async fn list(client: &Client, sent: bool, all: bool) -> Result<Vec<Mail>, MailError> {
    let mailbox = if sent { "sent" } else { "inbox" };
    Ok(client.get("/api/v1/mail", &[("box", mailbox.into()), ("all", all.to_string())]).await?)
}

/// Moves one mail a step at the server (`body`: `{"result"}` for ack, `{"reason"}` for fail)
/// and in the cache; answers the server's copy.
pub async fn step(client: &Client, id: &str, action: Action, body: &StepRequest) -> Result<Mail, MailError> {
    let mail: Mail = client.post(&format!("/api/v1/mail/{id}/{}", action), body).await?;
    refresh_cache(&mail);
    Ok(mail)
}

/// M12: a mail's timeline; with `wait_for`, once that state (or a terminal one) is reached or
/// `timeout` passes. Answers the status and whether the state was reached.
pub async fn status(
    client: &Client,
    id: &str,
    wait_for: Option<MailState>,
    timeout: Duration,
) -> Result<(MailStatus, bool), MailError> {
    let reached = |m: &Mail| wait_for.is_none_or(|t| m.state.rank() >= t.rank() || m.state.is_terminal());
    let deadline = Instant::now() + timeout;
    loop {
        let mut query = Vec::new();
        if let Some(t) = wait_for {
            let left = deadline.saturating_duration_since(Instant::now());
            query.push(("waitFor", t.to_string()));
            query.push(("timeout", format!("{}ms", left.as_millis().min(60_000))));
        }
        let status: MailStatus = client.get(&format!("/api/v1/mail/{id}"), &query).await?;
        let done = reached(&status.mail);
        if done || Instant::now() >= deadline {
            return Ok((status, done));
        }
    }
}
