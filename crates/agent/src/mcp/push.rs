//! The live push: follows this PC's inbox cache — filled by this process's poller or by the
//! agent's, through the one cursor, so there is never a second consumer — and tells the session
//! about each new mail once (`pcmail_core::channel`).
//!
//! A mail is pushed, then marked presented in the session (H3) — presented, not seen: the agent
//! reads or closes it with the tools. A process killed between the push and the mark has shown
//! it unmarked, so a hook shows it again rather than never.

use std::path::PathBuf;
use std::time::Duration;

use pcmail_core::channel::{self, METHOD};
use rmcp::model::{CustomNotification, ServerNotification};
use rmcp::{Peer, RoleServer, ServiceError};

use crate::cache::{Cache, CacheError};
use crate::hooks::HOOK_BUSY;

/// How often the cache is looked at: a push reaches the session well within a second.
pub const TICK: Duration = Duration::from_millis(200);

#[derive(Debug, thiserror::Error)]
enum FollowError {
    #[error(transparent)]
    Cache(#[from] CacheError),
    #[error("the session is gone: {0}")]
    Closed(#[from] ServiceError),
}

struct Follower {
    home: PathBuf,
    session: String,
    cache: Option<Cache>,
    /// The cursor when following began: older mail is the hooks' to show.
    after: Option<i64>,
    /// Pushed, not yet marked presented (the mark failed): never pushed twice.
    unmarked: Vec<String>,
}

/// Pushes until the session goes away.
pub async fn follow(peer: Peer<RoleServer>, home: PathBuf, session: String) {
    let mut f = Follower { home, session, cache: None, after: None, unmarked: Vec::new() };
    loop {
        match f.tick(&peer).await {
            Ok(()) => {}
            Err(FollowError::Closed(e)) => {
                tracing::debug!(error = %e, "push stopped");
                return;
            }
            Err(e) => {
                // A busy or broken cache is looked at again next tick, through a fresh handle.
                tracing::warn!(error = %e, "push skipped");
                f.cache = None;
            }
        }
        tokio::time::sleep(TICK).await;
    }
}

impl Follower {
    async fn tick(&mut self, peer: &Peer<RoleServer>) -> Result<(), FollowError> {
        let cache = match &mut self.cache {
            Some(c) => c,
            slot => slot.insert(Cache::open(&self.home, HOOK_BUSY)?),
        };
        let Some(after) = self.after else {
            // Until a first poll has set the cursor, everything in the cache is backlog.
            self.after = cache.state("cursor")?.and_then(|c| c.parse().ok());
            return Ok(());
        };
        let now = crate::now();
        let fresh = cache.unpresented_after(after)?;
        for m in channel::to_push(&fresh, after, now) {
            if self.unmarked.contains(&m.id) {
                continue;
            }
            let push = channel::push(m);
            let params = serde_json::json!({"content": push.content, "meta": push.meta});
            peer.send_notification(ServerNotification::CustomNotification(CustomNotification::new(
                METHOD,
                Some(params),
            )))
            .await?;
            self.unmarked.push(m.id.clone());
        }
        if !self.unmarked.is_empty() {
            cache.mark_pushed(&self.unmarked, &self.session, now)?;
            self.unmarked.clear();
        }
        Ok(())
    }
}
