//! The live push: follows this PC's inbox cache — filled by this process's poller or by the
//! agent's, through the one cursor, so there is never a second consumer — and tells the session
//! about each new mail once (`pcmail_core::channel`).
//!
//! Claude Code drops channel notifications without a word in sessions not started with its
//! channels flag, and tells the server nothing either way. So a push counts as presented (H3)
//! only in a session the user declared as listening (`presented_in`); otherwise the hooks show
//! the mail as if no push had happened. Either way the mail is never marked seen or done.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use pcmail_core::channel::{self, METHOD};
use rmcp::model::{CustomNotification, ServerNotification};
use rmcp::{Peer, RoleServer, ServiceError};
use tokio::sync::Notify;

use crate::cache::{Cache, CacheError};
use crate::hooks::HOOK_BUSY;

/// How often the cache is looked at for mail another process (the agent) fetched.
const TICK: Duration = Duration::from_millis(200);
/// How seldom, at most, while the cache cannot be read.
const MAX_PAUSE: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
enum FollowError {
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("the session is gone: {0}")]
    Closed(#[from] ServiceError),
}

struct Follower {
    home: PathBuf,
    /// The session pushes are presented in, when it listens to channels.
    presented_in: Option<String>,
    cache: Option<Cache>,
    /// Where pushes begin: at the cursor when following began (older mail is the hooks' to
    /// show), then past every mail looked at, so none is pushed twice. Mail reaches the cache in
    /// seq order (M11's cursor), so nothing behind it can still arrive.
    from: Option<channel::Start>,
    started: pcmail_core::Ts,
    /// Intents open when following began (the session-start hook lists them, I5) and every
    /// intent pushed since, with the text last seen: each new one is pushed once (I8), and
    /// again as an edit each time its text changes (K8).
    intents_seen: Option<std::collections::HashMap<String, String>>,
}

/// Pushes until the session goes away: every [`TICK`], and at once when `fetched` is told of a
/// poll that brought mail.
pub async fn follow(peer: Peer<RoleServer>, home: PathBuf, presented_in: Option<String>, fetched: Arc<Notify>) {
    let mut f = Follower { home, presented_in, cache: None, from: None, started: crate::now(), intents_seen: None };
    let mut pause = TICK;
    loop {
        match f.tick(&peer).await {
            Ok(()) => pause = TICK,
            Err(FollowError::Closed(e)) => {
                tracing::debug!(error = %e, "push stopped");
                return;
            }
            Err(e) => {
                // A busy or broken cache is looked at again, through a fresh handle, less often
                // while it stays broken.
                tracing::warn!(error = %e, retry_in = ?pause, "push skipped");
                f.cache = None;
                pause = (pause * 2).min(MAX_PAUSE);
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(pause) => {}
            _ = fetched.notified() => {}
        }
    }
}

async fn notify(peer: &Peer<RoleServer>, push: channel::Push) -> Result<(), ServiceError> {
    let params = serde_json::json!({"content": push.content, "meta": push.meta});
    peer.send_notification(ServerNotification::CustomNotification(CustomNotification::new(METHOD, Some(params)))).await
}

impl Follower {
    async fn tick(&mut self, peer: &Peer<RoleServer>) -> Result<(), FollowError> {
        let cache = match &mut self.cache {
            Some(c) => c,
            slot => slot.insert(Cache::open(&self.home, HOOK_BUSY)?),
        };
        let Some(from) = self.from else {
            let cursor = cache.state("cursor")?.and_then(|c| c.parse().ok());
            self.from = Some(channel::start(cursor, self.started));
            self.intents_seen = Some(cache.open_intents()?.into_iter().map(|m| (m.id, m.body)).collect());
            return Ok(());
        };
        // I8: each intent recorded since, once, with where to answer it.
        let seen = self.intents_seen.get_or_insert_with(Default::default);
        for m in cache.open_intents()? {
            match seen.get(&m.id) {
                None => notify(peer, channel::push_intent(&m)).await?,
                Some(body) if *body != m.body => notify(peer, channel::push_edit(&m)).await?,
                Some(_) => continue,
            }
            seen.insert(m.id, m.body);
        }
        let now = crate::now();
        let fresh = cache.unpresented_after(from.after_seq)?;
        let mut pushed = Vec::new();
        for m in channel::to_push(&fresh, from, now) {
            notify(peer, channel::push(m)).await?;
            pushed.push(m.id.clone());
        }
        // Past what was pushed, and past what is not pushable now (closed, expired), which never
        // becomes so.
        let after_seq = fresh.iter().map(|m| m.seq).chain([from.after_seq]).max().unwrap_or(from.after_seq);
        self.from = Some(channel::Start { after_seq, ..from });
        if let Some(session) = &self.presented_in
            && !pushed.is_empty()
            && let Err(e) = cache.mark_pushed(&pushed, session, now)
        {
            // Unmarked, the session's hooks show the mail once more: a repeat, never a loss.
            tracing::warn!(error = %e, "pushed mail not marked presented");
        }
        Ok(())
    }
}
