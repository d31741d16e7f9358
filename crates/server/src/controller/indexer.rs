//! P13: the search index filled behind the writes, off the send path. A store that is this
//! process's own (SQLite, the Sheets adapter's working copy) takes the mail above the index's
//! mark in batches (`Store::index_search`, whose batch `pcmail_core::search::index_due` picks):
//! at once while a batch was full, then every `INDEX_EVERY`. Searches stay whole meanwhile —
//! they read the mail above the mark row by row — so a mail is found as soon as it is stored.
//! A restart, a crash or a copied store only leaves a longer tail, which the first batches
//! take. A shared store (PostgreSQL) keeps its index in the writing transaction; its indexer
//! only builds the search indexes a `store copy` into it left out (P14), then ends.

use pcmail_core::search::{INDEX_BATCH, INDEX_EVERY};
use pcmail_store::Store;

use crate::app::{App, warn_unless_outage};

/// After a failed batch (a full disk, E15: said by the health watch, not here again).
const AFTER_ERROR: std::time::Duration = std::time::Duration::from_secs(1);

/// While a PostgreSQL store's search indexes are built (by this replica or another).
const BUILDING_EVERY: std::time::Duration = std::time::Duration::from_secs(5);

/// Runs until shutdown; on a `shared` store, until its deferred search indexes are built.
pub async fn run(app: App, shared: bool) {
    let mut shutdown = app.watch_shutdown();
    loop {
        let rest = match app.store().index_search(INDEX_BATCH).await {
            Ok(behind) if behind.seqs > 0 => std::time::Duration::ZERO,
            Ok(behind) if behind.building => BUILDING_EVERY,
            // A shared store has nothing more for it (and its health is watched elsewhere).
            Ok(_) if shared => return,
            Ok(_) => INDEX_EVERY,
            Err(e) => {
                // Refused while the disk is full, as every write is: the health watch says so.
                let outage = app.store().health().refusing().is_some();
                warn_unless_outage!(outage, error = %e, "search index batch failed; trying again (searches stay whole)");
                AFTER_ERROR
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(rest) => {}
            _ = shutdown.wait_for(|stop| *stop) => return,
        }
    }
}
