//! P13: the search index filled behind the writes, off the send path. A store that is this
//! process's own (SQLite, the Sheets adapter's working copy) takes the mail above the index's
//! mark in batches (`Store::index_search`, whose batch `pcmail_core::search::index_due` picks):
//! at once while a batch was full, then every `INDEX_EVERY`. Searches stay whole meanwhile —
//! they read the mail above the mark row by row — so a mail is found as soon as it is stored.
//! A restart, a crash or a copied store only leaves a longer tail, which the first batches
//! take. A shared store (PostgreSQL) keeps its index in the writing transaction: no indexer.

use pcmail_core::search::{INDEX_BATCH, INDEX_EVERY};
use pcmail_store::Store;

use crate::app::App;

/// After a failed batch (a full disk, E15: said by the health watch, not here again).
const AFTER_ERROR: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs until shutdown.
pub async fn run(app: App) {
    let mut shutdown = app.watch_shutdown();
    loop {
        let rest = match app.store().index_search(INDEX_BATCH).await {
            Ok(behind) if behind.seqs > 0 => std::time::Duration::ZERO,
            Ok(_) => INDEX_EVERY,
            Err(e) => {
                if app.store().health().refusing().is_some() {
                    tracing::debug!(error = %e, "search index batch refused; trying again");
                } else {
                    tracing::warn!(error = %e, "search index batch failed; trying again (searches stay whole)");
                }
                AFTER_ERROR
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(rest) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}
